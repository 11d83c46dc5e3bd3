// RMSNorm: one block per row; the sum of squares is reduced in f32 across the block. The fused
// forms spare a launch each where the model follows a norm with a residual add (add_rms_norm) or
// with RoPE (rms_norm_rope): at batch 1 such kernels move a few kilobytes and cost their launch.
#include <atomic>
#include <optional>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/head_rows.cuh"
#include "backend/cuda/imma_pieces.cuh"
#include "backend/cuda/norm.cuh"

namespace fl::cuda {
namespace {

// transformers: x * pow(mean(x^2) + eps, -0.5), then * gain (rms_inverse_of_sum,
// device_common.cuh). The factor from the row, its squares summed across the block:
__device__ __forceinline__ float rms_inverse(const float* src, int64_t cols, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += src[i] * src[i];
  return rms_inverse_of_sum(block_sum(sum_sq), cols, eps);
}

// out = rms(x) * gain; with `residual`, also residual += out (add_rms_norm).
__global__ void rms_norm_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t cols,
                                const uint8_t* weight, DType weight_type, Gain gain, float eps, float* residual,
                                int64_t residual_stride) {
  enter_kernel();
  const float* src = x + blockIdx.x * x_stride;
  float* dst = out + blockIdx.x * out_stride;
  const float inv = rms_inverse(src, cols, eps);
  float* res = residual ? residual + blockIdx.x * residual_stride : nullptr;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = apply_gain(src[i] * inv, weight, weight_type, gain, i);
    dst[i] = v;
    if (res) res[i] = res[i] + v;
  }
}

