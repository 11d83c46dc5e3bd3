#pragma once
// What the kernels that norm, rotate and store a step's head rows share: a norm's gain factor,
// the rotate-half pair, and the Q8_0 store of a cache row. rms_norm_rope_group_kernel and
// kv_write_kernel (norm.cu, attention.cu) and the decode attention from projections
// (attention_decode.cu), which does their work inside the attention launch, take these same
// functions, so that the fused launch gives the separate kernels' bits (CudaOps.
// AttentionFromProjectionsMatchesTheThreeOps holds it).
#include <cstdint>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernel_types.cuh"

namespace fl::cuda {

// The factor a norm's gain multiplies element i by: w[i], 1 + w[i], or 1 (no gain: v * 1 is v).
__device__ __forceinline__ float gain_factor(const uint8_t* weight, DType weight_type, Gain gain, int64_t i) {
  if (gain == Gain::none) return 1.0f;
  const float w = load_weight(weight, i, weight_type);
  return gain == Gain::one_plus_weight ? 1.0f + w : w;
}

__device__ __forceinline__ float apply_gain(float v, const uint8_t* weight, DType weight_type, Gain gain, int64_t i) {
  return gain == Gain::none ? v : v * gain_factor(weight, weight_type, gain, i);
}

// Rotate-half RoPE of one pair (a = x[i], b = x[i + half], both normed): the angle's sine and
// cosine from sincosf(inv_freq[i] * position), an f32 angle as transformers computes it. Each
// product and sum rounded on its own (the _rn intrinsics): left to ptxas, `a * c - b * s` may be
// contracted into an FMA one way in one kernel and another way in the next.
__device__ __forceinline__ void rotate_pair(float a, float b, float s, float c, float& lo, float& hi) {
  lo = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  hi = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// A Q8_0 block (34 bytes: f16 scale, 32 int8 codes) from the 32 values held by 32 consecutive
// lanes, as quantize_row_q8_0_ref: d = amax / 127, q = round(x / d). Every lane of the 32 calls
// it (the max is a shuffle among them; a wave64 wave's two halves stay apart: offsets below 32);
// `store` false: the lane joins the max but writes nothing (a lane past the row).
__device__ __forceinline__ void store_q8_0_lane(uint8_t* block, float x, int lane_in_block, bool store) {
  float amax = fabsf(x);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, gpu::shfl_xor(amax, offset));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (!store) return;
  const float qf = fminf(fmaxf(roundf(x * id), -128.0f), 127.0f);
  block[2 + lane_in_block] = static_cast<uint8_t>(static_cast<int8_t>(qf));
  // One 16-bit store of the scale (rows are 34-byte blocks from a cudaMalloc base, so it is
  // aligned). Two byte stores of the half's bits lost the low byte on sm_90a with nvcc 13.0
  // (the ops harness caught it: every scale's low byte read back 0).
  if (lane_in_block == 0) *reinterpret_cast<uint16_t*>(block) = gpu::float_to_f16_bits(d);
}

}  // namespace fl::cuda
