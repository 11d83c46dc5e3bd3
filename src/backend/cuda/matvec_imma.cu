// One-input HFQ4 matrix-vector products on the integer tensor cores (mma.sync m16n8k32, s8 x s8
// -> s32; sm_80 and later): out[m] = sum_k x[k] W[m, k] for a plain matrix or a group of them
// sharing the input (q/k/v: one pieces launch for all; no gate or experts),
// BackendOptions::imma_matvec.
//
// Why: the register kernel (matmul.cu) spends ~2.9 instructions per weight (a byte permute and an
// FMA each, plus the lane's input loads and their sum), and on the large many-wave products that
// issue rate, not DRAM, bounds it (ncu, 31B gate_up on an H100: 0.71 warps issued per scheduler
// and cycle, its time scaling with the SM clock; bench/RESULTS.md twenty-seventh session). Here a
// lane turns a word of 8 codes into mma operands with a mask, a shift and a mask, and one mma
// multiplies 16 rows x 32 codes by the input: ~0.7 instructions per weight.
//
// The input. hfq4_imma_pieces_kernel (or the kernel that wrote x: imma_pieces.cuh) cuts x into 4
// int8 pieces per element under one exponent per weight group (kGroup elements): with E such that
// max |x| < 2^E over the group, x' = x 2^(6-E) lies in (-64, 64) and
//   x' = i0 + 2^-7 (i1 + 2^-7 (i2 + 2^-7 (i3 + r))),   i0..i3 rounded to nearest, |r| <= 1/2,
// every step exact in f32 (power-of-two scalings, and differences that keep a value's low bits),
// |i0..i3| <= 64. So an element is kept to within 2^(E-28): exactly for the group's elements
// within 2^-4 of its largest, and for the smaller ones an absolute error far under the rounding
// of an f32 sum over the group. The pieces are the B operand's columns 0..3 (4..7 are zero), the
// codes (0..15, exact as s8) the A operand, and the s32 sums are exact. Per group and row:
//   sum_k x_k (s c_k + m) = s 2^(E-6) (C0 + 2^-7 C1 + 2^-14 C2 + 2^-21 C3) + m sum_k x_k
// with C_p = sum_k c_k i_p,k and sum_k x_k the f32 sum the pieces kernel writes beside the
// exponent. The result is not the register kernel's (an f32 chain of its own order); the op
// harness holds it to the CPU oracle (CudaOps.ImmaMatvecMatchesTheOracle).
//
// The k order. A lane's A registers hold 4 consecutive logical k per row and register; any
// bijection between logical k and the group's codes works if the B registers follow the same one,
// so each lane takes its code bytes in memory order: lane (g = lane / 4, t = lane % 4) reads
// kGroup / 8 bytes of rows g and g + 8, at byte t * kGroup / 8 of the group's codes; for the
// group's mma j, word j of those: its low nibbles (a mask) are a0 / a1 (rows g, g + 8; logical k
// 4t .. 4t + 3), its high nibbles (a shift and a mask) a2 / a3 (logical k 16 + 4t ..). Byte b of
// the codes holds code 2b (low nibble) and 2b + 1, so logical k = 4t + q of mma j is the group's
// code t kGroup/4 + 8j + 2q and logical 16 + 4t + q the one after it. The pieces kernel stores
// each piece in that order: per group, piece p, lane group t and mma j, 8 bytes: the even
// elements' pieces (b0), then the odd ones' (b1).
//
// Work split: a block is 8 warps, 8 / kSplit row tiles of 16 rows, kSplit warps per tile that
// take every kSplit-th group; their sums meet in shared memory in a fixed order. The launcher
// picks kSplit (1, 2, 4 or 8). A warp keeps the next group's codes and pieces
// in flight while it multiplies one; its first group's codes are loaded before enter_kernel()
// (weights are never written by a kernel).
#include <atomic>
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/imma_pieces.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matvec_rows.cuh"

