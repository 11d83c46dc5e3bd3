// Attention over a sequence's fresh keys/values plus its KV cache (ring or linear rows), for
// prefill and decode alike, and the KV write.
//
// Work split (flash-decoding): grid = (token x head, n_splits). Each block takes one contiguous
// slice of the query's visible keys; its 4 warps stride over the slice with an online softmax
// (running max, running sum, running weighted V), merge in shared memory, and either write the
// normalised output (n_splits == 1) or a partial (max, sum, V) that attention_merge_kernel
// combines. Splitting along the context keeps all SMs busy at batch 1 with long contexts, where
// (token x head) alone gives only 16-32 blocks.
#include <cfloat>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/attention.cuh"

namespace fl::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kMaxPerLane = 512 / kWarp;  // head_dim <= 512

// Where key/value j of KV head g lives: the step's fresh rows (f32) or a cache row (any format).
// Resolved once per key, so the per-element loads do no 64-bit index arithmetic.
struct KvRow {
  const float* fresh;    // non-null: read fresh[d]
  const uint8_t* cached;  // otherwise: element d of this packed row
};

__device__ __forceinline__ KvRow kv_row(const AttentionArgs& a, const float* fresh, const uint8_t* cache, int64_t j,
                                        int64_t p0, int g) {
  if (j >= p0) return {fresh + ((j - p0) * a.n_kv_heads + g) * a.head_dim, nullptr};
  return {nullptr, cache + ((j % a.cache_rows) * a.n_kv_heads + g) * a.cache_row_bytes};
}

// The cache's element type is a template parameter: a run-time switch per element cost more than
// the load itself.
template <DType C>
__device__ __forceinline__ float kv_load(const KvRow& row, int d) {
  return row.fresh ? row.fresh[d] : load_weight_t<C>(row.cached, d);
}

template <DType C>
__global__ void __launch_bounds__(kAttnWarps * kWarp) attention_kernel(AttentionArgs a) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int g = h / (a.n_heads / a.n_kv_heads);
  const int D = a.head_dim;
  const int64_t p0 = a.positions[0];
  const int64_t query_pos = p0 + t;
  const int64_t first = a.window > 0 ? max(int64_t{0}, query_pos - a.window + 1) : 0;
  const int64_t n_visible = query_pos - first + 1;
  const int64_t chunk = (n_visible + a.n_splits - 1) / a.n_splits;
  const int64_t begin = first + blockIdx.y * chunk;
  const int64_t end = min(begin + chunk, query_pos + 1);

  float q[kMaxPerLane], acc[kMaxPerLane];
  const float* qv = a.q + (static_cast<int64_t>(t) * a.n_heads + h) * D;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    q[i] = d < D ? qv[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  for (int64_t j = begin + warp; j < end; j += kAttnWarps) {
    const KvRow krow = kv_row(a, a.k_new, a.k_cache, j, p0, g);
    const KvRow vrow = kv_row(a, a.v_new, a.v_cache, j, p0, g);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < D) dot += q[i] * kv_load<C>(krow, d);
    }
    const float s = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < D) acc[i] = acc[i] * correction + p * kv_load<C>(vrow, d);
    }
    m = m_new;
  }

  // Merge the warps: shared [warp][D + 2] = (acc..., m, l).
  extern __shared__ float smem[];
  float* mine = smem + warp * (D + 2);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < D) mine[d] = acc[i];
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

// Combines the n_splits partials of one (token, head).
__global__ void attention_merge_kernel(AttentionArgs a) {
  const int D = a.head_dim;
  const float* parts = a.partial + static_cast<int64_t>(blockIdx.x) * a.n_splits * (D + 2);
  float m_all = -FLT_MAX;
  for (int s = 0; s < a.n_splits; ++s)
    if (parts[s * (D + 2) + D + 1] > 0.0f) m_all = fmaxf(m_all, parts[s * (D + 2) + D]);
  float l_all = 0.0f;
  for (int s = 0; s < a.n_splits; ++s) {
    const float ls = parts[s * (D + 2) + D + 1];
    if (ls > 0.0f) l_all += ls * expf(parts[s * (D + 2) + D] - m_all);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < a.n_splits; ++s) {
      const float ls = parts[s * (D + 2) + D + 1];
      if (ls > 0.0f) v += parts[s * (D + 2) + d] * expf(parts[s * (D + 2) + D] - m_all);
    }
    a.out[static_cast<int64_t>(blockIdx.x) * D + d] = v / l_all;
  }
}

