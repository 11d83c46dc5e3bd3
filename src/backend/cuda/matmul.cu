// Matrix-vector products on packed weights: out[i, m] = sum_k x[i, k] * W[m, k] for every weight
// format, with the weight decoded in registers. Rows are read whole including the padded tail
// block; values with k >= K are never used (tail predication). Two kernels:
//
// matvec_rows_kernel (one input per weight matrix: batch-1 decode and the routed expert pairs):
// each warp owns kRows rows and each lane 8 consecutive weights per 256-wide chunk (Q8_0, HFQ6,
// the plain formats; HFQ4 has its own kernels, below). The lane's 8 inputs are loaded once (two
// 16-byte loads) and used for all kRows rows: with one row per warp, x (4 bytes per weight, read
// through L1 with 32-byte strides between lanes) was 7.5x the weight traffic and capped the
// kernel near 256 GB/s on the H200. All kRows x kUnroll chunks' loads are issued before the first
// decode, so a lane has that many requests in flight.
//
// matvec_kernel (several inputs: prefill and batched decode): one warp per row, each weight chunk
// decoded once and used for up to kTokens inputs.
//
// HFQ4 rows take their own pair (matvec_hfq4_rows_kernel, matvec_hfq4_tokens_kernel): each lane
// reads 16 weights with one 8-byte load and the block's affine map is factored out,
// sum_k x_k (s c_k + m) = s sum_k x_k c_k + m sum_k x_k, with sum_k x_k shared by every row the
// lane holds. A code becomes a float with one byte permute (hfq4_lane_dot): ~3 instructions per
// weight where decoding each weight took ~6, which capped the kernel near 1.3 TB/s on the H200's
// large matrices. The two kernels run the same per-lane arithmetic in the same order, so
// a row's result does not depend on how many inputs share the launch.
//
// Many inputs on HFQ4 weights go to the tensor-core GEMM instead (matmul_mma.cu).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <iterator>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/hfq4_rows.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matvec_rows.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/wgmma.cuh"
#endif

namespace fl::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kTokens = 8;  // inputs sharing one pass over a weight row (plain matmul)