// One block per (token, head) row of x [T, heads, D]: the norm, then the rotate-half pairs
// (i, i + half) for i < half; dims >= 2 * half are only normed.
__global__ void rms_norm_rope_kernel(float* x, int64_t heads, int64_t head_dim, const uint8_t* weight,
                                     DType weight_type, Gain gain, float eps, const int32_t* positions,
                                     const float* inv_freq, int64_t half) {
  enter_kernel();
  float* v = x + blockIdx.x * head_dim;
  const float inv = rms_inverse(v, head_dim, eps);
  __syncthreads();  // every thread has read the row before any writes it
  const float pos = static_cast<float>(positions[blockIdx.x / heads]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(inv_freq[i] * pos, &s, &c);  // f32 angle, as transformers computes it
    const float a = apply_gain(v[i] * inv, weight, weight_type, gain, i);
    const float b = apply_gain(v[i + half] * inv, weight, weight_type, gain, i + half);
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
  for (int64_t i = 2 * half + threadIdx.x; i < head_dim; i += blockDim.x)
    v[i] = apply_gain(v[i] * inv, weight, weight_type, gain, i);
}

int norm_threads(int64_t cols) { return cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64; }

struct HeadNormParts {
  HeadNormPart part[kMaxHeadNormParts];
  int64_t first_block[kMaxHeadNormParts + 1];  // part p owns blocks [first_block[p], first_block[p + 1])
  int n;
  L2Spans gains;  // the parts' gain rows, pulled into L2 before the wait
};

// rms_norm_rope_kernel over several tensors: block b is a (token, head) row of the part whose
// block range holds b; parts without rope are only normed.
__global__ void rms_norm_rope_group_kernel(HeadNormParts parts, float eps, const int32_t* positions,
                                           const float* inv_freq, int64_t half) {
  prefetch_spans_l2(parts.gains);  // weights: allowed before the wait (launch.cuh)
  enter_kernel();
  int p = 0;
  while (p + 1 < parts.n && blockIdx.x >= parts.first_block[p + 1]) ++p;
  const HeadNormPart& part = parts.part[p];
  const int64_t row = blockIdx.x - parts.first_block[p], D = part.head_dim;
  const uint8_t* weight = static_cast<const uint8_t*>(part.weight);
  float* v = part.x + row * D;
  const float* src =
      part.src ? part.src + row / part.heads * part.src_token_stride + row % part.heads * part.src_head_stride : v;
  const float inv = rms_inverse(src, D, eps);
  __syncthreads();  // every thread has read the row before any writes it
  const int64_t rope_half = part.rope ? half : 0;
  const float pos = part.rope ? static_cast<float>(positions[row / part.heads]) : 0.0f;
  for (int64_t i = threadIdx.x; i < rope_half; i += blockDim.x) {
    float s, c;
    sincosf(inv_freq[i] * pos, &s, &c);
    const float a = apply_gain(src[i] * inv, weight, part.weight_type, part.gain, i);
    const float b = apply_gain(src[i + rope_half] * inv, weight, part.weight_type, part.gain, i + rope_half);
    rotate_pair(a, b, s, c, v[i], v[i + rope_half]);
  }
  for (int64_t i = 2 * rope_half + threadIdx.x; i < D; i += blockDim.x)
    v[i] = apply_gain(src[i] * inv, weight, part.weight_type, part.gain, i);
}

// Backend::residual_update, one block per row, in the default's order of operations (each term
// normed, summed, the sum normed, added to h, scaled; then the norms of h): what differs from the
// CPU oracle is the reductions' summation order and the adds the compiler contracts into FMAs
// (as in add_rms_norm), within the op harness's budget. Each pass reads back what the same
// thread wrote in the pass before (the same i), so only the reductions need the block.
__global__ void residual_update_kernel(ResidualUpdateArgs a) {
  enter_kernel();
  const int64_t row = blockIdx.x, cols = a.cols;
  float inv[kMaxResidualTerms];
  for (int t = 0; t < a.n_terms; ++t)
    inv[t] = a.terms[t].normed ? rms_inverse(a.terms[t].x + row * a.terms[t].stride, cols, a.eps) : 1.0f;
  // The branch: the (normed) terms summed, into term 0's row; its sum of squares for the merge.
  float* branch = a.terms[0].x + row * a.terms[0].stride;
  float branch_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float sum = 0.0f;
    for (int t = 0; t < a.n_terms; ++t) {
      const ResidualTermArgs& term = a.terms[t];
      const float x = term.x[row * term.stride + i];
      const float v =
          term.normed ? apply_gain(x * inv[t], static_cast<const uint8_t*>(term.weight), term.weight_type, term.gain, i)
                      : x;
      sum = t == 0 ? v : sum + v;
    }
    branch[i] = sum;
    branch_sq += sum * sum;
  }
  float merge_inv = 1.0f;
  if (a.merge) merge_inv = rms_inverse_of_sum(block_sum(branch_sq), cols, a.eps);
  const float scalar = a.scalar ? load_weight(static_cast<const uint8_t*>(a.scalar), 0, a.scalar_type) : 1.0f;
  float* h = a.h + row * a.h_stride;
  float h_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = branch[i];
    if (a.merge)
      v = apply_gain(v * merge_inv, static_cast<const uint8_t*>(a.merge_weight), a.merge_type, a.merge_gain, i);
    float updated = h[i] + v;
    if (a.scalar) updated = updated * scalar;
    h[i] = updated;
    h_sq += updated * updated;
  }
  if (a.n_norms == 0) return;
  const float h_inv = rms_inverse_of_sum(block_sum(h_sq), cols, a.eps);
  for (int n = 0; n < a.n_norms; ++n) {
    const StreamNormArgs& norm = a.norms[n];
    float* out = norm.out + row * norm.stride;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = apply_gain(h[i] * h_inv, static_cast<const uint8_t*>(norm.weight), norm.weight_type, norm.gain, i);
      if (norm.scale != 1.0f) v = v * norm.scale;
      out[i] = v;
    }
  }
}

// Element i of a norm gain row stored as G (float: f32, uint16_t: bf16 bits).
template <typename G>
__device__ __forceinline__ float plain_gain(const void* weight, int i) {
  if constexpr (sizeof(G) == 4)
    return __ldg(static_cast<const float*>(weight) + i);
  else
    return bf16_bits_to_float(__ldg(static_cast<const unsigned short*>(weight) + i));
}