// One warp per (token, KV head): converts the row to the cache's element type.
__global__ void kv_write_kernel(uint8_t* k_cache, uint8_t* v_cache, DType type, int64_t cache_rows, int64_t row_bytes,
                                const float* k, const float* v, const int32_t* positions, int64_t n_tokens,
                                int64_t n_kv, int64_t D) {
  const int64_t t = blockIdx.x / n_kv, head = blockIdx.x % n_kv;
  // Positions are consecutive, so token t + cache_rows (if in this batch) lands on the same ring
  // row later: only the last writer of each row writes, as the sequential CPU loop ends up.
  if (t + cache_rows < n_tokens) return;
  const int lane = threadIdx.x;
  const int64_t row = positions[t] % cache_rows;
  for (int which = 0; which < 2; ++which) {
    const float* src = (which ? v : k) + (t * n_kv + head) * D;
    uint8_t* dst = (which ? v_cache : k_cache) + (row * n_kv + head) * row_bytes;
    if (type == DType::f32) {
      for (int64_t d = lane; d < D; d += kWarp) reinterpret_cast<float*>(dst)[d] = src[d];
    } else if (type == DType::bf16) {
      for (int64_t d = lane; d < D; d += kWarp)
        reinterpret_cast<uint16_t*>(dst)[d] = gpu::float_to_bf16_bits(src[d]);
    } else {  // q8_0, as quantize_row_q8_0_ref: d = amax / 127, q = round(x / d), f16 scale
      // 32 lanes per 32-value block: a wave64 warp does two blocks per step. The max stays within
      // each block's 32 lanes (xor offsets below 32), and every lane runs every step, so the
      // shuffles see converged lanes.
      constexpr int kBlocksPerStep = kWarp / 32;
      const int lane_block = kBlocksPerStep == 1 ? 0 : lane / 32, in_block = kBlocksPerStep == 1 ? lane : lane % 32;
      const int64_t n_blocks = (D + 31) / 32;
      for (int64_t step = 0; step < n_blocks; step += kBlocksPerStep) {
        const int64_t b = step + lane_block;
        const int64_t i = b * 32 + in_block;
        const float x = b < n_blocks && i < D ? src[i] : 0.0f;  // padded lanes hold code 0
        float amax = fabsf(x);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, gpu::shfl_xor(amax, offset));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (b >= n_blocks) continue;
        uint8_t* block = dst + b * 34;
        const float qf = fminf(fmaxf(roundf(x * id), -128.0f), 127.0f);
        block[2 + in_block] = static_cast<uint8_t>(static_cast<int8_t>(qf));
        // One 16-bit store of the scale (rows are 34-byte blocks from a cudaMalloc base, so it is
        // aligned). Two byte stores of the half's bits lost the low byte on sm_90a with nvcc 13.0
        // (the ops harness caught it: every scale's low byte read back 0).
        if (in_block == 0) *reinterpret_cast<uint16_t*>(block) = gpu::float_to_f16_bits(d);
      }
    }
  }
}

}  // namespace

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.head_dim > kMaxPerLane * kWarp || a.n_heads % a.n_kv_heads) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(a.n_tokens * a.n_heads), static_cast<unsigned>(a.n_splits));
  const size_t smem = static_cast<size_t>(kAttnWarps) * (a.head_dim + 2) * sizeof(float);
  switch (a.cache_type) {
    case DType::f32: attention_kernel<DType::f32><<<grid, kAttnWarps * kWarp, smem, stream>>>(a); break;
    case DType::bf16: attention_kernel<DType::bf16><<<grid, kAttnWarps * kWarp, smem, stream>>>(a); break;
    case DType::q8_0: attention_kernel<DType::q8_0><<<grid, kAttnWarps * kWarp, smem, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.n_splits == 1) return err;
  attention_merge_kernel<<<static_cast<unsigned>(a.n_tokens * a.n_heads), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_kv_write(uint8_t* k_cache, uint8_t* v_cache, DType cache_type, int64_t cache_rows,
                            int64_t cache_row_bytes, const float* k, const float* v, const int32_t* positions,
                            int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  if (cache_type != DType::f32 && cache_type != DType::bf16 && cache_type != DType::q8_0) return cudaErrorInvalidValue;
  kv_write_kernel<<<static_cast<unsigned>(n_tokens * n_kv_heads), kWarp, 0, stream>>>(
      k_cache, v_cache, cache_type, cache_rows, cache_row_bytes, k, v, positions, n_tokens, n_kv_heads, head_dim);
  return cudaGetLastError();
}

}  // namespace fl::cuda
