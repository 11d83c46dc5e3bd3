// Attention over a sequence's fresh keys/values plus its KV cache (ring or linear rows), for
// prefill and decode alike, and the KV write.
//
// Work split (flash-decoding): grid = (token x head, n_splits). Each block takes one contiguous
// slice of the query's visible keys; its 4 warps stride over the slice with an online softmax
// (running max, running sum, running weighted V), 4 keys per step (attend_keys), merge in shared memory, and either write the
// normalised output (n_splits == 1) or a partial (max, sum, V) that attention_merge_kernel
// combines. Splitting along the context keeps all SMs busy at batch 1 with long contexts, where
// (token x head) alone gives only 16-32 blocks.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_prefetch.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/head_rows.cuh"

namespace fl::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kMaxChunks = 2;    // 8-element chunks of a head row per lane: head_dim <= 2 * 8 * kWarp

// Element d = c * 8 * kWarp + lane * 8 + e of a head row lives in lane `lane`, chunk c, slot e:
// eight consecutive elements per lane, so a Q8_0 row yields a lane's chunk with four halfword
// loads and one scale load (RawChunk), where element-wise loads took three byte loads each.
__device__ __forceinline__ int chunk_start(int c, int lane) { return c * 8 * kWarp + lane * 8; }

// N (1, 2 or 4) warp sums at once, every lane getting all N: a butterfly whose first one or two
// exchanges halve the values each lane carries, then a plain reduction and N broadcasts; 10
// shuffles for N = 4 where N separate warp_sum calls take 20. Decode attention is a chain of
// these per 4 keys, and the shuffles were most of its latency.
template <int N>
__device__ __forceinline__ void warp_sums(float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4, "warp_sums takes 1, 2 or 4 values");
  const int lane = threadIdx.x % kWarp;
  if constexpr (N == 1) {
    v[0] = warp_sum(v[0]);
  } else {
    constexpr int kHalf = kWarp / 2, kQuarter = kWarp / 4;
    const bool upper = lane & kHalf;
    float r;
    int first_reduced;  // the offset below which the plain reduction continues
    if constexpr (N == 2) {
      r = (upper ? v[1] : v[0]) + gpu::shfl_xor(upper ? v[0] : v[1], kHalf);  // lane holds value `upper`
      first_reduced = kQuarter;
    } else {
      const float t0 = (upper ? v[2] : v[0]) + gpu::shfl_xor(upper ? v[0] : v[2], kHalf);
      const float t1 = (upper ? v[3] : v[1]) + gpu::shfl_xor(upper ? v[1] : v[3], kHalf);
      const bool odd = lane & kQuarter;  // lane holds value 2 * upper + odd
      r = (odd ? t1 : t0) + gpu::shfl_xor(odd ? t0 : t1, kQuarter);
      first_reduced = kWarp / 8;
    }
#pragma unroll
    for (int offset = first_reduced; offset > 0; offset /= 2) r += gpu::shfl_xor(r, offset);
    if constexpr (N == 2) {
      v[0] = gpu::shfl(r, 0);
      v[1] = gpu::shfl(r, kHalf);
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = gpu::shfl(r, (u >> 1) * kHalf + (u & 1) * kQuarter);
    }
  }
}