// The factors apply_gain multiplies by at this thread's columns threadIdx.x + j * blockDim.x: 1
// past the row or without a gain (x * 1 is x exactly).
template <int kPer, typename G>
__device__ __forceinline__ void load_gain_factors(float (&f)[kPer], bool used, const void* weight, Gain gain,
                                                  int cols) {
#pragma unroll
  for (int j = 0; j < kPer; ++j) f[j] = 1.0f;
  if (!used || gain == Gain::none) return;
  const bool one_plus = gain == Gain::one_plus_weight;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < cols) {
      const float w = plain_gain<G>(weight, i);
      f[j] = one_plus ? 1.0f + w : w;
    }
  }
}

// residual_update_kernel with the row in registers: kPer elements per thread over at most
// kMaxThreads, every gain a row of G. Small code on purpose: at batch 1 the update is one block
// that runs once per step, its instructions fetched cold. The form before (every gain through
// load_weight's run-time switch over all formats, inlined per gain and element: 104 KB of code
// for 4 elements per thread over 1024 threads) spent ~5 us per update in the replayed step (H200;
// a launch that only waits cost < 1 us of it; ncu: "no instruction" the most sampled stall). This
// one (34 KB for 8 per thread) took decode 334 -> 366 tok/s on Qwen3.5-4B, 288 -> 316 on Gemma 4
// 26B-A4B and 77.8 -> 87.6 on the 31B; a first cut with these block sizes but the gains' format
// still switched at run time (58 KB) gained nothing. Gains are weights, which no kernel writes, so
// they are loaded into registers before enter_kernel(), while the previous kernel still runs;
// after the wait come only the terms, h, at most four reductions and the stores. What differs
// from residual_update_kernel is the order of roundings where a gain is 1 (x * inv * 1 for
// x * inv, within the op harness's budget). Columns are int: rows of at most 12 * 448.
template <int kPer, int kMaxThreads, typename G>
__global__ void __launch_bounds__(kMaxThreads) residual_update_registers_kernel(ResidualUpdateArgs a, L2Spans gains) {
  const int cols = static_cast<int>(a.cols), threads = blockDim.x;
  prefetch_spans_l2(gains);
  // The next product's weights into L2 (a hint: BackendOptions::update_prefetch_mb).
  if (a.l2_prefetch_bytes > 0) prefetch_slice_l2(a.l2_prefetch, a.l2_prefetch_bytes);
  float term_gain[kMaxResidualTerms][kPer], merge_gain[kPer], norm_gain[kMaxStreamNorms][kPer];
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t)
    load_gain_factors<kPer, G>(term_gain[t], t < a.n_terms && a.terms[t].normed, a.terms[t].weight, a.terms[t].gain,
                               cols);
  load_gain_factors<kPer, G>(merge_gain, a.merge, a.merge_weight, a.merge_gain, cols);
  // The output norms' gains too, where registers allow (12 per thread: after the h pass, overlapping
  // the last reduction).
  constexpr bool kNormGainsEarly = kPer <= 8;
  auto load_norm_gains = [&] {
#pragma unroll
    for (int n = 0; n < kMaxStreamNorms; ++n)
      load_gain_factors<kPer, G>(norm_gain[n], n < a.n_norms, a.norms[n].weight, a.norms[n].gain, cols);
  };
  if constexpr (kNormGainsEarly) load_norm_gains();
  const float scalar = a.scalar ? plain_gain<G>(a.scalar, 0) : 1.0f;
  enter_kernel();
  float x[kMaxResidualTerms][kPer], h[kPer];
  float* h_row = a.h + blockIdx.x * a.h_stride;
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t) {
    const float* x_row = t < a.n_terms ? a.terms[t].x + blockIdx.x * a.terms[t].stride : nullptr;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * threads;
      x[t][j] = x_row && i < cols ? x_row[i] : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * threads;
    h[j] = i < cols ? h_row[i] : 0.0f;
  }
  float inv[kMaxResidualTerms];
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t) {
    inv[t] = 1.0f;
    if (t < a.n_terms && a.terms[t].normed) {
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) sq += x[t][j] * x[t][j];
      inv[t] = rms_inverse_of_sum(block_sum(sq), cols, a.eps);
    }
  }
  float branch_sq = 0.0f;  // the branch (normed terms summed) replaces x[0]
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    float sum = x[0][j] * inv[0] * term_gain[0][j];
    if (a.n_terms > 1) sum = sum + x[1][j] * inv[1] * term_gain[1][j];
    x[0][j] = sum;  // 0 past the row: every term is
    branch_sq += sum * sum;
  }
  const float merge_inv = a.merge ? rms_inverse_of_sum(block_sum(branch_sq), cols, a.eps) : 1.0f;
  float h_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * threads;
    float updated = h[j] + x[0][j] * merge_inv * merge_gain[j];
    if (a.scalar) updated = updated * scalar;
    h[j] = i < cols ? updated : 0.0f;
    if (i < cols) h_row[i] = updated;
    h_sq += h[j] * h[j];
  }
  if (a.n_norms == 0) return;
  if constexpr (!kNormGainsEarly) load_norm_gains();
  const float h_inv = rms_inverse_of_sum(block_sum(h_sq), cols, a.eps);
