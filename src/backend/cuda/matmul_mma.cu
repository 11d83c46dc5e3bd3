// Tensor-core GEMM on HFQ4 weights for many inputs: out[t, n] = sum_k x[t, k] * W[n, k].
//
// Hopper and Ampere run bf16 mma.sync (m16n8k16, f32 accumulators). The weights enter the tensor
// cores as their 4-bit codes, which bf16 holds exactly; the group's affine map w = code * scale +
// min is applied afterwards in f32, per group of 128 or 256 k:
//   sum_k x_k w_k = scale * sum_k x_k code_k + min * sum_k x_k.
// The activations are split into `kParts` bf16 pieces (matmul_mma.cuh: 3 pieces are exact), each
// multiplied by the same code fragment, so that with 3 pieces the result is the f32 dot product up
// to summation order and the op harness's 1e-5 budget holds for prefill as for decode.
//
// Three kernels:
//   - matmul_wgmma_kernel (Hopper, one piece, HFQ4, plain products of 64 or 128 inputs per tile):
//     warpgroup MMA with the inputs bulk-copied per stage; see its comment. The same bits as:
//   - matmul_bf16_pipelined_kernel (one piece, HFQ4): 16, 64 or 128 inputs x 128 weight rows per
//     block (128 inputs where that still gives every SM a block; 16 for sparse expert groups), 64
//     k per stage, every operand copied by cp.async four stages deep; see its comment.
//   - matmul_mma_kernel (2 or 3 pieces, and Q8_0 weights): 16 or 64 inputs x 128 weight rows, 64
//     k per stage; 8 warps as 2 (inputs) x 4 (rows) or 1 x 8. A
//     stage's global loads go to registers while the previous stage's shared-memory tiles feed the
//     tensor cores (one shared buffer, register prefetch). The 16 code bytes of a row's 32 k are
//     stored transposed (byte q of each word goes to word q), so that one 32-bit shared load gives
//     a lane the four code pairs it needs for two mma k-steps, and a warp's 32 loads hit 32 banks.
//
// Grouped (mixture of experts): the block's 64 inputs are routed pairs of one expert, gathered by
// index (MmaWorkItem); the routed pairs are sorted by expert on the device first.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/matmul_mma.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/wgmma.cuh"
#endif

namespace fl::cuda {

// Few pairs per expert (batched decode: 64 tokens x top-8 over 128 experts is 4 each) take
// 16-input tiles: a 64-input tile would multiply mostly zero rows, and at 4 pairs per expert the
// tensor work, not the weight bytes, bounded the step (26B-A4B: 28 of 74 ms). (128-pair items on
// the pipelined kernel were measured for long prompts and lost: 26B-A4B experts at 4096 tokens
// 2233 -> 2518 us, the partial last item of each expert costing more than the wider tile saves.)
int grouped_tile_rows(int64_t n_pairs, int64_t n_experts) { return n_pairs <= 16 * n_experts ? 16 : 64; }

// Each expert's pairs make ceil(count / tile) items: at most n_pairs / tile whole ones plus one
// partial per expert that has pairs.
int64_t max_work_items(int64_t n_pairs, int64_t n_experts) {
  return n_pairs / grouped_tile_rows(n_pairs, n_experts) + (n_experts < n_pairs ? n_experts : n_pairs);
}

#if !defined(FIRELINE_GPU_HIP)
namespace {

constexpr int kTileT = 64;                // inputs per block (16 for sparse expert groups; 128 pipelined)
constexpr int kTileN = 128;               // weight rows per block
constexpr int kTileK = 64;                // k per stage
constexpr int kThreads = 256;             // 8 warps
constexpr int kAStride = kTileK + 8;      // bf16 per shared A row: 144 bytes keeps ldmatrix conflict-free

// Bytes (b0 b1 b2 b3) of four words -> word q holds byte q of each: a 4x4 byte transpose.
__device__ __forceinline__ uint4 transpose_bytes(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w2, w3, 0x5140);  // bytes 0, 1
  const uint32_t hi01 = __byte_perm(w0, w1, 0x7362), hi23 = __byte_perm(w2, w3, 0x7362);  // bytes 2, 3
  return make_uint4(__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632), __byte_perm(hi01, hi23, 0x5410),
                    __byte_perm(hi01, hi23, 0x7632));
}

// Byte j of w (two 4-bit codes: the even k in the low nibble) as a bf16 pair (even k in the low
// half), exactly: 0x43 in the high byte makes bf16 128 + code, and 128 is then subtracted.
template <int j>
__device__ __forceinline__ uint32_t codes_to_bf16x2(uint32_t low_nibbles, uint32_t high_nibbles) {
  constexpr uint32_t sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12);
  const uint32_t biased = (__byte_perm(low_nibbles, high_nibbles, sel) & 0x00ff00ffu) | 0x43004300u;
  const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Q8_0 (34-byte blocks of 32 k: an f16 scale, 32 int8 codes): one block is one 32-wide half of a
// stage, so the scale is applied per half. Its codes are stored as bf16 pairs, 16 words per
// (half, row) plus 4 of padding: lanes (g, q) read word 20 g + q + c, 32 distinct banks.
constexpr int kQ8Words = 16, kQ8Stride = kQ8Words + 4;

template <DType F, int kParts, int kTileRows>
struct MmaShared {
  static constexpr bool kQ8 = F == DType::q8_0;
  uint16_t a[2][kParts][kTileRows][kAStride];  // bf16 pieces of the inputs, two stages [stage][part][t][k]
  uint4 b[kQ8 ? 1 : 2][kQ8 ? 1 : kTileN];   // HFQ4: transposed code bytes   [k32 half][n] (16 B)
  uint32_t b8[kQ8 ? 2 : 1][kQ8 ? kTileN : 1][kQ8Stride];  // Q8_0: bf16 code pairs [k32 half][n][k/2]
  float scale[2][kTileN], min[kTileN];      // the current group's affine map [n] (Q8_0: per half)
  float xsum[kTileRows];                    // HFQ4: sum of the group's inputs [t]
};

// The inputs cut once per call (not once per 128-row tile, as when each GEMM block split its
// own): pieces [part][row][k_pad] bf16, zero past K, and sums [row][k_pad / 64] of each 64-wide
// chunk of the inputs as the pieces hold them (with fewer than 3 pieces, the rounded inputs: the
// HFQ4 min term then multiplies the same inputs as the codes do, so the whole product is that of
// the rounded inputs). k_pad = K rounded up to 64.
struct SplitInputs {
  uint16_t* pieces;
  float* sums;
  int64_t rows, k_pad;
};

__host__ __device__ inline int64_t padded_k(int64_t K) { return (K + kTileK - 1) / kTileK * kTileK; }

SplitInputs split_layout(void* scratch, int64_t rows, int64_t K) {
  SplitInputs s;
  s.rows = rows;
  s.k_pad = padded_k(K);
  s.sums = static_cast<float*>(scratch);
  const int64_t sum_bytes = (rows * (s.k_pad / kTileK) * 4 + 15) / 16 * 16;
  s.pieces = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(scratch) + sum_bytes);
  return s;
}

// The pipelined kernel's order of k within each 32: position p = 16 s + 8 h + 2 q + e holds k =
// 8 q + 2 s + h + 4 e. A lane q of an mma fragment then needs, for two k-steps, exactly the eight
// codes of bytes 4q .. 4q + 3 of the row's 16 code bytes: one 32-bit shared load, and the raw code
// bytes can be copied into shared memory as they lie (matmul_bf16_pipelined_kernel).
__host__ __device__ constexpr int pipelined_k_of_position(int p) {
  return 8 * ((p % 8) / 2) + 2 * (p / 16) + (p / 8) % 2 + 4 * (p % 2);
}

