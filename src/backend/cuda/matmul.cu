// Matrix-vector products on packed weights: out[i, m] = sum_k x[i, k] * W[m, k] for every weight
// format, with the weight decoded in registers. Rows are read whole including the padded tail
// block; values with k >= K are never used (tail predication). Two kernels:
//
// matvec_rows_kernel (one input per weight matrix: batch-1 decode and the routed expert pairs):
// each warp owns kRows rows and each lane 8 consecutive weights per 256-wide chunk, so one load
// instruction reads 128 contiguous bytes of HFQ4 codes. The lane's 8 inputs are loaded once (two
// 16-byte loads) and used for all kRows rows: with one row per warp, x (4 bytes per weight, read
// through L1 with 32-byte strides between lanes) was 7.5x the weight traffic and capped the
// kernel near 256 GB/s on the H200. All kRows x kUnroll chunks' loads are issued before the first
// decode, so a lane has that many requests in flight.
//
// matvec_kernel (several inputs: prefill and batched decode): one warp per row, each weight chunk
// decoded once and used for up to kTokens inputs.
//
// Many inputs on HFQ4 weights go to the tensor-core GEMM instead (matmul_mma.cu).
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"

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

// One input per group g (the plain matmul's single input, or routed pair g with its expert's
// matrix); warp w of block b computes rows (b * kWarpsPerBlock + w) * kRows + r, r < kRows.
template <DType F, int kRows, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    matvec_rows_kernel(MatvecArgs a, bool vector_x, bool prefetch) {
  const int lane = threadIdx.x % kWarp;
  // A grouped launch: this block's segment (few, so a linear search), and the block within it.
  int64_t block = blockIdx.x;
  float* out = a.out;
  const uint8_t* matrix = a.weight;
  int64_t M = a.M, row_bytes = a.row_bytes;
  if (a.n_segments > 0) {
    int s = 0;
    while (s + 1 < a.n_segments && block >= a.segments[s + 1].first_block) ++s;
    block -= a.segments[s].first_block;
    out = a.segments[s].out;
    matrix = a.segments[s].weight;
    M = a.segments[s].M;
    row_bytes = a.segments[s].row_bytes;
  }
  const int64_t m_first = (block * kWarpsPerBlock + threadIdx.x / kWarp) * kRows;
  // Everything above reads only the kernel's arguments. A plain product's rows are known now:
  // start pulling them into L2 while the previous kernel (a norm, an attention merge) finishes.
  if (prefetch && blockIdx.y == 0 && m_first < M)
    for (int r = 0; r < kRows && m_first + r < M; ++r)
      for (int64_t byte = lane * 128; byte < row_bytes; byte += 128 * kWarp)
        prefetch_l2(matrix + (m_first + r) * row_bytes + byte);
  enter_kernel();
  if (m_first >= M) return;
  for (int64_t g = blockIdx.y; g < a.n_inputs; g += gridDim.y) {
    const uint8_t* weight = matrix;
    if (a.expert_ids) weight += static_cast<int64_t>(a.expert_ids[g]) * a.expert_bytes;
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

template <DType F, int kRows>
cudaError_t launch_rows(MatvecArgs a, cudaStream_t stream) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarpsPerBlock) * kRows;
  int64_t blocks = (a.M + rows_per_block - 1) / rows_per_block;
  if (a.n_segments > 0) {  // the segments' blocks one after another
    blocks = 0;
    for (int s = 0; s < a.n_segments; ++s) {
      a.segments[s].first_block = blocks;
      blocks += (a.segments[s].M + rows_per_block - 1) / rows_per_block;
    }
  }
  if (blocks == 0) return cudaSuccess;  // every segment empty
  const unsigned row_blocks = static_cast<unsigned>(blocks);
  const unsigned y = static_cast<unsigned>(a.n_inputs < 65535 ? a.n_inputs : 65535);
  // 16-byte x loads need every input row 16-byte aligned: an aligned base and, with several
  // input rows, a stride of whole float4s.
  const bool vector_x = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                        (a.x_stride % 4 == 0 || (a.n_inputs - 1) / a.x_row_div == 0);
  // The L2 prefetch before enter_kernel() pays only when the whole grid is resident while the
  // previous kernel runs (one wave: the small matrices of a decode step); a multi-wave grid's
  // later blocks start after it anyway, and there the prefetches only add L2 requests (31B
  // decode 54 -> 50 tok/s with them on every matrix).
  const bool prefetch = !a.expert_ids && blocks * y <= 2 * static_cast<int64_t>(current_device_traits().sm_count);
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

template <DType F>
cudaError_t launch_format(const MatvecArgs& a, cudaStream_t stream) {
  // One input per matrix (decode, expert pairs): rows share each lane's x registers. Four rows per
  // warp cut x traffic 4x but make 32 rows per block, so a small matrix (k_proj of a global
  // layer: 1024 rows) would leave most of the 132 SMs idle; fewer rows per warp while the grid
  // would have under two blocks per SM.
  if (a.expert_ids || a.n_inputs == 1) {
    if (row_blocks_at(a, 4) >= 264) return launch_rows<F, 4>(a, stream);
    if (row_blocks_at(a, 2) >= 132) return launch_rows<F, 2>(a, stream);
    return launch_rows<F, 1>(a, stream);
  }
  // Several inputs (prefill, batched decode) share each weight load across kTokens accumulators,
  // with 4 chunks in flight.
  const unsigned row_blocks = static_cast<unsigned>((a.M + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int64_t groups = (a.n_inputs + kTokens - 1) / kTokens;
  const unsigned y = static_cast<unsigned>(groups < 65535 ? groups : 65535);
  return launch_kernel(matvec_kernel<F, kTokens, 4>, dim3(row_blocks, y), kWarpsPerBlock * kWarp, 0, stream, a);
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
  return !a.expert_ids && a.n_segments == 0 && a.n_inputs >= kMmaMinInputs && matmul_mma_supports(a.weight_type);
}

size_t matvec_scratch_bytes(const MatvecArgs& a) {
  return takes_mma(a) ? matmul_mma_scratch_bytes(a, a.act_pieces) : 0;
}

cudaError_t launch_matvec(const MatvecArgs& a, cudaStream_t stream) {
  if (a.n_segments != 0) return cudaErrorInvalidValue;  // launch_matvec_group
  if (a.M == 0 || a.n_inputs == 0) return cudaSuccess;
  if (takes_mma(a)) return launch_matmul_mma(a, a.act_pieces, stream);
  cudaError_t result = cudaErrorInvalidValue;
  dispatch_weight_format(a.weight_type, [&](auto format) { result = launch_format<decltype(format)::value>(a, stream); });
  return result;
}

}  // namespace fl::cuda
