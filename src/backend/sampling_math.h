#pragma once
// The per-element arithmetic of the sampling chain (backend/sampling.h says what the chain is),
// shared by the host reference (sampling.cpp) and the GPU kernel (cuda/sampling.cu): C++17 and
// no standard library containers, because hipcc compiles the kernels as C++17.
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FL_HOST_DEVICE __host__ __device__
#else
#define FL_HOST_DEVICE
#endif

namespace fl {

// One listed id's adjustment (ids unique within a spec).
struct SampleAdjust {
  int32_t id = 0;
  float bias = 0.0f;  // logit_bias (may be -inf: banned)
  int32_t count = 0;  // occurrences in the penalty window
};

// The chain's scalar parameters (SampleSpec adds the adjustment list; the GPU kernel gets these
// by value).
struct SampleScalars {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0 or >= vocab: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  double uniform = 0.0;  // the draw's uniform number in [0, 1) (unused when greedy)
};

inline constexpr double kSampleMassScale = 4294967296.0;  // 2^32: q = floor(w * 2^32)

// Products and sums rounded one at a time: nvcc (and GCC on targets with FMA) would otherwise
// contract a * b + c into one fused operation in some places and not others. On the device the
// _rn intrinsics are never contracted; host code using these helpers is compiled with
// -ffp-contract=off (sampling.cpp; see CMakeLists.txt), and nothing else should call them.
FL_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FL_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Step 1 for one logit.
FL_HOST_DEVICE inline float adjusted_logit(float logit, float bias, int32_t count, float repetition, float presence,
                                           float frequency) {
  float l = add_rn(logit, bias);
  if (count > 0) {
    if (repetition != 1.0f) l = l > 0 ? l / repetition : mul_rn(l, repetition);
    l = add_rn(l, -add_rn(presence, mul_rn(frequency, static_cast<float>(count))));
  }
  return l;
}

// exp(x) for x <= 0, the same bits on every machine: x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite
// with a two-part ln2; k ln2_hi is exact), a degree-7 Taylor polynomial for e^r in Horner form
// (truncation error < 6e-9), then 2^k by exponent arithmetic. Relative error ~2e-7. Below -87
// (under the smallest normal float) it returns 0: such a weight has mass 0 anyway. No libm
// calls (rintf and fmaf are library calls on baseline x86-64, ~20 ns each).
FL_HOST_DEVICE inline float exp_exact(float x) {
  if (!(x > -87.0f)) return 0.0f;  // also -inf and NaN
  if (x >= 0.0f) return 1.0f;     // callers pass l - max <= 0; exactly 1 for the top token
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (nearest even)
  const float k = add_rn(add_rn(mul_rn(x, 1.44269504088896341f), kRound), -kRound);
  float r = add_rn(x, -mul_rn(k, 0.693145751953125f));
  r = add_rn(r, -mul_rn(k, 1.42860682030941723212e-6f));
  float p = 1.98412698412698413e-4f;  // 1/7!
  p = add_rn(mul_rn(p, r), 1.38888888888888894e-3f);
  p = add_rn(mul_rn(p, r), 8.33333333333333322e-3f);
  p = add_rn(mul_rn(p, r), 4.16666666666666644e-2f);
  p = add_rn(mul_rn(p, r), 1.66666666666666657e-1f);
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  // p in [0.70, 1.42]; k in [-126, 0]: scale by 2^k in two exact steps that stay normal.
  const int ki = static_cast<int>(k);
  const int k1 = ki / 2, k2 = ki - k1;
  auto pow2 = [](int e) {  // 2^e for e in [-126, 127], exactly
    union {
      uint32_t u;
      float f;
    } v{static_cast<uint32_t>(e + 127) << 23};
    return v.f;
  };
  return mul_rn(mul_rn(p, pow2(k1)), pow2(k2));
}

// Step 8's draw point in [0, kept): u * kept rounds up to kept itself for u within 2^-53 of 1.
FL_HOST_DEVICE inline uint64_t sample_draw_point(double uniform, uint64_t kept) {
  const auto r = static_cast<uint64_t>(uniform * static_cast<double>(kept));
  return r < kept ? r : kept - 1;
}

// Step 5's integer mass of a weight in [0, 1].
FL_HOST_DEVICE inline uint64_t sample_mass(float w) { return static_cast<uint64_t>(static_cast<double>(w) * kSampleMassScale); }

}  // namespace fl