// Thread: 8 consecutive k of one row (or, kPipelinedOrder, 8 consecutive positions of that order)
// -> one 16-byte store per piece; 8 threads make a 64-wide chunk's sum (shuffles within the 8).
//
// tile_rows > 0 (the Hopper kernel, one piece): the pieces are stored tiled instead, so that one
// bulk copy moves a block's inputs of one stage: [row / tile_rows][stage][8-position chunk]
// [row % tile_rows][8], over rows rounded up to tile_rows (the rows past `rows` zero).
//
// With `gather` (the Hopper kernel's expert items): row r of the output is item r / tile_rows's
// pair r % tile_rows, whose input is x row pair_ids[first + r % tile_rows] / x_row_div (zero past
// the item's count); the items past n_items are not written (their blocks return at once). A
// token routed to k experts is so copied k times, once into each item that holds one of its pairs.
struct SplitGather {
  const MmaWorkItem* items = nullptr;  // null: rows are x's rows
  const int32_t* n_items = nullptr;
  const int32_t* pair_ids = nullptr;
  int64_t x_row_div = 1;
};
template <int kParts, bool kPipelinedOrder>
__global__ void split_inputs_kernel(SplitInputs out, const float* x, int64_t x_stride, int64_t K, int tile_rows,
                                    SplitGather gather) {
  enter_kernel();
  const int64_t k = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  const int64_t padded_rows = tile_rows > 0 ? (out.rows + tile_rows - 1) / tile_rows * tile_rows : out.rows;
  const int64_t real_rows = gather.items ? static_cast<int64_t>(*gather.n_items) * tile_rows : padded_rows;
  for (int64_t row = blockIdx.y; row < padded_rows && row < real_rows; row += gridDim.y) {
    // (row is the block's alone, so the whole block leaves the loop together: the shuffles below
    // always have all their lanes)
    float v[8];
    bool valid = row < out.rows;
    int64_t src_row = row;
    if (gather.items) {
      const MmaWorkItem item = gather.items[row / tile_rows];
      valid = row % tile_rows < item.count;
      src_row = valid ? gather.pair_ids[item.first + row % tile_rows] / gather.x_row_div : 0;
    }
    const float* src = x + (valid ? src_row : 0) * x_stride;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t at = kPipelinedOrder ? k / 32 * 32 + pipelined_k_of_position(static_cast<int>(k % 32) + i) : k + i;
      v[i] = at < K && valid ? src[at] : 0.0f;
    }
    if constexpr (kParts < kMmaExactParts) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = pieces_value<kParts>(v[i]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += v[i];
    sum += gpu::shfl_xor(sum, 1);
    sum += gpu::shfl_xor(sum, 2);
    sum += gpu::shfl_xor(sum, 4);
    if (k >= out.k_pad) continue;  // after the shuffles: every lane takes part
    if (threadIdx.x % 8 == 0 && valid) out.sums[row * (out.k_pad / kTileK) + k / kTileK] = sum;
    uint32_t pairs[4][kParts];  // [k pair][piece]
#pragma unroll
    for (int i = 0; i < 4; ++i) split_pair<kParts>(v[2 * i], v[2 * i + 1], pairs[i]);
    if (tile_rows > 0) {  // one piece: [tile][stage][chunk][row in tile][8]
      const int64_t tile = row / tile_rows, stage = k / kTileK, chunk = (k % kTileK) / 8;
      *reinterpret_cast<uint4*>(out.pieces +
                                (((tile * (out.k_pad / kTileK) + stage) * 8 + chunk) * tile_rows + row % tile_rows) * 8) =
          make_uint4(pairs[0][0], pairs[1][0], pairs[2][0], pairs[3][0]);
      continue;
    }
#pragma unroll
    for (int p = 0; p < kParts; ++p)
      *reinterpret_cast<uint4*>(out.pieces + (p * out.rows + row) * out.k_pad + k) =
          make_uint4(pairs[0][p], pairs[1][p], pairs[2][p], pairs[3][p]);
  }
}

// A block's inputs: rows [t0, t0 + tile_rows) of x, or (grouped) one work item's routed pairs,
// with its expert's matrix. False: the grid's bound on the items exceeds the real ones.
struct BlockRows {
  const uint8_t* matrix;
  int64_t t0;
  int t_count;
  const int32_t* pairs;  // null: plain rows
};
__device__ __forceinline__ bool block_rows(const MatvecArgs& a, const MmaGroupedRows& grouped, int tile_rows,
                                           BlockRows& out) {
  out.matrix = a.weight;
  out.t0 = static_cast<int64_t>(blockIdx.y) * tile_rows;
  out.t_count = static_cast<int>(a.n_inputs - out.t0 < tile_rows ? a.n_inputs - out.t0 : tile_rows);
  out.pairs = nullptr;
  if (!grouped.items) return true;
  if (static_cast<int32_t>(blockIdx.y) >= *grouped.n_items) return false;
  const MmaWorkItem item = grouped.items[blockIdx.y];
  out.matrix += static_cast<int64_t>(item.expert) * a.expert_bytes;
  out.pairs = grouped.pair_ids + item.first;
  out.t_count = item.count;
  out.t0 = 0;
  return true;
}

// A warp's kMi x kNj accumulator tiles (inputs from t_base, weight rows from n_base) to the
// output, or with split-K to this split's partials.
template <int kMi, int kNj>
__device__ __forceinline__ void store_warp_tile(const MatvecArgs& a, const BlockRows& rows, float* k_partial,
                                                const float (&acc)[kMi][kNj][4], int t_base, int64_t n_base, int g,
                                                int q) {
#pragma unroll
  for (int i = 0; i < kMi; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = t_base + i * 16 + g + (c >= 2 ? 8 : 0);
      if (t >= rows.t_count) continue;
      const int64_t row = rows.pairs ? rows.pairs[t] : rows.t0 + t;
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        const int64_t n = n_base + j * 8 + 2 * q + (c & 1);
        if (n < a.M) {
          if (k_partial)
            k_partial[(static_cast<int64_t>(blockIdx.z) * a.n_inputs + row) * a.M + n] = acc[i][j][c];
          else
            a.out[row * a.out_stride + n] = acc[i][j][c];
        }
      }
    }
}

