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

// One part of launch_rms_norm_rope_group: x [T, heads, D] contiguous, in place.
struct HeadNormPart {
  float* x = nullptr;
  int64_t heads = 0, head_dim = 0;
  const void* weight = nullptr;
  DType weight_type = DType::f32;
  Gain gain = Gain::none;
  bool rope = false;  // with positions / inv_freq / half of the launch
  // Rows read from here (token and head strides in elements) into x, normed; null: x in place.
  const float* src = nullptr;
  int64_t src_token_stride = 0, src_head_stride = 0;
};
constexpr int kMaxHeadNormParts = 4;
// Every part's head rows normed (and RoPE'd where asked) in one launch.
cudaError_t launch_rms_norm_rope_group(const HeadNormPart* parts, int n_parts, int64_t n_tokens, float eps,
                                       const int32_t* positions, const float* inv_freq, int64_t half,
                                       cudaStream_t stream);

// launch_residual_update's arguments: Backend::residual_update with device pointers and element
// strides; every matrix [rows, cols].
struct ResidualTermArgs {
  float* x = nullptr;
  int64_t stride = 0;
  const void* weight = nullptr;
  DType weight_type = DType::f32;
  Gain gain = Gain::none;
  bool normed = true;
};
struct StreamNormArgs {
  float* out = nullptr;
  int64_t stride = 0;
  const void* weight = nullptr;
  DType weight_type = DType::f32;
  Gain gain = Gain::none;
  float scale = 1.0f;
};
constexpr int kMaxResidualTerms = 2, kMaxStreamNorms = 4;
struct ResidualUpdateArgs {
  float* h = nullptr;
  int64_t h_stride = 0, rows = 0, cols = 0;
  float eps = 0.0f;
  int n_terms = 0;
  ResidualTermArgs terms[kMaxResidualTerms];
  bool merge = false;
  const void* merge_weight = nullptr;
  DType merge_type = DType::f32;
  Gain merge_gain = Gain::none;
  const void* scalar = nullptr;  // null: no layer scalar
  DType scalar_type = DType::f32;
  int n_norms = 0;
  StreamNormArgs norms[kMaxStreamNorms];
  // Each norm's output also cut into the integer matvec's pieces (imma_pieces.cuh) for
  // pieces_group-weight groups, at pieces[n] (hfq4_imma_scratch_bytes(cols, pieces_group) bytes;
  // nullptr: not cut): the next products' inputs cut where they are made
  // (BackendOptions::imma_ready_pieces). Only where residual_update_cuts_pieces says so (one row,
  // the register or cluster kernel; CUDA).
  void* pieces[kMaxStreamNorms] = {};
  int pieces_group = 0;
  bool cuts_pieces() const {
    for (int n = 0; n < n_norms; ++n)
      if (pieces[n]) return true;
    return false;
  }
  // One row spread over a cluster of blocks (sm_90 devices, builds with sm_90a code; rows of
  // 16-byte-aligned f32 with a multiple of 8 columns, gains as the register kernel takes them)
  // instead of one block: BackendOptions::cluster_residual_update. Only the order of the row's
  // sums differs.
  bool cluster = false;
  // Weights the next kernel reads (BackendOptions::update_prefetch_mb): the register and cluster
  // kernels pull them into L2 before their wait, each block a slice. Weights only (launch.cuh).
  const uint8_t* l2_prefetch = nullptr;
  int64_t l2_prefetch_bytes = 0;
};
cudaError_t launch_residual_update(const ResidualUpdateArgs& a, cudaStream_t stream);
// Whether this device and build have the cluster form of the one-row update (ResidualUpdateArgs::cluster).
bool residual_update_cluster_available();
// How many launches took that form (for tests that check it ran).
int64_t residual_update_cluster_launches();
// Whether launch_residual_update can cut its norms' outputs into pieces for these arguments.
bool residual_update_cuts_pieces(const ResidualUpdateArgs& a);

}  // namespace fl::cuda
