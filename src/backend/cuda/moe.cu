// Mixture-of-experts routing and combination. The expert matrices themselves go through the
// matvec kernel with expert ids read from device memory (matmul.cu), so the chosen experts never
// visit the host.
#include <cfloat>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_route.cuh"

namespace fl::cuda {
namespace {

constexpr int kRouteThreads = 256;
constexpr int kMaxTopK = 64;

// One block per token: softmax over the experts in shared memory, then top_k rounds of a block
// argmax (highest probability, lowest id on ties), renormalise, per-expert scale.
__global__ void moe_route_kernel(float* weights, int32_t* ids, const float* logits, int64_t n_experts, int64_t top_k,
                                 const uint8_t* per_expert_scale, DType scale_type) {
  enter_kernel();
  extern __shared__ float prob[];
  __shared__ float s_val[kRouteThreads];
  __shared__ int s_idx[kRouteThreads];
  __shared__ float chosen_p[kMaxTopK];
  __shared__ int chosen_id[kMaxTopK];
  const int64_t t = blockIdx.x;
  const float* row = logits + t * n_experts;

  float local_max = -FLT_MAX;
  for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x) local_max = fmaxf(local_max, row[e]);
  s_val[threadIdx.x] = local_max;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) s_val[threadIdx.x] = fmaxf(s_val[threadIdx.x], s_val[threadIdx.x + step]);
    __syncthreads();
  }
  const float max_logit = s_val[0];
  __syncthreads();
  float local_sum = 0.0f;
  for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x) {
    prob[e] = expf(row[e] - max_logit);
    local_sum += prob[e];
  }
  const float sum = block_sum(local_sum);
  for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x) prob[e] /= sum;
  __syncthreads();

  for (int64_t j = 0; j < top_k; ++j) {
    float best = -1.0f;
    int best_e = 0x7fffffff;
    for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x)
      if (prob[e] > best) best = prob[e], best_e = static_cast<int>(e);
    s_val[threadIdx.x] = best;
    s_idx[threadIdx.x] = best_e;
    __syncthreads();
    for (int step = blockDim.x / 2; step > 0; step /= 2) {
      if (threadIdx.x < step) {
        const float ov = s_val[threadIdx.x + step];
        const int oi = s_idx[threadIdx.x + step];
        if (ov > s_val[threadIdx.x] || (ov == s_val[threadIdx.x] && oi < s_idx[threadIdx.x]))
          s_val[threadIdx.x] = ov, s_idx[threadIdx.x] = oi;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      chosen_p[j] = s_val[0];
      chosen_id[j] = s_idx[0];
      prob[s_idx[0]] = -2.0f;  // taken
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += chosen_p[j];
    for (int64_t j = 0; j < top_k; ++j) {
      float w = chosen_p[j] / top_sum;
      if (per_expert_scale) w *= load_weight(per_expert_scale, chosen_id[j], scale_type);
      weights[t * top_k + j] = w;
      ids[t * top_k + j] = chosen_id[j];
    }
  }
}

// The same routing with one warp per token for up to kWarp * kPerLane experts (Gemma 4: 128,
// Qwen3.5: 256): probabilities stay in registers and every reduction is a warp shuffle. The block
// kernel above spends 8 __syncthreads per top-k round (~16 us per layer at top-8, measured on
// the H200), which at batch 1 was 7 % of the decode step.
template <int kPerLane>
__global__ void moe_route_warp_kernel(float* weights, int32_t* ids, const float* logits, int64_t n_tokens,
                                      int64_t n_experts, int64_t top_k, const uint8_t* per_expert_scale,
                                      DType scale_type, L2Spans scale_lines) {
  prefetch_spans_l2(scale_lines);  // a weight: read only after the top-k, so fetched while waiting
  enter_kernel();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (t >= n_tokens) return;  // the whole warp
  const int lane = threadIdx.x % kWarp;
  route_token_in_warp<kPerLane>(logits + t * n_experts, n_experts, top_k, per_expert_scale, scale_type,
                                ids + t * top_k + lane, weights + t * top_k + lane);
}

// out[t, c] = sum over the token's experts in ascending id order of weight * y[pair, c]; pairs of
// id -1 (another rank's expert, --ep) have no y row and are skipped.
__global__ void moe_combine_kernel(float* out, int64_t out_stride, const float* y, const float* weights,
                                   const int32_t* ids, int64_t top_k, int64_t cols) {
  enter_kernel();
  const int64_t t = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  int order[kMaxTopK];
  for (int64_t j = 0; j < top_k; ++j) order[j] = static_cast<int>(j);
  for (int64_t a = 1; a < top_k; ++a)  // insertion sort by expert id: top_k is small
    for (int64_t b = a; b > 0 && ids[t * top_k + order[b]] < ids[t * top_k + order[b - 1]]; --b) {
      int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  float sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    const int64_t pair = t * top_k + order[j];
    if (ids[pair] >= 0) sum = fmaf(y[pair * cols + c], weights[pair], sum);  // (the fused experts' FMA)
  }
  out[t * out_stride + c] = sum;
}

// Backend::moe_keep_experts: a few hundred pairs per step at most, one thread each.
__global__ void moe_keep_experts_kernel(int32_t* ids, float* weights, int64_t n, int32_t first, int32_t count) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (id >= first && id - first < count) {
      ids[i] = id - first;
    } else {
      ids[i] = -1;
      weights[i] = 0.0f;
    }
  }
}

}  // namespace

cudaError_t launch_moe_route(float* weights, int32_t* ids, const float* logits, int64_t n_tokens, int64_t n_experts,
                             int64_t top_k, const void* per_expert_scale, DType scale_type, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  if (top_k > kMaxTopK || top_k > n_experts) return cudaErrorInvalidValue;
  if (top_k <= kWarp && n_experts <= 16 * kWarp) {  // one warp per token, 4 tokens per block
    const unsigned blocks = static_cast<unsigned>((n_tokens + 3) / 4);
    const auto* scale = static_cast<const uint8_t*>(per_expert_scale);
    L2Spans scale_lines;
    add_l2_span(scale_lines, scale, scale ? row_bytes(scale_type, n_experts) : 0);
    if (n_experts <= 4 * kWarp)
      return launch_kernel(moe_route_warp_kernel<4>, blocks, 4 * kWarp, 0, stream, weights, ids, logits, n_tokens,
                           n_experts, top_k, scale, scale_type, scale_lines);
    return launch_kernel(moe_route_warp_kernel<16>, blocks, 4 * kWarp, 0, stream, weights, ids, logits, n_tokens,
                         n_experts, top_k, scale, scale_type, scale_lines);
  }
  return launch_kernel(moe_route_kernel, static_cast<unsigned>(n_tokens), kRouteThreads, n_experts * sizeof(float),
                       stream, weights, ids, logits, n_experts, top_k, static_cast<const uint8_t*>(per_expert_scale),
                       scale_type);
}

cudaError_t launch_moe_combine(float* out, int64_t out_stride, const float* y, const float* weights,
                               const int32_t* ids, int64_t n_tokens, int64_t top_k, int64_t cols, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  if (top_k > kMaxTopK) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(n_tokens));
  return launch_kernel(moe_combine_kernel, grid, 256, 0, stream, out, out_stride, y, weights, ids, top_k, cols);
}

cudaError_t launch_moe_keep_experts(int32_t* ids, float* weights, int64_t n, int32_t first, int32_t count,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  return launch_kernel(moe_keep_experts_kernel, static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream,
                       ids, weights, n, first, count);
}

}  // namespace fl::cuda