template <DType F, int kT, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) matvec_kernel(MatvecArgs a) {
  enter_kernel();
  const int lane = threadIdx.x % kWarp;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (m >= a.M) return;
  const int64_t n_groups = (a.n_inputs + kT - 1) / kT;
  for (int64_t g = blockIdx.y; g < n_groups; g += gridDim.y) {
    int64_t first = g * kT, count = kT;
    if (first + count > a.n_inputs) count = a.n_inputs - first;
    const uint8_t* row = a.weight + m * a.row_bytes;
    float acc[kT];
    const float* xs[kT];  // input rows, resolved once: no 64-bit division in the inner loop
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      acc[t] = 0.0f;
      xs[t] = a.x + ((first + (t < count ? t : 0)) / a.x_row_div) * a.x_stride;
    }
    // kUnroll chunks per step: all their weight loads are issued before the first FMA, so each
    // warp keeps several requests in flight (one 4-byte load per lane is far too little to
    // cover HBM latency).
    for (int64_t base = lane * 8; base < a.K; base += 8 * kWarp * kUnroll) {
      float w[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k0 = base + u * 8 * kWarp;
        if (k0 < a.K) decode8<F>(row, k0, a.K, w[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k0 = base + u * 8 * kWarp;
        if (k0 >= a.K) break;
        const bool whole = k0 + 8 <= a.K;
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          if (t < count) {
            const float* x = xs[t] + k0;
            float sum = 0.0f;
            if (whole) {
#pragma unroll
              for (int j = 0; j < 8; ++j) sum += w[u][j] * x[j];
            } else {
              for (int j = 0; k0 + j < a.K; ++j) sum += w[u][j] * x[j];
            }
            acc[t] += sum;
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0 && t < count) a.out[(first + t) * a.out_stride + m] = sum;
    }
  }
}

// Pulls a warp's rows m_first .. m_first + n_rows - 1 into L2 (before enter_kernel(): while the
// previous kernel finishes).
__device__ __forceinline__ void prefetch_rows(const RowsTarget& t, int64_t m_first, int n_rows) {
  const int lane = threadIdx.x % kWarp;
  for (int r = 0; r < n_rows && m_first + r < t.M; ++r)
    for (int64_t byte = lane * 128; byte < t.row_bytes; byte += 128 * kWarp)
      prefetch_l2(t.matrix + (m_first + r) * t.row_bytes + byte);
}

// One input per group g (the plain matmul's single input, or routed pair g with its expert's
// matrix); warp w of block b computes rows (b * kWarpsPerBlock + w) * kRows + r, r < kRows.
template <DType F, int kRows, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    matvec_rows_kernel(MatvecArgs a, bool vector_x, bool prefetch) {
  const int lane = threadIdx.x % kWarp;
  const RowsTarget target = rows_target(a);
  float* out = target.out;
  const uint8_t* matrix = target.matrix;
  const int64_t M = target.M, row_bytes = target.row_bytes;
  const int64_t m_first = (target.block * kWarpsPerBlock + threadIdx.x / kWarp) * kRows;
  // Everything above reads only the kernel's arguments. A plain product's rows are known now:
  // start pulling them into L2 while the previous kernel (a norm, an attention merge) finishes.
  if (prefetch && blockIdx.y == 0) prefetch_rows(target, m_first, kRows);
  enter_kernel();
  if (m_first >= M) return;
  for (int64_t g = blockIdx.y; g < a.n_inputs; g += gridDim.y) {
    const uint8_t* weight = matrix;
    if (a.expert_ids) {
      const int32_t expert = a.expert_ids[g];
      if (expert < 0) continue;  // a pair another rank runs (--ep): nothing to compute or store
      weight += static_cast<int64_t>(expert) * a.expert_bytes;
    }
    const uint8_t* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {  // rows past M re-read the last row and are not stored
      const int64_t m = m_first + r < M ? m_first + r : M - 1;
      rows[r] = weight + m * row_bytes;
    }
    const float* x = a.x + (g / a.x_row_div) * a.x_stride;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int64_t base = lane * 8; base < a.K; base += 8 * kWarp * kUnroll) {
      RawChunk<F> raw[kUnroll][kRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k0 = base + u * 8 * kWarp;
        if (k0 < a.K) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) raw[u][r].load(rows[r], k0, a.K);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k0 = base + u * 8 * kWarp;
        if (k0 >= a.K) break;
        const bool whole = k0 + 8 <= a.K;
        float xv[8];
        if (whole && vector_x) {
          const float4 lo = __ldg(reinterpret_cast<const float4*>(x + k0));
          const float4 hi = __ldg(reinterpret_cast<const float4*>(x + k0 + 4));
          xv[0] = lo.x, xv[1] = lo.y, xv[2] = lo.z, xv[3] = lo.w;
          xv[4] = hi.x, xv[5] = hi.y, xv[6] = hi.z, xv[7] = hi.w;
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) xv[j] = k0 + j < a.K ? x[k0 + j] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float w[8];
          raw[u][r].decode(w);
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += w[j] * xv[j];  // xv[j] = 0 past K: no NaN from padding
          acc[r] += sum;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = warp_sum(acc[r]);
      if (lane == 0 && m_first + r < M) out[g * a.out_stride + m_first + r] = sum;
    }
  }
}

// ---- HFQ4 ---- (the per-lane arithmetic: hfq4_rows.cuh)

// The rows kernel for HFQ4 (one input per matrix; grouped segments; expert pairs), kWarpsPerBlock
// warps of kRows rows each, kUnroll warp steps of loads in flight per lane. Gated (MatvecArgs::
// gated): a warp's kRows rows are kRows / 2 gate rows and the same up rows, and it stores
// act(gate) * up for each: the products' loop is the plain one's, row by row, so the values are
// those of the two products and gated_activation, one launch and one store fewer.
//
// kRing: the loads as a ring of kUnroll steps: a step's registers are refilled with the step
// kUnroll past it as soon as its arithmetic is done, so a warp's next loads fly while it works on
// the steps it holds (without it the warp issues kUnroll steps, multiplies them all, then waits a
// whole round trip for the next kUnroll). The same steps in the same order: the same bits.
template <int kGroup, int kRows, int kUnroll, int kWarps, bool kGated, bool kRing = false>
__global__ void __launch_bounds__(kWarps* kWarp) matvec_hfq4_rows_kernel(MatvecArgs a, bool vector_x, bool prefetch) {
  using L = Hfq4Lanes<kGroup>;
  static_assert(!kGated || kRows % 2 == 0, "gated: pairs of gate and up rows");
  constexpr int kOuts = kGated ? kRows / 2 : kRows;  // outputs per warp
  const int lane = threadIdx.x % kWarp, sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const RowsTarget target = rows_target(a);
  float* out = target.out;
  const uint8_t* matrix = target.matrix;
  const int64_t M = target.M, row_bytes = target.row_bytes;
  // gated: the up rows' matrix (a separate one, or the stack's rows M .. 2M - 1)
  const uint8_t* up_matrix = kGated ? (a.up_weight ? a.up_weight : matrix + M * row_bytes) : nullptr;
  const int64_t m_first = (target.block * kWarps + threadIdx.x / kWarp) * kOuts;
  if (prefetch && blockIdx.y == 0) {  // as matvec_rows_kernel
    prefetch_rows(target, m_first, kOuts);
    if constexpr (kGated) prefetch_rows(RowsTarget{out, up_matrix, M, row_bytes, 0}, m_first, kOuts);
  }
  enter_kernel();
  if (m_first >= M) return;
  const int64_t n_blocks = (a.K + kGroup - 1) / kGroup;
  for (int64_t g = blockIdx.y; g < a.n_inputs; g += gridDim.y) {
    const uint8_t* weight = matrix;
    const uint8_t* up_weight = up_matrix;
    if (a.expert_ids) {
      const int32_t expert = a.expert_ids[g];
      if (expert < 0) continue;  // a pair another rank runs (--ep): nothing to compute or store
      weight += static_cast<int64_t>(expert) * a.expert_bytes;
      up_weight += static_cast<int64_t>(expert) * a.expert_bytes;
    }
    const uint8_t* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {  // rows past M re-read the last row and are not stored
      const int64_t m = m_first + r % kOuts;
      rows[r] = (kGated && r >= kOuts ? up_weight : weight) + (m < M ? m : M - 1) * row_bytes + 8 * sub;
    }
    const float* x = a.x + (g / a.x_row_div) * a.x_stride;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    // step block b's loads into slot u: this lane's 8 code bytes (at 8 * sub) and the block's
    // (scale, min), every row; then its arithmetic
    uint2 codes[kUnroll][kRows];
    float2 scale_min[kUnroll][kRows];
    const auto load_step = [&](int u, int64_t b) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* p = rows[r] + b * L::kBlockBytes;
        codes[u][r] = *reinterpret_cast<const uint2*>(p + 8);
        scale_min[u][r] = *reinterpret_cast<const float2*>(p - 8 * sub);
      }
    };
    const auto multiply_step = [&](int u, int64_t b) {
      float xv[16];
      const float x_sum = load_x16(x, b * kGroup + 16 * sub, a.K, vector_x, xv);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        acc[r] += hfq4_lane_dot(codes[u][r], scale_min[u][r].x, scale_min[u][r].y, xv, x_sum);
    };
    if constexpr (kRing) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (lane_block + u * L::kBlocksPerStep < n_blocks) load_step(u, lane_block + u * L::kBlocksPerStep);
      for (int64_t first = lane_block; first < n_blocks; first += L::kBlocksPerStep * kUnroll) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t b = first + u * L::kBlocksPerStep;
          if (b >= n_blocks) break;
          multiply_step(u, b);
          const int64_t next = b + L::kBlocksPerStep * kUnroll;  // this slot's next step
          if (next < n_blocks) load_step(u, next);
        }
      }
    } else {
      for (int64_t first = lane_block; first < n_blocks; first += L::kBlocksPerStep * kUnroll) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (first + u * L::kBlocksPerStep < n_blocks) load_step(u, first + u * L::kBlocksPerStep);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t b = first + u * L::kBlocksPerStep;
          if (b >= n_blocks) break;
          multiply_step(u, b);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kOuts; ++r) {
      float value = warp_sum(acc[r]);
      if constexpr (kGated) value = gated_value(value, warp_sum(acc[r + kOuts]), a.act);
      if (lane == 0 && m_first + r < M) out[g * a.out_stride + m_first + r] = value;
    }
  }
}

// The rows kernel's plain one-input product (no segments, gate or experts) on pairs of warps that
// split each row's warp steps, even ones and odd ones, for the products whose grid is about one
// wave with long rows (the 31B's down and o_proj: 5376 rows, 10 warps of 4 rows per SM). There the
// register kernel's warps wait for their loads with nothing else to issue (ncu: 61 % of cycles
// without an eligible warp, 1.3 TB/s); twice the warps, each with half the steps, keep the same
// bytes in flight and overlap one warp's arithmetic with another's loads, as the many-wave
// products do (31B gate_up: 2.2 TB/s). The pair's two sums meet lane by lane in shared memory
// before the warp sum: each lane's value is its even steps' sum plus its odd steps' sum, an order
// of additions of its own (not the register kernel's bits; within the op harness's budget).
// At most 80 registers (6 blocks, 24 warps per SM): the 31B's products need 20.4 warps per SM
// for one wave (95 without the bound: 5 blocks, a second wave of 12 blocks). Measured (H100,
// bench/RESULTS.md twenty-seventh session): 31B down 46.8 -> 39.2 us, o_proj 19.1 -> 16.2, decode
// +7 %; Qwen3.5-4B down (640 warps of 4 rows, where the register kernel takes 2 rows per warp)
// 13.5 -> 11.3 us; no gain on products of several waves.
template <int kGroup, int kRows, int kUnroll>
__global__ void __launch_bounds__(4 * kWarp, 6) matvec_hfq4_rows_split_kernel(MatvecArgs a, bool vector_x, bool prefetch) {
  using L = Hfq4Lanes<kGroup>;
  __shared__ float odd_sums[2][kRows][kWarp];  // [pair][row][lane]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, pair = warp / 2, half = warp % 2;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int64_t M = a.M, row_bytes = a.row_bytes;
  const int64_t m_first = (static_cast<int64_t>(blockIdx.x) * 2 + pair) * kRows;
  if (prefetch && half == 0) prefetch_rows(RowsTarget{a.out, a.weight, M, row_bytes, 0}, m_first, kRows);
  enter_kernel();
  const int64_t n_blocks = (a.K + kGroup - 1) / kGroup;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {  // rows past M re-read the last row and are not stored
    const int64_t m = m_first + r < M ? m_first + r : M - 1;
    rows[r] = a.weight + m * row_bytes + 8 * sub;
  }
  float acc[kRows];
  const GlobalInputRow input[1] = {{a.x, a.K, vector_x}};
  accumulate_hfq4_rows<kGroup, kRows, kUnroll, 2>(acc, rows, input, lane_block + half * L::kBlocksPerStep, n_blocks);
  if (half == 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) odd_sums[pair][r][lane] = acc[r];
  }
  __syncthreads();  // (every warp reaches it: rows past M are computed, not stored)
  if (half == 1) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float value = warp_sum(acc[r] + odd_sums[pair][r][lane]);
    if (lane == 0 && m_first + r < M) a.out[m_first + r] = value;
  }
}

