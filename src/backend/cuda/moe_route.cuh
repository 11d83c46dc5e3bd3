#pragma once
// One token's routing in one warp (the decode route kernel's, and the fused experts' where they
// route for themselves: moe.cu, moe_decode.cu): softmax over the token's logits, top_k rounds of
// a warp argmax (highest probability, lowest id on ties), renormalised in choice order, times
// the per-expert scale. One definition, so that both give the same bits.
#include <cfloat>

#include "backend/cuda/device_common.cuh"

namespace fl::cuda {

// row: the token's logits [n_experts] (Row: const float*, or const volatile float* for logits
// written by other blocks of the same launch); up to kWarp * kPerLane experts and kWarp choices.
// Lane j < top_k ends holding choice j: *id and *weight (unset on other lanes).
template <int kPerLane, typename Row>
__device__ __forceinline__ void route_token_in_warp(Row row, int64_t n_experts, int64_t top_k,
                                                    const uint8_t* per_expert_scale, DType scale_type, int32_t* id,
                                                    float* weight) {
  const int lane = threadIdx.x % kWarp;
  float p[kPerLane];
  float local_max = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t e = lane + static_cast<int64_t>(i) * kWarp;
    p[i] = e < n_experts ? row[e] : -FLT_MAX;
    local_max = fmaxf(local_max, p[i]);
  }
  const float max_logit = warp_max(local_max);
  float local_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t e = lane + static_cast<int64_t>(i) * kWarp;
    p[i] = e < n_experts ? expf(p[i] - max_logit) : 0.0f;
    local_sum += p[i];
  }
  const float sum = warp_sum(local_sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = lane + static_cast<int64_t>(i) * kWarp < n_experts ? p[i] / sum : -1.0f;

  float top_sum = 0.0f, chosen_p = 0.0f;  // lane j < top_k keeps choice j
  int chosen_id = 0;
  for (int64_t j = 0; j < top_k; ++j) {
    float best = -1.0f;
    int best_e = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (p[i] > best) best = p[i], best_e = lane + i * kWarp;  // ascending e: the lowest id on ties
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float ov = gpu::shfl_xor(best, offset);
      const int oi = gpu::shfl_xor(best_e, offset);
      if (ov > best || (ov == best && oi < best_e)) best = ov, best_e = oi;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)  // taken (compares, not an index: p stays in registers)
      if (lane + i * kWarp == best_e) p[i] = -2.0f;
    top_sum += best;  // in choice order, as the block kernel sums
    if (lane == j) chosen_p = best, chosen_id = best_e;
  }
  if (lane < top_k) {
    float w = chosen_p / top_sum;
    if (per_expert_scale) w *= load_weight(per_expert_scale, chosen_id, scale_type);
    *weight = w;
    *id = chosen_id;
  }
}

}  // namespace fl::cuda
