#pragma once
// The online softmax step of both flash attention kernels (attention_mma.cu's f32 path and
// attention_flash_bf16.cu's bf16 one), on one warp's tile of scores.
#include <cfloat>
#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace fl::cuda {

// 2^x on the SFU (ex2.approx: ~2 ulp; 2^-inf = 0); HIP builds (which run neither flash kernel)
// take exp2f.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(FIRELINE_GPU_HIP)
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// s: a warp's scores [key tiles of 8][4] in the mma accumulator's layout (this lane: rows g and
// g + 8 of the row group, whose positions are pos[0] and pos[1]; keys 2q and 2q + 1 of each tile,
// the tile's first key being `key0`). Masks each score (the row's causal limit, its sliding
// window, keys at or past key_end), scales it, and turns it into an unnormalised probability
// against the rows' running max m (which it updates; the quad's lanes agree), adds those to this
// lane's share of the rows' sum l, and returns in corr the factor the rows' outputs must be
// rescaled by. kBase2 (the bf16 kernel, whose P is rounded to bf16 right after): `scale` holds
// log2 e and the powers run on the SFU; otherwise expf (the f32 path). When the tile's keys are
// split over several warps, `combine_max` turns this warp's row maxima into the tile's (every
// warp then keeps the same m, and its l counts its own keys).
struct NoCombine {
  __device__ void operator()(float (&)[2]) const {}
};
template <int kKeyTiles, bool kBase2, typename CombineMax = NoCombine>
__device__ __forceinline__ void online_softmax_tile(float (&s)[kKeyTiles][4], int64_t key0, int64_t key_end,
                                                    const int64_t (&pos)[2], int window, float scale, int q,
                                                    float (&m)[2], float (&l)[2], float (&corr)[2],
                                                    CombineMax combine_max = {}) {
  auto power = [](float x) { return kBase2 ? fast_exp2(x) : expf(x); };
  float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t j = key0 + n * 8 + 2 * q + (c & 1), p = pos[c / 2];
      const bool visible = j <= p && (window <= 0 || j > p - window) && j < key_end;
      s[n][c] = visible ? s[n][c] * scale : -INFINITY;
      tile_max[c / 2] = fmaxf(tile_max[c / 2], s[n][c]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], gpu::shfl_xor(tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], gpu::shfl_xor(tile_max[r], 2));
  }
  combine_max(tile_max);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m[r], tile_max[r]);
    corr[r] = power(m[r] - m_new);  // 1 while no key is visible yet (both -FLT_MAX)
    m[r] = m_new;
    l[r] *= corr[r];
  }
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[n][c] = power(s[n][c] - m[c / 2]);  // masked: 0
      l[c / 2] += s[n][c];
    }
}

}  // namespace fl::cuda