#pragma unroll
  for (int n = 0; n < kMaxStreamNorms; ++n) {
    if (n >= a.n_norms) break;
    float* out = a.norms[n].out + blockIdx.x * a.norms[n].stride;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * threads;
      if (i < cols) out[i] = h[j] * h_inv * norm_gain[n][j] * a.norms[n].scale;
    }
  }
  // A norm with pieces: its row again (the same values) into shared memory (cols floats, the
  // launch's dynamic size), where warps take it a group at a time (8 consecutive elements per
  // lane, unlike the strided columns here); one row there at a time.
  extern __shared__ float pieces_row[];
#pragma unroll
  for (int n = 0; n < kMaxStreamNorms; ++n) {
    if (n >= a.n_norms) break;
    uint8_t* pieces = static_cast<uint8_t*>(a.pieces[n]);  // (block-uniform)
    if (!pieces) continue;
    __syncthreads();  // (the last cut has read the shared row)
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * threads;
      if (i < cols) pieces_row[i] = h[j] * h_inv * norm_gain[n][j] * a.norms[n].scale;
    }
    __syncthreads();
    if (a.pieces_group == 256)
      cut_imma_row_from_shared<256>(pieces_row, cols, pieces);
    else
      cut_imma_row_from_shared<128>(pieces_row, cols, pieces);
  }
}

// Calls f(weight, format, elements) for every gain row the update reads, and the layer scalar.
template <typename Fn>
void for_each_gain(const ResidualUpdateArgs& a, Fn&& f) {
  for (int t = 0; t < a.n_terms; ++t)
    if (a.terms[t].normed && a.terms[t].gain != Gain::none) f(a.terms[t].weight, a.terms[t].weight_type, a.cols);
  if (a.merge && a.merge_gain != Gain::none) f(a.merge_weight, a.merge_type, a.cols);
  for (int n = 0; n < a.n_norms; ++n)
    if (a.norms[n].gain != Gain::none) f(a.norms[n].weight, a.norms[n].weight_type, a.cols);
  if (a.scalar) f(a.scalar, a.scalar_type, int64_t{1});
}

// The register kernel with kPer elements per thread: the fewest whole warps that hold the row.
template <int kPer, int kMaxThreads>
cudaError_t launch_residual_update_registers(const ResidualUpdateArgs& a, DType gain_type, const L2Spans& gains,
                                             cudaStream_t stream) {
  const int64_t warps = (a.cols + kPer * kWarp - 1) / (kPer * kWarp);
  const dim3 grid(static_cast<unsigned>(a.rows)), block(static_cast<unsigned>(warps * kWarp));
  const size_t shared = a.cuts_pieces() ? static_cast<size_t>(a.cols) * sizeof(float) : 0;  // (<= 21 KB)
  if (gain_type == DType::bf16)
    return launch_kernel(residual_update_registers_kernel<kPer, kMaxThreads, uint16_t>, grid, block, shared, stream,
                         a, gains);
  return launch_kernel(residual_update_registers_kernel<kPer, kMaxThreads, float>, grid, block, shared, stream, a,
                       gains);
}

// The gains' one format when the register kernel reads them all (f32 or bf16; f32 where there
// are none), with every gain row (and the layer scalar) added to `gains` for the L2 prefetch.
std::optional<DType> register_gain_format(const ResidualUpdateArgs& a, L2Spans* gains) {
  bool seen = false, plain = true;
  DType gain_type = DType::f32;
  for_each_gain(a, [&](const void* weight, DType type, int64_t elements) {
    if (gains) add_l2_span(*gains, weight, row_bytes(type, elements));
    plain = plain && (type == DType::f32 || type == DType::bf16) && (!seen || type == gain_type);
    gain_type = type;
    seen = true;
  });
  if (!plain) return std::nullopt;
  return gain_type;
}