// Decode's expert down products with their combine (moe_experts on the per-pair path, up to
// kMaxPairs pairs per token): warp w of block (x, t) owns output row m of token t and takes the
// token's pairs' rows m (each pair's expert) against the pairs' inputs, every dot the rows
// kernel's (accumulate_hfq4_rows: a lane's blocks in order, then warp_sum), then
//   out[t, m] = sum over the pairs in ascending expert id (a stable order) of fmaf(dot, weight, sum),
// moe_combine_kernel's sum: the bits of the rows kernel's [pairs, M] outputs and the combine,
// without their round trip through memory and the combine's launch. A pair with id -1 (another
// rank's, --ep) adds nothing; its loads read expert 0's row.
template <int kGroup, int kMaxPairs, int kUnroll>
__global__ void __launch_bounds__(4 * kWarp, 4) matvec_hfq4_pairs_sum_kernel(MatvecArgs a, const float* pair_weights,
                                                                         int top_k, bool vector_x) {
  using L = Hfq4Lanes<kGroup>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int64_t t = blockIdx.y, m = static_cast<int64_t>(blockIdx.x) * 4 + warp;
  enter_kernel();
  if (m >= a.M) return;
  int32_t ids[kMaxPairs];
  const uint8_t* rows[kMaxPairs];
  GlobalInputRow inputs[kMaxPairs];
#pragma unroll
  for (int r = 0; r < kMaxPairs; ++r) {  // pairs past top_k repeat pair 0 and are not summed
    const int64_t pair = t * top_k + (r < top_k ? r : 0);
    ids[r] = r < top_k ? a.expert_ids[pair] : -1;
    const int64_t expert = ids[r] >= 0 ? ids[r] : 0;
    rows[r] = a.weight + expert * a.expert_bytes + m * a.row_bytes + 8 * sub;
    inputs[r] = GlobalInputRow{a.x + pair * a.x_stride, a.K, vector_x};
  }
  float acc[kMaxPairs];
  accumulate_hfq4_rows<kGroup, kMaxPairs, kUnroll, 1, kMaxPairs>(acc, rows, inputs, lane_block,
                                                                  (a.K + kGroup - 1) / kGroup);
  float dot[kMaxPairs];
  int rank[kMaxPairs];  // a pair's place in ascending id order, ties in pair order (a stable sort)
#pragma unroll
  for (int r = 0; r < kMaxPairs; ++r) {
    dot[r] = warp_sum(acc[r]);
    rank[r] = 0;
#pragma unroll
    for (int s = 0; s < kMaxPairs; ++s)
      if (s < top_k && (ids[s] < ids[r] || (ids[s] == ids[r] && s < r))) ++rank[r];
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPairs; ++j) {
    if (j >= top_k) break;
    float d = 0.0f, w = 0.0f;
    bool skip = true;
#pragma unroll
    for (int r = 0; r < kMaxPairs; ++r)
      if (r < top_k && rank[r] == j) d = dot[r], w = pair_weights[t * top_k + r], skip = ids[r] < 0;
    if (!skip) sum = fmaf(d, w, sum);  // (moe_combine_kernel's FMA)
  }
  if (lane == 0) a.out[t * a.out_stride + m] = sum;
}

#if !defined(FIRELINE_GPU_HIP)
// The shared memory of matvec_hfq4_rows_async_kernel: per warp, kStages transaction barriers and
// kStages stages of kRows row chunks. A chunk is kSteps warp steps of blocks (8 G256 or 16 G128
// blocks: 1088 or 1152 bytes, whole 16-byte units), copied as the row's bytes are laid out, with
// 16 bytes of room: a row that starts 8 bytes past a 16-byte boundary (odd rows of a matrix with
// an odd number of blocks per row) is copied from the boundary before it.
template <int kGroup, int kRows, int kSteps, int kStages, int kWarps>
struct Hfq4BulkRing {
  using L = Hfq4Lanes<kGroup>;
  static constexpr int kChunkBlocks = kSteps * L::kBlocksPerStep;
  static constexpr int kChunkBytes = kChunkBlocks * L::kBlockBytes;
  static_assert(kChunkBytes % 16 == 0, "chunks of whole 16-byte units keep every chunk's shift the row's");
  static constexpr int kSlotBytes = kChunkBytes + 16;
  static constexpr int kStageBytes = kRows * kSlotBytes;
  static constexpr int kBarrierBytes = (kWarps * kStages * 8 + 15) / 16 * 16;
  static constexpr size_t kBytes = kBarrierBytes + static_cast<size_t>(kWarps) * kStages * kStageBytes;
};