// kTileRows inputs per block: 64 as 2 x 4 warps of 32 inputs x 32 rows, or 16 as 1 x 8 warps of
// 16 inputs x 16 rows.
template <DType F, int kParts, int kTileRows>
__global__ void __launch_bounds__(kThreads, 2)
    matmul_mma_kernel(MatvecArgs a, MmaGroupedRows grouped, SplitInputs in, float* k_partial, int k_groups_per_split) {
  static_assert(kTileRows == 16 || kTileRows == 64, "16 or 64 inputs per block");
  constexpr int kWarpsT = kTileRows == 64 ? 2 : 1, kWarpsN = 8 / kWarpsT;
  constexpr int kWarpRows = kTileRows / kWarpsT, kWarpCols = kTileN / kWarpsN;
  constexpr int kMi = kWarpRows / 16, kNj = kWarpCols / 8;               // mma tiles per warp: inputs, weight rows
  constexpr int kLoadIters = (kTileRows * 8 + kThreads - 1) / kThreads;  // 16-byte input chunks per thread
  enter_kernel();
  constexpr bool kQ8 = F == DType::q8_0;
  constexpr int kGroup = F == DType::hfq4_g256 ? 256 : F == DType::hfq4_g128 ? 128 : 32;
  constexpr int kBlockBytes = kQ8 ? 34 : 8 + kGroup / 2;
  extern __shared__ uint4 smem_raw[];
  MmaShared<F, kParts, kTileRows>& s = *reinterpret_cast<MmaShared<F, kParts, kTileRows>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_t = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g = lane / 4, q = lane % 4;            // mma fragment coordinates

  BlockRows rows;
  if (!block_rows(a, grouped, kTileRows, rows)) return;
  const uint8_t* matrix = rows.matrix;
  const int64_t t0 = rows.t0;
  const int t_count = rows.t_count;
  const int32_t* pairs = rows.pairs;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;

  // Loader roles. Inputs: chunk c = tid, tid + 256 of a stage's 64 rows x 8 sixteen-byte chunks
  // per piece (cp.async into the other stage buffer). Codes: thread -> weight row tid % 128,
  // k32 half tid / 128 (16 bytes). Affine map and group sums: threads < 128 and < 64.
  const uint16_t* piece_row[kLoadIters];
  bool row_valid[kLoadIters];
#pragma unroll
  for (int i = 0; i < kLoadIters; ++i) {
    const int r = (tid + i * kThreads) / 8;
    row_valid[i] = r < t_count;  // (and r < kTileRows)
    const int64_t xrow = row_valid[i] ? (pairs ? pairs[r] / a.x_row_div : t0 + r) : 0;
    piece_row[i] = in.pieces + xrow * in.k_pad + ((tid + i * kThreads) % 8) * 8;
  }
  const float* sum_row = nullptr;
  if (tid < t_count) sum_row = in.sums + (pairs ? pairs[tid] / a.x_row_div : t0 + tid) * (in.k_pad / kTileK);
  const int load_n = tid % kTileN, load_half = tid / kTileN;
  const uint8_t* w_row = matrix + (n0 + load_n < a.M ? n0 + load_n : a.M - 1) * a.row_bytes;

  auto load_inputs = [&](int64_t k0, int buffer) {
#pragma unroll
    for (int i = 0; i < kLoadIters; ++i) {
      const int c = tid + i * kThreads, r = c / 8, kc = (c % 8) * 8;
      if (kTileRows * 8 % kThreads != 0 && c >= kTileRows * 8) break;  // 16-input tiles: half the threads
#pragma unroll
      for (int p = 0; p < kParts; ++p)
        cp_async_16(&s.a[buffer][p][r][kc], piece_row[i] + p * in.rows * in.k_pad + k0, row_valid[i]);
    }
    cp_async_commit();
  };
  uint32_t code_next[4];
  float2 affine_next = make_float2(0.0f, 0.0f);
  // Q8_0: a block is 34 bytes at a 2-byte boundary (a row ends after ceil(K / 32) of them), read
  // as 8 aligned words and one halfword: 9 loads where 17 halfword loads were (the LM head's Q8_0
  // GEMM at 64 inputs ran at ~610 GB/s), and 9 registers held across a stage instead of 17. The
  // halfword is the block's last two bytes when the block starts on a 4-byte boundary, its first
  // two (the scale) otherwise, so nothing outside the block is read. A thread's blocks all start
  // alike (a stage's k0 / 32 is even: 68 bytes per pair of blocks); lanes are consecutive rows,
  // so only rows of an odd number of blocks (row bytes = 2 mod 4) mix the two cases in a warp.
  uint32_t q8_next[9] = {};
  const bool q8_word_aligned = (reinterpret_cast<uintptr_t>(w_row + load_half * kBlockBytes) & 3u) == 0;
  // Halfword i (bytes 2i, 2i + 1) of the loaded block, in the low 16 bits (the consumers read those).
  auto q8_halfword = [&](int i) -> uint32_t {
    return q8_word_aligned ? (i < 16 ? q8_next[i / 2] >> (16 * (i % 2)) : q8_next[8])
                           : (i == 0 ? q8_next[0] : q8_next[1 + (i - 1) / 2] >> (16 * ((i - 1) % 2)));
  };
  auto load_codes = [&](int64_t k0) {
    const int64_t kc = k0 + load_half * 32;
    if constexpr (kQ8) {
      if (kc >= a.K) {
#pragma unroll
        for (int i = 0; i < 9; ++i) q8_next[i] = 0u;
        return;
      }
      const uint8_t* block = w_row + (kc / 32) * kBlockBytes;
      const uint32_t* words = reinterpret_cast<const uint32_t*>(block + (q8_word_aligned ? 0 : 2));
      const uint32_t alone = __ldg(reinterpret_cast<const uint16_t*>(block + (q8_word_aligned ? 32 : 0)));
      uint32_t w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = __ldg(words + j);
#pragma unroll
      for (int j = 0; j < 8; ++j) q8_next[j] = q8_word_aligned ? w[j] : (j == 0 ? alone : w[j - 1]);
      q8_next[8] = q8_word_aligned ? alone : w[7];
      return;
    }
    // HFQ4: within the row's padded blocks (kGroup % 64 == 0)
    const uint8_t* block = w_row + (kc / kGroup) * kBlockBytes;
    const uint2* codes = reinterpret_cast<const uint2*>(block + 8 + (kc % kGroup) / 2);  // 8-byte aligned
    const uint2 c0 = __ldg(codes), c1 = __ldg(codes + 1);
    code_next[0] = c0.x, code_next[1] = c0.y, code_next[2] = c1.x, code_next[3] = c1.y;
    if (tid < kTileN && k0 % kGroup == 0) {
      const uint8_t* own = matrix + (n0 + tid < a.M ? n0 + tid : a.M - 1) * a.row_bytes + (k0 / kGroup) * kBlockBytes;
      affine_next = __ldg(reinterpret_cast<const float2*>(own));  // scale, min
    }
  };

  float acc[kMi][kNj][4], part[kMi][kNj][4];
#pragma unroll
  for (int i = 0; i < kMi; ++i)
#pragma unroll
    for (int j = 0; j < kNj; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = part[i][j][c] = 0.0f;

  // Split-K (gridDim.z > 1, few tiles): this block's whole groups [z * per_split, ...) of K, its
  // partial sums to k_partial[z]; launch_matmul_mma adds the splits in order afterwards.
  const int64_t n_stages = (a.K + kTileK - 1) / kTileK;
  const int64_t stages_per_split = static_cast<int64_t>(k_groups_per_split) * (kGroup > kTileK ? kGroup / kTileK : 1);
  const int64_t stage_begin = static_cast<int64_t>(blockIdx.z) * stages_per_split;
  const int64_t stage_end = min(n_stages, stage_begin + stages_per_split);
  load_inputs(stage_begin * kTileK, static_cast<int>(stage_begin & 1));
  load_codes(stage_begin * kTileK);
  for (int64_t stage = stage_begin; stage < stage_end; ++stage) {
    const int64_t k0 = stage * kTileK;
    const int buffer = static_cast<int>(stage & 1);
    const bool group_first = k0 % kGroup == 0;
    const bool group_last = (k0 + kTileK) % kGroup == 0 || stage + 1 == n_stages;
    if constexpr (kQ8) {
      uint32_t pairs[kQ8Words];
#pragma unroll
      for (int i = 0; i < kQ8Words; ++i) pairs[i] = int8_pair_to_bf16x2(q8_halfword(1 + i));
      uint4* dst = reinterpret_cast<uint4*>(s.b8[load_half][load_n]);
#pragma unroll
      for (int i = 0; i < kQ8Words / 4; ++i)
        dst[i] = make_uint4(pairs[4 * i], pairs[4 * i + 1], pairs[4 * i + 2], pairs[4 * i + 3]);
      s.scale[load_half][load_n] = f16_bits_to_float(static_cast<uint16_t>(q8_halfword(0)));
    } else {
      s.b[load_half][load_n] = transpose_bytes(code_next[0], code_next[1], code_next[2], code_next[3]);
    }
    if (!kQ8 && group_first) {
      if (tid < kTileN) s.scale[0][tid] = affine_next.x, s.min[tid] = affine_next.y;
      if (tid < kTileRows) {  // the group's input sums, from the 64-wide chunk sums
        float sum = 0.0f;
        for (int64_t c = k0 / kTileK; c < n_stages && c < (k0 + kGroup) / kTileK; ++c) sum += sum_row ? sum_row[c] : 0.0f;
        s.xsum[tid] = sum;
      }
    }
    cp_async_wait_all();  // this stage's inputs (the only group in flight)
    __syncthreads();
    if (stage + 1 < stage_end) {  // in flight during the products below
      load_inputs(k0 + kTileK, buffer ^ 1);
      load_codes(k0 + kTileK);
    }

#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 32 k: two mma k-steps share one code word per tile
      uint32_t b[kNj][4];                   // [n tile][k-step 0 reg 0, reg 1, k-step 1 reg 0, reg 1]
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        if constexpr (kQ8) {  // k-step 0: k = 2q and 2q + 8; k-step 1: 16 more
          const uint32_t* pairs = s.b8[half][warp_n * kWarpCols + j * 8 + g];
          b[j][0] = pairs[q], b[j][1] = pairs[4 + q], b[j][2] = pairs[8 + q], b[j][3] = pairs[12 + q];
        } else {
          const uint32_t word = reinterpret_cast<const uint32_t*>(&s.b[half][warp_n * kWarpCols + j * 8 + g])[q];
          const uint32_t low = word & 0x0f0f0f0fu, high = (word >> 4) & 0x0f0f0f0fu;
          b[j][0] = codes_to_bf16x2<0>(low, high);
          b[j][1] = codes_to_bf16x2<1>(low, high);
          b[j][2] = codes_to_bf16x2<2>(low, high);
          b[j][3] = codes_to_bf16x2<3>(low, high);
        }
      }
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const int kk = half * 32 + step * 16;
#pragma unroll
        for (int i = 0; i < kMi; ++i) {
#pragma unroll
          for (int p = 0; p < kParts; ++p) {
            uint32_t frag[4];
            ldmatrix_x4(frag, &s.a[buffer][p][warp_t * kWarpRows + i * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
            for (int j = 0; j < kNj; ++j) mma_bf16(part[i][j], frag, b[j][2 * step], b[j][2 * step + 1]);
          }
        }
      }
      if constexpr (kQ8) {  // acc += scale * sum(x code), per output, for this half's block
#pragma unroll
        for (int i = 0; i < kMi; ++i)
#pragma unroll
          for (int j = 0; j < kNj; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              acc[i][j][c] += s.scale[half][warp_n * kWarpCols + j * 8 + 2 * q + (c & 1)] * part[i][j][c];
              part[i][j][c] = 0.0f;
            }
      }
    }
    if (!kQ8 && group_last) {  // acc += scale * sum(x code) + min * sum(x), per output
#pragma unroll
      for (int i = 0; i < kMi; ++i)
#pragma unroll
        for (int j = 0; j < kNj; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int t = warp_t * kWarpRows + i * 16 + g + (c >= 2 ? 8 : 0);
            const int n = warp_n * kWarpCols + j * 8 + 2 * q + (c & 1);
            acc[i][j][c] += s.scale[0][n] * part[i][j][c] + s.min[n] * s.xsum[t];
            part[i][j][c] = 0.0f;
          }
    }
    __syncthreads();
  }

  store_warp_tile(a, rows, k_partial, acc, warp_t * kWarpRows, n0 + warp_n * kWarpCols, g, q);
}