// Up to 8 elements per thread over up to 512 threads, then 12 (the 31B's 5376 columns in 14 warps).
constexpr int64_t kRegisterRowMax = 12 * 448;

// The one-row update spread over a cluster of blocks (sm_90). The register kernel holds the row
// on one SM, whose ~1300 instructions per warp (31B: 12 columns per thread over 14 warps, the
// pieces cut on top) make a latency chain of ~6-9 us that nothing else in the step overlaps
// (ncu: residual_update_registers_kernel 9.2 us on the 31B, 8.8 us on the 26B-A4B, at decode).
// Here each lane holds 8 consecutive columns, each warp one 256-column span (the integer
// matvec's group: a warp cuts its own pieces from registers, no shared-memory pass), and the
// warps sit in up to 8 blocks of up to 4 warps, one block per SM. A row's sums of squares go
// through distributed shared memory: each warp's total, written by its lanes into every block's
// slot for that warp, then the cluster barrier, then each thread adds the slots in warp order
// (the same bits in every block). Columns: a multiple of 8, at most kRegisterRowMax.
constexpr int kClusterMaxBlocks = 8, kClusterMaxWarps = 4, kClusterSpan = 8 * kWarp;
// (it takes the rows the register kernel does, whose widest fits its slots)
static_assert(kRegisterRowMax <= int64_t{kClusterMaxBlocks} * kClusterMaxWarps * kClusterSpan);

#if FIRELINE_GPU_HOPPER
// 8 consecutive gain factors from column `col` of a row of G (16-byte aligned): 1 without a gain.
template <typename G>
__device__ __forceinline__ void load_gain_8(float (&f)[8], bool used, const void* weight, Gain gain, int col,
                                            bool in_row) {
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = 1.0f;
  if (!used || gain == Gain::none || !in_row) return;
  const float add = gain == Gain::one_plus_weight ? 1.0f : 0.0f;
  if constexpr (sizeof(G) == 4) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(weight) + col);
    const float4 lo = __ldg(p), hi = __ldg(p + 1);
    const float w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = add + w[j];
  } else {
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(weight) + col));
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int j = 0; j < 8; ++j)
      f[j] = add + bf16_bits_to_float(static_cast<unsigned short>(words[j / 2] >> (16 * (j % 2))));
  }
}

__device__ __forceinline__ void load_row_8(float (&v)[8], const float* row, int col, bool in_row) {
  if (!in_row) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    return;
  }
  const float4 lo = *reinterpret_cast<const float4*>(row + col), hi = *reinterpret_cast<const float4*>(row + col + 4);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