// q . (a chunk's 8 values) and acc += p * (the chunk's values). Q8_0 keeps its scale out of the
// element loop (one multiply per chunk, not per value) and decodes its codes with a byte permute
// and a subtract each (RawChunk<q8_0>::decode_codes): attention_bench, Gemma 4 sliding layers at
// 4k, 26B 14.4 -> 13.5 us alone, 508 -> 481 us for 64 batched rows.
// The chunk's values as w[i] * (the returned factor): Q8_0's codes and block scale, else the
// decoded values and 1.
template <DType S>
__device__ __forceinline__ float decode_factored(const RawChunk<S>& raw, float (&w)[8]) {
  if constexpr (S == DType::q8_0) {
    raw.decode_codes(w);
    return raw.scale();
  } else {
    raw.decode(w);
    return 1.0f;
  }
}
template <DType S>
__device__ __forceinline__ float chunk_dot(const RawChunk<S>& raw, const float (&q)[8]) {
  float w[8], dot = 0.0f;
  const float factor = decode_factored(raw, w);
#pragma unroll
  for (int i = 0; i < 8; ++i) dot += q[i] * w[i];
  return dot * factor;
}
template <DType S>
__device__ __forceinline__ void chunk_axpy(const RawChunk<S>& raw, float p, float (&acc)[8]) {
  float v[8];
  p *= decode_factored(raw, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += p * v[i];
}

// The online softmax over keys [b, e) whose rows have format S (the cache's type, or f32 for the
// step's fresh rows); row(j) gives key j's K or V row as bytes. Each warp takes every
// kAttnWarps-th key, kKeysPerStep at a time: the K and V loads of all of them are issued before the
// first shuffle, so a warp waits for memory once per step instead of once per key (the serial
// load -> warp sum -> exp chain per key was what kept decode attention near 38 GB/s). Registers
// bound kKeysPerStep: a Q8_0 chunk is held as 5 halfwords, an f32/bf16 chunk as 8 floats.
template <DType S, int kKeysPerStep, int kChunks, class KRowFn, class VRowFn>
__device__ __forceinline__ void attend_keys(int64_t b, int64_t e, int D, float scale, const float (&q)[kChunks][8],
                                            float (&acc)[kChunks][8], float& m, float& l, KRowFn k_row, VRowFn v_row) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t j = b + warp; j < e; j += kAttnWarps * kKeysPerStep) {
    RawChunk<S> kr[kKeysPerStep][kChunks], vr[kKeysPerStep][kChunks];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      const int64_t key = j + u * kAttnWarps;
      if (key >= e) break;
      const uint8_t* krow = k_row(key);
      const uint8_t* vrow = v_row(key);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        if (chunk_start(c, lane) < D) {
          kr[u][c].load(krow, chunk_start(c, lane), D);
          vr[u][c].load(vrow, chunk_start(c, lane), D);
        }
    }
    float s[kKeysPerStep];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      float dot = 0.0f;
      if (j + u * kAttnWarps < e) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (chunk_start(c, lane) < D) dot += chunk_dot(kr[u][c], q[c]);  // q is 0 past D
      }
      s[u] = dot;
    }
    warp_sums<kKeysPerStep>(s);  // every lane shuffles: the loop bounds are uniform per warp
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      s[u] *= scale;
      if (j + u * kAttnWarps < e) m_new = fmaxf(m_new, s[u]);
    }
    const float correction = expf(m - m_new);
    l *= correction;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c][i] *= correction;
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      if (j + u * kAttnWarps >= e) break;
      const float p = expf(s[u] - m_new);
      l += p;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        if (chunk_start(c, lane) < D) chunk_axpy(vr[u][c], p, acc[c]);
    }
    m = m_new;
  }
}