// The one-piece (bf16) HFQ4 GEMM, pipelined: what bounded matmul_mma_kernel at one piece was not
// the tensor cores but the loop around them (Nsight Compute, 31B gate_up at 4096 inputs: 12
// instructions per mma, two barriers per stage, codes staged through registers, 1.2 eligible warps
// per scheduler). Here every operand travels by cp.async, kStages deep, one barrier per stage:
//   - inputs: the split pieces in pipelined_k_of_position's order, 16-byte copies;
//   - codes: the raw bytes of the rows' HFQ4 blocks (8-byte copies: a block's codes are only
//     8-byte aligned), which that order lets a lane read as one word per 32 k;
//   - each 64-wide chunk's input sum (for the min term) and, at a group's first stage, the rows'
//     (scale, min), kept in a ring of 4 groups (a G128 group ends two stages after the next
//     groups' maps are requested).
// A lane turns a code word into its four B registers with a shift, a LOP3 and a bf16 subtract
// each. Warps are 2 (inputs) x 4 (rows) of kTileRows / 2 x 32 outputs at 64 and 128 inputs: at
// 128, one code fragment feeds 4 mma per k-step (2 in matmul_mma_kernel), the accumulators (sum
// and current group, 128 registers) leave one block per SM, and the deep pipeline hides the
// latency instead. At 16 inputs (sparse expert groups: batched decode's 4 pairs per expert), 1 x 8
// warps of 16 x 16: the weight bytes bound those, and the pipeline keeps them streaming.
constexpr int kStages = 4;
constexpr int kCodeStride = 12;  // words per row of a stage's codes (8 used): lanes (g, q) hit 32 banks
constexpr int kAffineRing = 4;

template <int kTileRows>
struct PipelinedShared {
  uint16_t a[kStages][kTileRows][kAStride];      // bf16 inputs  [stage][t][k position]
  uint32_t codes[kStages][kTileN][kCodeStride];  // raw code bytes [stage][n][k / 8]
  float sums[kStages][kTileRows];                // the stage's input sums [stage][t]
  float2 affine[kAffineRing][kTileN];            // (scale, min) [group % ring][n]
};

// Codes (`shifted`: a row's code word shifted so that the wanted nibbles sit at bits 0 and 16)
// -> the bf16 pair (code, code') exactly: one LOP3 keeps the two nibbles and sets 0x43 in each high
// byte (bf16 128 + code; the 0x43004300 in `bias` is a register, as LOP3 takes one immediate), and
// 128 is subtracted.
__device__ __forceinline__ uint32_t nibble_pair_to_bf16x2(uint32_t shifted, uint32_t bias) {
  uint32_t biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(biased) : "r"(shifted), "n"(0x000f000f), "r"(bias));  // (a & b) | c
  const __nv_bfloat162 v =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <DType F, int kTileRows>
__global__ void __launch_bounds__(kThreads, kTileRows == 128  ? 1
                                            : kTileRows == 64 ? 2
                                                              : 3)
    matmul_bf16_pipelined_kernel(MatvecArgs a, MmaGroupedRows grouped, SplitInputs in, float* k_partial,
                                 int k_groups_per_split) {
  static_assert(kTileRows == 16 || kTileRows == 64 || kTileRows == 128, "16, 64 or 128 inputs per block");
  static_assert(F == DType::hfq4_g256 || F == DType::hfq4_g128, "HFQ4 codes");
  constexpr int kWarpsT = kTileRows >= 64 ? 2 : 1, kWarpsN = 8 / kWarpsT;  // warps: inputs x rows
  constexpr int kWarpRows = kTileRows / kWarpsT, kWarpCols = kTileN / kWarpsN;
  constexpr int kMi = kWarpRows / 16, kNj = kWarpCols / 8;  // warp: kMi x kNj mma tiles
  constexpr int kInputChunks = kTileRows * 8;               // 16-byte input copies per stage
  constexpr int kInputCopies = (kInputChunks + kThreads - 1) / kThreads;  // per thread (16 inputs: threads < 128)
  constexpr int kCodeCopies = kTileN * 4 / kThreads;        // 8-byte code copies per thread and stage
  constexpr int kGroup = F == DType::hfq4_g256 ? 256 : 128;
  constexpr int kBlockBytes = 8 + kGroup / 2;
  enter_kernel();
  extern __shared__ uint4 smem_raw[];
  PipelinedShared<kTileRows>& s = *reinterpret_cast<PipelinedShared<kTileRows>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_t = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g = lane / 4, q = lane % 4;  // mma fragment coordinates

  BlockRows rows;
  if (!block_rows(a, grouped, kTileRows, rows)) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  auto input_row = [&](int r) { return rows.pairs ? rows.pairs[r] / a.x_row_div : rows.t0 + r; };
  auto weight_row = [&](int n) { return rows.matrix + (n0 + n < a.M ? n0 + n : a.M - 1) * a.row_bytes; };

  // Copy roles. Inputs: chunk c = tid + 256 i < kInputChunks of a stage's kTileRows rows x 8. Codes: row
  // c / 4, bytes 8 (c % 4) .. of the stage's 32, for c = tid and tid + 256. Sums: row tid. Maps:
  // weight row tid.
  const uint16_t* piece_src[kInputCopies];
  bool piece_valid[kInputCopies];
#pragma unroll
  for (int i = 0; i < kInputCopies; ++i) {
    const int c = tid + i * kThreads, r = c / 8;
    piece_valid[i] = c < kInputChunks && r < rows.t_count;
    piece_src[i] = in.pieces + (piece_valid[i] ? input_row(r) : 0) * in.k_pad + (c % 8) * 8;
  }
  const uint8_t* code_src[kCodeCopies];
#pragma unroll
  for (int i = 0; i < kCodeCopies; ++i)
    code_src[i] = weight_row((tid + i * kThreads) / 4) + 8 + ((tid + i * kThreads) % 4) * 8;
  const bool sum_valid = tid < rows.t_count;
  const float* sum_src = in.sums + (sum_valid ? input_row(tid) : 0) * (in.k_pad / kTileK);
  const uint8_t* affine_src = weight_row(tid % kTileN);

  // Split-K as in matmul_mma_kernel: whole groups [z * per_split, ...) of K per block.
  constexpr int kStagesPerGroup = kGroup / kTileK;
  const int n_stages = static_cast<int>((a.K + kTileK - 1) / kTileK);
  const int64_t stages_per_split = static_cast<int64_t>(k_groups_per_split) * kStagesPerGroup;  // 2^30 groups: no split
  const int64_t split_begin = blockIdx.z * stages_per_split, split_end = split_begin + stages_per_split;
  const int stage_begin = static_cast<int>(split_begin < n_stages ? split_begin : n_stages);
  const int stage_end = static_cast<int>(split_end < n_stages ? split_end : n_stages);

  // The next stage to copy, as running offsets (32-bit: a row is at most a few hundred KB): its
  // first k, the byte offset of its HFQ4 block in a row, and its place in the group.
  int load_stage = stage_begin, load_block = (stage_begin / kStagesPerGroup) * kBlockBytes;
  int load_in_group = 0, load_slot = 0;  // (stage_begin is a group's first stage)
  auto load_next = [&]() {
    const int k0 = load_stage * kTileK;
#pragma unroll
    for (int i = 0; i < kInputCopies; ++i) {
      const int c = tid + i * kThreads;
      if (kInputChunks % kThreads == 0 || c < kInputChunks)
        cp_async_16(&s.a[load_slot][c / 8][(c % 8) * 8], piece_src[i] + k0, piece_valid[i]);
    }
    const int code_offset = load_block + load_in_group * (kTileK / 2);
#pragma unroll
    for (int i = 0; i < kCodeCopies; ++i) {
      const int c = tid + i * kThreads;
      cp_async_small<8>(&s.codes[load_slot][c / 4][(c % 4) * 2], code_src[i] + code_offset);
    }
    if (tid < kTileRows) cp_async_small<4>(&s.sums[load_slot][tid], sum_src + load_stage, sum_valid);
    if (tid < kTileN && load_in_group == 0)
      cp_async_small<8>(&s.affine[(load_stage / kStagesPerGroup) % kAffineRing][tid], affine_src + load_block);
    ++load_stage;
    load_slot = load_slot + 1 == kStages ? 0 : load_slot + 1;
    if (++load_in_group == kStagesPerGroup) load_in_group = 0, load_block += kBlockBytes;
  };

  float acc[kMi][kNj][4], part[kMi][kNj][4], xsum[kMi][2];
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
    xsum[i][0] = xsum[i][1] = 0.0f;
#pragma unroll
    for (int j = 0; j < kNj; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = part[i][j][c] = 0.0f;
  }

  const uint32_t bias = 0x43004300u;  // in a register: one LOP3 then masks and biases a code pair
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {  // one commit per stage, real or not: the wait counts groups
    if (load_stage < stage_end) load_next();
    cp_async_commit();
  }
  int slot = 0, in_group = 0;
  for (int stage = stage_begin; stage < stage_end; ++stage) {
    cp_async_wait<kStages - 2>();  // this stage's copies (this thread's) ...
    __syncthreads();               // ... and everyone's; and the slot refilled below is no longer read
    if (load_stage < stage_end) load_next();
    cp_async_commit();

#pragma unroll
    for (int i = 0; i < kMi; ++i) {
      xsum[i][0] += s.sums[slot][warp_t * kWarpRows + i * 16 + g];
      xsum[i][1] += s.sums[slot][warp_t * kWarpRows + i * 16 + g + 8];
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 32 k: two mma k-steps from one code word per n tile
      uint32_t b[kNj][4];                   // [n tile][k-step 0 reg 0, reg 1, k-step 1 reg 0, reg 1]
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        const uint32_t word = s.codes[slot][warp_n * kWarpCols + j * 8 + g][half * 4 + q];
#pragma unroll
        for (int r = 0; r < 4; ++r) b[j][r] = nibble_pair_to_bf16x2(word >> (8 * (r / 2) + 4 * (r % 2)), bias);
      }
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const int kk = half * 32 + step * 16;
#pragma unroll
        for (int i = 0; i < kMi; ++i) {
          uint32_t frag[4];
          ldmatrix_x4(frag, &s.a[slot][warp_t * kWarpRows + i * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
          for (int j = 0; j < kNj; ++j) mma_bf16(part[i][j], frag, b[j][2 * step], b[j][2 * step + 1]);
        }
      }
    }
    if (++in_group == kStagesPerGroup || stage + 1 == n_stages) {  // acc += scale * sum(x code) + min * sum(x)
      const float2* maps = s.affine[(stage / kStagesPerGroup) % kAffineRing];
#pragma unroll
      for (int j = 0; j < kNj; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float2 map = maps[warp_n * kWarpCols + j * 8 + 2 * q + c];
#pragma unroll
          for (int i = 0; i < kMi; ++i) {
            acc[i][j][c] = fmaf(map.y, xsum[i][0], fmaf(map.x, part[i][j][c], acc[i][j][c]));
            acc[i][j][c + 2] = fmaf(map.y, xsum[i][1], fmaf(map.x, part[i][j][c + 2], acc[i][j][c + 2]));
            part[i][j][c] = part[i][j][c + 2] = 0.0f;
          }
        }
#pragma unroll
      for (int i = 0; i < kMi; ++i) xsum[i][0] = xsum[i][1] = 0.0f;
      in_group = 0;
    }
    slot = slot + 1 == kStages ? 0 : slot + 1;
  }
  cp_async_wait<0>();  // (only empty groups remain; nothing may be in flight at exit)

  store_warp_tile(a, rows, k_partial, acc, warp_t * kWarpRows, n0 + warp_n * kWarpCols, g, q);
}