__device__ __forceinline__ void store_row_8(float* row, int col, const float (&v)[8]) {
  *reinterpret_cast<float4*>(row + col) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(row + col + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
#endif

// Same arithmetic as residual_update_registers_kernel per element (only the sums' order differs).
// kPiecesGroup: 0, or the weight group the norms' outputs are cut for (those with a.pieces[n]).
template <typename G, int kPiecesGroup>
__global__ void __launch_bounds__(kClusterMaxWarps* kWarp) residual_update_cluster_kernel(ResidualUpdateArgs a,
                                                                                          L2Spans gains) {
#if FIRELINE_GPU_HOPPER
  // [reduction][warp of the row]: (term 0, term 1) squares, the branch's, the updated row's.
  __shared__ float2 slots[3][kClusterMaxBlocks * kClusterMaxWarps];
  cluster_arrive_relaxed();  // this block has started: its slots may be written (waited for below)
  const int cols = static_cast<int>(a.cols), lane = threadIdx.x % kWarp;
  const int warps_per_block = blockDim.x / kWarp, n_warps = gridDim.x * warps_per_block;
  const int warp = static_cast<int>(blockIdx.x) * warps_per_block + static_cast<int>(threadIdx.x) / kWarp;
  const int col = warp * kClusterSpan + 8 * lane;
  const bool in_row = col < cols;  // (cols % 8 == 0: a lane's columns are all in the row or none)
  prefetch_spans_l2(gains);
  // The next product's weights into L2 (a hint: BackendOptions::update_prefetch_mb).
  if (a.l2_prefetch_bytes > 0) prefetch_slice_l2(a.l2_prefetch, a.l2_prefetch_bytes);
  float term_gain[kMaxResidualTerms][8], merge_gain[8], norm_gain[kMaxStreamNorms][8];
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t)
    load_gain_8<G>(term_gain[t], t < a.n_terms && a.terms[t].normed, a.terms[t].weight, a.terms[t].gain, col, in_row);
  load_gain_8<G>(merge_gain, a.merge, a.merge_weight, a.merge_gain, col, in_row);
#pragma unroll
  for (int n = 0; n < kMaxStreamNorms; ++n)
    load_gain_8<G>(norm_gain[n], n < a.n_norms, a.norms[n].weight, a.norms[n].gain, col, in_row);
  const float scalar = a.scalar ? plain_gain<G>(a.scalar, 0) : 1.0f;
  enter_kernel();
  // Every warp's (p, q) summed over the cluster, in warp order: the same bits in every block.
  // Each reduction has its own slots, so a fast block's next writes never meet a slow block's
  // reads of the last ones.
  auto cluster_sum = [&](float2 v, int reduction) {
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    if (lane < static_cast<int>(gridDim.x)) store_cluster_float2(&slots[reduction][warp], lane, v);
    cluster_arrive();
    cluster_wait();
    float2 total = make_float2(0.0f, 0.0f);
    for (int w = 0; w < n_warps; ++w) {
      const float2 s = slots[reduction][w];
      total.x += s.x;
      total.y += s.y;
    }
    return total;
  };
  float x[kMaxResidualTerms][8], h[8];
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t) load_row_8(x[t], t < a.n_terms ? a.terms[t].x : nullptr, col,
                                                         in_row && t < a.n_terms);
  load_row_8(h, a.h, col, in_row);
  float sq[kMaxResidualTerms] = {0.0f, 0.0f};
#pragma unroll
  for (int t = 0; t < kMaxResidualTerms; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) sq[t] += x[t][j] * x[t][j];
  cluster_wait();  // every block has started (the arrival at the top)
  const float2 term_sq = cluster_sum(make_float2(sq[0], sq[1]), 0);  // (a term is normed: cluster_update_fits)
  float inv[kMaxResidualTerms];
  inv[0] = a.n_terms > 0 && a.terms[0].normed ? rms_inverse_of_sum(term_sq.x, cols, a.eps) : 1.0f;
  inv[1] = a.n_terms > 1 && a.terms[1].normed ? rms_inverse_of_sum(term_sq.y, cols, a.eps) : 1.0f;
  float branch_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float sum = x[0][j] * inv[0] * term_gain[0][j];
    if (a.n_terms > 1) sum = sum + x[1][j] * inv[1] * term_gain[1][j];
    x[0][j] = sum;
    branch_sq += sum * sum;
  }
  const float merge_inv =
      a.merge ? rms_inverse_of_sum(cluster_sum(make_float2(branch_sq, 0.0f), 1).x, cols, a.eps) : 1.0f;
  float h_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float updated = h[j] + x[0][j] * merge_inv * merge_gain[j];
    if (a.scalar) updated = updated * scalar;
    h[j] = in_row ? updated : 0.0f;
    h_sq += h[j] * h[j];
  }
  if (in_row) store_row_8(a.h, col, h);
  if (a.n_norms == 0) return;
  const float h_inv = rms_inverse_of_sum(cluster_sum(make_float2(h_sq, 0.0f), 2).x, cols, a.eps);