namespace fl::cuda {

namespace {
std::atomic<int64_t> g_imma_matvec_launches{0};  // imma_matvec_launches
std::atomic<int64_t> g_imma_pieces_launches{0};  // imma_pieces_launches
std::atomic<int64_t> g_imma_lean_launches{0};    // imma_lean_launches
}

#if !defined(FIRELINE_GPU_HIP)
namespace {

// c += a * b: A 16 x 32 (row-major) and B 32 x 8 (column-major) s8, s32 accumulators.
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher never runs it below sm_80
#endif
}

// x [K] -> per group: the 4 pieces in the matvec's k order (pieces, kPieceBytes per group), and
// (2^(E-6), sum of the group's x) after them (imma_group_scales; cut_imma_group, imma_pieces.cuh).
// Lane l of a group takes its 8 consecutive elements. kGated: x is act(gate) * up (gated_value),
// computed here and also stored to `out` [K], the gated activation's own output (a dense MLP's
// down projection input, cut where it is made: BackendOptions::imma_ready_pieces). Row
// blockIdx.y of several (routed experts' inputs): x, up and out that row's (x_stride apart; up
// has x's stride, out out_stride), its pieces imma_row_stride bytes apart.
template <int kGroup, bool kGated>
__global__ void __launch_bounds__(256)
    hfq4_imma_pieces_kernel(const float* x, int64_t x_stride, const float* up, float* out, int64_t out_stride, Act act,
                            int64_t K, int64_t n_groups, uint8_t* pieces) {
  constexpr int kLanes = ImmaGroup<kGroup>::kLanesPerGroup;
  const int64_t row = blockIdx.y;
  x += row * x_stride;
  if constexpr (kGated) up += row * x_stride, out += row * out_stride;
  pieces += row * imma_row_stride<kGroup>(K);
  float2* group_scales = imma_group_scales<kGroup>(pieces, K);
  enter_kernel();
  const int lane = threadIdx.x % kWarp, l = lane % kLanes;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int64_t group = warp * (kWarp / kLanes) + lane / kLanes;
  const int64_t k0 = group * kGroup + 8 * l;
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool in = group < n_groups && k0 + j < K;
    if constexpr (kGated) {
      v[j] = in ? gated_value(x[k0 + j], up[k0 + j], act) : 0.0f;
      if (in) out[k0 + j] = v[j];
    } else {
      v[j] = in ? x[k0 + j] : 0.0f;
    }
  }
  cut_imma_group<kGroup>(v, l, group, group < n_groups, pieces, group_scales);
}

// One group's loads, asked for an iteration before they are used: the codes, the rows' (scale,
// min) and the input's (2^(E-6), sum) too. (With the factors loaded in the iteration that uses
// them, ncu put half the gate_up product's stall samples on their load and first use.)
template <int kGroup>
struct ImmaStage {
  uint2 codes_a[ImmaGroup<kGroup>::kLaneBytes / 8], codes_b[ImmaGroup<kGroup>::kLaneBytes / 8];  // rows g, g + 8
  uint4 piece[ImmaGroup<kGroup>::kLanePieceBytes / 16];  // this lane's column (piece g; zero for g >= 4)
  float2 sm_a, sm_b;  // rows g, g + 8: (scale, min)
  float2 xs;          // the input's (2^(E-6), sum of x)
};

