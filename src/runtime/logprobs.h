#pragma once
// Log-probabilities of sampled tokens (OpenAI's `logprobs`): log_softmax of the model's own
// logits, before temperature, penalties, logit_bias and truncation change them for the draw (as
// vLLM reports by default: what the model thought, not what the sampler was allowed to pick).
#include <cstdint>
#include <span>
#include <vector>

namespace fl {

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;  // <= 0; at least kMinLogprob (OpenAI's floor for impossible tokens)
};

inline constexpr float kMinLogprob = -9999.0f;

struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // the `top_n` most likely tokens, most likely first (ties: lower id)
};

// `logits` [vocab]; `chosen` the sampled id (in range); 0 <= top_n (at most the vocabulary). The
// normaliser is summed in double over the finite logits; NaN logits count as impossible.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n);

}  // namespace fl