// A plain product's matrix and output for this block's row tile blockIdx.x: a.weight's, or with
// segments (several matrices of one input; each segment's outputs [n_inputs, M] contiguous) the
// segment whose tiles hold it. With K split, the partials are [split][t][columns], this matrix's
// rows at columns column0 + n.
struct PlainTarget {
  const uint8_t* weight;
  float* out;
  int64_t out_stride, M, row_bytes, tile, column0, columns;
};
__device__ __forceinline__ PlainTarget plain_target(const MatvecArgs& a) {
  PlainTarget t{a.weight, a.out, a.out_stride, a.M, a.row_bytes, static_cast<int64_t>(blockIdx.x), 0, a.M};
  if (a.n_segments == 0) return t;
  int s = 0;
  int64_t column0 = 0, columns = a.segments[0].M;
  for (int i = 1; i < a.n_segments; ++i) {
    columns += a.segments[i].M;
    if (t.tile >= a.segments[i].first_block) s = i;
  }
  for (int i = 0; i < s; ++i) column0 += a.segments[i].M;
  const MatvecSegment& seg = a.segments[s];
  return PlainTarget{seg.weight, seg.out, seg.M, seg.M, seg.row_bytes, t.tile - seg.first_block, column0, columns};
}

// ---- Hopper: the one-piece GEMM on warpgroup MMA (wgmma, sm_90a) ----
//
// matmul_bf16_pipelined_kernel's mma.sync keeps the tensor pipe about a third busy (its entry in
// bench/RESULTS.md: 210 TFLOPS, latency-bound at 8 warps per SM). wgmma runs asynchronously: a
// warpgroup issues a stage's four k-steps and converts the next stage's codes while they run. The
// weights are the MMA's A operand (64 rows per warpgroup, two warpgroups: 128 rows per block),
// converted from their codes straight into A's registers as in the pipelined kernel (the inputs'
// k permuted the same way, so one 32-bit load gives a lane its codes for two k-steps); the inputs
// are B (kTileT = 64 or 128 per block: the wgmma's N), read by the tensor cores from shared
// memory in the canonical layout (wgmma.cuh): [stage][8-position chunk][input] of 16 bytes. The
// split kernel stores them in that layout (tiled), so one bulk copy per stage brings them: a copy
// of the async proxy, which the wgmma reads without the per-thread proxy fence that cp.async's
// writes need (with that fence after each stage's copies, the first version took ~3000 cycles a
// stage for ~500 of tensor work). Expert items (MmaGroupedRows::hopper) come the same way: the
// split kernel gathers each item's pairs into a tile of its own (SplitGather), and the block
// stores its outputs to the items' pair rows.
// The group's affine map is applied as in the other kernels: sums of code products per group in
// `part` (the group's first k-step overwrites it), then acc += scale * part + min * sum(x).
//
// Stages: kWgStages slots, copies kWgAhead stages ahead. The slot refilled at stage s was read by
// the wgmma of stage s - 2, which each warpgroup has waited for (at most one stage in flight after
// each stage) before the barrier that precedes the refill.
constexpr int kWgStages = 6;
[[maybe_unused]] constexpr int kWgAhead = kWgStages - 2;
constexpr int kWgGroups = 2;             // consumer warpgroups per block
constexpr int kWgRows = 64 * kWgGroups;  // weight rows per block
constexpr int kWgThreads = 128 * kWgGroups;
constexpr int kWgSumRing = 4;  // groups whose stage sums are kept (copies run at most 2 groups ahead)

template <int kTileT>
struct WgmmaShared {
  uint4 inputs[kWgStages][8][kTileT];               // bf16 inputs, 8 positions each [stage][chunk][t]
  uint32_t codes[kWgStages][kWgRows][kCodeStride];  // raw code bytes [stage][n][k / 8]
  float sums[kWgSumRing][4][kTileT];                // the inputs' 64-wide sums [group % ring][stage of group][t]
  float2 affine[kAffineRing][kWgRows];              // (scale, min) [group % ring][n]
  uint64_t inputs_landed[kWgStages];                // transaction barriers of the inputs' bulk copies
};

