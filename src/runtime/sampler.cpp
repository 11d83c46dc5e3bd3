#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"

namespace fl {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f) fail("temperature {} is outside [0, 100]", temperature);
  if (top_k < 0) fail("top_k {} must be 0 (off) or positive", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p {} is outside (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p {} is outside [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || repetition_penalty > 100.0f)
    fail("repetition_penalty {} is outside (0, 100]", repetition_penalty);
  if (!(std::fabs(presence_penalty) <= 2.0f)) fail("presence_penalty {} is outside [-2, 2]", presence_penalty);
  if (!(std::fabs(frequency_penalty) <= 2.0f)) fail("frequency_penalty {} is outside [-2, 2]", frequency_penalty);
  if (penalty_last_n < 0) fail("penalty_last_n {} must not be negative", penalty_last_n);
  for (auto [id, bias] : logit_bias) {
    if (id < 0) fail("logit_bias names token {}, which is negative", id);
    if (std::isnan(bias)) fail("logit_bias for token {} is NaN", id);
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
  reset();
}

void Sampler::reset() {
  recent_.clear();
  rng_state_ = params_.seed;
}

void Sampler::accept(int32_t token) {
  if (params_.penalty_last_n == 0) return;
  recent_.push_back(token);
  while (static_cast<int>(recent_.size()) > params_.penalty_last_n) recent_.pop_front();
}

// splitmix64: small, fast, and identical everywhere (std distributions are not).
double Sampler::next_uniform() {
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (V == 0) fail("sampler: empty logits");
  candidates_.resize(V);
  for (int64_t i = 0; i < V; ++i) candidates_[i] = {static_cast<int32_t>(i), logits[i], 0.0f};

  // 1. logit bias
  for (auto [id, bias] : params_.logit_bias)
    if (id < V) candidates_[id].logit += bias;

  // 2. penalties over the recent window
  if (!recent_.empty() &&
      (params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f)) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : recent_) ++counts[t];
    for (auto [id, count] : counts) {
      if (id < 0 || id >= V) continue;
      float& l = candidates_[id].logit;
      if (params_.repetition_penalty != 1.0f) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }

  // 3. greedy
  auto by_logit = [](const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  if (params_.temperature == 0.0f) {
    const Candidate* best = &candidates_[0];
    for (const Candidate& c : candidates_)
      if (by_logit(c, *best)) best = &c;
    if (best->logit == -std::numeric_limits<float>::infinity()) fail("sampler: every token is banned");
    return best->id;
  }

  // 4. temperature, top-k, softmax, top-p, min-p. Only as much of the vocabulary is sorted as
  // the cuts can reach (a full sort of Gemma's 262k entries costs more than a GPU decode step):
  // the top k; else, for top-p / min-p, a sorted prefix grown until the cut falls inside it;
  // else nothing (the draw then walks the tokens in id order: the same distribution).
  for (Candidate& c : candidates_) c.logit /= params_.temperature;
  const bool top_k = params_.top_k > 0 && params_.top_k < V;
  if (top_k) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(), by_logit);
    candidates_.resize(params_.top_k);
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : candidates_) max_logit = std::max(max_logit, c.logit);
  if (max_logit == -std::numeric_limits<float>::infinity()) fail("sampler: every token is banned");
  double sum = 0;
  for (Candidate& c : candidates_) sum += (c.p = std::exp(c.logit - max_logit));
  for (Candidate& c : candidates_) c.p = static_cast<float>(c.p / sum);
  if (!top_k && (params_.top_p < 1.0f || params_.min_p > 0.0f)) {
    const auto n = static_cast<int64_t>(candidates_.size());
    for (int64_t m = std::min<int64_t>(n, 256);; m = std::min<int64_t>(n, m * 4)) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + m, candidates_.end(), by_logit);
      bool inside = m == n;
      if (params_.top_p < 1.0f) {  // the nucleus fits (min-p then acts inside it)
        double mass = 0;
        for (int64_t i = 0; i < m; ++i) mass += candidates_[i].p;
        inside = inside || mass >= params_.top_p;
      } else {  // the prefix reaches below the min-p floor
        inside = inside || candidates_[m - 1].p < params_.min_p * candidates_.front().p;
      }
      if (inside) {
        candidates_.resize(m);
        break;
      }
    }
  }
  if (params_.top_p < 1.0f) {
    double mass = 0;
    size_t keep = 0;
    while (keep < candidates_.size() && mass < params_.top_p) mass += candidates_[keep++].p;
    candidates_.resize(std::max<size_t>(keep, 1));
  }
  if (params_.min_p > 0.0f) {
    const float floor = params_.min_p * candidates_.front().p;
    size_t keep = 1;
    while (keep < candidates_.size() && candidates_[keep].p >= floor) ++keep;
    candidates_.resize(keep);
  }

  // 5. draw
  double total = 0;
  for (const Candidate& c : candidates_) total += c.p;
  double r = next_uniform() * total;
  for (const Candidate& c : candidates_) {
    r -= c.p;
    if (r < 0) return c.id;
  }
  return candidates_.back().id;
}

}  // namespace fl
