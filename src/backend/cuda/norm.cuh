#pragma once
// RMSNorm (norm.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

#include "backend/cuda/kernel_types.cuh"

namespace fl::cuda {

// out[r] = rms(x[r]) (* gain); row strides in elements. With `residual`, also
// residual[r] += out[r] (add_rms_norm; out may be x).
cudaError_t launch_rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                            int64_t cols, const void* weight, DType weight_type, Gain gain, float eps,
                            cudaStream_t stream, float* residual = nullptr, int64_t residual_stride = 0);
// x [T, heads, D] contiguous, in place: each head row normed (* gain), then rotate-half RoPE on
// the pairs (i, i + half), i < half (as launch_rope).
cudaError_t launch_rms_norm_rope(float* x, int64_t n_tokens, int64_t heads, int64_t head_dim, const void* weight,
                                 DType weight_type, Gain gain, float eps, const int32_t* positions,
                                 const float* inv_freq, int64_t half, cudaStream_t stream);

}  // namespace fl::cuda