#pragma unroll
  for (int n = 0; n < kMaxStreamNorms; ++n) {
    if (n >= a.n_norms) break;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = h[j] * h_inv * norm_gain[n][j] * a.norms[n].scale;
    if (in_row) store_row_8(a.norms[n].out, col, v);
    if constexpr (kPiecesGroup != 0) {
      if (a.pieces[n]) {
        // A 256-column group is this warp's span; a 128-column one, each half of the warp's.
        constexpr int kLanes = ImmaGroup<kPiecesGroup>::kLanesPerGroup;
        const int group = warp * (kClusterSpan / kPiecesGroup) + lane / kLanes;
        const int n_groups = (cols + kPiecesGroup - 1) / kPiecesGroup;
        uint8_t* pieces = static_cast<uint8_t*>(a.pieces[n]);
        cut_imma_group<kPiecesGroup>(v, lane % kLanes, group, group < n_groups, pieces,
                                     imma_group_scales<kPiecesGroup>(pieces, cols));
      }
    }
  }
#else
  (void)a, (void)gains;
#if !defined(FIRELINE_GPU_HIP)
  __trap();  // launched only on sm_90 devices from builds with sm_90a code
#endif
#endif
}

std::atomic<int64_t> g_cluster_update_launches{0};  // residual_update_cluster_launches

// Whether the cluster kernel takes these arguments (besides the device and the gains' format,
// which launch_residual_update checks).
// Only updates with a normed term (Gemma 4's) take it: timed there (H100: 31B +6.0 %, 26B-A4B
// +4.6 %); with Qwen3.5's raw terms, whose one-block update has a single reduction, the 4B lost
// 2.0 % (bench/RESULTS.md, twenty-ninth session).
bool cluster_update_fits(const ResidualUpdateArgs& a) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool normed = false;
  for (int t = 0; t < a.n_terms; ++t) normed = normed || a.terms[t].normed;
  bool ok = normed && a.rows == 1 && a.cols > 0 && a.cols % 8 == 0 && a.cols <= kRegisterRowMax && aligned(a.h);
  for (int t = 0; t < a.n_terms; ++t) ok = ok && aligned(a.terms[t].x) && aligned(a.terms[t].weight);
  for (int n = 0; n < a.n_norms; ++n) ok = ok && aligned(a.norms[n].out) && aligned(a.norms[n].weight);
  for (int n = 0; n < a.n_norms; ++n) ok = ok && aligned(a.pieces[n]);  // (nullptr is)
  return ok && aligned(a.merge_weight);
}

cudaError_t launch_residual_update_cluster(const ResidualUpdateArgs& a, DType gain_type, const L2Spans& gains,
                                           cudaStream_t stream) {
#if defined(FIRELINE_CUDA_SM90A)
  const int warps = static_cast<int>((a.cols + kClusterSpan - 1) / kClusterSpan);
  const int warps_per_block = (warps + kClusterMaxBlocks - 1) / kClusterMaxBlocks;
  const unsigned blocks = static_cast<unsigned>((warps + warps_per_block - 1) / warps_per_block);
  const dim3 block(static_cast<unsigned>(warps_per_block * kWarp));
  auto launch = [&](auto kernel) { return launch_kernel_cluster(kernel, dim3(blocks), block, 0, stream, blocks, a, gains); };
  const bool bf16 = gain_type == DType::bf16;
  if (!a.cuts_pieces())
    return bf16 ? launch(residual_update_cluster_kernel<uint16_t, 0>) : launch(residual_update_cluster_kernel<float, 0>);
  if (a.pieces_group == 256)
    return bf16 ? launch(residual_update_cluster_kernel<uint16_t, 256>)
                : launch(residual_update_cluster_kernel<float, 256>);
  return bf16 ? launch(residual_update_cluster_kernel<uint16_t, 128>) : launch(residual_update_cluster_kernel<float, 128>);
#else
  (void)a, (void)gain_type, (void)gains, (void)stream;
  return cudaErrorInvalidValue;
#endif
}

}  // namespace

cudaError_t launch_rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                            int64_t cols, const void* weight, DType weight_type, Gain gain, float eps,
                            cudaStream_t stream, float* residual, int64_t residual_stride) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(rms_norm_kernel, static_cast<unsigned>(rows), norm_threads(cols), 0, stream, out, out_stride, x,
                       x_stride, cols, static_cast<const uint8_t*>(weight), weight_type, gain, eps, residual,
                       residual_stride);
}

