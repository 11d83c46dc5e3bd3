#pragma once
// The sampler chain: logits -> one token id. Each step is a small function over a candidate list
// (id, logit, probability), applied in this order:
//   1. logit bias (OpenAI logit_bias; -inf bans a token)
//   2. penalties over the last `penalty_last_n` accepted tokens: repetition (transformers /
//      llama.cpp: positive logits divided by r, negative multiplied), then presence and frequency
//      (OpenAI: logit -= presence * [count > 0] + frequency * count)
//   3. temperature 0: greedy (highest logit, lowest id on ties) and stop here
//   4. temperature (logits / T), then top-k, top-p (smallest set whose probability reaches p),
//      min-p (keep p >= min_p * p_max), in transformers' warper order
//   5. a draw from what is left, with a seeded generator: the same seed and the same logits give
//      the same tokens on every machine (the generator and the uniform draw are our own code).
// `accept(token)` records a token (prompt or generated) for the penalties.
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

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
  void accept(int32_t token);
  void reset();  // forget accepted tokens and restart the generator from the seed

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  std::deque<int32_t> recent_;
  uint64_t rng_state_ = 0;
  std::vector<Candidate> candidates_;
};

}  // namespace fl
