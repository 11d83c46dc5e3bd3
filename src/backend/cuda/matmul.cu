// Matrix-vector products on packed weights: out[i, m] = sum_k x[i, k] * W[m, k] for every weight
// format, with the weight decoded in registers. One warp per output row; each lane decodes 8
// consecutive weights per 256-wide chunk (one word of HFQ4 codes, three halfwords of HFQ6/Q8_0
// codes), so a warp reads 256 weights of its row with coalesced loads and reads the row once per
// group of up to kTokens inputs. Rows are read whole including the padded tail block; values
// with k >= K are never used (tail predication).
//
// Still to come (issue 7): 16-byte loads with several in flight, fused expert kernels, and a
// tensor-core GEMM for prefill.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/matmul.cuh"

namespace fl::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kTokens = 8;  // inputs sharing one pass over a weight row (plain matmul)

template <DType F, int kT, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) matvec_kernel(MatvecArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (m >= a.M) return;
  const int64_t n_groups = a.expert_ids ? a.n_inputs : (a.n_inputs + kT - 1) / kT;
  for (int64_t g = blockIdx.y; g < n_groups; g += gridDim.y) {
    const uint8_t* weight = a.weight;
    int64_t first = g * kT, count = kT;
    if (a.expert_ids) {
      weight += static_cast<int64_t>(a.expert_ids[g]) * a.expert_bytes;
      first = g;
      count = 1;
    }
    if (first + count > a.n_inputs) count = a.n_inputs - first;
    const uint8_t* row = weight + m * a.row_bytes;
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

template <DType F>
cudaError_t launch_format(const MatvecArgs& a, cudaStream_t stream) {
  const unsigned row_blocks = static_cast<unsigned>((a.M + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int64_t groups = a.expert_ids ? a.n_inputs : (a.n_inputs + kTokens - 1) / kTokens;
  const unsigned y = static_cast<unsigned>(groups < 65535 ? groups : 65535);
  dim3 grid(row_blocks, y);
  // One input (decode): a single accumulator leaves registers for 8 chunks of weights in flight
  // per lane (K = 2816 is then two steps per row); measured on the H200, 26B-A4B decode matmuls
  // went from 7.96 to 6.58 ms per token. Expert pairs keep 4 chunks: 8 made them slower (2.98 ->
  // 3.66 ms), as their grid already has a block row per pair. Several inputs share each weight
  // load across kTokens accumulators with 4 chunks in flight.
  if (a.expert_ids)
    matvec_kernel<F, 1, 4><<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(a);
  else if (a.n_inputs == 1)
    matvec_kernel<F, 1, 8><<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(a);
  else
    matvec_kernel<F, kTokens, 4><<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_matvec(const MatvecArgs& a, cudaStream_t stream) {
  if (a.M == 0 || a.n_inputs == 0) return cudaSuccess;
  cudaError_t result = cudaErrorInvalidValue;
  dispatch_weight_format(a.weight_type, [&](auto format) { result = launch_format<decltype(format)::value>(a, stream); });
  return result;
}

}  // namespace fl::cuda
