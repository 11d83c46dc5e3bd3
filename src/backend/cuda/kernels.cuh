#pragma once
// Launchers for every CUDA kernel, grouped by op family (the kernels live in norm.cu,
// elementwise.cu, matmul.cu, attention.cu, moe.cu). A launcher takes raw device pointers, sizes,
// element strides and a stream, launches, and returns the launch's cudaError_t; the backend
// (cuda_backend.cpp) checks it and names the op in the error. No fmt or other heavy host headers
// here: nvcc compiles this file.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace fl::cuda {

enum class Gain : int { none = 0, weight = 1, one_plus_weight = 2 };
enum class Act : int { gelu_tanh = 0, silu = 1 };

// ---- norm.cu ----
// out[r] = rms(x[r]) (* gain); row strides in elements.
cudaError_t launch_rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                            int64_t cols, const void* weight, DType weight_type, Gain gain, float eps,
                            cudaStream_t stream);

// ---- elementwise.cu ----
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

// ---- matmul.cu ----
// out[i, m] = sum_k x[xrow(i), k] * W_i[m, k] for i < n_inputs, m < M, where W_i is `weight`, or,
// when expert_ids is given, the expert matrix weight + expert_ids[i] * expert_bytes, and
// xrow(i) = i / x_row_div (x_row_div = 1 for plain matmul).
struct MatvecArgs {
  float* out = nullptr;
  int64_t out_stride = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  const uint8_t* weight = nullptr;
  DType weight_type = DType::f32;
  int64_t M = 0, K = 0;
  int64_t row_bytes = 0;
  int64_t n_inputs = 0;
  const int32_t* expert_ids = nullptr;
  int64_t expert_bytes = 0;
  int64_t x_row_div = 1;
};
cudaError_t launch_matvec(const MatvecArgs& args, cudaStream_t stream);

// ---- attention.cu ----
struct AttentionArgs {
  float* out = nullptr;  // [T, n_heads, D]
  const float* q = nullptr;
  const float* k_new = nullptr;  // [T, n_kv_heads, D]
  const float* v_new = nullptr;
  const uint8_t* k_cache = nullptr;  // [cache_rows, n_kv_heads] rows of cache_row_bytes
  const uint8_t* v_cache = nullptr;
  DType cache_type = DType::f32;
  int64_t cache_rows = 0;
  int64_t cache_row_bytes = 0;
  const int32_t* positions = nullptr;  // [T], consecutive
  int n_tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int window = 0;
  int n_splits = 1;          // blocks along the context per (token, head)
  float* partial = nullptr;  // [T, n_heads, n_splits, head_dim + 2] when n_splits > 1
};
cudaError_t launch_attention(const AttentionArgs& args, cudaStream_t stream);
// Writes k, v ([T, n_kv, D] f32) into cache rows positions[t] % cache_rows, converting to the
// cache's type (f32, bf16 or q8_0).
cudaError_t launch_kv_write(uint8_t* k_cache, uint8_t* v_cache, DType cache_type, int64_t cache_rows,
                            int64_t cache_row_bytes, const float* k, const float* v, const int32_t* positions,
                            int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim, cudaStream_t stream);

// ---- moe.cu ----
// Softmax over logits [T, E], top_k (highest first, lower id on ties), renormalise, times
// per_expert_scale (optional).
cudaError_t launch_moe_route(float* weights, int32_t* ids, const float* logits, int64_t n_tokens, int64_t n_experts,
                             int64_t top_k, const void* per_expert_scale, DType scale_type, cudaStream_t stream);
// out[t, :] = sum_j weights[t, j] * y[t * top_k + j, :], summed in ascending expert id order.
cudaError_t launch_moe_combine(float* out, int64_t out_stride, const float* y, const float* weights,
                               const int32_t* ids, int64_t n_tokens, int64_t top_k, int64_t cols, cudaStream_t stream);

}  // namespace fl::cuda
