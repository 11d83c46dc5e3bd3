#pragma once
// Which attention kernel a step runs and how many splits along the context (attention.cu):
// plain host code, without the GPU runtime's headers, so that host-only tests include it.
#include <cstdint>

#include "core/dtype.h"

namespace fl::cuda {

// How a step's attention runs: the kernel (group_queries: the tensor-core kernel by query group)
// and the splits along the context.
struct AttentionPlan {
  bool group_queries = false;
  bool by_kv_head = false;  // the decode kernel by KV head (attention_decode.cu)
  int n_splits = 1;
};
// T query rows (one sequence's consecutive tokens, or with per_row one decode row per sequence),
// max_keys: the most keys a query can see (fixed by the cache size, not the position, so that a
// captured decode step stays valid). The CUDA backend and attention_bench share this choice. No
// rows (or no SMs) plan one unsplit SIMT launch.
AttentionPlan plan_attention(int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, int64_t max_keys,
                             bool per_row, int sm_count, DType cache_type);

// Decode rows may take the tensor-core kernel with group_queries: a block per (query row, KV
// head, split) whose 16 query rows hold the KV head's query heads (at most 16), head dims
// multiples of 64 up to 512. False in HIP builds (no mma.sync).
bool flash_decode_applies(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

// Decode rows over a Q8_0 cache with head dims 256 or 512 and 1, 2, 4, 8 or 16 query heads per KV
// head may take the decode kernel by KV head (attention_decode.cu). False in HIP builds (no
// cp.async).
bool decode_by_kv_head_applies(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, DType cache_type);

}  // namespace fl::cuda
