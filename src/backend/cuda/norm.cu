// RMSNorm: one block per row; the sum of squares is reduced in f32 across the block. The fused
// forms spare a launch each where the model follows a norm with a residual add (add_rms_norm) or
// with RoPE (rms_norm_rope): at batch 1 such kernels move a few kilobytes and cost their launch.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/norm.cuh"

namespace fl::cuda {
namespace {

// transformers: x * pow(mean(x^2) + eps, -0.5), then * gain
__device__ __forceinline__ float rms_inverse(const float* src, int64_t cols, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += src[i] * src[i];
  sum_sq = block_sum(sum_sq);
  return powf(sum_sq / static_cast<float>(cols) + eps, -0.5f);
}

__device__ __forceinline__ float apply_gain(float v, const uint8_t* weight, DType weight_type, Gain gain, int64_t i) {
  if (gain == Gain::none) return v;
  const float w = load_weight(weight, i, weight_type);
  return v * (gain == Gain::one_plus_weight ? 1.0f + w : w);
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

}  // namespace fl::cuda
