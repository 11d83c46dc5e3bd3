#pragma once
// Mixture-of-experts routing and combination (moe.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

namespace fl::cuda {

// Softmax over logits [T, E], top_k (highest first, lower id on ties), renormalise, times
// per_expert_scale (optional).
cudaError_t launch_moe_route(float* weights, int32_t* ids, const float* logits, int64_t n_tokens, int64_t n_experts,
                             int64_t top_k, const void* per_expert_scale, DType scale_type, cudaStream_t stream);
// out[t, :] = sum_j weights[t, j] * y[t * top_k + j, :], summed in ascending expert id order.
cudaError_t launch_moe_combine(float* out, int64_t out_stride, const float* y, const float* weights,
                               const int32_t* ids, int64_t n_tokens, int64_t top_k, int64_t cols, cudaStream_t stream);

// Expert parallelism (Backend::moe_keep_experts), in place over n pairs: ids in [first, first +
// count) become id - first; any other pair gets id 0 and weight 0.
cudaError_t launch_moe_keep_experts(int32_t* ids, float* weights, int64_t n, int32_t first, int32_t count,
                                    cudaStream_t stream);

}  // namespace fl::cuda
