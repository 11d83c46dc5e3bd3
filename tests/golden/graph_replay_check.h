#pragma once
// The graph-replay check both architectures' golden tests run: the same prompt prefix into two
// sequences, then the rest token by token, eagerly into one and through Model::make_decode_graph
// into the other. Every step's logits must be byte-identical, and so must every byte of the two
// sequences' state afterwards (KV rows, and recurrent states on hybrid models).
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include "model/model.h"

namespace fl::test {

// Every buffer of the sequence's state, copied to the host.
inline std::vector<std::vector<uint8_t>> sequence_state_bytes(Backend& backend, const Sequence& seq) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& buffer : seq.storage) {
    const size_t n = buffer->size();
    out.emplace_back(n);
    backend.copy_to_host(out.back().data(),
                         make_tensor(buffer->data(), DType::u8, {static_cast<int64_t>(n)}, backend.device()));
  }
  return out;
}

// Runs the check over ids[prefill:] and returns the replayed steps' logits [steps, vocab] (for
// comparison with transformers). Failures are reported through gtest.
inline std::vector<float> replayed_decode_equals_eager(Model& model, Backend& backend, Sequence& eager,
                                                       Sequence& replayed, std::span<const int32_t> ids,
                                                       int64_t prefill) {
  model.forward(eager, ids.first(static_cast<size_t>(prefill)), LogitsMode::last);
  model.forward(replayed, ids.first(static_cast<size_t>(prefill)), LogitsMode::last);
  auto graph = model.make_decode_graph(replayed);
  std::vector<float> replayed_logits;
  for (size_t t = static_cast<size_t>(prefill); t < ids.size(); ++t) {
    std::vector<float> a = model.forward(eager, ids.subspan(t, 1), LogitsMode::last);
    std::vector<float> b = graph->step(ids[t]);
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
      ADD_FAILURE() << "logits differ at step " << t;
      return replayed_logits;
    }
    replayed_logits.insert(replayed_logits.end(), b.begin(), b.end());
  }
  EXPECT_TRUE(graph->captured());
  const auto a = sequence_state_bytes(backend, eager), b = sequence_state_bytes(backend, replayed);
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) EXPECT_EQ(a[i], b[i]) << "state buffer " << i << " differs";
  return replayed_logits;
}

}  // namespace fl::test