// kChunks: 8-element chunks per lane of a head row, 1 for D <= 256 and 2 up to 512: the query,
// the output and the loaded rows are held in registers for that many. The kernel is
// latency-bound, so D <= 256 asks for 5 blocks per SM (96 registers, a few bytes spilled; 168 at
// two chunks held 3 blocks). attention_bench, Q8_0 at 4k: Gemma 4 26B sliding, 64 batched rows
// 442 -> 317 us (4 blocks per SM, 106 registers: 333), one sequence 13.5 -> 12.5 (4 blocks:
// 12.0); Qwen3.5-4B, 64 rows 1680 -> 1167.
constexpr int kAttnThreads = kAttnWarps * kWarp;
template <DType C, int kChunks>
__global__ void __launch_bounds__(kAttnThreads, kChunks == 1 ? 5 : 1) attention_kernel(AttentionArgs a) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int g = h / (a.n_heads / a.n_kv_heads);
  const int D = a.head_dim;
  // One sequence: query t is at positions[0] + t and keys from positions[0] on are this step's
  // fresh rows. Per-row caches (batched decode): query t is at positions[t] in its own cache and
  // only its own key is fresh. Either way key j >= p0 is fresh row t + (j - query_pos).
  const bool per_row = a.k_row_caches != nullptr;
  const int64_t query_pos = per_row ? a.positions[t] : a.positions[0] + t;
  const int64_t p0 = per_row ? query_pos : a.positions[0];
  const int64_t first = a.window > 0 ? max(int64_t{0}, query_pos - a.window + 1) : 0;
  const int64_t n_visible = query_pos - first + 1;
  const int64_t chunk = (n_visible + a.n_splits - 1) / a.n_splits;
  const int64_t begin = first + blockIdx.y * chunk;
  const int64_t end = min(begin + chunk, query_pos + 1);
  // Keys before p0 are in the cache (ring row j % cache_rows); keys from p0 on are this step's
  // fresh f32 rows.
  const int64_t row_stride = static_cast<int64_t>(a.n_kv_heads) * a.cache_row_bytes;
  const uint8_t* k_cache = (per_row ? a.k_row_caches[t] : a.k_cache) + g * a.cache_row_bytes;
  const uint8_t* v_cache = (per_row ? a.v_row_caches[t] : a.v_cache) + g * a.cache_row_bytes;
  // The cached rows this block reads were written by earlier steps' KV writes, and positions and
  // the row tables by host uploads: pull the rows into L2 while the previous kernel (the q/k
  // norms) still runs, so the key steps below wait on L2 instead of DRAM. Only a hint: were a
  // position stale, other lines of the same cache would be fetched and nothing computed differs.
  prefetch_cached_keys(k_cache, v_cache, begin, min(end, p0), a.cache_rows, row_stride, a.cache_row_bytes);
  enter_kernel();

  float q[kChunks][8], acc[kChunks][8];
  const float* qv = a.q + (static_cast<int64_t>(t) * a.n_heads + h) * D;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int d = chunk_start(c, lane) + i;
      q[c][i] = d < D ? qv[d] : 0.0f;
      acc[c][i] = 0.0f;
    }
  float m = -FLT_MAX, l = 0.0f;
  // Decode reads many cached keys and one fresh one; prefill's fresh keys take the 1-key path.
  attend_keys<C, C == DType::q8_0 ? 4 : 2, kChunks>(
      begin, min(end, p0), D, a.scale, q, acc, m, l,
      [&](int64_t j) { return k_cache + (j % a.cache_rows) * row_stride; },
      [&](int64_t j) { return v_cache + (j % a.cache_rows) * row_stride; });
  const int64_t fresh_stride = static_cast<int64_t>(a.n_kv_heads) * D;
  const float* k_fresh = a.k_new + g * D;
  const float* v_fresh = a.v_new + g * D;
  const int64_t fresh_base = t - query_pos;  // + j: the fresh row of key j
  attend_keys<DType::f32, 1, kChunks>(
      max(begin, p0), end, D, a.scale, q, acc, m, l,
      [&](int64_t j) { return reinterpret_cast<const uint8_t*>(k_fresh + (fresh_base + j) * fresh_stride); },
      [&](int64_t j) { return reinterpret_cast<const uint8_t*>(v_fresh + (fresh_base + j) * fresh_stride); });

  // Merge the warps: shared [warp][D + 2] = (acc..., m, l).
  extern __shared__ float smem[];
  float* mine = smem + warp * (D + 2);
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int d = chunk_start(c, lane) + i;
      if (d < D) mine[d] = acc[c][i];
    }
  if (lane == 0) mine[D] = m, mine[D + 1] = l;
  __syncthreads();
  float m_all = -FLT_MAX;
  for (int w = 0; w < kAttnWarps; ++w)
    if (smem[w * (D + 2) + D + 1] > 0.0f) m_all = fmaxf(m_all, smem[w * (D + 2) + D]);
  float l_all = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) {
    const float lw = smem[w * (D + 2) + D + 1];
    if (lw > 0.0f) l_all += lw * expf(smem[w * (D + 2) + D] - m_all);
  }
  const int64_t out_index = static_cast<int64_t>(t) * a.n_heads + h;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      const float lw = smem[w * (D + 2) + D + 1];
      if (lw > 0.0f) v += smem[w * (D + 2) + d] * expf(smem[w * (D + 2) + D] - m_all);
    }
    if (a.n_splits == 1) {
      a.out[out_index * D + d] = v / l_all;
    } else {
      a.partial[(out_index * a.n_splits + blockIdx.y) * (D + 2) + d] = v;
    }
  }
  if (a.n_splits > 1 && threadIdx.x == 0) {
    float* p = a.partial + (out_index * a.n_splits + blockIdx.y) * (D + 2);
    p[D] = m_all;
    p[D + 1] = l_all;
  }
}