// matvec_hfq4_rows_kernel's products (one input per matrix: plain, grouped, gated or expert pairs)
// with the weights streamed into shared memory by bulk copies (cp.async.bulk, the Hopper copy
// engine), for products whose grid is about one wave. The register kernel holds its loads in
// registers and waits for all of them before any arithmetic, so a warp's bytes in flight drop to
// none while it computes; ncu on the 31B's down matvec (5376 x 21504, one wave of 10 warps per
// SM): 16 % achieved occupancy, 1.37 TB/s, 61 % of cycles with no eligible warp. Here each warp
// keeps kStages - 1 chunks of its rows in flight while it computes one: its lane 0 issues a bulk
// copy per row and chunk (one instruction for ~1 KB; the cp.async form before this one spent two
// 8-byte copies per lane, row and step, and ran 10-40 % slower than the register kernel: L1 80 %
// busy, bench/RESULTS.md twenty-sixth session), and the warp waits on the chunk's transaction
// barrier. Without expert ids the first chunks are issued before enter_kernel(): weights are never
// written by a kernel, so they may load while the previous kernel finishes (expert ids are the
// previous kernel's output). Each lane adds the same terms in the same order as the register
// kernel (its blocks in order, then warp_sum; gated: act(gate) * up from the two sums), so the
// bits are that kernel's. sm_90a only (the launcher checks); elsewhere the body traps. Measured
// (H100): 2-3 % faster than the register kernel on one-wave products with long rows (31B down,
// o_proj at 4 rows), 10-45 % slower with several waves (4 blocks per SM for the shared memory),
// decode 6-13 % slower: L1 (the copies' writes, the lanes' reads and the input loads) saturates
// first. Off by default (BackendOptions::async_matvec).
template <int kGroup, int kRows, int kSteps, int kStages, int kWarps, bool kGated>
__global__ void __launch_bounds__(kWarps * kWarp) matvec_hfq4_rows_async_kernel(MatvecArgs a, bool vector_x) {
#if FIRELINE_GPU_HOPPER
  using L = Hfq4Lanes<kGroup>;
  using Ring = Hfq4BulkRing<kGroup, kRows, kSteps, kStages, kWarps>;
  static_assert(kStages >= 2, "a chunk computes while the next loads");
  static_assert(!kGated || kRows % 2 == 0, "gated: pairs of gate and up rows");
  constexpr int kOuts = kGated ? kRows / 2 : kRows;  // outputs per warp
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared_bytes) + warp * kStages;
  unsigned char* ring = shared_bytes + Ring::kBarrierBytes + static_cast<size_t>(warp) * kStages * Ring::kStageBytes;
  const RowsTarget target = rows_target(a);
  const int64_t M = target.M, row_bytes = target.row_bytes;
  const int64_t m_first = (target.block * kWarps + warp) * kOuts;
  const int64_t n_blocks = (a.K + kGroup - 1) / kGroup;
  const int64_t n_chunks = (n_blocks + Ring::kChunkBlocks - 1) / Ring::kChunkBlocks;
  // gated: the up rows' matrix (a separate one, or the stack's rows M .. 2M - 1)
  const uint8_t* up_matrix = kGated ? (a.up_weight ? a.up_weight : target.matrix + M * row_bytes) : nullptr;
  // Each row's first byte at the 16-byte boundary at or before it, and how far past it the row
  // starts (0 or 8: blocks are whole 8-byte units), from the matrices at `offset` bytes (an
  // expert's). Rows past M re-read the last row and are not stored.
  const uint8_t* row_copy[kRows];
  int row_shift[kRows];
  auto point_rows = [&](int64_t offset) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t m = m_first + r % kOuts;
      const uint8_t* row = (kGated && r >= kOuts ? up_matrix : target.matrix) + offset + (m < M ? m : M - 1) * row_bytes;
      row_shift[r] = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
      row_copy[r] = row - row_shift[r];
    }
  };
  // Chunk i of the rows into slot `slot` (lane 0): bytes past the row's end up to the next
  // 16-byte boundary come along (at most 8: inside the weight arena's 256-byte padding) and are
  // never read.
  auto issue = [&](int64_t i, int64_t slot) {
    if (lane != 0 || i >= n_chunks) return;
    const int64_t blocks = n_blocks - i * Ring::kChunkBlocks < Ring::kChunkBlocks ? n_blocks - i * Ring::kChunkBlocks
                                                                                   : Ring::kChunkBlocks;
    const uint32_t bytes = static_cast<uint32_t>(blocks * L::kBlockBytes);
    uint32_t total = 0, copy_bytes[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) total += copy_bytes[r] = (row_shift[r] + bytes + 15) / 16 * 16;
    uint64_t* barrier = barriers + slot;
    mbarrier_arrive_expect_tx(barrier, total);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      bulk_copy_to_shared(ring + slot * Ring::kStageBytes + r * Ring::kSlotBytes,
                          row_copy[r] + i * Ring::kChunkBytes, copy_bytes[r], barrier);
  };
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(barriers + s, 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  const bool active = m_first < M, early = active && !a.expert_ids;
  // Chunks this warp has waited for, over all its inputs: chunk i of an input waits in slot
  // (done + i) % kStages for that slot's phase (done + i) / kStages.
  int64_t done = 0;
  if (early) {
    point_rows(0);
    for (int i = 0; i + 1 < kStages; ++i) issue(i, i);
  }
  enter_kernel();
  if (!active) return;
  for (int64_t g = blockIdx.y; g < a.n_inputs; g += gridDim.y) {
    if (a.expert_ids) {  // (without expert ids there is one input: its chunks went out early)
      const int32_t expert = a.expert_ids[g];
      if (expert < 0) continue;  // a pair another rank runs (--ep): nothing to compute or store
      point_rows(static_cast<int64_t>(expert) * a.expert_bytes);
      for (int i = 0; i + 1 < kStages; ++i) issue(i, (done + i) % kStages);
    }
    const float* x = a.x + (g / a.x_row_div) * a.x_stride;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int64_t i = 0; i < n_chunks; ++i) {
      // Every lane has read chunk i - 1 (its slot is the one refilled): generic reads, then the
      // copy engine's writes.
      __syncwarp();
      if (lane == 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      issue(i + kStages - 1, (done + i + kStages - 1) % kStages);
      const int64_t k = done + i;
      mbarrier_wait_parity(barriers + k % kStages, static_cast<uint32_t>((k / kStages) & 1));
      const unsigned char* stage = ring + (k % kStages) * Ring::kStageBytes;
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        const int j = lane_block + u * L::kBlocksPerStep;  // block within the chunk
        if (i * Ring::kChunkBlocks + j >= n_blocks) break;
        float xv[16];
        const float x_sum = load_x16(x, (i * Ring::kChunkBlocks + j) * kGroup + 16 * sub, a.K, vector_x, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const unsigned char* block = stage + r * Ring::kSlotBytes + row_shift[r] + j * L::kBlockBytes;
          const float2 scale_min = *reinterpret_cast<const float2*>(block);
          acc[r] += hfq4_lane_dot(*reinterpret_cast<const uint2*>(block + 8 + 8 * sub), scale_min.x, scale_min.y, xv,
                                  x_sum);
        }
      }
    }
    done += n_chunks;
#pragma unroll
    for (int r = 0; r < kOuts; ++r) {
      float value = warp_sum(acc[r]);
      if constexpr (kGated) value = gated_value(value, warp_sum(acc[r + kOuts]), a.act);
      if (lane == 0 && m_first + r < M) target.out[g * a.out_stride + m_first + r] = value;
    }
  }
#else
  __trap();
#endif
}
#endif

// Several inputs on HFQ4 rows (prefill and batched decode steps below the GEMM's threshold): one
// warp per row, each lane's codes read once for up to kT inputs, each input's sum built exactly
// as matvec_hfq4_rows_kernel builds it.
template <int kGroup, int kT>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp) matvec_hfq4_tokens_kernel(MatvecArgs a, bool vector_x) {
  using L = Hfq4Lanes<kGroup>;
  enter_kernel();
  const int lane = threadIdx.x % kWarp, sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (m >= a.M) return;
  const int64_t n_blocks = (a.K + kGroup - 1) / kGroup, n_groups = (a.n_inputs + kT - 1) / kT;
  const uint8_t* row = a.weight + m * a.row_bytes + 8 * sub;
  for (int64_t g = blockIdx.y; g < n_groups; g += gridDim.y) {
    const int64_t first_input = g * kT;
    const int count = static_cast<int>(a.n_inputs - first_input < kT ? a.n_inputs - first_input : kT);
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
    for (int64_t b = lane_block; b < n_blocks; b += L::kBlocksPerStep) {
      const uint8_t* p = row + b * L::kBlockBytes;
      const uint2 codes = *reinterpret_cast<const uint2*>(p + 8);
      const float2 scale_min = *reinterpret_cast<const float2*>(p - 8 * sub);
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if (t < count) {
          float xv[16];
          const float* x = a.x + ((first_input + t) / a.x_row_div) * a.x_stride;
          const float x_sum = load_x16(x, b * kGroup + 16 * sub, a.K, vector_x, xv);
          acc[t] += hfq4_lane_dot(codes, scale_min.x, scale_min.y, xv, x_sum);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0 && t < count) a.out[(first_input + t) * a.out_stride + m] = sum;
    }
  }
}

