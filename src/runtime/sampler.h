#pragma once
// The sampler chain: logits -> one token id. The chain itself (logit bias and penalties,
// greedy, temperature, top-k, top-p, min-p, the draw) is defined once, in backend/sampling.h, so
// that the host, the CPU backend and the GPU kernel choose the same token bit for bit; this
// class holds what it needs between tokens:
//   - the penalty window: the last `penalty_last_n` accepted tokens (prompt or generated),
//     turned into per-id counts for repetition (transformers / llama.cpp: positive logits
//     divided by r, negative multiplied), presence and frequency (OpenAI: logit -= presence *
//     [count > 0] + frequency * count)
//   - the seeded generator of the draw: the same seed and the same logits give the same tokens
//     on every machine (the generator and the uniform draw are our own code).
// `sample(logits)` samples on the host; `next_spec()` gives the same step's inputs to a backend's
// sample op (device sampling: only the chosen id leaves the GPU). Either consumes the generator
// in the same way, so the two paths can be mixed within one generation.
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "backend/sampling.h"

namespace fl {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;          // window of accepted tokens the penalties look at
  uint64_t seed = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;

  void validate() const;  // throws fl::Error naming the parameter and its valid range
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  int32_t sample(std::span<const float> logits);
  // The next step's SampleSpec (adjustments from the bias and the window, the draw's uniform).
  SampleSpec next_spec();
  void accept(int32_t token);
  void reset();  // forget accepted tokens and restart the generator from the seed

  const SamplingParams& params() const { return params_; }

 private:
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  std::deque<int32_t> recent_;
  uint64_t rng_state_ = 0;
  std::vector<float> scratch_;
};

}  // namespace fl
