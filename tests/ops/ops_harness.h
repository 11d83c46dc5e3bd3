#pragma once
// The op harness: every CUDA op against the CPU oracle on fresh random inputs, with the GPU
// output poisoned (all bits set: NaN) before each launch so that an element the kernel forgets to
// write fails the comparison. Shapes are deliberately odd: 1, 3, 17 and 128 rows; K = 704, 2112,
// 2816 (not multiples of the 256-wide groups); head dims 16, 256, 512; contexts crossing the
// sliding window several times.
//
// Error budgets (each with its reason):
// - kSumBudget 1e-5, relative to the largest reference magnitude of the output: the GPU sums in
//   a different order (warp trees instead of a left-to-right loop); f32 reassociation over K
//   <= 2816 terms usually stays near 1e-6 relative, so 1e-5 only catches real errors. Matmuls
//   scale it by sqrt(K / 256) (see there: one output can be a small result of cancellation).
// - kExactBudget 0: element-wise ops (add, scale, activations, KV conversion) perform the same
//   single f32 operations on both sides and must match bit for bit... except transcendental
//   functions (tanh, exp, sin/cos), whose CUDA and glibc implementations differ by an ulp or two:
//   those use kUlpBudget 1e-6 relative.
//
// This header holds what every part of the harness shares: the budgets, the Twin tensors (a
// host copy for the oracle, a device copy for the GPU) and the CudaOps fixture. The tests are
// split by op family: ops_matmul_test.cpp (matrix products and the mixture-of-experts ops),
// ops_test.cpp (everything else: sampling, norms, RoPE, attention, linear attention, graphs,
// and the bf16 tensor-core precision across families).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/sampling.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"
#include "util/test_util.h"

