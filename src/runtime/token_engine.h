#pragma once
// The token half of generation: one sequence on one model, ids in, logits out. prefill() runs a
// prompt in chunks (so a long prompt fits the scratch the model was loaded for, and a cancel flag
// is honoured between chunks); append() feeds one token (sampled, or forced by the thinking cap)
// and leaves its logits. Decode steps go through Model::make_decode_graph (a replayed device
// graph on CUDA; the same ops re-run on the CPU) unless disabled.
//
// The sequence (its KV cache, allocated once by the constructor) is kept between prompts: a
// prompt that extends what the sequence already holds (a chat's next turn, when the template
// re-renders the history token for token) only runs its new tokens. Anything else starts over at
// position 0; the sliding-window ring cannot be rolled back, so a shorter common prefix is not
// reused.
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"

namespace fl {

struct EngineOptions {
  int64_t context = 4096;        // positions of the sequence (LoadOptions.max_seq)
  DType kv_dtype = DType::f32;   // KV cache element type
  int64_t prefill_chunk = 512;   // most tokens per forward (LoadOptions.max_tokens)
  bool decode_graph = true;      // decode through make_decode_graph (else Model::forward)
};

class TokenEngine {
 public:
  TokenEngine(Model& model, EngineOptions options);
  ~TokenEngine();

  // Makes the sequence hold `prompt` and leaves the logits of its last token. Throws fl::Error
  // when the prompt is empty or longer than the context (naming both numbers). Returns false
  // when `cancel` became true between chunks (the sequence is then emptied).
  bool prefill(std::span<const int32_t> prompt, const std::atomic<bool>* cancel = nullptr);
  // Feeds one token at the next position; logits() then follow it. Throws when the context is full.
  void append(int32_t token);
  // The same, and samples the next token by `spec` (Sampler::next_spec()) where the logits are:
  // through the decode graph on the device, so that only the id crosses to the host. logits()
  // is then empty; the returned token is the one Sampler::sample(logits) would have chosen.
  int32_t append_and_sample(int32_t token, const SampleSpec& spec);

  std::span<const float> logits() const { return logits_; }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t context() const { return options_.context; }
  bool full() const { return n_past() >= options_.context; }
  int64_t reused_tokens() const { return reused_; }  // prompt tokens of the last prefill found cached
  const std::vector<int32_t>& tokens() const { return tokens_; }
  Model& model() const { return model_; }
  const EngineOptions& options() const { return options_; }
  void reset();  // empties the sequence (keeps its memory)

 private:
  int32_t step(int32_t token, const SampleSpec* spec);

  Model& model_;
  EngineOptions options_;
  std::unique_ptr<Sequence> seq_;
  std::unique_ptr<DecodeGraph> graph_;
  std::vector<int32_t> tokens_;  // what the sequence holds, in order
  std::vector<float> logits_;
  int64_t reused_ = 0;
};

}  // namespace fl