// Combines the n_splits partials of one (token, head): block (token x head, slice) takes kWarp
// output elements. The splits' weights exp(m_s - m_all) are computed once per block into shared
// memory; then each warp sums every n_warps-th split's partials for its lane's element (coalesced
// rows), and the warps' sums are added in warp order. (One block per (token, head) put the whole
// merge on 16 SMs at batch 1: 9.6 us per layer for 64 splits.)
constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(AttentionArgs a) {
  enter_kernel();
  extern __shared__ float weight[];  // [n_splits]
  constexpr int kMergeWarps = kMergeThreads / kWarp;
  __shared__ float reduce[kMergeWarps][kWarp];
  const int D = a.head_dim;
  const float* parts = a.partial + static_cast<int64_t>(blockIdx.x) * a.n_splits * (D + 2);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  float local_max = -FLT_MAX;
  for (int s = threadIdx.x; s < a.n_splits; s += kMergeThreads)
    if (parts[s * (D + 2) + D + 1] > 0.0f) local_max = fmaxf(local_max, parts[s * (D + 2) + D]);
  local_max = warp_max(local_max);
  if (lane == 0) reduce[warp][0] = local_max;
  __syncthreads();
  float m_all = -FLT_MAX;
  for (int w = 0; w < kMergeWarps; ++w) m_all = fmaxf(m_all, reduce[w][0]);
  float local_sum = 0.0f;
  for (int s = threadIdx.x; s < a.n_splits; s += kMergeThreads) {
    const float ls = parts[s * (D + 2) + D + 1];
    weight[s] = ls > 0.0f ? expf(parts[s * (D + 2) + D] - m_all) : 0.0f;
    local_sum += ls > 0.0f ? ls * weight[s] : 0.0f;
  }
  const float l_all = block_sum(local_sum);  // its barriers also publish weight[] and free reduce[]
  const int d = blockIdx.y * kWarp + lane;
  float v = 0.0f;
  if (d < D) {
#pragma unroll 8  // independent loads in flight: the sum waits for L2 once per 8 splits
    for (int s = warp; s < a.n_splits; s += kMergeWarps) v += parts[s * (D + 2) + d] * weight[s];
  }
  reduce[warp][lane] = v;
  __syncthreads();
  if (warp == 0 && d < D) {
    float sum = 0.0f;
    for (int w = 0; w < kMergeWarps; ++w) sum += reduce[w][lane];
    a.out[static_cast<int64_t>(blockIdx.x) * D + d] = sum / l_all;
  }
}

// One block per (token, KV head), one thread per element of the head row (D rounded up to whole
// 32-value Q8_0 blocks): the K and V elements are loaded at once, so a write costs one memory
// round trip. (A warp walking the row's blocks one after another took ~13 us for D = 512.)
__global__ void kv_write_kernel(uint8_t* k_cache, uint8_t* v_cache, uint8_t* const* k_row_caches,
                                uint8_t* const* v_row_caches, DType type, int64_t cache_rows, int64_t row_bytes,
                                const float* k, const float* v, const int32_t* positions, int64_t n_tokens,
                                int64_t n_kv, int64_t D) {
  enter_kernel();
  const int64_t t = blockIdx.x / n_kv, head = blockIdx.x % n_kv;
  if (k_row_caches) {  // one row per sequence, each into its own cache
    k_cache = k_row_caches[t];
    v_cache = v_row_caches[t];
  } else if (t + cache_rows < n_tokens) {
    // Positions are consecutive, so token t + cache_rows (if in this batch) lands on the same
    // ring row later: only the last writer of each row writes, as the sequential CPU loop ends up.
    return;
  }
  const int64_t row = positions[t] % cache_rows, i = threadIdx.x;
  const int64_t src_offset = (t * n_kv + head) * D, dst_offset = (row * n_kv + head) * row_bytes;
  const float values[2] = {i < D ? k[src_offset + i] : 0.0f, i < D ? v[src_offset + i] : 0.0f};  // past D: code 0
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const float x = values[which];
    uint8_t* dst = (which ? v_cache : k_cache) + dst_offset;
    if (type == DType::f32) {
      if (i < D) reinterpret_cast<float*>(dst)[i] = x;
    } else if (type == DType::bf16) {
      if (i < D) reinterpret_cast<uint16_t*>(dst)[i] = gpu::float_to_bf16_bits(x);
    } else {  // q8_0: each 32 consecutive threads hold one block (a wave64 wave holds two)
      // (a wave64 wave's idle half past the row joins the max and stores nothing)
      store_q8_0_lane(dst + (i / 32) * 34, x, static_cast<int>(i % 32), i < (D + 31) / 32 * 32);
    }
  }
}

}  // namespace