namespace fl::ops_harness {

constexpr float kSumBudget = 1e-5f;
constexpr float kUlpBudget = 1e-6f;

// A product's budget over K-term dot products: reassociation error grows like sqrt(K) for
// random-sign terms, and never below the short-sum budget.
inline float dot_budget(int64_t K) { return kSumBudget * std::max(1.0f, std::sqrt(static_cast<float>(K) / 256.0f)); }

// A tensor with one copy in host memory (used by the CPU oracle) and one on the GPU.
struct Twin {
  HostBuffer host;
  std::unique_ptr<DeviceBuffer> device;
  Tensor cpu, gpu;
};

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    cpu_ = make_cpu_backend();
    gpu_ = make_backend("cuda");
  }

  // Raw bytes -> twin of the given dtype/shape.
  Twin twin_bytes(DType dtype, std::initializer_list<int64_t> shape, const void* bytes) {
    Twin t;
    Tensor probe = make_tensor(nullptr, dtype, shape);
    const size_t n = static_cast<size_t>(probe.nbytes());
    t.host = HostBuffer(n);
    std::memcpy(t.host.data(), bytes, n);
    t.cpu = make_tensor(t.host.data(), dtype, shape);
    t.device = gpu_->allocate(n);
    t.gpu = make_tensor(t.device->data(), dtype, shape, Device::cuda);
    gpu_->copy_to_device(t.gpu, bytes);
    return t;
  }

  // Random values encoded in `dtype` (row by row, through the quant registry).
  Twin twin_random(DType dtype, std::initializer_list<int64_t> shape, float scale = 1.0f) {
    Tensor probe = make_tensor(nullptr, dtype, shape);
    const int64_t rows = probe.rows(), cols = probe.cols();
    std::vector<float> values(static_cast<size_t>(rows * cols));
    std::normal_distribution<float> dist(0.0f, scale);
    for (float& v : values) v = dist(rng_);
    std::vector<uint8_t> bytes(static_cast<size_t>(probe.nbytes()));
    const QuantFormat& f = quant_format(dtype);
    for (int64_t r = 0; r < rows; ++r)
      f.quantize_row(values.data() + r * cols, bytes.data() + r * probe.row_bytes(), cols);
    return twin_bytes(dtype, shape, bytes.data());
  }

  Twin twin_ids(std::initializer_list<int64_t> shape, int32_t limit) {
    Tensor probe = make_tensor(nullptr, DType::i32, shape);
    std::vector<int32_t> ids(static_cast<size_t>(probe.numel()));
    std::uniform_int_distribution<int32_t> dist(0, limit - 1);
    for (int32_t& v : ids) v = dist(rng_);
    return twin_bytes(DType::i32, shape, ids.data());
  }

  // The CPU's routing of T tokens over E experts (top K; random logits, bf16 per-expert scales),
  // on both sides: {weights [T, K] f32, ids [T, K] i32}.
  std::pair<Twin, Twin> twin_routing(int64_t T, int64_t E, int64_t K) {
    Twin logits = twin_random(DType::f32, {T, E}, 2.0f), scale = twin_random(DType::bf16, {E});
    std::pair<Twin, Twin> routing{twin_output(DType::f32, {T, K}), twin_output(DType::i32, {T, K})};
    auto& [w, ids] = routing;
    cpu_->moe_route(w.cpu, ids.cpu, logits.cpu, &scale.cpu);
    gpu_->copy_to_device(ids.gpu, ids.host.data());
    gpu_->copy_to_device(w.gpu, w.host.data());
    return routing;
  }

  Twin twin_positions(int64_t first, int64_t n) {
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(first + i);
    return twin_bytes(DType::i32, {n}, pos.data());
  }

  // An output twin: the CPU side zeroed, the GPU side poisoned with all bits set (NaN).
  Twin twin_output(DType dtype, std::initializer_list<int64_t> shape) {
    Tensor probe = make_tensor(nullptr, dtype, shape);
    std::vector<uint8_t> poison(static_cast<size_t>(probe.nbytes()), 0xff);
    Twin t = twin_bytes(dtype, shape, poison.data());
    std::memset(t.host.data(), 0, t.host.size());
    return t;
  }

  std::vector<uint8_t> gpu_bytes(const Twin& t) {
    std::vector<uint8_t> out(t.host.size());
    Tensor whole = make_tensor(t.device->data(), DType::u8, {static_cast<int64_t>(out.size())}, Device::cuda);
    gpu_->copy_to_host(out.data(), whole);
    return out;
  }

  // out = x W^T on backend b (another than gpu_: switched kernels), written over NaN; its bytes.
  std::vector<uint8_t> matmul_over_nan(Backend& b, Twin& out, const Twin& x, const Twin& w) {
    const std::vector<uint8_t> nan_bytes(out.host.size(), 0xff);
    b.copy_to_device(out.gpu, nan_bytes.data());
    b.matmul(out.gpu, x.gpu, w.gpu);
    b.synchronize();
    return gpu_bytes(out);
  }

  // x [1, K] W^T on backend b, whose switched kernel counts its launches (`launches`): the kernel
  // ran, two runs give the same bytes, and the result is close to the CPU oracle.
  void expect_counted_matvec(Backend& b, int64_t (*launches)(), const Twin& x, const Twin& w, const std::string& what) {
    const int64_t M = w.cpu.dim(0), K = w.cpu.dim(1);
    Twin out = twin_output(DType::f32, {1, M});
    const int64_t before = launches();
    const std::vector<uint8_t> first = matmul_over_nan(b, out, x, w);
    EXPECT_EQ(launches(), before + 1) << what << ": the kernel did not run";
    EXPECT_EQ(matmul_over_nan(b, out, x, w), first) << what << ": two runs differ";
    cpu_->matmul(out.cpu, x.cpu, w.cpu);
    expect_close(out, dot_budget(K), what);
  }

  // x [1, K] times a group of weights of one input (matmul_group, one launch) on backend b, whose
  // switched kernel counts its launches: it ran once, and each output (written over NaN) is close
  // to the CPU oracle's.
  void expect_counted_group(Backend& b, int64_t (*launches)(), const Twin& x, const std::vector<Twin>& weights,
                            const std::string& what) {
    const int64_t K = x.cpu.dim(1);
    std::vector<Twin> outs;
    std::vector<Tensor> cpu_outs, gpu_outs;
    std::vector<const Tensor*> cpu_w, gpu_w;
    for (const Twin& w : weights) outs.push_back(twin_output(DType::f32, {1, w.cpu.dim(0)}));
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::vector<uint8_t> nan_bytes(outs[i].host.size(), 0xff);
      b.copy_to_device(outs[i].gpu, nan_bytes.data());
      cpu_outs.push_back(outs[i].cpu), gpu_outs.push_back(outs[i].gpu);
      cpu_w.push_back(&weights[i].cpu), gpu_w.push_back(&weights[i].gpu);
    }
    const int64_t before = launches();
    cpu_->matmul_group(cpu_outs, x.cpu, cpu_w);
    b.matmul_group(gpu_outs, x.gpu, gpu_w);
    b.synchronize();
    EXPECT_EQ(launches(), before + 1) << what << ": one launch for the group";
    for (size_t i = 0; i < outs.size(); ++i)
      expect_close(outs[i], dot_budget(K),
                   what + ", segment " + std::to_string(i) + " of " + std::to_string(outs.size()));
  }

  // moe_experts under --ep on both sides: the [T, K] routing (ids, w: host copies) filtered to
  // the experts in [E/4, 3E/4) (moe_keep_experts; the others become id -1 and are not run), then
  // backend b's result against the oracle's within `budget`.
  void expect_kept_experts_close(Backend& b, const Twin& x, const Twin& gate_up, const Twin& down, const Twin& ids,
                                 const Twin& w, int64_t E, float budget, const std::string& what) {
    const int64_t T = ids.cpu.dim(0), K = ids.cpu.dim(1), H = x.cpu.dim(1);
    Twin kept_ids = twin_bytes(DType::i32, {T, K}, ids.host.data());
    Twin kept_w = twin_bytes(DType::f32, {T, K}, w.host.data());
    cpu_->moe_keep_experts(kept_ids.cpu, kept_w.cpu, E / 4, E / 2);
    b.moe_keep_experts(kept_ids.gpu, kept_w.gpu, E / 4, E / 2);
    Twin kept_out = twin_output(DType::f32, {T, H});
    cpu_->moe_experts(kept_out.cpu, x.cpu, gate_up.cpu, down.cpu, kept_ids.cpu, kept_w.cpu, Activation::gelu_tanh);
    b.moe_experts(kept_out.gpu, x.gpu, gate_up.gpu, down.gpu, kept_ids.gpu, kept_w.gpu, Activation::gelu_tanh);
    b.synchronize();
    expect_close(kept_out, budget, what);
  }

  // max |gpu - cpu| / max(max |cpu|, min_scale) over f32 outputs; NaN (an unwritten element) fails.
  void expect_close(const Twin& t, float budget, const std::string& what, float min_scale = 1e-30f) {
    std::vector<uint8_t> g = gpu_bytes(t);
    const float* gv = reinterpret_cast<const float*>(g.data());
    const float* cv = static_cast<const float*>(t.host.data());
    const size_t n = t.host.size() / 4;
    float max_ref = 0.0f, max_diff = 0.0f;
    size_t worst = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_FALSE(std::isnan(gv[i])) << what << ": element " << i << " was not written";
      max_ref = std::max(max_ref, std::fabs(cv[i]));
      float d = std::fabs(gv[i] - cv[i]);
      if (d > max_diff) max_diff = d, worst = i;
    }
    EXPECT_LE(max_diff, budget * std::max(max_ref, min_scale))
        << what << ": element " << worst << " gpu " << gv[worst] << " cpu " << cv[worst] << " (max |ref| " << max_ref
        << ")";
  }

  void expect_identical(const Twin& t, const std::string& what) {
    std::vector<uint8_t> g = gpu_bytes(t);
    const uint8_t* c = static_cast<const uint8_t*>(t.host.data());
    size_t first = 0, count = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] != c[i] && count++ == 0) first = i;
    ASSERT_EQ(count, 0u) << what << ": " << count << " of " << g.size() << " bytes differ, first at byte " << first
                         << " (gpu " << int(g[first]) << ", cpu " << int(c[first]) << ")";
  }

  // A K and a V cache of `rows` rows, zero on both sides.
  std::pair<Twin, Twin> zeroed_caches(DType type, int64_t rows, int64_t n_kv, int64_t D) {
    std::pair<Twin, Twin> caches{twin_output(type, {rows, n_kv, D}), twin_output(type, {rows, n_kv, D})};
    const std::vector<uint8_t> zeros(caches.first.host.size(), 0);
    for (Twin* t : {&caches.first, &caches.second}) {
      std::memset(t->host.data(), 0, zeros.size());
      gpu_->copy_to_device(t->gpu, zeros.data());
    }
    return caches;
  }

  // Writes `past` tokens of random K/V history (positions 0 .. past - 1) into the caches through
  // kv_write, `chunk` tokens a call: the GPU's always, the CPU's too when with_cpu.
  void write_history(const Twin& k_cache, const Twin& v_cache, int64_t past, int64_t n_kv, int64_t D, bool with_cpu,
                     int64_t chunk = 64) {
    for (int64_t at = 0; at < past;) {
      const int64_t n = std::min<int64_t>(chunk, past - at);
      Twin k = twin_random(DType::f32, {n, n_kv, D}), v = twin_random(DType::f32, {n, n_kv, D});
      Twin pos = twin_positions(at, n);
      if (with_cpu) cpu_->kv_write({k_cache.cpu, v_cache.cpu}, k.cpu, v.cpu, pos.cpu);
      gpu_->kv_write({k_cache.gpu, v_cache.gpu}, k.gpu, v.gpu, pos.gpu);
      at += n;
    }
    gpu_->synchronize();
  }

  // A mixture-of-experts block's inputs: T tokens routed top-8 over 128 experts (H = 256, I =
  // 176), routed on the CPU and the same ids and weights given to the GPU; with `favoured`,
  // every token's first choice is expert 0.
  struct RoutedExperts {
    Twin w, ids, gate_up, down, x, out;
  };
  RoutedExperts routed_experts(DType type, int64_t T, bool favoured, int64_t E = 128) {
    const int64_t K = 8, H = 256, I = 176;
    Twin logits = twin_random(DType::f32, {T, E}, 2.0f);
    if (favoured) {
      float* l = static_cast<float*>(logits.host.data());
      for (int64_t t = 0; t < T; ++t) l[t * E] += 10.0f;
      gpu_->copy_to_device(logits.gpu, l);
    }
    RoutedExperts e;
    e.w = twin_output(DType::f32, {T, K});
    e.ids = twin_output(DType::i32, {T, K});
    cpu_->moe_route(e.w.cpu, e.ids.cpu, logits.cpu, nullptr);
    gpu_->copy_to_device(e.w.gpu, e.w.host.data());
    gpu_->copy_to_device(e.ids.gpu, e.ids.host.data());
    e.gate_up = twin_random(type, {E, 2 * I, H}, 0.3f);
    e.down = twin_random(type, {E, H, I}, 0.3f);
    e.x = twin_random(DType::f32, {T, H});
    e.out = twin_output(DType::f32, {T, H});
    return e;
  }

  std::mt19937 rng_{12345};
  std::unique_ptr<Backend> cpu_, gpu_;
};

inline constexpr DType kWeightTypes[] = {DType::f32,       DType::f16,       DType::bf16,     DType::q8_0,
                                         DType::hfq4_g256, DType::hfq4_g128, DType::hfq6_g256};

// The CPU tensor of t's f32 values rounded to bf16 (nearest even, as the GPU rounds), kept in
// `storage`.
inline Tensor rounded_to_bf16(const Twin& t, HostBuffer& storage) {
  storage = HostBuffer(t.host.size());
  const float* src = static_cast<const float*>(t.host.data());
  float* dst = static_cast<float*>(storage.data());
  for (size_t i = 0; i < t.host.size() / 4; ++i) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
  Tensor out = t.cpu;
  out.data = storage.data();
  return out;
}

inline float max_abs(const Twin& t) {
  const float* v = static_cast<const float*>(t.host.data());
  float m = 0.0f;
  for (size_t i = 0; i < t.host.size() / 4; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

}  // namespace fl::ops_harness