// Whether the matvec's 16-byte x loads are allowed: every input row 16-byte aligned (an aligned
// base and, with several input rows, a stride of whole float4s).
bool vector_x_ok(const MatvecArgs& a) {
  return reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (a.x_stride % 4 == 0 || (a.n_inputs - 1) / a.x_row_div == 0);
}

template <DType F, int kRows>
cudaError_t launch_rows(MatvecArgs a, cudaStream_t stream) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarpsPerBlock) * kRows;
  const int64_t blocks = number_row_blocks(a, rows_per_block);
  if (blocks == 0) return cudaSuccess;  // every segment empty
  const unsigned row_blocks = static_cast<unsigned>(blocks);
  const unsigned y = static_cast<unsigned>(a.n_inputs < 65535 ? a.n_inputs : 65535);
  const bool vector_x = vector_x_ok(a);
  // The L2 prefetch before enter_kernel() pays only when the whole grid is resident while the
  // previous kernel runs (one wave: the small matrices of a decode step); a multi-wave grid's
  // later blocks start after it anyway, and there the prefetches only add L2 requests (31B
  // decode 54 -> 50 tok/s with them on every matrix).
  const bool prefetch = a.weight_prefetch && !a.expert_ids && blocks * y <= 2 * static_cast<int64_t>(current_device_traits().sm_count);
  // 8 chunks in flight per lane whatever kRows: 4 rows x 4 chunks took 178 registers (one
  // block per SM); 4 x 2 keeps two blocks resident.
  return launch_kernel(matvec_rows_kernel<F, kRows, 8 / kRows>, dim3(row_blocks, y), kWarpsPerBlock * kWarp, 0, stream,
                       a, vector_x, prefetch);
}

// Row blocks the rows kernel would launch with kRows rows per warp (all segments, all inputs).
int64_t row_blocks_at(const MatvecArgs& a, int k_rows) {
  const int64_t per_block = static_cast<int64_t>(kWarpsPerBlock) * k_rows;
  if (a.n_segments == 0) return (a.M + per_block - 1) / per_block * a.n_inputs;
  int64_t blocks = 0;
  for (int s = 0; s < a.n_segments; ++s) blocks += (a.segments[s].M + per_block - 1) / per_block;
  return blocks;
}

// Warps a rows launch would run with kRows rows per warp (all segments, all inputs).
int64_t row_warps_at(const MatvecArgs& a, int k_rows) {
  int64_t warps = 0;
  if (a.n_segments == 0) return (a.M + k_rows - 1) / k_rows * a.n_inputs;
  for (int s = 0; s < a.n_segments; ++s) warps += (a.segments[s].M + k_rows - 1) / k_rows;
  return warps;
}

template <int kGroup, int kRows, int kUnroll>
cudaError_t launch_hfq4_rows(MatvecArgs a, cudaStream_t stream) {
  constexpr int kWarps = 4;  // 4-warp blocks: a large matrix's blocks spread more evenly (H200)
  const int64_t outs_per_block = static_cast<int64_t>(kWarps) * (a.gated ? kRows / 2 : kRows);
  const int64_t blocks = number_row_blocks(a, outs_per_block);
  if (blocks == 0) return cudaSuccess;
  const unsigned y = static_cast<unsigned>(a.n_inputs < 65535 ? a.n_inputs : 65535);
  const bool prefetch = a.weight_prefetch && !a.expert_ids && blocks * y <= 4 * static_cast<int64_t>(current_device_traits().sm_count);
  if constexpr (kRows % 2 == 0) {
    if (a.gated)
      return launch_kernel(matvec_hfq4_rows_kernel<kGroup, kRows, kUnroll, kWarps, true>,
                           dim3(static_cast<unsigned>(blocks), y), kWarps * kWarp, 0, stream, a, vector_x_ok(a), prefetch);
  }
  if (a.gated) return cudaErrorInvalidValue;
  return launch_kernel(matvec_hfq4_rows_kernel<kGroup, kRows, kUnroll, kWarps, false>,
                       dim3(static_cast<unsigned>(blocks), y), kWarps * kWarp, 0, stream, a, vector_x_ok(a), prefetch);
}

// Routed expert pairs on the rows kernel at a shape of their own (MatvecArgs::expert_rows /
// expert_steps; 4-warp blocks; the choice: expert_rows_plan.h). Why: the 26B-A4B's gate_up pairs
// (8 x 1408 rows of 11 G256 blocks, 6 warp steps) ran at the plain products' 4 rows and 2 steps:
// 2816 warps, ~1.07 waves at 5 blocks per SM, each warp waiting out 3 rounds of DRAM latency
// (14.3 us a layer in the H100's replayed step for 17.8 MB).

// Launches per shape of kExpertRowsShapes, in its order (expert_rows_launches).
std::atomic<int64_t> g_expert_rows_launches[std::size(kExpertRowsShapes)];

template <int kGroup, int kRows, int kSteps>
cudaError_t launch_expert_rows_shape(MatvecArgs& a, int64_t blocks, cudaStream_t stream) {
  const unsigned y = static_cast<unsigned>(a.n_inputs < 65535 ? a.n_inputs : 65535);
  const dim3 grid(static_cast<unsigned>(blocks), y);
  const cudaError_t err =
      a.expert_ring ? launch_kernel(matvec_hfq4_rows_kernel<kGroup, kRows, kSteps, 4, false, true>, grid, 4 * kWarp, 0,
                                    stream, a, vector_x_ok(a), false)
                    : launch_kernel(matvec_hfq4_rows_kernel<kGroup, kRows, kSteps, 4, false>, grid, 4 * kWarp, 0,
                                    stream, a, vector_x_ok(a), false);
  for (size_t i = 0; i < std::size(kExpertRowsShapes); ++i)
    if (err == cudaSuccess && kExpertRowsShapes[i] == ExpertRowsShape{kRows, kSteps})
      g_expert_rows_launches[i].fetch_add(1, std::memory_order_relaxed);
  return err;
}
// Blocks of that kernel (the ring form or not) one SM holds (the occupancy API, once per shape).
template <int kGroup, int kRows, int kSteps, bool kRing>
int expert_rows_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, matvec_hfq4_rows_kernel<kGroup, kRows, kSteps, 4, false, kRing>, 4 * kWarp, 0) != cudaSuccess)
      n = 1;
    return n < 1 ? 1 : n;
  }();
  return blocks;
}
template <int kGroup, bool kRing>
int expert_rows_blocks_per_sm(ExpertRowsShape s) {
  switch (s.rows * 10 + s.steps) {
    case 14: return expert_rows_blocks_per_sm<kGroup, 1, 4, kRing>();
    case 24: return expert_rows_blocks_per_sm<kGroup, 2, 4, kRing>();
    case 42: return expert_rows_blocks_per_sm<kGroup, 4, 2, kRing>();
    case 43: return expert_rows_blocks_per_sm<kGroup, 4, 3, kRing>();
    case 44: return expert_rows_blocks_per_sm<kGroup, 4, 4, kRing>();
    case 82: return expert_rows_blocks_per_sm<kGroup, 8, 2, kRing>();
    case 83: return expert_rows_blocks_per_sm<kGroup, 8, 3, kRing>();
    default: return 1;
  }
}

