#pragma once
// The HFQ4 one-input products' per-lane arithmetic, shared by the rows kernels (matmul.cu) and
// the fused decode experts (moe_decode.cu): a row of kGroup-weight blocks (f32 scale, f32 min,
// kGroup / 2 bytes of nibbles) read 16 weights per lane, kGroup / 16 lanes per block, kWarp * 16 /
// kGroup blocks per warp step. Every kernel that sums a row through these functions adds the
// same terms in the same order (a lane's blocks in order, then warp_sum), so a row's value is the
// same bits whichever kernel, grid or neighbour rows computed it. Device code: .cu files only.
#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace fl::cuda {

#if defined(__CUDACC__) || defined(__HIPCC__)
template <int kGroup>
struct Hfq4Lanes {
  static constexpr int kLanesPerBlock = kGroup / 16;
  static constexpr int kBlocksPerStep = kWarp / kLanesPerBlock;
  static constexpr int kBlockBytes = 8 + kGroup / 2;
};

// The 16 inputs of a lane's weights (zero past K, so the padded tail's codes add nothing) and
// their sum.
__device__ __forceinline__ float load_x16(const float* x, int64_t k0, int64_t K, bool vector_x, float xv[16]) {
  if (vector_x && k0 + 16 <= K) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 t = __ldg(reinterpret_cast<const float4*>(x + k0 + 4 * q));
      xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) xv[j] = k0 + j < K ? x[k0 + j] : 0.0f;
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j) sum += xv[j];
  return sum;
}

// The inputs of a product, as accumulate_hfq4_rows reads them: an input row in global memory
// written before the kernel began (through the read-only cache: load_x16), or one in shared memory
// (an input made earlier in the same kernel: the read-only path may not see another block's
// writes). Both give the same values and the same sum.
struct GlobalInputRow {
  const float* x;
  int64_t K;
  bool vector_x;
  __device__ __forceinline__ float operator()(int64_t k0, float xv[16]) const { return load_x16(x, k0, K, vector_x, xv); }
};
// A shared-memory row holds element k at k + k / 16 (shared_row_index): a lane reads 16
// consecutive inputs from 16 k0 + 16 sub, so unpadded the warp's 32 lanes would hit 2 of the 32
// banks (16-way conflicts); with one float of padding per 16 they hit all 32, G128 and G256 alike.
__device__ __forceinline__ int64_t shared_row_index(int64_t k) { return k + k / 16; }
__host__ __device__ constexpr int64_t shared_row_floats(int64_t K) { return K + (K + 15) / 16; }
struct SharedInputRow {
  const float* x;  // shared memory, padded (shared_row_index)
  int64_t K;
  __device__ __forceinline__ float operator()(int64_t k0, float xv[16]) const {
    const float* row = x + shared_row_index(k0);  // (k0 is a multiple of 16)
#pragma unroll
    for (int j = 0; j < 16; ++j) xv[j] = k0 + j < K ? row[j] : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) sum += xv[j];
    return sum;
  }
};

// sum_j x_j (s c_j + m) over a lane's 16 weights, as s' * sum_j x_j f_j + m' * sum_j x_j with
// f_j = 0.5 + c_j / 32: the code shifted to bits 3..6 of its byte, and that byte permuted into
// bits 16..23 under the exponent of 0.5 (a shift and a mask per 4 codes, one PRMT per weight; no
// int-to-float conversion). Then sum_j x_j c_j = 32 sum_j x_j f_j - 16 sum_j x_j, so s' = 32 s
// and m' = m - 16 s. The chains carry the 0.5 offset, about twice the codes' part, which costs
// 1-2 bits against an exact dot product. (The code in bits 0..3, f = 0.5 + c / 256, saved the
// shift but carried an offset 17x the codes' part: 4 bits, over the op harness's budget.)
__device__ __forceinline__ float hfq4_lane_dot(uint2 codes, float scale, float min, const float xv[16], float x_sum) {
  float even = 0.0f, odd = 0.0f;  // two chains: weights 2i (low nibbles) and 2i + 1 (high ones)
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t word = w ? codes.y : codes.x;
    const uint32_t low = (word << 3) & 0x78787878u, high = (word >> 1) & 0x78787878u;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      // bytes of the result: 0 and 1 from the constant's zero byte, 2 = byte b of the codes,
      // 3 = 0x3F from the constant
      const uint32_t selector = 0x7044u | (static_cast<uint32_t>(b) << 8);
      even = fmaf(__uint_as_float(gpu::byte_perm(low, 0x3F000000u, selector)), xv[8 * w + 2 * b], even);
      odd = fmaf(__uint_as_float(gpu::byte_perm(high, 0x3F000000u, selector)), xv[8 * w + 2 * b + 1], odd);
    }
  }
  // Spelled out (a rounded product, then one FMA) so that no kernel contracts it differently.
  return fmaf(32.0f * scale, even + odd, __fmul_rn(min - 16.0f * scale, x_sum));
}

// A lane's sums over its blocks of kRows rows (`rows`: each row's first block, offset to this
// lane's code bytes, 8 * sub), one warp step of kBlocksPerStep blocks after another from block
// `first`, every kSpan-th step (1: all of them; 2: every other one, for a pair of warps that split
// the steps), kUnroll steps of loads issued before the first one's arithmetic. The rows come in
// kInputs equal runs, run i multiplying inputs[i] (a GlobalInputRow or SharedInputRow; the fused
// experts' down rows: several pairs' activations at once). The order of additions is the lane's
// blocks in order, whatever kRows, kUnroll or kInputs. The rows kernel keeps its own copy of this
// loop: through this function ptxas (sm_90a) gave it 127 registers instead of 96 at 2 steps and
// 164 instead of 128 at 4, fewer warps per SM on the products it runs.
template <int kGroup, int kRows, int kUnroll, int kSpan, int kInputs, class InputRow>
__device__ __forceinline__ void accumulate_hfq4_rows(float (&acc)[kRows], const uint8_t* const (&rows)[kRows],
                                                     const InputRow (&inputs)[kInputs], int first_block,
                                                     int64_t n_blocks) {
  using L = Hfq4Lanes<kGroup>;
  static_assert(kRows % kInputs == 0, "equal runs of rows per input");
  constexpr int kRowsPerInput = kRows / kInputs;
  constexpr int kStride = kSpan * L::kBlocksPerStep;  // blocks from one of this lane's steps to its next
  const int sub = threadIdx.x % kWarp % L::kLanesPerBlock;
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  for (int64_t first = first_block; first < n_blocks; first += kStride * kUnroll) {
    uint2 codes[kUnroll][kRows];
    float2 scale_min[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = first + u * kStride;
      if (b < n_blocks) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* p = rows[r] + b * L::kBlockBytes;  // this lane's 8 code bytes, at 8 * sub
          codes[u][r] = *reinterpret_cast<const uint2*>(p + 8);
          scale_min[u][r] = *reinterpret_cast<const float2*>(p - 8 * sub);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = first + u * kStride;
      if (b >= n_blocks) break;
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        float xv[16];
        const float x_sum = inputs[i](b * kGroup + 16 * sub, xv);
#pragma unroll
        for (int r = i * kRowsPerInput; r < (i + 1) * kRowsPerInput; ++r)
          acc[r] += hfq4_lane_dot(codes[u][r], scale_min[u][r].x, scale_min[u][r].y, xv, x_sum);
      }
    }
  }
}
#endif

}  // namespace fl::cuda
