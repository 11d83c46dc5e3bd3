#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace fl {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n) {
  const auto V = static_cast<int64_t>(logits.size());
  if (chosen < 0 || chosen >= V) fail("logprobs: token {} is outside the vocabulary [0, {})", chosen, V);
  if (top_n < 0) fail("logprobs: top_n = {} must not be negative", top_n);
  auto usable = [](float l) { return !std::isnan(l) && l != -std::numeric_limits<float>::infinity(); };
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : logits)
    if (usable(l)) max_logit = std::max(max_logit, l);
  // A +inf logit (or none usable at all) makes a degenerate distribution: the largest logits get
  // 0 and the rest the floor.
  double sum = 0.0;
  if (std::isfinite(max_logit))
    for (float l : logits)
      if (usable(l)) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_z = std::isfinite(max_logit) ? max_logit + std::log(sum) : 0.0;
  auto logprob_of = [&](int32_t id) {
    const float l = logits[static_cast<size_t>(id)];
    if (!usable(l)) return kMinLogprob;
    if (!std::isfinite(max_logit)) return l == max_logit ? 0.0f : kMinLogprob;
    return std::max(kMinLogprob, static_cast<float>(static_cast<double>(l) - log_z));
  };

  TokenLogprobs out;
  out.chosen = {chosen, logprob_of(chosen)};
  const int n = static_cast<int>(std::min<int64_t>(top_n, V));
  if (n == 0) return out;
  // Most likely first, ties to the lower id; NaN sorts last.
  auto before = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    const bool na = std::isnan(la), nb = std::isnan(lb);
    if (na != nb) return nb;
    if (!na && la != lb) return la > lb;
    return a < b;
  };
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), before);
  out.top.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out.top.push_back({ids[static_cast<size_t>(i)], logprob_of(ids[static_cast<size_t>(i)])});
  return out;
}

}  // namespace fl
