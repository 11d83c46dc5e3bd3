#pragma once
// Matrix-vector products on packed weights, plain and per-expert (matmul.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

namespace fl::cuda {

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

}  // namespace fl::cuda