template <int kTileT>
__device__ __forceinline__ void wgmma_rs(float (&d)[kTileT / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                         bool accumulate) {
  if constexpr (kTileT == 128) wgmma_m64n128k16_rs(d, a, b_desc, accumulate);
  else wgmma_m64n64k16_rs(d, a, b_desc, accumulate);
}

template <DType F, int kTileT>
__global__ void __launch_bounds__(kWgThreads, 1)
    matmul_wgmma_kernel(MatvecArgs a, MmaGroupedRows grouped, SplitInputs in, float* k_partial,
                        int k_groups_per_split) {
  static_assert(kTileT == 64 || kTileT == 128, "64 or 128 inputs per block");
  static_assert(F == DType::hfq4_g256 || F == DType::hfq4_g128, "HFQ4 codes");
  static_assert(kWgThreads >= kTileT && kWgThreads >= kWgRows, "a thread per input sum and per row's map");
#if FIRELINE_GPU_HOPPER
  constexpr int kGroup = F == DType::hfq4_g256 ? 256 : 128;
  constexpr int kBlockBytes = 8 + kGroup / 2;
  constexpr int kStagesPerGroup = kGroup / kTileK;
  constexpr uint32_t kInputBytes = kTileT * kTileK * 2;  // a stage's inputs: one bulk copy
  constexpr int kCodeCopies = kWgRows * 4 / kWgThreads;  // 8-byte code copies per thread
  constexpr int kAcc = kTileT / 2;                     // accumulators per thread (64 x kTileT per warpgroup)
  enter_kernel();
  extern __shared__ uint4 smem_raw[];
  WgmmaShared<kTileT>& s = *reinterpret_cast<WgmmaShared<kTileT>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, q = lane % 4;
  const int row0 = (warp / 4) * 64 + (warp % 4) * 16 + g;  // this thread's weight rows: row0, row0 + 8

  BlockRows rows;
  if (!block_rows(a, grouped, kTileT, rows)) return;
  const PlainTarget target = plain_target(a);  // (segments: plain products only)
  if (a.n_segments > 0) rows.matrix = target.weight;
  const int64_t M = target.M, row_bytes = target.row_bytes;
  const int64_t n0 = target.tile * kWgRows;
  auto weight_row = [&](int n) { return rows.matrix + (n0 + n < M ? n0 + n : M - 1) * row_bytes; };

  // The block's tile of inputs is tile blockIdx.y of the split kernel's (split rows
  // blockIdx.y * kTileT + t): inputs t0 + t of a plain product, or item blockIdx.y's pairs,
  // gathered there. Copy roles. Inputs: thread 0, the block's tile ([tile][stage][...]). Codes:
  // row c / 4, bytes 8 (c % 4) .. of the stage's 32. Sums: input tid. Maps: weight row tid.
  const uint16_t* tile_src = in.pieces + static_cast<int64_t>(blockIdx.y) * (in.k_pad / kTileK) * (kInputBytes / 2);
  const uint8_t* code_src[kCodeCopies];
#pragma unroll
  for (int i = 0; i < kCodeCopies; ++i)
    code_src[i] = weight_row((tid + i * kWgThreads) / 4) + 8 + ((tid + i * kWgThreads) % 4) * 8;
  const bool sum_valid = tid < rows.t_count;
  const float* sum_src =
      in.sums + (sum_valid ? static_cast<int64_t>(blockIdx.y) * kTileT + tid : 0) * (in.k_pad / kTileK);
  const uint8_t* affine_src = weight_row(tid % kWgRows);

  const int n_stages = static_cast<int>((a.K + kTileK - 1) / kTileK);
  const int64_t stages_per_split = static_cast<int64_t>(k_groups_per_split) * kStagesPerGroup;
  const int64_t split_begin = blockIdx.z * stages_per_split, split_end = split_begin + stages_per_split;
  const int stage_begin = static_cast<int>(split_begin < n_stages ? split_begin : n_stages);
  const int stage_end = static_cast<int>(split_end < n_stages ? split_end : n_stages);

  int load_stage = stage_begin, load_block = (stage_begin / kStagesPerGroup) * kBlockBytes;
  int load_in_group = 0, load_slot = 0;
  auto load_next = [&]() {
    if (tid == 0) {
      mbarrier_arrive_expect_tx(&s.inputs_landed[load_slot], kInputBytes);
      bulk_copy_to_shared(&s.inputs[load_slot][0][0], tile_src + static_cast<int64_t>(load_stage) * (kInputBytes / 2),
                          kInputBytes, &s.inputs_landed[load_slot]);
    }
    const int code_offset = load_block + load_in_group * (kTileK / 2);
#pragma unroll
    for (int i = 0; i < kCodeCopies; ++i) {
      const int c = tid + i * kWgThreads;
      cp_async_small<8>(&s.codes[load_slot][c / 4][(c % 4) * 2], code_src[i] + code_offset);
    }
    const int group = load_stage / kStagesPerGroup;
    if (tid < kTileT)
      cp_async_small<4>(&s.sums[group % kWgSumRing][load_in_group][tid], sum_src + load_stage, sum_valid);
    if (tid < kWgRows && load_in_group == 0)
      cp_async_small<8>(&s.affine[group % kAffineRing][tid], affine_src + load_block);
    ++load_stage;
    load_slot = load_slot + 1 == kWgStages ? 0 : load_slot + 1;
    if (++load_in_group == kStagesPerGroup) load_in_group = 0, load_block += kBlockBytes;
  };

  float acc[kAcc], part[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = part[i] = 0.0f;
  uint32_t frag[2][4][4];  // A fragments [stage parity][k-step][register]: read by wgmma until waited for

  const uint32_t bias = 0x43004300u;
  if (tid == 0) {
    for (int i = 0; i < kWgStages; ++i) mbarrier_init(&s.inputs_landed[i], 1);
    fence_mbarrier_init();
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kWgAhead; ++i) {
    if (load_stage < stage_end) load_next();
    cp_async_commit();
  }
  // One stage; the A fragments alternate between two register sets by stage parity (a compile-time
  // index: a run-time one would put them in local memory).
  int slot = 0, in_group = 0;
  auto run_stage = [&](auto parity, int stage) {
    cp_async_wait<kWgAhead - 1>();  // this stage's code copies (this thread's) ...
    __syncthreads();                // ... and everyone's; the slot refilled below was read at stage - 2
    if (load_stage < stage_end) load_next();
    cp_async_commit();

    uint32_t(&f)[4][4] = frag[decltype(parity)::value];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t w0 = s.codes[slot][row0][half * 4 + q], w1 = s.codes[slot][row0 + 8][half * 4 + q];
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        f[half * 2 + step][0] = nibble_pair_to_bf16x2(w0 >> (8 * step), bias);
        f[half * 2 + step][1] = nibble_pair_to_bf16x2(w1 >> (8 * step), bias);
        f[half * 2 + step][2] = nibble_pair_to_bf16x2(w0 >> (8 * step + 4), bias);
        f[half * 2 + step][3] = nibble_pair_to_bf16x2(w1 >> (8 * step + 4), bias);
      }
    }
    // the stage's inputs: the slot's ((stage - begin) / kWgStages)-th bulk copy
    mbarrier_wait_parity(&s.inputs_landed[slot], static_cast<uint32_t>((stage - stage_begin) / kWgStages) & 1);
    wgmma_fence_operands(part);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_rs<kTileT>(part, f[ks], wgmma_descriptor(&s.inputs[slot][2 * ks][0], kTileT * 16, 128),
                       in_group != 0 || ks != 0);
    wgmma_commit();
    wgmma_fence_operands(part);

    if (++in_group == kStagesPerGroup || stage + 1 == n_stages) {  // acc += scale * part + min * sum(x)
      wgmma_wait<0>();
      wgmma_fence_operands(part);
      const int group = stage / kStagesPerGroup;
      const float2 map0 = s.affine[group % kAffineRing][row0], map1 = s.affine[group % kAffineRing][row0 + 8];
      const float(&sums)[4][kTileT] = s.sums[group % kWgSumRing];
#pragma unroll
      for (int j = 0; j < kTileT / 8; ++j) {
        float2 xsum = *reinterpret_cast<const float2*>(&sums[0][8 * j + 2 * q]);
#pragma unroll
        for (int st = 1; st < kStagesPerGroup; ++st) {
          if (st >= in_group) break;  // a partial last group
          const float2 v = *reinterpret_cast<const float2*>(&sums[st][8 * j + 2 * q]);
          xsum.x += v.x, xsum.y += v.y;
        }
        acc[4 * j + 0] = fmaf(map0.y, xsum.x, fmaf(map0.x, part[4 * j + 0], acc[4 * j + 0]));
        acc[4 * j + 1] = fmaf(map0.y, xsum.y, fmaf(map0.x, part[4 * j + 1], acc[4 * j + 1]));
        acc[4 * j + 2] = fmaf(map1.y, xsum.x, fmaf(map1.x, part[4 * j + 2], acc[4 * j + 2]));
        acc[4 * j + 3] = fmaf(map1.y, xsum.y, fmaf(map1.x, part[4 * j + 3], acc[4 * j + 3]));
      }
      in_group = 0;
    } else {
      wgmma_wait<1>();  // the previous stage's: its A registers and its slot are free again
    }
    slot = slot + 1 == kWgStages ? 0 : slot + 1;
  };
  for (int stage = stage_begin; stage < stage_end; stage += 2) {
    run_stage(std::integral_constant<int, 0>{}, stage);
    if (stage + 1 < stage_end) run_stage(std::integral_constant<int, 1>{}, stage + 1);
  }
  // (The last stage folded, so nothing is in flight; saying so spares the loop's back edge the
  // wait ptxas would otherwise put there for the exit path.)
  wgmma_wait<0>();
  wgmma_fence_operands(part);
  cp_async_wait<0>();

  // out[t, n0 + row]: d[4 j + c] holds row row0 + 8 (c / 2), input 8 j + 2 q + c % 2.
#pragma unroll
  for (int j = 0; j < kTileT / 8; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = 8 * j + 2 * q + (c & 1);
      const int64_t n = n0 + row0 + 8 * (c / 2);
      if (t >= rows.t_count || n >= M) continue;
      const int64_t row = rows.pairs ? rows.pairs[t] : rows.t0 + t;
      if (k_partial)
        k_partial[(static_cast<int64_t>(blockIdx.z) * a.n_inputs + row) * target.columns + target.column0 + n] =
            acc[4 * j + c];
      else
        target.out[row * target.out_stride + n] = acc[4 * j + c];
    }
#else
  __trap();  // launched only where hopper_gemm_active()
#endif
}

// One block: count the pairs per expert, cut each expert's pairs into work items of <= tile, and
// list the pairs by expert (the order within an expert is whatever the atomics give: each pair's
// output is computed on its own, so the result does not depend on it).
__global__ void moe_sort_pairs_kernel(MmaWorkItem* items, int32_t* n_items, int32_t* pair_ids, const int32_t* ids,
                                      int64_t n_pairs, int64_t n_experts, int tile) {
  enter_kernel();
  extern __shared__ int32_t cursor[];  // [n_experts]
  for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < n_experts) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // a few hundred experts: a serial scan is shorter than a parallel one
    int32_t offset = 0, n = 0;
    for (int64_t e = 0; e < n_experts; ++e) {
      const int32_t count = cursor[e];
      for (int32_t first = 0; first < count; first += tile)
        items[n++] =
            MmaWorkItem{static_cast<int32_t>(e), offset + first, count - first < tile ? count - first : tile, 0};
      cursor[e] = offset;
      offset += count;
    }
    *n_items = n;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < n_experts) pair_ids[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(p);
  }
}

