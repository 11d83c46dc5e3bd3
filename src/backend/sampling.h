#pragma once
// Sampling one token from a row of logits: the one definition every path follows (the host
// Sampler, the CPU backend's op, the CUDA kernel in cuda/sampling.cu), written so that all of
// them choose the same token bit for bit. The chain (SamplingParams in runtime/sampler.h says
// what each parameter means):
//   1. adjustments: for each listed id, logit += bias, then the penalties of its count in the
//      recent window (repetition: positive logits / r, negative * r; then presence + frequency)
//   2. temperature 0: greedy (highest logit, lowest id on ties; NaN counts as -inf), done
//   3. l = logit / temperature (NaN becomes -inf, +inf the largest float, -0 becomes +0, so that
//      the order is total and l - m is never NaN);
//      m = max l (all -inf: every token is banned)
//   4. top-k: the k first in (l descending, id ascending) order
//   5. weights w = exp_exact(l - m) in [0, 1] (w = 1 for the top token) and integer masses
//      q = floor(w * 2^32): sums of integers are exact in any order, which is what lets a GPU
//      tree reduction agree with a CPU loop
//   6. top-p: the shortest prefix in that order whose mass reaches ceil(top_p * total mass)
//   7. min-p: w >= min_p (w is p / p_max)
//   8. draw: r = floor(u * kept mass) for the caller's uniform u in [0, 1); the token is the first
//      kept id, in id order, whose running mass exceeds r.
// Only float divides, multiplies and adds (each rounded once, never fused), compares and integer
// ops appear, exactly rounded by IEEE 754 on both sides; exp is our own (exp_exact in
// sampling_math.h), since libm's expf and CUDA's differ in ulps.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/sampling_math.h"

namespace fl {

struct SampleSpec : SampleScalars {
  std::vector<SampleAdjust> adjust;  // one entry per id
};

// The reference: applies steps 1-8 to `logits` (adjusted and divided in place) and returns the
// token. Throws fl::Error when every token is banned.
int32_t sample_logits_reference(std::span<float> logits, const SampleSpec& spec);

}  // namespace fl