AttentionPlan plan_attention(int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, int64_t max_keys,
                             bool per_row, int sm_count, DType cache_type) {
  AttentionPlan plan;
  if (n_tokens <= 0 || n_heads <= 0 || sm_count <= 0) return plan;
  if (!per_row && flash_attention_applies(n_tokens, head_dim)) return plan;  // prefill: never split
  if ((per_row || n_tokens == 1) && decode_by_kv_head_applies(n_heads, n_kv_heads, head_dim, cache_type)) {
    // Decode over a Q8_0 cache: a block per (row, KV head) and split, split along the context to
    // about 2 blocks per SM for one sequence and 4 for batched rows, in whole tiles.
    // attention_bench on the H200 (us at 4k, incl. merge; blocks per SM 1 / 2 / 4): one sequence,
    // Gemma 4 26B global 26.7 / 22.8 / 22.8 (129 tiles), 31B global 46.9 / 32.5 / 39.3, Qwen3.5-4B
    // 18.3 / 13.9 / 14.2; 64 batched rows, 26B sliding 218 / 218 / 160, 26B global 830 / 685 /
    // 734, 31B global 1952 / 1654 / 1362.
    const int64_t blocks_per_sm = per_row ? 4 : 2;
    const int64_t tile = decode_by_kv_head_tile_keys();
    const int64_t blocks = n_tokens * n_kv_heads, tiles = std::max<int64_t>(1, (max_keys + tile - 1) / tile);
    plan.by_kv_head = true;
    plan.n_splits = static_cast<int>(std::clamp<int64_t>((blocks_per_sm * sm_count + blocks - 1) / blocks, 1, tiles));
    return plan;
  }
  const int64_t group = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
  if (flash_decode_applies(n_heads, n_kv_heads, head_dim)) {
    const int64_t tile = flash_decode_tile_keys(head_dim);
    const int64_t tiles = std::max<int64_t>(1, (max_keys + tile - 1) / tile);
    if (per_row) {
      // Batched decode: blocks per (sequence, KV head) when the group fills at least half of the
      // block's 16 query rows (8 heads: Gemma 4's global layers, Qwen3.5-35B-A3B's) and those
      // blocks are at least half the SMs; split along the context to one block per SM.
      // attention_bench --batch 64, Gemma 4 26B global at 4k (128 blocks unsplit): 2389 us; 2
      // splits (1 per SM) 1375, 3 splits 1780, 5 splits 1615. (Sliding layers' 2-head groups took
      // 29.9 -> 38.8 ms per 64-sequence step on the tensor cores, so they stay on the SIMT kernel.)
      const int64_t blocks = n_tokens * n_kv_heads;
      if (2 * group >= 16 && 2 * blocks >= sm_count) {
        plan.group_queries = true;
        plan.n_splits = static_cast<int>(std::clamp<int64_t>((sm_count + blocks - 1) / blocks, 1, tiles));
      }
    } else if (group >= 4) {
      // One sequence's decode: each KV head's keys read once for its query heads, split along the
      // context into whole tiles so that two blocks (~100 KB of shared memory and 2 x 128 x 248
      // registers each) run on every SM. attention_bench on the H200 (Q8 KV, incl. merge):
      // Gemma 4 26B global (8 heads per KV head, D = 512) 4k 53.9 -> 53.2 us, 32k 461 -> 251;
      // Qwen3.5-35B-A3B (8) 4k 36.8 -> 31.0, 32k 261 -> 121; Qwen3.5-4B (4) 4k equal, 32k 279 ->
      // 246; while 2-head groups (Gemma 4's sliding layers) lose: 17.5 -> 21.2 us.
      const int64_t blocks = n_tokens * n_kv_heads;
      plan.group_queries = true;
      plan.n_splits = static_cast<int>(std::clamp<int64_t>((2 * sm_count + blocks - 1) / blocks, 1, tiles));
    }
    if (plan.group_queries) return plan;
  }
  // The SIMT kernel: batched rows take twice the splits that make about 8 blocks per SM (one warp
  // walks its keys one after another: load, warp sum, exp; only many warps in flight hide the
  // latency), >= 16 keys per split. attention_bench --batch 64 at 4k, Gemma 4 26B sliding layers
  // (1024 blocks unsplit): 2 / 4 / 8 splits 481 / 442 / 453 us; 31B's (2048): 1 / 2 / 4 splits
  // 907 / 892 / 849. One sequence's decode aims for one wave of about 2 blocks per SM (3 fit, at 164
  // registers), with at most 512 keys per split: attention_bench, Gemma 4 sliding layers (window
  // 1024) at 8 blocks per SM: 26B 17.4 us (64 splits, 2.6 waves), 31B 24.2; at ~2 per SM: 14.1
  // (16 splits) and 21.4 (8); fewer splits than that, or 1.3 waves, were slower.
  const int64_t blocks = n_tokens * n_heads;
  const int64_t at_8_per_sm = std::clamp<int64_t>((8 * static_cast<int64_t>(sm_count) + blocks - 1) / blocks, 1,
                                                  std::max<int64_t>(1, max_keys / 16));
  if (per_row) {
    plan.n_splits = static_cast<int>(std::min<int64_t>(2 * at_8_per_sm, std::max<int64_t>(1, max_keys / 16)));
  } else {
    const int64_t one_wave = (2 * static_cast<int64_t>(sm_count) + blocks - 1) / blocks, by_keys = (max_keys + 511) / 512;
    plan.n_splits = static_cast<int>(std::clamp<int64_t>(std::max(one_wave, by_keys), 1, at_8_per_sm));
  }
  return plan;
}

