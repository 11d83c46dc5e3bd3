#pragma once
// What both architectures' golden tests share: reading a fixture's golden tensors, the largest
// logit difference, and whether a CUDA device is there to run the GPU cases on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"
#ifdef FIRELINE_HAVE_GPU
#include "backend/cuda/cuda_backend.h"
#else
namespace fl {
inline bool cuda_device_available() { return false; }
inline int64_t cuda_branch_forks(Backend&) { return 0; }
inline int64_t cuda_workspace_growths(Backend&) { return 0; }
inline bool cuda_hopper_gemm_active(Backend&) { return false; }
inline int64_t cuda_hopper_expert_gemm_launches() { return 0; }
inline int64_t cuda_group_gemm_launches() { return 0; }
inline bool cuda_imma_matvec_available(Backend&) { return false; }
inline int64_t cuda_imma_matvec_launches() { return 0; }
inline int64_t cuda_imma_pieces_launches() { return 0; }
}  // namespace fl
#endif

namespace fl::test {

// Every element of tensor `name` of a golden file; empty when it is absent (a failure too unless
// the tensor is optional: fixtures made before a tensor was added lack it).
template <typename T>
std::vector<T> read_golden(const SafetensorsFile& f, const char* name, bool optional = false) {
  const SafetensorsEntry* e = f.find(name);
  if (!optional) {
    EXPECT_NE(e, nullptr) << name;
  }
  if (!e) return {};
  Tensor t = f.tensor(*e);
  return std::vector<T>(t.ptr<T>(), t.ptr<T>() + t.numel());
}

// max |a - b|; infinity when either side holds a NaN (so that no tolerance accepts it).
inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// Batched decode against each sequence decoded alone. The CPU backend runs a batch's rows one
// after another through the single-row ops: identical bits. On a GPU, attention splits a row's
// context into a number of blocks that depends on the batch (few rows: many splits each; a lone
// sequence of 8+ query heads per KV head: the tensor-core kernel), so the summation order, and
// with it the last bits, differ; everything else is per-row identical.
inline float batched_decode_tolerance(const Backend& backend) { return backend.device() == Device::cpu ? 0.0f : 1e-5f; }

// max |a - b| over two states' bytes read as f32: meaningful for sequences whose KV rows and
// recurrent states are all f32 (the batched tests' sequences), not for bf16 or Q8_0 caches.
inline float max_state_diff(const std::vector<std::vector<uint8_t>>& a, const std::vector<std::vector<uint8_t>>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || a[i].size() % sizeof(float)) return INFINITY;
    m = std::max(m, max_abs_diff(reinterpret_cast<const float*>(a[i].data()),
                                 reinterpret_cast<const float*>(b[i].data()), a[i].size() / sizeof(float)));
  }
  return m;
}

// Two sequences per prompt length n, each given the first n prompt ids: the pairs the batched
// tests compare (one decoded in a batch, its twin alone or sampled on the host).
struct TwinSequences {
  std::vector<std::unique_ptr<Sequence>> first, second;
};
inline TwinSequences prefilled_twins(Model& model, std::span<const int32_t> prompt, std::span<const int64_t> lengths,
                                     const std::function<std::unique_ptr<Sequence>()>& make_sequence) {
  TwinSequences twins;
  for (int64_t n : lengths) {
    for (auto* side : {&twins.first, &twins.second}) {
      side->push_back(make_sequence());
      model.forward(*side->back(), prompt.first(static_cast<size_t>(n)), LogitsMode::last);
    }
  }
  return twins;
}

}  // namespace fl::test
