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

// out[r] = rms(x[r]) (* gain); row strides in elements.
cudaError_t launch_rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                            int64_t cols, const void* weight, DType weight_type, Gain gain, float eps,
                            cudaStream_t stream);

}  // namespace fl::cuda
