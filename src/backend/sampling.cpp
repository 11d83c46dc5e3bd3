#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace fl {
namespace {

struct Candidate {
  int32_t id;
  float logit;
  float weight;
  uint64_t mass;
};

// The chain's order: higher logit first, lower id on ties.
bool before(const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

}  // namespace

int32_t sample_logits_reference(std::span<float> logits, const SampleSpec& spec) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (V == 0) fail("sampler: empty logits");
  for (const SampleAdjust& a : spec.adjust)  // 1
    if (a.id >= 0 && a.id < V)
      logits[a.id] = adjusted_logit(logits[a.id], a.bias, a.count, spec.repetition_penalty, spec.presence_penalty,
                                    spec.frequency_penalty);

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (spec.temperature == 0.0f) {  // 2
    int64_t best = 0;
    float best_logit = kNegInf;
    for (int64_t i = 0; i < V; ++i)
      if (logits[i] > best_logit) best_logit = logits[best = i];  // NaN compares false: never chosen
    if (best_logit == kNegInf) fail("sampler: every token is banned");
    return static_cast<int32_t>(best);
  }

  float max_logit = kNegInf;  // 3
  for (float& l : logits) {
    l /= spec.temperature;
    if (std::isnan(l)) l = kNegInf;  // NaN never wins, never has mass
    if (l > std::numeric_limits<float>::max()) l = std::numeric_limits<float>::max();  // +inf: l - m stays finite
    if (l == 0.0f) l = 0.0f;          // -0 == +0 in the order below, as on the GPU's integer keys
    max_logit = std::max(max_logit, l);
  }
  if (max_logit == kNegInf) fail("sampler: every token is banned");

  // Candidates in id order; only as much of them is sorted as the cuts need (a full sort of
  // Gemma's 262k entries costs more than a GPU decode step).
  thread_local std::vector<Candidate> c;  // reused: 262k entries are 6 MB to allocate per token
  c.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) c[i] = {static_cast<int32_t>(i), logits[i], 0.0f, 0};
  bool sorted_prefix = false;
  if (spec.top_k > 0 && spec.top_k < V) {  // 4
    std::partial_sort(c.begin(), c.begin() + spec.top_k, c.end(), before);
    c.resize(static_cast<size_t>(spec.top_k));
    sorted_prefix = true;
  }
  uint64_t total = 0;  // 5
  for (Candidate& x : c) total += x.mass = sample_mass(x.weight = exp_exact(x.logit - max_logit));

  if (spec.top_p < 1.0f) {  // 6: grow a sorted prefix until it holds the cut
    const auto need = static_cast<uint64_t>(std::ceil(static_cast<double>(spec.top_p) * static_cast<double>(total)));
    const auto n = static_cast<int64_t>(c.size());
    for (int64_t m = sorted_prefix ? n : std::min<int64_t>(n, 256);; m = std::min<int64_t>(n, m * 4)) {
      if (!sorted_prefix || m < n) std::partial_sort(c.begin(), c.begin() + m, c.end(), before);
      uint64_t mass = 0;
      int64_t keep = 0;
      while (keep < m && mass < need) mass += c[keep++].mass;
      if (mass >= need || m == n) {
        c.resize(static_cast<size_t>(std::max<int64_t>(keep, 1)));
        break;
      }
    }
  }
  if (spec.min_p > 0.0f)  // 7 (the top token has weight 1 and always stays)
    c.erase(std::remove_if(c.begin(), c.end(), [&](const Candidate& x) { return x.weight < spec.min_p; }), c.end());

  if (sorted_prefix || spec.top_p < 1.0f)  // 8: back to id order (a cut reordered them)
    std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  uint64_t kept = 0;
  for (const Candidate& x : c) kept += x.mass;
  const uint64_t r = sample_draw_point(spec.uniform, kept);
  uint64_t running = 0;
  for (const Candidate& x : c)
    if ((running += x.mass) > r) return x.id;
  return c.back().id;  // unreachable: r < kept
}

}  // namespace fl
