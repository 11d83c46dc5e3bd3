// RMSNorm: one block per row; the sum of squares is reduced in f32 across the block.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/norm.cuh"

namespace fl::cuda {
namespace {

__global__ void rms_norm_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t cols,
                                const uint8_t* weight, DType weight_type, Gain gain, float eps) {
  const float* src = x + blockIdx.x * x_stride;
  float* dst = out + blockIdx.x * out_stride;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += src[i] * src[i];
  sum_sq = block_sum(sum_sq);
  // transformers: x * pow(mean(x^2) + eps, -0.5), then * gain
  const float inv = powf(sum_sq / static_cast<float>(cols) + eps, -0.5f);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = src[i] * inv;
    if (gain != Gain::none) {
      float w = load_weight(weight, i, weight_type);
      v *= gain == Gain::one_plus_weight ? 1.0f + w : w;
    }
    dst[i] = v;
  }
}

}  // namespace

cudaError_t launch_rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                            int64_t cols, const void* weight, DType weight_type, Gain gain, float eps,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64;
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      out, out_stride, x, x_stride, cols, static_cast<const uint8_t*>(weight), weight_type, gain, eps);
  return cudaGetLastError();
}

}  // namespace fl::cuda