// out[t, n] = the sum of the K splits' partials [split][t][columns], in split order
// (deterministic): columns = M for one matrix (out = a.out, a.out_stride), or with segments (several
// matrices, each output [t, M_s] contiguous) segment s's rows at its offset among the columns.
__global__ void sum_k_splits_kernel(MatvecArgs a, const float* partial, int64_t rows, int64_t columns, int splits) {
  enter_kernel();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * columns) return;
  float sum = 0.0f;
  for (int z = 0; z < splits; ++z) sum += partial[z * rows * columns + i];
  const int64_t t = i / columns;
  int64_t c = i % columns;
  if (a.n_segments == 0) {
    a.out[t * a.out_stride + c] = sum;
    return;
  }
  int s = 0;
  while (s + 1 < a.n_segments && c >= a.segments[s].M) c -= a.segments[s++].M;
  a.segments[s].out[t * a.segments[s].M + c] = sum;
}

// Whether the pipelined one-piece kernel takes a product: HFQ4 weights and bf16 (one-piece)
// inputs, at every tile size (16, 64 and 128 inputs).
constexpr bool takes_pipelined(DType type, int parts) {
  return parts == 1 && (type == DType::hfq4_g256 || type == DType::hfq4_g128);
}

// Inputs per block of a plain product: the pipelined kernel's 128 where that still makes a block
// for every SM, else 64. The 128-input tile's 102 KiB of shared memory is more than a block may
// have on sm_86/sm_89 (99 KiB); there the 64-input tile (65 KiB) serves every size.
int dense_tile_rows(int64_t row_tiles, int64_t n_inputs, DType type, int parts) {
  if (!takes_pipelined(type, parts)) return kTileT;
  if (static_cast<size_t>(current_device_traits().max_block_smem) < sizeof(PipelinedShared<128>)) return kTileT;
  const int64_t tiles = row_tiles * ((n_inputs + 127) / 128);
  return tiles >= current_device_traits().sm_count ? 128 : kTileT;
}

// A plain product's 128-row weight tiles (kTileN = kWgRows): its matrix's, or with segments (several
// matrices of one input, launch_matmul_mma) each segment's in turn; each segment's first tile is
// recorded in first_block, and `columns` is the segments' rows together (the K-split partials'
// width).
int64_t number_row_tiles(MatvecArgs& a, int64_t* columns = nullptr) {
  if (a.n_segments == 0) {
    if (columns) *columns = a.M;
    return (a.M + kTileN - 1) / kTileN;
  }
  int64_t tiles = 0, cols = 0;
  for (int s = 0; s < a.n_segments; ++s) {
    a.segments[s].first_block = tiles;
    tiles += (a.segments[s].M + kTileN - 1) / kTileN;
    cols += a.segments[s].M;
  }
  if (columns) *columns = cols;
  return tiles;
}

// How many K splits a plain product takes: with fewer tiles than SMs (batched decode, short
// prompts: a 4096-row matrix at 64 inputs is 32 tiles for 132 SMs) K is cut at group boundaries
// until the blocks fill one wave of the GPU (blocks_per_sm resident per SM), at most 16 splits.
// One wave, not more: a block's time is a pipeline ramp plus its stages, so a second wave of
// short blocks costs more than fewer, longer ones (Hopper's wgmma kernel holds one block per SM
// at 64 inputs, 166 registers x 256 threads; the rule before, about two blocks per SM whatever
// the kernel, sent its 64-input products into two waves: 26B q_proj 6 splits x 32 tiles = 192
// blocks for 132 SMs).
struct KSplits {
  int splits = 1, groups_per_split = 1 << 30;
};
KSplits plan_k_splits(int64_t row_tiles, int64_t n_inputs, int64_t K, DType type, int tile_rows, int blocks_per_sm) {
  KSplits k;
  // the split unit: a whole HFQ4 group, or one 64-wide stage (two Q8_0 blocks)
  const int64_t group = type == DType::hfq4_g256 ? 256 : type == DType::hfq4_g128 ? 128 : kTileK;
  const int64_t n_groups = (K + group - 1) / group;
  const int64_t tiles = row_tiles * ((n_inputs + tile_rows - 1) / tile_rows);
  const int sms = current_device_traits().sm_count;
  if (tiles >= sms || n_groups < 2) return k;
  const int64_t want = std::min<int64_t>({std::max<int64_t>(1, blocks_per_sm * sms / tiles), n_groups, 16});
  k.groups_per_split = static_cast<int>((n_groups + want - 1) / want);
  k.splits = static_cast<int>((n_groups + k.groups_per_split - 1) / k.groups_per_split);  // <= want
  return k;
}

// Whether a bench or test turned the Hopper kernel off (allow_hopper_gemm).
std::atomic<bool> g_hopper_gemm_allowed{true};
std::atomic<int64_t> g_hopper_expert_launches{0};  // hopper_expert_gemm_launches
std::atomic<int64_t> g_segment_launches{0};        // segment_gemm_launches
std::atomic<bool> g_one_wave_k_splits{true};       // allow_one_wave_k_splits

// Whether a grouped product's items go to the Hopper kernel (MmaGroupedRows::hopper asked for):
// one piece on HFQ4, 64-pair items, the kernel active. Both the launch and the scratch sizing
// (mma_grouped_scratch_bytes) decide by it.
bool hopper_takes_items(bool asked, DType type, int parts, int tile_rows) {
  return asked && takes_pipelined(type, parts) && tile_rows == kTileT && hopper_gemm_active();
}

// Blocks of a plain product resident per SM, for the K-split plan: the Hopper kernel's 64-input
// tile holds one (its registers), the mma.sync kernels' two (and the Hopper kernel's products are
// planned as two where a bench asked for the old plan: allow_one_wave_k_splits).
int plain_blocks_per_sm(DType type, int parts) {
  return takes_pipelined(type, parts) && hopper_gemm_active() && g_one_wave_k_splits.load(std::memory_order_relaxed)
             ? 1
             : 2;
}

template <DType F, int kParts>
cudaError_t launch_parts(const MatvecArgs& a, const MmaGroupedRows* grouped, cudaStream_t stream) {
  constexpr bool kPipelined = takes_pipelined(F, kParts);
  MatvecArgs args = a;  // (with segments: their first tiles set)
  int64_t columns = 0;  // the K-split partials' width: M, or the segments' rows together
  const int64_t row_tiles = number_row_tiles(args, &columns);
  const int tile_rows = grouped ? grouped->tile_rows : dense_tile_rows(row_tiles, a.n_inputs, F, kParts);
  const int64_t t_tiles = grouped ? grouped->max_items : (a.n_inputs + tile_rows - 1) / tile_rows;
  if (t_tiles > 65535) return cudaErrorInvalidValue;  // 4M inputs: the caller splits first
  const int64_t x_rows = grouped ? (a.n_inputs + a.x_row_div - 1) / a.x_row_div : a.n_inputs;
  // The Hopper kernel (64- and 128-input tiles of plain products; asked for, 64-pair expert items:
  // its inputs arrive tiled, one bulk copy per stage): kWgRows weight rows and kWgThreads threads
  // per block. Expert items have their pairs gathered into one tile per item by the split kernel.
  const bool hopper_items = grouped && hopper_takes_items(grouped->hopper, F, kParts, tile_rows);
  const bool hopper = hopper_items || (kPipelined && !grouped && hopper_gemm_active());
  if (a.n_segments > 0 && (grouped || !hopper)) return cudaErrorInvalidValue;  // matmul_mma_takes_segments
  const int64_t split_rows = hopper_items ? t_tiles * tile_rows : x_rows;  // (gathered: every item's tile)
  const size_t need = !grouped      ? matmul_mma_scratch_bytes(a, kParts)
                      : hopper_items ? mma_scratch_bytes(split_rows, a.K, kParts)
                                     : mma_scratch_bytes(x_rows, a.K, kParts);
  if (!a.scratch || a.scratch_bytes < need) return cudaErrorInvalidValue;
  const SplitInputs in = split_layout(a.scratch, split_rows, a.K);
  const dim3 split_grid(static_cast<unsigned>((in.k_pad / 8 + 255) / 256),
                        static_cast<unsigned>(split_rows < 65535 ? split_rows : 65535));
  SplitGather gather;
  if (hopper_items) {
    gather = SplitGather{grouped->items, grouped->n_items, grouped->pair_ids, a.x_row_div};
    g_hopper_expert_launches.fetch_add(1, std::memory_order_relaxed);
  }
  cudaError_t err = launch_kernel(split_inputs_kernel<kParts, kPipelined>, split_grid, 256, 0, stream, in, a.x,
                                  a.x_stride, a.K, hopper ? tile_rows : 0, gather);
  if (err != cudaSuccess) return err;
  void (*kernel)(MatvecArgs, MmaGroupedRows, SplitInputs, float*, int) = nullptr;  // both kernels' signature
  size_t smem = 0;
  if constexpr (kPipelined) {
    if (hopper) {
      kernel = tile_rows == 128 ? matmul_wgmma_kernel<F, 128> : matmul_wgmma_kernel<F, 64>;
      smem = tile_rows == 128 ? sizeof(WgmmaShared<128>) : sizeof(WgmmaShared<64>);
    } else {
      kernel = tile_rows == 128  ? matmul_bf16_pipelined_kernel<F, 128>
               : tile_rows == 64 ? matmul_bf16_pipelined_kernel<F, 64>
                                 : matmul_bf16_pipelined_kernel<F, 16>;
      smem = tile_rows == 128  ? sizeof(PipelinedShared<128>)
             : tile_rows == 64 ? sizeof(PipelinedShared<64>)
                               : sizeof(PipelinedShared<16>);
    }
  } else {
    kernel = tile_rows == 16 ? matmul_mma_kernel<F, kParts, 16> : matmul_mma_kernel<F, kParts, 64>;
    smem = tile_rows == 16 ? sizeof(MmaShared<F, kParts, 16>) : sizeof(MmaShared<F, kParts, 64>);
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const MmaGroupedRows rows = grouped ? *grouped : MmaGroupedRows{};
  // (plain_blocks_per_sm: one for the Hopper kernel, which `hopper` is here for a plain product)
  const KSplits k =
      grouped ? KSplits{} : plan_k_splits(row_tiles, a.n_inputs, a.K, F, tile_rows, plain_blocks_per_sm(F, kParts));
  float* partial = k.splits > 1 ? reinterpret_cast<float*>(static_cast<uint8_t*>(a.scratch) +
                                                           mma_scratch_bytes(x_rows, a.K, kParts))
                                : nullptr;
  static_assert(kWgRows == kTileN, "both kernels' blocks take 128 weight rows");
  err = launch_kernel(kernel,
                      dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(t_tiles),
                           static_cast<unsigned>(k.splits)),
                      hopper ? kWgThreads : kThreads, smem, stream, args, rows, in, partial, k.groups_per_split);
  if (err != cudaSuccess || k.splits == 1) return err;
  const int64_t n = a.n_inputs * columns;
  return launch_kernel(sum_k_splits_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, stream, args, partial,
                       a.n_inputs, columns, k.splits);
}