// Routed experts (a.expert_ids; no segments): pair p = blockIdx.x / (the blocks one matrix
// takes) multiplies its expert's matrix (a.weight + expert_ids[p] * a.expert_bytes; a negative
// id, another rank's pair, stores nothing) by input row p / a.x_row_div, whose pieces lie
// imma_row_stride apart from `pieces`, into a.out + p * a.out_stride. The ids are the previous
// kernel's output, so such a block loads its first codes after enter_kernel().
// prefetch: the block's rows are pulled into L2 before enter_kernel() (MatvecArgs::weight_prefetch).
// l2_ahead > 0 (MatvecArgs::imma_l2_ahead): each warp also asks L2 for the codes of the group
// l2_ahead iterations past the one its registers are loading. Why: with 110 registers a warp holds
// one group's loads in flight (two blocks per SM), and a prefetch holds no register, so more of
// the rows' bytes are on their way from DRAM while the warps wait on the loads they hold.
// kLean (MatvecArgs::imma_lean): only the codes and the rows' factors go an iteration ahead; the
// group's pieces and input factors are loaded at the top of the iteration that uses them (the
// same bytes for every tile of the block and the SM's other blocks at that split: L1 hits after
// the first). That frees their registers (79 at G256 against 116: ptxas, sm_90a), so three
// blocks fit an SM, and the launcher splits the tiles until ~20 warps per SM. Why: on the H100
// the 31B's down (336 tiles, 84 groups) ran at ~1.6 TB/s with ~10 warps per SM, each warp
// waiting ~9 cycles of long scoreboard per instruction on its one group in flight (ncu; a
// shared-memory ring of 2-4 groups per warp lost: bench/RESULTS.md thirty-ninth session), so
// more warps, each with fewer groups, is what is left. At the same warps per tile, the register
// form's bits (the same arithmetic in the same order); its own rule may take more warps per tile,
// which adds the warps' partial sums in another order.
template <bool kLean>
constexpr int kImmaBlocksPerSm = kLean ? 3 : 2;  // (the registers each form leaves an SM)

