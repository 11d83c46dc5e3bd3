#pragma once
// Attention over fresh K/V plus the KV cache, and the KV write (attention.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/attention_plan.h"
#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/norm.cuh"
#include "core/dtype.h"

namespace fl::cuda {

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
  // Batched decode: query row t belongs to its own sequence, whose cache rows start at
  // k_row_caches[t] / v_row_caches[t] (device arrays; all caches share rows, layout and type);
  // k_cache / v_cache are then unused and positions[t] is row t's own position.
  const uint8_t* const* k_row_caches = nullptr;
  const uint8_t* const* v_row_caches = nullptr;
  // Decode (the tensor-core kernel): a block's query rows are one query row's query heads of one
  // KV head, so the group's K/V rows are read once for all its heads (plan_attention sets it).
  bool group_queries = false;
  // Decode rows over a Q8_0 cache (attention_decode.cu): a block per (query row, KV head, split)
  // reading the KV head's rows once for its query heads from shared memory (plan_attention sets it).
  bool by_kv_head = false;
  // With by_kv_head: 4- and 8-head groups on the tensor cores (BackendOptions::decode_attention_mma;
  // attention_decode.cu says how). Other groups keep the SIMT form.
  bool tensor_cores = false;
  int n_splits = 1;          // blocks along the context per (token, head), or per (token, KV head) with group_queries
  float* partial = nullptr;  // [T, n_heads, n_splits, head_dim + 2] when n_splits > 1
  // bf16 pieces per Q, K, P and V value in the tensor-core kernel: 3 (the f32 products) or 1
  // (bf16 values, f32 sums: attention_flash_bf16.cu where it applies). Q8_0 cache codes are
  // exact in one piece either way.
  int pieces = 3;
  // Device scratch of the bf16 prompt kernel (flash_bf16_scratch_bytes), else unused.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // Decode from the projections (Backend::attention_from_projections; by_kv_head, one sequence,
  // n_tokens == 1): q, k_new and v_new are the raw projections, which the kernel norms (and
  // rotates) as launch_rms_norm_rope_group(fresh_norms, 3, 1, norm_eps, positions, inv_freq,
  // rope_half) would, without writing them back; and the block holding the step's own key writes
  // it into k_cache_write / v_cache_write (the cache rows k_cache / v_cache read, Q8_0), as
  // launch_kv_write would. fresh_norms[i].x is unused (q, k_new, v_new say where the rows are).
  bool from_projections = false;
  HeadNormPart fresh_norms[3];
  float norm_eps = 0.0f;
  const float* inv_freq = nullptr;
  int rope_half = 0;
  uint8_t* k_cache_write = nullptr;
  uint8_t* v_cache_write = nullptr;
  // Weights the next kernel reads (BackendOptions::attention_prefetch_mb): the decode kernel by KV
  // head pulls them into L2 before its wait, each block a slice. Weights only (launch.cuh).
  const uint8_t* l2_prefetch = nullptr;
  int64_t l2_prefetch_bytes = 0;
};
// Runs the decode kernel by KV head for by_kv_head (attention_decode.cu), the tensor-core kernel
// (attention_mma.cu) for prefill-sized steps (flash_attention_applies, n_splits == 1) and for
// group_queries, else the SIMT kernel; either way split along the context
// when n_splits > 1, with a merge of the splits after.
cudaError_t launch_attention(const AttentionArgs& args, cudaStream_t stream);
// The merge alone (launch_attention runs it after split kernels): out from partial.
cudaError_t launch_attention_merge(const AttentionArgs& args, cudaStream_t stream);

// The tensor-core kernel takes >= kFlashMinTokens queries and head dims that are multiples of 16
// up to 512 (CUDA builds only; HIP keeps the SIMT kernel).
constexpr int64_t kFlashMinTokens = 16;
bool flash_attention_applies(int64_t n_tokens, int64_t head_dim);
// Keys per tile of that kernel (a split takes whole tiles).
int64_t flash_decode_tile_keys(int64_t head_dim);
cudaError_t launch_flash_attention(const AttentionArgs& args, cudaStream_t stream);
// The decode kernel by KV head (attention_decode.cu): one query row per sequence (n_tokens == 1,
// or per-row caches), a Q8_0 cache, head dims 256 and 512, 1-16 query heads per KV head (powers of
// two); the keys of a split walked in tiles of decode_by_kv_head_tile_keys(). CUDA builds only.
int64_t decode_by_kv_head_tile_keys();
cudaError_t launch_attention_by_kv_head(const AttentionArgs& args, cudaStream_t stream);
// Whether that kernel takes a step from its projections (AttentionArgs::from_projections): one
// query row, 1-8 query heads per KV head, RoPE pairs (i, i + rope_half) in whole warps
// (rope_half % 32 == 0, 2 * rope_half <= head_dim), v without gain or RoPE. False in HIP builds.
bool decode_from_projections_applies(const AttentionArgs& args);
int64_t decode_from_projections_launches();  // such launches so far (tests)
int64_t decode_by_kv_head_mma_launches();    // launches of its tensor-core form so far (tests)
// The bf16 prompt kernel (attention_flash_bf16.cu): pieces == 1, one sequence's prompt of a shape
// the tensor-core kernel takes (flash_attention_applies), whose shared memory fits the current
// device (D = 512: Hopper). It gathers the keys the step sees into bf16 scratch first:
// args.scratch of flash_bf16_scratch_bytes(args). launch_flash_attention runs it when pieces == 1
// and args.scratch is set: the caller decides once, with flash_bf16_applies, when it sets scratch.
bool flash_bf16_applies(const AttentionArgs& args);
size_t flash_bf16_scratch_bytes(const AttentionArgs& args);
cudaError_t launch_flash_bf16(const AttentionArgs& args, cudaStream_t stream);
// Writes k, v ([T, n_kv, D] f32) into cache rows positions[t] % cache_rows, converting to the
// cache's type (f32, bf16 or q8_0); with k_row_caches / v_row_caches (device arrays), row t into
// its own cache.
cudaError_t launch_kv_write(uint8_t* k_cache, uint8_t* v_cache, DType cache_type, int64_t cache_rows,
                            int64_t cache_row_bytes, const float* k, const float* v, const int32_t* positions,
                            int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim, cudaStream_t stream,
                            uint8_t* const* k_row_caches = nullptr, uint8_t* const* v_row_caches = nullptr);

}  // namespace fl::cuda