template <DType F>
cudaError_t launch_format(const MatvecArgs& a, int parts, const MmaGroupedRows* grouped, cudaStream_t stream) {
  switch (parts) {
    case 1: return launch_parts<F, 1>(a, grouped, stream);
    case 2: return launch_parts<F, 2>(a, grouped, stream);
    case 3: return launch_parts<F, 3>(a, grouped, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

void allow_hopper_gemm(bool allowed) { g_hopper_gemm_allowed.store(allowed, std::memory_order_relaxed); }
void allow_one_wave_k_splits(bool allowed) { g_one_wave_k_splits.store(allowed, std::memory_order_relaxed); }

int64_t hopper_expert_gemm_launches() { return g_hopper_expert_launches.load(std::memory_order_relaxed); }
int64_t segment_gemm_launches() { return g_segment_launches.load(std::memory_order_relaxed); }

bool hopper_gemm_active() {
#if defined(FIRELINE_CUDA_SM90A)
  return g_hopper_gemm_allowed.load(std::memory_order_relaxed) && current_device_traits().major == 9;
#else
  return false;
#endif
}

bool matmul_mma_supports(DType type) {
  return type == DType::hfq4_g256 || type == DType::hfq4_g128 || type == DType::q8_0;
}

size_t mma_scratch_bytes(int64_t x_rows, int64_t K, int parts) {
  const int64_t k_pad = padded_k(K);
  const int64_t sum_bytes = (x_rows * (k_pad / kTileK) * 4 + 15) / 16 * 16;
  const int64_t piece_rows = (x_rows + 127) / 128 * 128;  // the Hopper kernel's tiles: whole ones
  return static_cast<size_t>(sum_bytes + static_cast<int64_t>(parts) * piece_rows * k_pad * 2);
}

size_t mma_grouped_scratch_bytes(int64_t x_rows, int64_t n_pairs, int64_t n_experts, int64_t K, DType type,
                                 int parts, bool hopper) {
  const size_t rows = mma_scratch_bytes(x_rows, K, parts);
  if (!hopper_takes_items(hopper, type, parts, grouped_tile_rows(n_pairs, n_experts))) return rows;
  return std::max(rows, mma_scratch_bytes(max_work_items(n_pairs, n_experts) * kTileT, K, parts));
}

size_t matmul_mma_scratch_bytes(const MatvecArgs& a, int parts) {
  // the split inputs, then the K splits' partial outputs [splits][n_inputs][M, or the segments' rows]
  MatvecArgs args = a;
  int64_t columns = 0;
  const int64_t row_tiles = number_row_tiles(args, &columns);
  const KSplits k =
      plan_k_splits(row_tiles, a.n_inputs, a.K, a.weight_type, dense_tile_rows(row_tiles, a.n_inputs, a.weight_type, parts),
                    plain_blocks_per_sm(a.weight_type, parts));
  const size_t partial = k.splits > 1 ? static_cast<size_t>(k.splits) * a.n_inputs * columns * sizeof(float) : 0;
  return mma_scratch_bytes(a.n_inputs, a.K, parts) + partial;
}

bool matmul_mma_takes_segments(const MatvecArgs& a, int parts) {
  // (from kMmaMinInputs inputs, as a plain product takes the GEMM: below, each product's matvec
  // gives every input the bits it gets alone, which batched decode keeps)
  if (a.n_segments < 1 || a.n_segments > kMaxMatvecSegments || a.expert_ids || a.n_inputs < kMmaMinInputs)
    return false;
  for (int s = 0; s < a.n_segments; ++s)
    if (a.segments[s].M <= 0) return false;
  return takes_pipelined(a.weight_type, parts) && hopper_gemm_active();
}

cudaError_t launch_matmul_mma(const MatvecArgs& a, int parts, cudaStream_t stream, const MmaGroupedRows* grouped) {
  if (a.n_segments != 0 && (grouped || !matmul_mma_takes_segments(a, parts))) return cudaErrorInvalidValue;
  if (a.n_segments != 0) {  // several matrices of one input: a.M is unused
    if (a.K <= 0) return cudaErrorInvalidValue;
    const cudaError_t err = a.weight_type == DType::hfq4_g256   ? launch_parts<DType::hfq4_g256, 1>(a, nullptr, stream)
                            : a.weight_type == DType::hfq4_g128 ? launch_parts<DType::hfq4_g128, 1>(a, nullptr, stream)
                                                                : cudaErrorInvalidValue;
    if (err == cudaSuccess) g_segment_launches.fetch_add(1, std::memory_order_relaxed);
    return err;
  }
  if ((a.expert_ids && !grouped) || a.M <= 0 || a.K <= 0) return cudaErrorInvalidValue;
  if (!grouped && a.n_inputs == 0) return cudaSuccess;
  if (grouped && a.n_inputs <= 0) return cudaErrorInvalidValue;  // n_inputs: the routed pairs
  if (grouped && grouped->max_items == 0) return cudaSuccess;
  switch (a.weight_type) {
    case DType::hfq4_g256: return launch_format<DType::hfq4_g256>(a, parts, grouped, stream);
    case DType::hfq4_g128: return launch_format<DType::hfq4_g128>(a, parts, grouped, stream);
    case DType::q8_0: return launch_format<DType::q8_0>(a, parts, grouped, stream);
    default: return cudaErrorInvalidValue;
  }
}


cudaError_t launch_moe_sort_pairs(MmaGroupedRows& out, MmaWorkItem* items, int32_t* n_items, int32_t* pair_ids,
                                  const int32_t* ids, int64_t n_pairs, int64_t n_experts, cudaStream_t stream) {
  if (n_experts <= 0 || n_experts > 8192) return cudaErrorInvalidValue;
  const int tile = grouped_tile_rows(n_pairs, n_experts);
  const cudaError_t err =
      launch_kernel(moe_sort_pairs_kernel, 1, 1024, static_cast<size_t>(n_experts) * sizeof(int32_t), stream, items,
                    n_items, pair_ids, ids, n_pairs, n_experts, tile);
  out.items = items;
  out.n_items = n_items;
  out.pair_ids = pair_ids;
  out.max_items = max_work_items(n_pairs, n_experts);
  out.tile_rows = tile;
  return err;
}

#else  // HIP: no mma.sync; launch_matvec keeps its several-input kernel

void allow_hopper_gemm(bool) {}
void allow_one_wave_k_splits(bool) {}
bool hopper_gemm_active() { return false; }

bool matmul_mma_supports(DType) { return false; }
size_t mma_scratch_bytes(int64_t, int64_t, int) { return 0; }
size_t mma_grouped_scratch_bytes(int64_t, int64_t, int64_t, int64_t, DType, int, bool) { return 0; }
int64_t hopper_expert_gemm_launches() { return 0; }
int64_t segment_gemm_launches() { return 0; }
size_t matmul_mma_scratch_bytes(const MatvecArgs&, int) { return 0; }
bool matmul_mma_takes_segments(const MatvecArgs&, int) { return false; }
cudaError_t launch_matmul_mma(const MatvecArgs&, int, cudaStream_t, const MmaGroupedRows*) {
  return cudaErrorInvalidValue;
}
cudaError_t launch_moe_sort_pairs(MmaGroupedRows&, MmaWorkItem*, int32_t*, int32_t*, const int32_t*, int64_t, int64_t,
                                  cudaStream_t) {
  return cudaErrorInvalidValue;
}

#endif

}  // namespace fl::cuda
