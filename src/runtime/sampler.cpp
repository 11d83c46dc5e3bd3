#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

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

SampleSpec Sampler::next_spec() {
  SampleSpec spec;
  spec.temperature = params_.temperature;
  spec.top_k = params_.top_k;
  spec.top_p = params_.top_p;
  spec.min_p = params_.min_p;
  spec.repetition_penalty = params_.repetition_penalty;
  spec.presence_penalty = params_.presence_penalty;
  spec.frequency_penalty = params_.frequency_penalty;
  // One entry per id: its summed bias and its count in the window (when a penalty is on).
  std::map<int32_t, SampleAdjust> adjust;
  for (auto [id, bias] : params_.logit_bias) {
    SampleAdjust& a = adjust.try_emplace(id, SampleAdjust{id, 0.0f, 0}).first->second;
    a.bias += bias;
  }
  if (params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f)
    for (int32_t t : recent_) ++adjust.try_emplace(t, SampleAdjust{t, 0.0f, 0}).first->second.count;
  spec.adjust.reserve(adjust.size());
  for (const auto& [id, a] : adjust) spec.adjust.push_back(a);
  if (spec.temperature != 0.0f) spec.uniform = next_uniform();  // the greedy path draws nothing
  return spec;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) fail("sampler: empty logits");
  scratch_.assign(logits.begin(), logits.end());
  return sample_logits_reference(scratch_, next_spec());
}

}  // namespace fl