// Launches the pairs at their own shape and returns true (the launch's status in *err), or
// returns false where the plain choice stays (auto's choice, or a shape not built here).
template <int kGroup>
bool launch_hfq4_expert_rows(MatvecArgs a, cudaStream_t stream, cudaError_t* err) {
  ExpertRowsShape shape{a.expert_rows, a.expert_steps};
  if (a.expert_rows < 0)
    shape = auto_expert_rows_shape(a.M, a.K, kGroup, a.n_inputs, current_device_traits().sm_count,
                                   [&](ExpertRowsShape s) {
                                     return a.expert_ring ? expert_rows_blocks_per_sm<kGroup, true>(s)
                                                          : expert_rows_blocks_per_sm<kGroup, false>(s);
                                   });
  // (a shape not built, {0, 0} among them, stays plain before its rows divide anything)
  if (std::find(std::begin(kExpertRowsShapes), std::end(kExpertRowsShapes), shape) == std::end(kExpertRowsShapes))
    return false;
  const int64_t blocks = number_row_blocks(a, 4 * static_cast<int64_t>(shape.rows));
  *err = cudaSuccess;
  if (blocks == 0) return true;
  switch (shape.rows * 10 + shape.steps) {
    case 42: *err = launch_expert_rows_shape<kGroup, 4, 2>(a, blocks, stream); break;
    case 24: *err = launch_expert_rows_shape<kGroup, 2, 4>(a, blocks, stream); break;
    case 43: *err = launch_expert_rows_shape<kGroup, 4, 3>(a, blocks, stream); break;
    case 44: *err = launch_expert_rows_shape<kGroup, 4, 4>(a, blocks, stream); break;
    case 82: *err = launch_expert_rows_shape<kGroup, 8, 2>(a, blocks, stream); break;
    case 83: *err = launch_expert_rows_shape<kGroup, 8, 3>(a, blocks, stream); break;
  }
  return true;
}

std::atomic<int64_t> g_split_matvec_launches{0};  // split_matvec_launches

// matvec_hfq4_rows_split_kernel: 4 rows per warp, 2 warp steps of loads in flight per lane (the
// pairs double the warps: the 4-step kernel's registers would not fit them in one wave).
template <int kGroup>
cudaError_t launch_hfq4_rows_split(const MatvecArgs& a, cudaStream_t stream) {
  constexpr int kRows = 4, kUnroll = 2;
  const int64_t blocks = (a.M + 2 * kRows - 1) / (2 * kRows);
  if (blocks == 0) return cudaSuccess;
  // (its grid is one wave: 6 blocks per SM are resident while the previous kernel finishes)
  const bool prefetch = a.weight_prefetch && blocks <= 6 * static_cast<int64_t>(current_device_traits().sm_count);
  const cudaError_t err = launch_kernel(matvec_hfq4_rows_split_kernel<kGroup, kRows, kUnroll>,
                                        dim3(static_cast<unsigned>(blocks)), 4 * kWarp, 0, stream, a, vector_x_ok(a),
                                        prefetch);
  if (err == cudaSuccess) g_split_matvec_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

std::atomic<int64_t> g_async_matvec_launches{0};  // async_matvec_launches

#if !defined(FIRELINE_GPU_HIP)
template <int kGroup, int kRows>
cudaError_t launch_hfq4_rows_async(MatvecArgs a, cudaStream_t stream) {
  // 4 warps, each with 3 chunks of 4 warp steps (G256, 4 rows: 52 KB a block, 4 blocks per SM)
  constexpr int kWarps = 4, kSteps = 4, kStages = 3;
  if (!a.expert_ids && a.n_inputs != 1) return cudaErrorInvalidValue;  // the kernel's early chunks: one input
  const int64_t blocks = number_row_blocks(a, static_cast<int64_t>(kWarps) * (a.gated ? kRows / 2 : kRows));
  if (blocks == 0) return cudaSuccess;
  const unsigned y = static_cast<unsigned>(a.n_inputs < 65535 ? a.n_inputs : 65535);
  constexpr size_t kShared = Hfq4BulkRing<kGroup, kRows, kSteps, kStages, kWarps>::kBytes;
  const dim3 grid(static_cast<unsigned>(blocks), y);
  auto launch = [&](auto kernel) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kShared));
    if (err == cudaSuccess) err = launch_kernel(kernel, grid, kWarps * kWarp, kShared, stream, a, vector_x_ok(a));
    return err;
  };
  const cudaError_t err = a.gated ? launch(matvec_hfq4_rows_async_kernel<kGroup, kRows, kSteps, kStages, kWarps, true>)
                                  : launch(matvec_hfq4_rows_async_kernel<kGroup, kRows, kSteps, kStages, kWarps, false>);
  if (err == cudaSuccess) g_async_matvec_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

// Whether every matrix the launch reads starts on an 8-byte boundary (the bulk copies round a
// row's start down to 16 bytes and index from there; blocks are whole 8-byte units).
bool rows_start_on_8_bytes(const MatvecArgs& a) {
  auto on_8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  if (!on_8(a.up_weight) || a.expert_bytes % 8 != 0) return false;
  if (a.n_segments == 0) return on_8(a.weight);
  for (int s = 0; s < a.n_segments; ++s)
    if (!on_8(a.segments[s].weight)) return false;
  return true;
}

// Rows per warp for matvec_hfq4_rows_async_kernel (MatvecArgs::async_rows), or 0 for the
// register kernel: on an sm_90 GPU in a build with sm_90a code (bulk copies), rows of 8+ blocks
// (shorter ones are one chunk with nothing to overlap). Its own choice: 4 rows where the register
// kernel would take 4, else 2 (gated products choose as the two products together would).
template <int kGroup>
int async_rows_for(const MatvecArgs& a, int64_t warps_at_4) {
  if (a.async_rows == 0 || !async_matvec_available() || !rows_start_on_8_bytes(a)) return 0;
  if (a.async_rows > 0) return a.async_rows;
  const int64_t n_blocks = (a.K + kGroup - 1) / kGroup;
  if (n_blocks < 8) return 0;
  return warps_at_4 >= 1024 ? 4 : 2;
}
#endif

// MatvecArgs::imma_rows on a product it takes: one input, HFQ4 rows of one matrix or a group of
// them (no gate or experts), a GPU that runs it.
bool takes_imma(const MatvecArgs& a) {
  const bool hfq4 = a.weight_type == DType::hfq4_g256 || a.weight_type == DType::hfq4_g128;
  return a.imma_rows != 0 && hfq4 && a.n_inputs == 1 && !a.expert_ids && !a.gated && (a.n_segments > 0 || a.M > 0) &&
         a.K > 0 && imma_matvec_available();
}