template <int kGroup, int kSplit, bool kLean = false>
__global__ void __launch_bounds__(256, kImmaBlocksPerSm<kLean>)
    matvec_hfq4_imma_kernel(MatvecArgs a, const uint8_t* pieces, const float2* group_scales, bool prefetch,
                            int l2_ahead) {
  using G = ImmaGroup<kGroup>;
  constexpr int kTiles = 8 / kSplit;
  __shared__ float partial[8][16];  // [warp][row of its tile]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int split = warp % kSplit;
  RowsTarget target = rows_target(a);  // the matrix, or a grouped launch's segment
  const bool experts = a.expert_ids != nullptr;
  int64_t pair = 0;
  if (experts) {  // (rows_target: one matrix, block blockIdx.x)
    const int64_t pair_blocks = (target.M + 16 * kTiles - 1) / (16 * kTiles);
    pair = target.block / pair_blocks;
    target.block -= pair * pair_blocks;
    target.out += pair * a.out_stride;
    pieces += pair / a.x_row_div * imma_row_stride<kGroup>(a.K);
    group_scales = imma_group_scales<kGroup>(const_cast<uint8_t*>(pieces), a.K);
  }
  const int64_t M = target.M, m0 = (target.block * kTiles + warp / kSplit) * 16;
  const int64_t n_groups = (a.K + kGroup - 1) / kGroup;
  // rows past M (the last tile) re-read row M - 1 and are not stored
  const uint8_t* row_a = target.matrix + (m0 + g < M ? m0 + g : M - 1) * target.row_bytes;
  const uint8_t* row_b = target.matrix + (m0 + g + 8 < M ? m0 + g + 8 : M - 1) * target.row_bytes;
  // The C columns this lane holds are pieces 2t and 2t + 1: their weights in the group's sum
  // (zero for t >= 2, whose columns are empty), and the min term once per row (t = 0).
  const float w_even = t == 0 ? 1.0f : t == 1 ? 0x1p-14f : 0.0f;
  const float w_odd = t == 0 ? 0x1p-7f : t == 1 ? 0x1p-21f : 0.0f;
  const float w_min = t == 0 ? 1.0f : 0.0f;
  auto load_codes = [&](int64_t group, ImmaStage<kGroup>& s) {
    const uint2* pa = reinterpret_cast<const uint2*>(row_a + group * G::kBlockBytes + 8 + t * G::kLaneBytes);
    const uint2* pb = reinterpret_cast<const uint2*>(row_b + group * G::kBlockBytes + 8 + t * G::kLaneBytes);
#pragma unroll
    for (int i = 0; i < G::kLaneBytes / 8; ++i) s.codes_a[i] = pa[i], s.codes_b[i] = pb[i];
    s.sm_a = *reinterpret_cast<const float2*>(row_a + group * G::kBlockBytes);
    s.sm_b = *reinterpret_cast<const float2*>(row_b + group * G::kBlockBytes);
  };
  auto load_pieces = [&](int64_t group, ImmaStage<kGroup>& s) {
    const uint4* p = reinterpret_cast<const uint4*>(pieces + group * G::kPieceBytes + (g * 4 + t) * G::kLanePieceBytes);
#pragma unroll
    for (int i = 0; i < G::kLanePieceBytes / 16; ++i) s.piece[i] = g < 4 ? p[i] : make_uint4(0, 0, 0, 0);
    s.xs = group_scales[group];
  };
  // A group's (scale, min) and codes on one row are kBlockBytes (136 or 72) from byte
  // group * kBlockBytes: at most two 128-byte lines, the first and the last byte's. Lanes t = 0, 1
  // take row g's two, t = 2, 3 row g + 8's.
  auto prefetch_codes_l2 = [&](int64_t group) {
    if (group >= n_groups) return;
    const uint8_t* row = t < 2 ? row_a : row_b;
    prefetch_l2(row + group * G::kBlockBytes + (t % 2) * (G::kBlockBytes - 1));
  };
  float acc_a = 0.0f, acc_b = 0.0f;
  ImmaStage<kGroup> stage;
  if (!experts) {
    if (split < n_groups) load_codes(split, stage);
    // After this warp's first codes, so that they are asked for first.
    if (prefetch) prefetch_block_rows_l2(target, target.block * kTiles * 16, kTiles * 16);
    // The groups the loop's first prefetches would have covered (weights: before the wait too).
    for (int i = 2; i <= l2_ahead; ++i) prefetch_codes_l2(split + i * kSplit);
  }
  enter_kernel();
  if (experts) {
    const int32_t expert = a.expert_ids[pair];
    if (expert < 0) return;  // the whole block: a pair another rank runs (--ep)
    const int64_t offset = static_cast<int64_t>(expert) * a.expert_bytes;
    row_a += offset, row_b += offset;
    if (split < n_groups) load_codes(split, stage);
    for (int i = 2; i <= l2_ahead; ++i) prefetch_codes_l2(split + i * kSplit);
  }
  if (!kLean && split < n_groups) load_pieces(split, stage);
  for (int64_t group = split; group < n_groups; group += kSplit) {
    if (kLean) load_pieces(group, stage);
    const float2 sm_a = stage.sm_a, sm_b = stage.sm_b, xs = stage.xs;
    ImmaStage<kGroup> next;
    if (group + kSplit < n_groups) {
      load_codes(group + kSplit, next);
      if (!kLean) load_pieces(group + kSplit, next);
    }
    if (l2_ahead > 0) prefetch_codes_l2(group + (l2_ahead + 1) * kSplit);
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < G::kMmas; ++j) {
      const uint32_t wa = j % 2 ? stage.codes_a[j / 2].y : stage.codes_a[j / 2].x;
      const uint32_t wb = j % 2 ? stage.codes_b[j / 2].y : stage.codes_b[j / 2].x;
      const uint32_t op[4] = {wa & 0x0f0f0f0fu, wb & 0x0f0f0f0fu, (wa >> 4) & 0x0f0f0f0fu, (wb >> 4) & 0x0f0f0f0fu};
      const uint4& p = stage.piece[j / 2];
      mma_s8(c, op, j % 2 ? p.z : p.x, j % 2 ? p.w : p.y);
    }
    const float f_a = fmaf(static_cast<float>(c[1]), w_odd, static_cast<float>(c[0]) * w_even);
    const float f_b = fmaf(static_cast<float>(c[3]), w_odd, static_cast<float>(c[2]) * w_even);
    acc_a += fmaf(sm_a.x * xs.x, f_a, w_min * sm_a.y * xs.y);
    acc_b += fmaf(sm_b.x * xs.x, f_b, w_min * sm_b.y * xs.y);
    stage = next;
  }
  // a row's four lanes (pieces 0-1, 2-3, and the empty columns) in a fixed order
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
  if constexpr (kSplit == 1) {
    if (t == 0 && m0 + g < M) target.out[m0 + g] = acc_a;
    if (t == 0 && m0 + g + 8 < M) target.out[m0 + g + 8] = acc_b;
  } else {
    if (t == 0) partial[warp][g] = acc_a, partial[warp][g + 8] = acc_b;
    __syncthreads();
    if (split == 0 && lane < 16) {
      float v = partial[warp][lane];
#pragma unroll
      for (int s = 1; s < kSplit; ++s) v += partial[warp + s][lane];
      if (m0 + lane < M) target.out[m0 + lane] = v;
    }
  }
}

