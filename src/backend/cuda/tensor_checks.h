#pragma once
// The CUDA backend's host-side checks of an op's tensors (device, format, shape, strides) and
// their reduction to what the launchers take: raw pointers and element strides. Every failure is
// an fl::Error naming the op. Host code (fmt); cuda_backend.cpp's ops call these before a launch,
// since the kernels trust their arguments.
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/cuda/norm.cuh"

namespace fl::cuda {

// f32 activation rows: pointer, row count, column count, row stride in elements.
struct F32Rows {
  float* data;
  int64_t rows, cols, stride;
};
// t as rows: f32 in GPU memory, innermost dimension contiguous, leading dimensions foldable.
F32Rows f32_rows(const Tensor& t, const char* op);

void require_device(const Tensor& t, const char* op);

// An f32 activation [T, heads, dim] with any token and head strides (a narrow() view of a fused
// projection); element strides.
struct F32Heads {
  float* data;
  int64_t tokens, heads, dim, token_stride, head_stride;
};
F32Heads f32_heads(const Tensor& t, const char* op, const char* what);

void same_shape(const F32Rows& a, const F32Rows& b, const char* op);

// A norm's gain weight: `cols` elements on the device, unless the norm has no gain.
void check_gain(const Tensor* weight, NormGain gain, int64_t cols, const char* op);

// A norm gain's bytes and format for the launchers (no gain: null, read as f32 by nobody).
inline const void* gain_data(const Tensor* weight) { return weight ? weight->data : nullptr; }
inline DType gain_dtype(const Tensor* weight) { return weight ? weight->dtype : DType::f32; }

// RoPE's inputs: x contiguous f32 [T, heads, D], positions i32 [T], inv_freq f32 [<= D / 2].
void check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const char* op);

// Backend::rms_norm_rope_group's parts checked (each a contiguous f32 [T, heads, D] of one T, the
// RoPE parts against positions and inv_freq, the gains) and reduced to the launcher's in `out`
// (kMaxHeadNormParts at most); returns T.
int64_t head_norm_parts(std::span<const HeadNorm> parts, const Tensor& positions, const Tensor& inv_freq,
                        HeadNormPart* out, const char* op);

// The per-row caches of one batched launch (attention_rows, kv_write_rows): in GPU memory, each
// with the first's rows, layout and type (the kernels size the grid and read rows from one
// description). caches is not empty.
void check_row_caches(std::span<const KvView> caches, const char* op);

// Backend::residual_update's tensors checked (Backend::check_residual_update's counts and aliases
// are the caller's) and reduced to the launcher's arguments: no pieces, no cluster.
ResidualUpdateArgs residual_update_args(const Tensor& h, const ResidualUpdate& u);

}  // namespace fl::cuda