template <int kGroup>
cudaError_t launch_hfq4(const MatvecArgs& a, cudaStream_t stream) {
  if (a.expert_ids || a.n_inputs == 1) {
    // Four rows per warp share each lane's x loads and sum; fewer when that would leave under
    // ~8 warps per SM (H200 matmul variants: a 5376-row matrix fastest at 4 rows per warp, a
    // 2816-row one at 2, a 2048-row one at 2). Gated products choose as the two products
    // together would (2M rows), at least 2 rows per warp (a gate row and its up row).
    MatvecArgs rows = a;
    if (a.gated) rows.M = 2 * a.M;
    const int64_t warps_at_4 = row_warps_at(rows, 4);
#if !defined(FIRELINE_GPU_HIP)
    switch (async_rows_for<kGroup>(a, warps_at_4)) {
      case 2: return launch_hfq4_rows_async<kGroup, 2>(a, stream);
      case 4: return launch_hfq4_rows_async<kGroup, 4>(a, stream);
      default: break;
    }
#endif
    if (a.expert_ids && !a.gated && a.expert_rows != 0) {
      cudaError_t err = cudaSuccess;
      if (launch_hfq4_expert_rows<kGroup>(a, stream, &err)) return err;
    }
    const int64_t n_blocks = (a.K + kGroup - 1) / kGroup;
    const int64_t sms = current_device_traits().sm_count;
    const bool plain = !a.expert_ids && !a.gated && a.n_segments == 0;
    // The integer tensor-core matvec (MatvecArgs::imma_rows, off by default) where asked and its
    // scratch was given (matvec_scratch_bytes).
    if (takes_imma(a) && a.scratch && a.scratch_bytes >= hfq4_imma_scratch_bytes(a.K, kGroup))
      return launch_hfq4_imma(a, kGroup, stream);
    // Pairs of warps that split each row's steps (MatvecArgs::split_rows): plain rows of 32+ blocks
    // whose 4-row warps make at most about one wave and whose 8-row blocks give every SM two or
    // more (H100: 31B down 46.8 -> 39.2 us, o_proj 19.1 -> 16.2, Qwen3.5-4B down at 640 warps
    // 13.5 -> 11.3; products of several waves gained nothing, 31B gate_up and q/k/v 0 %).
    if (a.split_rows != 0 && plain && n_blocks >= 32 &&
        (a.split_rows == 2 || (warps_at_4 <= 12 * sms && (a.M + 7) / 8 >= 2 * sms)))
      return launch_hfq4_rows_split<kGroup>(a, stream);
    if (warps_at_4 >= 1024) {
      // Four warp steps of loads in flight instead of two when the grid is about one wave of the
      // 4-step kernel (128 registers with nvcc 13, 168 with 12: 12-16 warps per SM) and the rows
      // are long (32+ blocks; now the gated, grouped and expert products of that shape): then
      // the bytes in flight per SM bound the product (bandwidth_bench, the load pattern alone on
      // the 31B's down: 1.75 TB/s at 2 steps, 3.39 at 4; the kernel: o_proj 17.6 -> 15.2 us, down
      // 44.0 -> 41.1). With several waves, or short rows, the 2-step kernel's occupancy and
      // shorter tail won (31B gate_up 56.3 vs 57.6 us, q/k/v 23.2 vs 26.4, 26B q_proj 5.8 vs 6.9).
      if (warps_at_4 <= 12 * sms && n_blocks >= 32) return launch_hfq4_rows<kGroup, 4, 4>(a, stream);
      return launch_hfq4_rows<kGroup, 4, 2>(a, stream);
    }
    if (a.gated || row_warps_at(rows, 2) >= 512) return launch_hfq4_rows<kGroup, 2, 4>(a, stream);
    return launch_hfq4_rows<kGroup, 1, 4>(a, stream);
  }
  if (a.gated) return cudaErrorInvalidValue;  // matvec_gated_supported
  const unsigned row_blocks = static_cast<unsigned>((a.M + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int64_t groups = (a.n_inputs + kTokens - 1) / kTokens;
  const unsigned y = static_cast<unsigned>(groups < 65535 ? groups : 65535);
  return launch_kernel(matvec_hfq4_tokens_kernel<kGroup, kTokens>, dim3(row_blocks, y), kWarpsPerBlock * kWarp, 0,
                       stream, a, vector_x_ok(a));
}

template <DType F>
cudaError_t launch_format(const MatvecArgs& a, cudaStream_t stream) {
  if constexpr (F == DType::hfq4_g256) {
    return launch_hfq4<256>(a, stream);
  } else if constexpr (F == DType::hfq4_g128) {
    return launch_hfq4<128>(a, stream);
  } else {
    // One input per matrix (decode, expert pairs): rows share each lane's x registers. Four rows
    // per warp cut x traffic 4x but make 32 rows per block, so a small matrix (k_proj of a global
    // layer: 1024 rows) would leave most of the 132 SMs idle; fewer rows per warp while the grid
    // would have under two blocks per SM.
    if (a.expert_ids || a.n_inputs == 1) {
      if (row_blocks_at(a, 4) >= 264) return launch_rows<F, 4>(a, stream);
      if (row_blocks_at(a, 2) >= 132) return launch_rows<F, 2>(a, stream);
      return launch_rows<F, 1>(a, stream);
    }
    // Several inputs (prefill, batched decode) share each weight load across kTokens
    // accumulators, with 4 chunks in flight.
    const unsigned row_blocks = static_cast<unsigned>((a.M + kWarpsPerBlock - 1) / kWarpsPerBlock);
    const int64_t groups = (a.n_inputs + kTokens - 1) / kTokens;
    const unsigned y = static_cast<unsigned>(groups < 65535 ? groups : 65535);
    return launch_kernel(matvec_kernel<F, kTokens, 4>, dim3(row_blocks, y), kWarpsPerBlock * kWarp, 0, stream, a);
  }
}

}  // namespace

cudaError_t launch_matvec_group(const MatvecArgs& a, cudaStream_t stream) {
  if (a.n_segments <= 0 || a.n_segments > kMaxMatvecSegments || a.n_inputs != 1 || a.expert_ids)
    return cudaErrorInvalidValue;
  cudaError_t result = cudaErrorInvalidValue;
  dispatch_weight_format(a.weight_type, [&](auto format) { result = launch_format<decltype(format)::value>(a, stream); });
  return result;
}

bool takes_mma(const MatvecArgs& a) {
  return !a.gated && !a.expert_ids && a.n_segments == 0 && a.n_inputs >= kMmaMinInputs &&
         matmul_mma_supports(a.weight_type);
}

bool matvec_gated_supported(const MatvecArgs& a) {
  return (a.weight_type == DType::hfq4_g256 || a.weight_type == DType::hfq4_g128) && a.n_segments == 0 &&
         (a.expert_ids || a.n_inputs == 1);
}

size_t matvec_scratch_bytes(const MatvecArgs& a) {
  if (takes_mma(a)) return matmul_mma_scratch_bytes(a, a.act_pieces);
  if (takes_imma(a)) return hfq4_imma_scratch_bytes(a.K, a.weight_type == DType::hfq4_g256 ? 256 : 128);
  return 0;
}

std::atomic<int64_t> g_pairs_sum_launches{0};  // hfq4_pairs_sum_launches

constexpr int kMaxSummedPairs = 8;

bool hfq4_pairs_sum_takes(const MatvecArgs& a, int64_t top_k) {
  const bool hfq4 = a.weight_type == DType::hfq4_g256 || a.weight_type == DType::hfq4_g128;
  return hfq4 && a.expert_ids && !a.gated && a.n_segments == 0 && top_k >= 1 && top_k <= kMaxSummedPairs &&
         a.n_inputs % top_k == 0 && a.n_inputs / top_k <= 65535 && a.x_row_div == 1;
}

cudaError_t launch_hfq4_pairs_sum(const MatvecArgs& a, const float* pair_weights, int top_k, cudaStream_t stream) {
  if (!hfq4_pairs_sum_takes(a, top_k) || !pair_weights) return cudaErrorInvalidValue;
  const int64_t tokens = a.n_inputs / top_k;
  if (a.M == 0 || tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((a.M + 3) / 4), static_cast<unsigned>(tokens));
  // 2 warp steps of loads in flight per lane: the experts' rows are short (26B-A4B down: 6 G128
  // blocks, 2 steps), so one round of loads covers them. Pair slots: the fewest of 2, 4 or 8 that
  // hold top_k (slots past it repeat pair 0's loads).
  auto launch = [&](auto kernel) {
    return launch_kernel(kernel, grid, 4 * kWarp, 0, stream, a, pair_weights, top_k, vector_x_ok(a));
  };
  const bool g256 = a.weight_type == DType::hfq4_g256;
  cudaError_t err;
  if (top_k <= 2) {
    err = g256 ? launch(matvec_hfq4_pairs_sum_kernel<256, 2, 2>) : launch(matvec_hfq4_pairs_sum_kernel<128, 2, 2>);
  } else if (top_k <= 4) {
    err = g256 ? launch(matvec_hfq4_pairs_sum_kernel<256, 4, 2>) : launch(matvec_hfq4_pairs_sum_kernel<128, 4, 2>);
  } else {
    err = g256 ? launch(matvec_hfq4_pairs_sum_kernel<256, kMaxSummedPairs, 2>)
               : launch(matvec_hfq4_pairs_sum_kernel<128, kMaxSummedPairs, 2>);
  }
  if (err == cudaSuccess) g_pairs_sum_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

int64_t hfq4_pairs_sum_launches() { return g_pairs_sum_launches.load(std::memory_order_relaxed); }

int64_t async_matvec_launches() { return g_async_matvec_launches.load(std::memory_order_relaxed); }
int64_t split_matvec_launches() { return g_split_matvec_launches.load(std::memory_order_relaxed); }
ExpertRowsShape plain_expert_rows_shape(int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count) {
  // launch_hfq4's rule for one-input rows (expert pairs: no gate, no segments, no split kernel)
  if (group <= 0) return {};
  const int64_t warps_at_4 = (M + 3) / 4 * n_pairs, n_blocks = (K + group - 1) / group;
  if (warps_at_4 >= 1024)
    return warps_at_4 <= 12 * static_cast<int64_t>(sm_count) && n_blocks >= 32 ? ExpertRowsShape{4, 4}
                                                                                 : ExpertRowsShape{4, 2};
  return (M + 1) / 2 * n_pairs >= 512 ? ExpertRowsShape{2, 4} : ExpertRowsShape{1, 4};
}

int64_t expert_rows_cost(ExpertRowsShape shape, int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count,
                         int blocks_per_sm) {
  if (shape.rows <= 0 || shape.steps <= 0 || group <= 0 || group > 512) return 0;
  const int64_t per_block = 4 * static_cast<int64_t>(shape.rows), blocks = (M + per_block - 1) / per_block * n_pairs;
  const int64_t wave = static_cast<int64_t>(sm_count) * (blocks_per_sm < 1 ? 1 : blocks_per_sm);
  const int64_t blocks_per_step = 512 / group;  // (Hfq4Lanes: 16 weights a lane)
  const int64_t steps = ((K + group - 1) / group + blocks_per_step - 1) / blocks_per_step;
  return (blocks + wave - 1) / wave * ((steps + shape.steps - 1) / shape.steps);
}

ExpertRowsShape auto_expert_rows_shape(int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count,
                                       const std::function<int(ExpertRowsShape)>& blocks_per_sm) {
  // (at most one token's pairs: where it was measured; several tokens' launches stay plain)
  if (M <= 0 || K <= 0 || n_pairs <= 0 || n_pairs > kExpertRowsAutoMaxPairs || sm_count <= 0 ||
      (group != 128 && group != 256))
    return {};
  const ExpertRowsShape plain = plain_expert_rows_shape(M, K, group, n_pairs, sm_count);
  if (expert_rows_cost(plain, M, K, group, n_pairs, sm_count, blocks_per_sm(plain)) < 3) return {};
  ExpertRowsShape best;
  int64_t best_cost = 0;
  for (const ExpertRowsShape s : kExpertRowsShapes) {
    const int64_t cost = expert_rows_cost(s, M, K, group, n_pairs, sm_count, blocks_per_sm(s));
    if (best_cost == 0 || cost < best_cost) best_cost = cost, best = s;
  }
  return best;
}

int expert_rows_blocks_per_sm(ExpertRowsShape shape, int group, bool ring) {
  if (ring)
    return group == 128 ? expert_rows_blocks_per_sm<128, true>(shape) : expert_rows_blocks_per_sm<256, true>(shape);
  return group == 128 ? expert_rows_blocks_per_sm<128, false>(shape) : expert_rows_blocks_per_sm<256, false>(shape);
}

int64_t matvec_weight_bytes(const MatvecArgs& a) {
  if (a.n_segments == 0) return a.M * a.row_bytes;
  int64_t bytes = 0;
  for (int i = 0; i < a.n_segments; ++i) bytes += a.segments[i].M * a.segments[i].row_bytes;
  return bytes;
}

int64_t expert_rows_launches(int rows, int steps) {
  int64_t n = 0;
  for (size_t i = 0; i < std::size(kExpertRowsShapes); ++i)
    if ((rows == 0 && steps == 0) || kExpertRowsShapes[i] == ExpertRowsShape{rows, steps})
      n += g_expert_rows_launches[i].load(std::memory_order_relaxed);
  return n;
}

bool async_matvec_available() { return sm90a_kernels_available(); }

cudaError_t launch_matvec(const MatvecArgs& a, cudaStream_t stream) {
  if (a.n_segments != 0) return cudaErrorInvalidValue;  // launch_matvec_group
  if (a.gated && !matvec_gated_supported(a)) return cudaErrorInvalidValue;
  if (a.M == 0 || a.n_inputs == 0) return cudaSuccess;
  if (takes_mma(a)) return launch_matmul_mma(a, a.act_pieces, stream);
  cudaError_t result = cudaErrorInvalidValue;
  dispatch_weight_format(a.weight_type, [&](auto format) { result = launch_format<decltype(format)::value>(a, stream); });
  return result;
}

}  // namespace fl::cuda