// Blocks of `rows_per_block` rows: per segment, or per routed pair (experts).
inline int64_t imma_blocks(MatvecArgs& a, int64_t rows_per_block) {
  const int64_t blocks = number_row_blocks(a, rows_per_block);  // (segments: each one's first block)
  return a.expert_ids ? blocks * a.n_inputs : blocks;
}

template <int kGroup, int kSplit, bool kLean = false>
cudaError_t launch_imma_split(MatvecArgs a, const uint8_t* pieces, const float2* scales, cudaStream_t stream) {
  const int64_t blocks = imma_blocks(a, 16 * (8 / kSplit));
  if (blocks == 0) return cudaSuccess;
  // (the prefetch only where the grid is about one wave, as the rows kernels': a larger matrix's
  // prefetched rows outnumber what L2 keeps until its blocks read them)
  const bool prefetch =
      a.weight_prefetch && blocks <= kImmaBlocksPerSm<kLean> * static_cast<int64_t>(current_device_traits().sm_count);
  return launch_kernel(matvec_hfq4_imma_kernel<kGroup, kSplit, kLean>, dim3(static_cast<unsigned>(blocks)), 256, 0,
                       stream, a, pieces, scales, prefetch, a.imma_l2_ahead);
}

// Cuts x [rows, K] (rows x_stride apart) into its pieces at `pieces` (hfq4_imma_scratch_bytes;
// several rows imma_row_stride apart); kGated: x is act(gate) * up (up x_stride apart too), also
// stored to out (out_stride apart).
template <int kGroup, bool kGated>
cudaError_t launch_imma_pieces(const float* x, int64_t x_stride, const float* up, float* out, int64_t out_stride,
                               Act act, int64_t rows, int64_t K, uint8_t* pieces, cudaStream_t stream) {
  const int64_t n_groups = (K + kGroup - 1) / kGroup;
  const int64_t groups_per_block = 8 * (kWarp / ImmaGroup<kGroup>::kLanesPerGroup);
  const dim3 grid(static_cast<unsigned>((n_groups + groups_per_block - 1) / groups_per_block),
                  static_cast<unsigned>(rows));
  const cudaError_t err = launch_kernel(hfq4_imma_pieces_kernel<kGroup, kGated>, grid, 256, 0, stream, x, x_stride, up,
                                        out, out_stride, act, K, n_groups, pieces);
  if (err == cudaSuccess) g_imma_pieces_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

template <int kGroup>
cudaError_t launch_imma(const MatvecArgs& a, cudaStream_t stream) {
  const int64_t n_groups = (a.K + kGroup - 1) / kGroup;
  auto* pieces = static_cast<uint8_t*>(a.scratch);
  float2* scales = imma_group_scales<kGroup>(pieces, a.K);
  cudaError_t err = cudaSuccess;
  if (!a.imma_pieces_ready) {
    // (experts: one row per distinct input, n_inputs / x_row_div of them)
    const int64_t rows = a.expert_ids ? (a.n_inputs + a.x_row_div - 1) / a.x_row_div : 1;
    err = launch_imma_pieces<kGroup, false>(a.x, a.x_stride, nullptr, nullptr, 0, Act::silu, rows, a.K, pieces, stream);
  }
  if (err != cudaSuccess) return err;
  // kSplit: as asked (MatvecArgs::imma_rows > 0, matmul_bench), else at least 2 warps per tile
  // and at least ~10 warps per SM (1320 on 132 SMs), at most 8 and no more than the row's groups.
  // H100 (bench/RESULTS.md twenty-seventh session), the fastest of 1, 2, 4 and 8 per product: 31B
  // q/k/v (1024 tiles) 2, o_proj and down (336 tiles) 4, gate_up (2688 tiles) 2, Qwen3.5-4B down
  // (160 tiles) 8, the 26B-A4B's (256-264 tiles) 4-8. One warp per tile keeps one group of loads
  // in flight per warp and was latency-bound (gate_up: 8.5 cycles of long scoreboard per issue,
  // 60.5 us against 52.1 at 2).
  // The lean form (MatvecArgs::imma_lean; not for experts) holds three blocks per SM: ~20 warps
  // per SM before a launch stops splitting its tiles further.
  const bool lean = a.imma_lean && !a.expert_ids;
  MatvecArgs counted = a;
  const int64_t tiles = imma_blocks(counted, 16);  // (all segments, or all pairs)
  const int per_sm = a.imma_warps_per_sm > 0 ? a.imma_warps_per_sm : lean ? 20 : 10;
  const int64_t min_warps = per_sm * static_cast<int64_t>(current_device_traits().sm_count);
  int split = 2;
  while (split < 8 && tiles * split < min_warps) split *= 2;
  while (split > 1 && split > n_groups) split /= 2;
  // (The Qwen3.5-4B gate_up's 288 blocks leave a second wave of 24 on 132 SMs; at 1 warp per tile
  // it is one wave of 144, and decode was 2.3 % slower: bench/RESULTS.md thirty-second session.)
  if (a.imma_rows > 0) split = a.imma_rows;
  switch (split * (lean ? -1 : 1)) {
    case 1: err = launch_imma_split<kGroup, 1>(a, pieces, scales, stream); break;
    case 2: err = launch_imma_split<kGroup, 2>(a, pieces, scales, stream); break;
    case 4: err = launch_imma_split<kGroup, 4>(a, pieces, scales, stream); break;
    case 8: err = launch_imma_split<kGroup, 8>(a, pieces, scales, stream); break;
    case -1: err = launch_imma_split<kGroup, 1, true>(a, pieces, scales, stream); break;
    case -2: err = launch_imma_split<kGroup, 2, true>(a, pieces, scales, stream); break;
    case -4: err = launch_imma_split<kGroup, 4, true>(a, pieces, scales, stream); break;
    case -8: err = launch_imma_split<kGroup, 8, true>(a, pieces, scales, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err == cudaSuccess) g_imma_matvec_launches.fetch_add(1, std::memory_order_relaxed);
  if (err == cudaSuccess && lean) g_imma_lean_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

}  // namespace
#endif

size_t hfq4_imma_scratch_bytes(int64_t K, int group) {
  const int64_t n_groups = (K + group - 1) / group;
  return static_cast<size_t>(n_groups) * (4 * static_cast<size_t>(group) + sizeof(float) * 2);
}

bool imma_matvec_available() {
#if defined(FIRELINE_GPU_HIP)
  return false;
#else
  return current_device_traits().major >= 8;
#endif
}

cudaError_t launch_hfq4_imma(const MatvecArgs& a, int group, cudaStream_t stream) {
#if defined(FIRELINE_GPU_HIP)
  (void)a, (void)group, (void)stream;
  return cudaErrorInvalidValue;
#else
  if (a.n_inputs != 1 || a.expert_ids || a.gated || a.n_segments < 0 || a.n_segments > kMaxMatvecSegments ||
      !a.scratch || a.scratch_bytes < hfq4_imma_scratch_bytes(a.K, group) || a.K <= 0)
    return cudaErrorInvalidValue;
  if (group == 256) return launch_imma<256>(a, stream);
  if (group == 128) return launch_imma<128>(a, stream);
  return cudaErrorInvalidValue;
#endif
}

size_t hfq4_imma_rows_scratch_bytes(int64_t rows, int64_t K, int group) {
  const int64_t stride = group == 256 ? imma_row_stride<256>(K) : imma_row_stride<128>(K);
  return static_cast<size_t>(rows * stride);
}

cudaError_t launch_hfq4_imma_experts(const MatvecArgs& a, int group, cudaStream_t stream) {
#if defined(FIRELINE_GPU_HIP)
  (void)a, (void)group, (void)stream;
  return cudaErrorInvalidValue;
#else
  if (!a.expert_ids || a.n_inputs < 1 || a.x_row_div < 1 || a.gated || a.n_segments != 0 || a.M <= 0 || a.K <= 0 ||
      a.imma_rows == 0 || !a.scratch ||
      a.scratch_bytes < hfq4_imma_rows_scratch_bytes((a.n_inputs + a.x_row_div - 1) / a.x_row_div, a.K, group))
    return cudaErrorInvalidValue;
  if (group == 256) return launch_imma<256>(a, stream);
  if (group == 128) return launch_imma<128>(a, stream);
  return cudaErrorInvalidValue;
#endif
}

cudaError_t launch_gated_activation_imma_pieces(float* out, const float* gate, const float* up, int64_t K, Act act,
                                                int group, void* pieces, cudaStream_t stream) {
#if defined(FIRELINE_GPU_HIP)
  (void)out, (void)gate, (void)up, (void)K, (void)act, (void)group, (void)pieces, (void)stream;
  return cudaErrorInvalidValue;
#else
  if (K <= 0 || !pieces) return cudaErrorInvalidValue;
  return launch_gated_activation_imma_pieces_rows(out, 0, gate, up, 0, 1, K, act, group, pieces, stream);
#endif
}

cudaError_t launch_gated_activation_imma_pieces_rows(float* out, int64_t out_stride, const float* gate,
                                                     const float* up, int64_t in_stride, int64_t rows, int64_t K,
                                                     Act act, int group, void* pieces, cudaStream_t stream) {
#if defined(FIRELINE_GPU_HIP)
  (void)out, (void)out_stride, (void)gate, (void)up, (void)in_stride, (void)rows, (void)K, (void)act, (void)group,
      (void)pieces, (void)stream;
  return cudaErrorInvalidValue;
#else
  if (K <= 0 || rows <= 0 || rows > 65535 || !pieces) return cudaErrorInvalidValue;
  auto* p = static_cast<uint8_t*>(pieces);
  if (group == 256) return launch_imma_pieces<256, true>(gate, in_stride, up, out, out_stride, act, rows, K, p, stream);
  if (group == 128) return launch_imma_pieces<128, true>(gate, in_stride, up, out, out_stride, act, rows, K, p, stream);
  return cudaErrorInvalidValue;
#endif
}

int64_t imma_matvec_launches() { return g_imma_matvec_launches.load(std::memory_order_relaxed); }
int64_t imma_pieces_launches() { return g_imma_pieces_launches.load(std::memory_order_relaxed); }
int64_t imma_lean_launches() { return g_imma_lean_launches.load(std::memory_order_relaxed); }

}  // namespace fl::cuda
