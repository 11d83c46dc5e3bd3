#pragma once
// Element-wise and row-wise ops: embedding gather, add, scale, soft-cap, gated activations, RoPE, argmax (elementwise.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

#include "backend/cuda/kernel_types.cuh"

namespace fl::cuda {

// out[t, :] = dequant(table[ids[t], :]) * scale
cudaError_t launch_embed(float* out, int64_t out_stride, const void* table, DType table_type, int64_t table_row_bytes,
                         int64_t vocab, const int32_t* ids, int64_t n_tokens, int64_t cols, float scale,
                         int32_t* error_flag, cudaStream_t stream);
cudaError_t launch_add(float* out, int64_t out_stride, const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                       int64_t rows, int64_t cols, cudaStream_t stream);
// x *= s, or x *= dequant(scalar[0]) when scalar is given
cudaError_t launch_scale(float* x, int64_t stride, int64_t rows, int64_t cols, float s, const void* scalar,
                         DType scalar_type, cudaStream_t stream);
cudaError_t launch_softcap(float* x, int64_t stride, int64_t rows, int64_t cols, float cap, cudaStream_t stream);
cudaError_t launch_gated_activation(float* out, int64_t out_stride, const float* gate, int64_t gate_stride,
                                    const float* up, int64_t up_stride, int64_t rows, int64_t cols, Act act,
                                    cudaStream_t stream);
// Rotate-half RoPE in place on x [T, heads, D] (contiguous), pairs (i, i + half) for i < half.
cudaError_t launch_rope(float* x, int64_t n_tokens, int64_t heads, int64_t head_dim, const int32_t* positions,
                        const float* inv_freq, int64_t half, cudaStream_t stream);
// out[r] = argmax(x[r]) (lowest index on ties).
cudaError_t launch_argmax(int32_t* out, const float* x, int64_t stride, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace fl::cuda