cudaError_t launch_rms_norm_rope(float* x, int64_t n_tokens, int64_t heads, int64_t head_dim, const void* weight,
                                 DType weight_type, Gain gain, float eps, const int32_t* positions,
                                 const float* inv_freq, int64_t half, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  return launch_kernel(rms_norm_rope_kernel, static_cast<unsigned>(n_tokens * heads), norm_threads(head_dim), 0, stream,
                       x, heads, head_dim, static_cast<const uint8_t*>(weight), weight_type, gain, eps, positions,
                       inv_freq, half);
}

cudaError_t launch_rms_norm_rope_group(const HeadNormPart* parts, int n_parts, int64_t n_tokens, float eps,
                                       const int32_t* positions, const float* inv_freq, int64_t half,
                                       cudaStream_t stream) {
  if (n_parts <= 0 || n_parts > kMaxHeadNormParts) return cudaErrorInvalidValue;
  HeadNormParts group{};
  int64_t blocks = 0, widest = 0;
  for (int p = 0; p < n_parts; ++p) {
    group.part[p] = parts[p];
    group.first_block[p] = blocks;
    blocks += n_tokens * parts[p].heads;
    widest = parts[p].head_dim > widest ? parts[p].head_dim : widest;
    if (parts[p].gain != Gain::none)
      add_l2_span(group.gains, parts[p].weight, row_bytes(parts[p].weight_type, parts[p].head_dim));
  }
  group.first_block[n_parts] = blocks;
  group.n = n_parts;
  if (blocks == 0) return cudaSuccess;
  return launch_kernel(rms_norm_rope_group_kernel, static_cast<unsigned>(blocks), norm_threads(widest), 0, stream,
                       group, eps, positions, inv_freq, half);
}

cudaError_t launch_residual_update(const ResidualUpdateArgs& a, cudaStream_t stream) {
  if (a.n_terms <= 0 || a.n_terms > kMaxResidualTerms || a.n_norms < 0 || a.n_norms > kMaxStreamNorms)
    return cudaErrorInvalidValue;
  if (a.cuts_pieces() && !residual_update_cuts_pieces(a)) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  // The register kernel takes gains that share one format it reads (f32 or bf16); wider rows,
  // and gains in other or mixed formats, come from memory.
  L2Spans gains;
  const std::optional<DType> gain_type = register_gain_format(a, &gains);
  if (gain_type && a.cluster && residual_update_cluster_available() && cluster_update_fits(a)) {
    // A cluster that cannot be placed (e.g. SMs held back by a partition) is refused at launch:
    // then the one-block kernel below runs instead.
    if (launch_residual_update_cluster(a, *gain_type, gains, stream) == cudaSuccess) {
      g_cluster_update_launches.fetch_add(1, std::memory_order_relaxed);
      if (a.l2_prefetch_bytes > 0) count_l2_prefetch_launch();
      return cudaSuccess;
    }
    (void)cudaGetLastError();  // (the refused launch's error, not left for the next check)
  }
  if (gain_type && a.cols <= kRegisterRowMax) {
    const cudaError_t launched =
        a.cols <= 4 * 128   ? launch_residual_update_registers<4, 128>(a, *gain_type, gains, stream)
        : a.cols <= 8 * 512 ? launch_residual_update_registers<8, 512>(a, *gain_type, gains, stream)
                            : launch_residual_update_registers<12, 448>(a, *gain_type, gains, stream);
    if (launched == cudaSuccess && a.l2_prefetch_bytes > 0) count_l2_prefetch_launch();
    return launched;
  }
  return launch_kernel(residual_update_kernel, static_cast<unsigned>(a.rows), norm_threads(a.cols), 0, stream, a);
}

int64_t residual_update_cluster_launches() { return g_cluster_update_launches.load(std::memory_order_relaxed); }

bool residual_update_cluster_available() { return sm90a_kernels_available(); }

bool residual_update_cuts_pieces(const ResidualUpdateArgs& a) {
#if defined(FIRELINE_GPU_HIP)
  (void)a;
  return false;
#else
  return a.rows == 1 && a.n_norms >= 1 && a.cols > 0 && a.cols <= kRegisterRowMax &&
         (a.pieces_group == 128 || a.pieces_group == 256) && register_gain_format(a, nullptr).has_value();
#endif
}

}  // namespace fl::cuda