namespace {
// One register chunk per lane up to D = 256, two above.
template <DType C>
cudaError_t launch_simt(const AttentionArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  if (a.head_dim <= 8 * kWarp) return launch_kernel(attention_kernel<C, 1>, grid, kAttnThreads, smem, stream, a);
  return launch_kernel(attention_kernel<C, kMaxChunks>, grid, kAttnThreads, smem, stream, a);
}
}  // namespace

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.head_dim > kMaxChunks * 8 * kWarp || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads || a.n_splits < 1 ||
      (a.n_splits > 1 && !a.partial))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  if (a.by_kv_head) {
    err = launch_attention_by_kv_head(a, stream);
  } else if (a.group_queries ||
             (a.n_splits == 1 && !a.k_row_caches && flash_attention_applies(a.n_tokens, a.head_dim))) {
    err = launch_flash_attention(a, stream);
  } else {
    dim3 grid(static_cast<unsigned>(a.n_tokens * a.n_heads), static_cast<unsigned>(a.n_splits));
    const size_t smem = static_cast<size_t>(kAttnWarps) * (a.head_dim + 2) * sizeof(float);
    switch (a.cache_type) {
      case DType::f32: err = launch_simt<DType::f32>(a, grid, smem, stream); break;
      case DType::bf16: err = launch_simt<DType::bf16>(a, grid, smem, stream); break;
      case DType::q8_0: err = launch_simt<DType::q8_0>(a, grid, smem, stream); break;
      default: return cudaErrorInvalidValue;
    }
  }
  if (err != cudaSuccess || a.n_splits == 1) return err;
  return launch_attention_merge(a, stream);
}

cudaError_t launch_attention_merge(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.n_splits < 2 || !a.partial) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.n_tokens * a.n_heads),
                  static_cast<unsigned>((a.head_dim + kWarp - 1) / kWarp));
  return launch_kernel(attention_merge_kernel, grid, kMergeThreads, a.n_splits * sizeof(float), stream, a);
}

cudaError_t launch_kv_write(uint8_t* k_cache, uint8_t* v_cache, DType cache_type, int64_t cache_rows,
                            int64_t cache_row_bytes, const float* k, const float* v, const int32_t* positions,
                            int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim, cudaStream_t stream,
                            uint8_t* const* k_row_caches, uint8_t* const* v_row_caches) {
  if (n_tokens == 0 || head_dim == 0) return cudaSuccess;
  if (cache_type != DType::f32 && cache_type != DType::bf16 && cache_type != DType::q8_0) return cudaErrorInvalidValue;
  // Whole 32-value blocks of threads (and whole warps: the Q8_0 max is a warp shuffle).
  const int64_t threads = (head_dim + 31) / 32 * 32;
  if (threads > 1024) return cudaErrorInvalidValue;
  const unsigned block = static_cast<unsigned>((threads + kWarp - 1) / kWarp * kWarp);
  return launch_kernel(kv_write_kernel, static_cast<unsigned>(n_tokens * n_kv_heads), block, 0, stream, k_cache,
                       v_cache, k_row_caches, v_row_caches, cache_type, cache_rows, cache_row_bytes, k, v, positions,
                       n_tokens, n_kv_heads, head_dim);
}

}  // namespace fl::cuda
