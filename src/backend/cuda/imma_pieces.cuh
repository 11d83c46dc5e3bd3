#pragma once
// The integer tensor-core matvec's input pieces (matvec_imma.cu says how x is cut and why): their
// layout, and the device code that cuts one weight group of x. Shared by the matvec's own pieces
// kernel and by the kernels whose one-row output is a product's input (the residual update's
// norm, the gated activation): those write the pieces beside their f32 output, so that the
// product needs no launch of its own for them (BackendOptions::imma_ready_pieces). The same
// values cut by the same code give the same bytes whichever kernel cut them.
#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace fl::cuda {

template <int kGroup>
struct ImmaGroup {
  static constexpr int kBlockBytes = 8 + kGroup / 2;  // f32 scale, f32 min, the codes
  static constexpr int kLaneBytes = kGroup / 8;       // code bytes per row and lane group t
  static constexpr int kMmas = kGroup / 32;           // mma k-steps per group (one code word each)
  static constexpr int kPieceBytes = 4 * kGroup;      // 4 int8 pieces per element
  static constexpr int kLanePieceBytes = kGroup / 4;  // one piece's bytes for lane group t
  static constexpr int kLanesPerGroup = kGroup / 8;   // cutting: 8 consecutive elements per lane
};

// Where a row of K elements keeps its pieces: n_groups * kPieceBytes bytes of pieces, then one
// (2^(E-6), sum of the group's x) pair per group (hfq4_imma_scratch_bytes in all).
template <int kGroup>
__host__ __device__ __forceinline__ float2* imma_group_scales(uint8_t* pieces, int64_t K) {
  return reinterpret_cast<float2*>(pieces + (K + kGroup - 1) / kGroup * ImmaGroup<kGroup>::kPieceBytes);
}

// Where a scratch holds the pieces of several rows (decode's routed experts: one input row per
// pair), the bytes from one row's to the next: a row's pieces and factors (hfq4_imma_scratch_bytes)
// rounded up to 256, so that every row's pieces keep the 16-byte alignment of their uint4 loads.
template <int kGroup>
__host__ __device__ __forceinline__ int64_t imma_row_stride(int64_t K) {
  const int64_t bytes = (K + kGroup - 1) / kGroup * (ImmaGroup<kGroup>::kPieceBytes + 8);
  return (bytes + 255) / 256 * 256;
}

// Cuts elements 8l .. 8l + 7 of `group` (v; zeros past the row), this lane being lane l of the
// group's kLanesPerGroup lanes, which sit together in the warp. Every lane of the warp calls it
// (the group's maximum and sum go over its lanes by xor butterflies; every lane ends with the same
// bits); lanes with !in_range take part and store nothing. A group with an infinite or NaN element
// gets a NaN factor (its products are NaN, as the f32 kernels' would be) and zero pieces.
template <int kGroup>
__device__ __forceinline__ void cut_imma_group(const float (&v)[8], int l, int64_t group, bool in_range,
                                               uint8_t* pieces, float2* group_scales) {
  using G = ImmaGroup<kGroup>;
  constexpr int kLanes = G::kLanesPerGroup;
  float amax = 0.0f, sum = 0.0f;
  int bad = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    bad |= !isfinite(v[j]);
    amax = fmaxf(amax, fabsf(v[j]));
    sum += v[j];
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {  // (offsets under kLanes stay in the group)
    amax = fmaxf(amax, gpu::shfl_xor(amax, offset));
    sum += gpu::shfl_xor(sum, offset);
    bad |= gpu::shfl_xor(bad, offset);
  }
  if (!in_range) return;
  int e = 0;
  frexpf(bad ? 0.0f : amax, &e);  // amax < 2^e (0 for a zero group)
  // x' = x 2^(6-e) in (-64, 64), by an exact multiply where 2^(6-e) is a normal float (ldexpf,
  // a slow path, for groups under 2^-120), then each piece rounded by the 1.5 * 2^23 trick: t =
  // r + 1.5 * 2^23 holds rint(r) in its low bits (the int8 byte, two's complement) and t - 1.5 *
  // 2^23 is rint(r) exactly; no float-to-int conversion (a quarter-rate instruction) at all.
  const float to_unit = e >= -120 ? __int_as_float((133 - e) << 23) : 0.0f;
  constexpr float kMagic = 12582912.0f;                    // 1.5 * 2^23
  uint32_t even[4] = {0, 0, 0, 0}, odd[4] = {0, 0, 0, 0};  // per piece: bytes of elements 0,2,4,6 / 1,3,5,7
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float r = bad ? 0.0f : e >= -120 ? v[j] * to_unit : ldexpf(v[j], 6 - e);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float t = r + kMagic;
      const uint32_t byte = static_cast<uint32_t>(__float_as_int(t)) & 0xffu;
      (j % 2 ? odd[p] : even[p]) |= byte << (8 * (j / 2));
      r = (r - (t - kMagic)) * 128.0f;  // |r - rint(r)| <= 1/2: the next piece in [-64, 64]
    }
  }
  // element 8l of the group: lane group t = 8l / (kGroup / 4), mma j = (8l % (kGroup / 4)) / 8
  const int t = 8 * l / G::kLanePieceBytes, mma = 8 * l % G::kLanePieceBytes / 8;
  uint8_t* base = pieces + group * G::kPieceBytes + t * G::kLanePieceBytes + 8 * mma;
#pragma unroll
  for (int p = 0; p < 4; ++p)
    *reinterpret_cast<uint2*>(base + p * 4 * G::kLanePieceBytes) = make_uint2(even[p], odd[p]);
  if (l == 0) group_scales[group] = make_float2(bad ? __int_as_float(0x7fc00000) : ldexpf(1.0f, e - 6), sum);
}

// Cuts a whole row that one block holds in shared memory (row[0, cols)): each warp takes
// kWarp / kLanesPerGroup groups at a time. The caller synchronises the block before (the row
// written) and nothing after (the pieces are global stores the next kernel reads).
template <int kGroup>
__device__ __forceinline__ void cut_imma_row_from_shared(const float* row, int cols, uint8_t* pieces) {
  constexpr int kLanes = ImmaGroup<kGroup>::kLanesPerGroup, kGroupsPerWarp = kWarp / kLanes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, n_warps = blockDim.x / kWarp;
  const int n_groups = (cols + kGroup - 1) / kGroup, l = lane % kLanes;
  float2* scales = imma_group_scales<kGroup>(pieces, cols);
  for (int first = warp * kGroupsPerWarp; first < n_groups; first += n_warps * kGroupsPerWarp) {  // warp-uniform
    const int group = first + lane / kLanes;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k = group * kGroup + 8 * l + j;
      v[j] = group < n_groups && k < cols ? row[k] : 0.0f;
    }
    cut_imma_group<kGroup>(v, l, group, group < n_groups, pieces, scales);
  }
}

}  // namespace fl::cuda
