// Prefill attention on the tensor cores (FlashAttention-2 style): a block takes 16-64 queries of
// one head, walks the visible keys in tiles of kKeys, and keeps the online softmax's running max,
// sum and output in registers; S = Q K^T and O += P V are bf16 mma.sync products with f32
// accumulators.
//
// Precision: Q, K, P and V are f32. Each is split into kPieces bf16 pieces (3 pieces hold all 24
// bits of an f32 significand) and the products of pieces i, j with i + j < kPieces are summed
// (6 products for 3 pieces: the dropped ones are below 2^-24 of the result), so the scores and
// the output are the f32 ones up to summation order, as the op harness and the golden tests
// require. With one piece (TensorCorePrecision::bf16, prompts only, where the faster
// attention_flash_bf16.cu kernel does not fit the device: D = 512 on sm_80) each value is rounded
// to bf16 once and every sum stays f32. The pieces are cut in registers from f32 tiles in shared
// memory. Tiles of keys that are all in a Q8_0 cache hold the int8 codes instead (exact in one
// piece) and a scale per key and 32-element block, applied to each block's share of S and folded
// into P for each block of output columns: three products per mma step instead of six.
//
// Decode (AttentionArgs::group_queries): a block takes one query row (a token of one sequence, or
// with per-row caches one sequence's decode row) and one KV head, and its query rows are that
// head's group of query heads (Gemma 4's global layers: 8 heads over D = 512), all at the row's
// position: the group's K/V rows are read once for all its heads, where the SIMT kernel reads them
// once per head. At batch 1 the visible keys are split over blocks (grid.z, whole tiles each);
// each split writes its unnormalised output, max and sum for attention_merge_kernel.
//
// Head dims up to 512 (Gemma 4's global layers) do not fit one warp's output registers, so the
// block's 4 warps are QW query groups x DW slices of the head dim (DW = 1, 2, 4 for D <= 128,
// 256, 512): each warp computes its slice's share of S, the shares are summed through shared
// memory in a fixed order (every warp of a group gets the same S, bit for bit), and each warp
// accumulates its slice of O.
#include <cfloat>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/flash_softmax.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/mma_sync.cuh"
#endif

namespace fl::cuda {

#if !defined(FIRELINE_GPU_HIP)
namespace {

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kMaxOutTiles = 16;  // 8-wide output tiles per warp: a head-dim slice of <= 128

// c += a * b summed over the piece products that matter (i + j < kPieces).
template <int kPieces>
__device__ __forceinline__ void mma_pieces(float c[4], const uint32_t (&a)[kPieces][4], const uint32_t (&b)[kPieces][2]) {
#pragma unroll
  for (int i = 0; i < kPieces; ++i)
#pragma unroll
    for (int j = 0; i + j < kPieces; ++j) mma_bf16(c, a[i], b[j][0], b[j][1]);
}

// An A fragment (rows g and g + 8, columns 2q and 2q + 8 of a 16 x 16 tile) from its four f32
// pairs: (row g, col 2q), (row g + 8, col 2q), (row g, col 2q + 8), (row g + 8, col 2q + 8), each
// split into kPieces bf16 pairs.
template <int kPieces>
__device__ __forceinline__ void split_a_fragment(float a0, float a1, float b0, float b1, float c0, float c1, float d0,
                                                 float d1, uint32_t (&frag)[kPieces][4]) {
  uint32_t p[4][kPieces];
  split_pair<kPieces>(a0, a1, p[0]);
  split_pair<kPieces>(b0, b1, p[1]);
  split_pair<kPieces>(c0, c1, p[2]);
  split_pair<kPieces>(d0, d1, p[3]);
#pragma unroll
  for (int i = 0; i < kPieces; ++i) frag[i][0] = p[0][i], frag[i][1] = p[1][i], frag[i][2] = p[2][i], frag[i][3] = p[3][i];
}

// The A fragment of rows r0 and r0 + 8 * stride of a row-major f32 tile in shared memory (r0
// pointing at row g, column 2q of the 16-column step).
template <int kPieces>
__device__ __forceinline__ void load_a_fragment(const float* r0, int stride, uint32_t (&frag)[kPieces][4]) {
  const float* r1 = r0 + 8 * stride;
  split_a_fragment<kPieces>(r0[0], r0[1], r1[0], r1[1], r0[8], r0[9], r1[8], r1[9], frag);
}

struct FlashLayout {
  int D, DW, QW, rows, stride;  // stride: floats per shared row (D + 4: conflict-free fragments)
  // by_group (decode): always 16 query rows (DW = 4), which a group of 8 heads half fills.
  __host__ __device__ static FlashLayout of(int D, bool by_group = false) {
    FlashLayout l;
    l.D = D;
    l.DW = by_group || D > 256 ? 4 : D <= 128 ? 1 : 2;
    l.QW = kFlashWarps / l.DW;
    l.rows = 16 * l.QW;
    l.stride = D + 4;
    return l;
  }
};

template <int kKeys>
__host__ __device__ size_t flash_smem_bytes(const FlashLayout& l) {
  return sizeof(float) * (static_cast<size_t>(l.rows + 2 * kKeys) * l.stride + (l.DW > 1 ? kFlashWarps * 16 * kKeys : 0) +
                          2 * kKeys * ((l.D + 31) / 32));
}

// A loaded Q8_0 chunk's 8 codes as exact floats (its scale is applied later).
__device__ __forceinline__ void q8_codes8(const RawChunk<DType::q8_0>& raw, float codes[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // int8 as offset binary: (c ^ 0x80) - 128 == c, exactly
    codes[2 * j] = __uint_as_float(0x4B000000u | ((raw.p[j] & 0xffu) ^ 0x80u)) - 8388736.0f;
    codes[2 * j + 1] = __uint_as_float(0x4B000000u | ((raw.p[j] >> 8) ^ 0x80u)) - 8388736.0f;
  }
}

// Two exact small integers (Q8_0 codes held as floats) as one bf16 pair, x0 in the low half.
__device__ __forceinline__ uint32_t bf16_pair(float x0, float x1) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <DType C, int kKeys, int kPieces>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_kernel(AttentionArgs a) {
  enter_kernel();
  constexpr int kKeyTiles = kKeys / 8;
  extern __shared__ float smem[];
  const FlashLayout L = FlashLayout::of(a.head_dim, a.group_queries);
  const int D = a.head_dim;
  float* s_q = smem;                            // [rows][stride]
  float* s_k = s_q + L.rows * L.stride;         // [kKeys][stride]
  float* s_v = s_k + kKeys * L.stride;          // [kKeys][stride]
  float* s_part = s_v + kKeys * L.stride;       // [warp][16][kKeys]: S shares when DW > 1
  const int n_scale_blocks = (D + 31) / 32;
  float* s_k_scale = s_part + (L.DW > 1 ? kFlashWarps * 16 * kKeys : 0);  // [kKeys][n_scale_blocks]
  float* s_v_scale = s_k_scale + kKeys * n_scale_blocks;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int qw = warp / L.DW, dw = warp % L.DW;
  const int g = lane / 4, q = lane % 4;
  const int group = a.n_heads / a.n_kv_heads;
  // Prefill: rows are tokens t0 + r of head h. Decode: rows are heads kv * group + r of query row
  // `seq`, every one at that row's position.
  const bool by_group = a.group_queries, per_row = a.k_row_caches != nullptr;
  const int seq = by_group ? blockIdx.x : 0;
  const int h = by_group ? 0 : blockIdx.y, kv = by_group ? blockIdx.y : h / group;
  const int t0 = by_group ? 0 : blockIdx.x * L.rows;
  const int n_rows = by_group ? group : a.n_tokens - t0;  // rows of this block with a query
  // p0: the position of the first fresh key, which is fresh row `fresh0` (per-row caches: each
  // sequence's own new key, row seq; one sequence: the step's first token, row 0).
  const int64_t p0 = a.positions[per_row ? seq : 0];
  const int64_t fresh0 = per_row ? seq : 0;
  const int64_t query_pos = per_row ? p0 : p0 + seq;  // decode rows' position
  const int slice = D / L.DW, d0 = dw * slice, out_tiles = slice / 8;
  // Query row r of the block: its [D] input and output offset.
  auto query_offset = [&](int r) -> int64_t {
    return by_group ? (static_cast<int64_t>(seq) * a.n_heads + kv * group + r) * D
                    : (static_cast<int64_t>(t0 + r) * a.n_heads + h) * D;
  };

  // Queries -> shared (rows past the block's queries are zero and never stored).
  for (int i = tid; i < L.rows * D; i += kFlashThreads) {
    const int r = i / D, d = i % D;
    s_q[r * L.stride + d] = r < n_rows ? a.q[query_offset(r) + d] : 0.0f;
  }
  // The keys any of this block's queries sees, and this split's whole tiles of them.
  const int64_t first_pos = by_group ? query_pos : p0 + t0;
  const int64_t last_pos = by_group ? query_pos : p0 + min(t0 + L.rows, a.n_tokens) - 1;
  const int64_t visible_begin = a.window > 0 ? max(int64_t{0}, first_pos - a.window + 1) : 0;
  const int64_t tiles = (last_pos + 1 - visible_begin + kKeys - 1) / kKeys;
  const int64_t split_keys = (tiles + a.n_splits - 1) / a.n_splits * kKeys;
  const int64_t key_begin = visible_begin + blockIdx.z * split_keys;
  const int64_t key_end = min(last_pos + 1, key_begin + split_keys);  // may be <= key_begin: no keys
  // This thread's two query rows (g and g + 8 of its group) and their positions.
  const int row0 = qw * 16 + g;
  const int64_t pos[2] = {by_group ? query_pos : p0 + t0 + row0, by_group ? query_pos : p0 + t0 + row0 + 8};
  const uint8_t* k_cache = per_row ? a.k_row_caches[seq] : a.k_cache;
  const uint8_t* v_cache = per_row ? a.v_row_caches[seq] : a.v_cache;

  float o[kMaxOutTiles][4];
#pragma unroll
  for (int j = 0; j < kMaxOutTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};

  const int64_t cache_stride = static_cast<int64_t>(a.n_kv_heads) * a.cache_row_bytes;
  const int64_t fresh_stride = static_cast<int64_t>(a.n_kv_heads) * D;
  // Q8_0 tiles whose keys are all cached (decode's every tile but the last) take the codes path:
  // K and V are held as their int8 codes (exact in one bf16 piece) with one scale per key and
  // 32-element block, so S = sum over blocks of scale * (q . codes) and O += (P * scale) . codes
  // need three mma per product where the f32 values' three pieces need six, and no split of K or
  // V at all. Each warp's head-dim slice must be whole blocks.
  const bool codes_ok = C == DType::q8_0 && slice % 32 == 0;
  for (int64_t kb = key_begin; kb < key_end; kb += kKeys) {
    __syncthreads();  // the previous tile's K/V are no longer read
    const bool codes_tile = codes_ok && min(kb + kKeys, key_end) <= p0;
    const int chunks = D / 8, total = kKeys * chunks;
    if constexpr (C == DType::q8_0) {
      if (codes_tile) {
        // Raw chunks in registers (5 halfwords each) while the loads are in flight, decoded at
        // the store: 8 floats per chunk held across the loads spilled.
        for (int base = 0; base < total; base += 4 * kFlashThreads) {
          RawChunk<DType::q8_0> raw[4][2];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int i = base + u * kFlashThreads + tid;
            if (i >= total) break;
            const int r = i / chunks, c = (i % chunks) * 8;
            const int64_t j = kb + r;
            if (j < key_end) {
              const int64_t row = (j % a.cache_rows) * cache_stride + kv * a.cache_row_bytes;
              raw[u][0].load(k_cache + row, c, D);
              raw[u][1].load(v_cache + row, c, D);
            } else {  // past the end: zero codes, zero scale
              raw[u][0].p[0] = raw[u][0].p[1] = raw[u][0].p[2] = raw[u][0].p[3] = raw[u][0].scale_bits = 0;
              raw[u][1].p[0] = raw[u][1].p[1] = raw[u][1].p[2] = raw[u][1].p[3] = raw[u][1].scale_bits = 0;
            }
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int i = base + u * kFlashThreads + tid;
            if (i >= total) break;
            const int r = i / chunks, c = (i % chunks) * 8;
#pragma unroll
            for (int which = 0; which < 2; ++which) {
              float codes[8];
              q8_codes8(raw[u][which], codes);
              float4* dst = reinterpret_cast<float4*>((which ? s_v : s_k) + r * L.stride + c);
              dst[0] = make_float4(codes[0], codes[1], codes[2], codes[3]);
              dst[1] = make_float4(codes[4], codes[5], codes[6], codes[7]);
              if (c % 32 == 0)
                (which ? s_v_scale : s_k_scale)[r * n_scale_blocks + c / 32] = f16_bits_to_float(raw[u][which].scale_bits);
            }
          }
        }
      }
    }
    // K/V rows -> shared f32, 8 elements per chunk: cached keys decoded from the cache's format,
    // this step's keys copied from the fresh f32 rows (16-byte loads when aligned). Keys past the
    // end are zero. Four chunks' loads per thread are issued before their stores: the tile load
    // is latency-bound, and one chunk at a time left it so.
    const bool fresh_vector = (reinterpret_cast<uintptr_t>(a.k_new) | reinterpret_cast<uintptr_t>(a.v_new)) % 16 == 0;
    for (int base = 0; base < (codes_tile ? 0 : total); base += 4 * kFlashThreads) {
      float kv8[4][2][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * kFlashThreads + tid;
        if (i >= total) break;
        const int r = i / chunks, c = (i % chunks) * 8;
        const int64_t j = kb + r;
        if (j >= key_end) {
#pragma unroll
          for (int e = 0; e < 8; ++e) kv8[u][0][e] = kv8[u][1][e] = 0.0f;
        } else if (j < p0) {
          const int64_t row = (j % a.cache_rows) * cache_stride + kv * a.cache_row_bytes;
          decode8<C>(k_cache + row, c, D, kv8[u][0]);
          decode8<C>(v_cache + row, c, D, kv8[u][1]);
        } else {  // fresh row fresh0 + (j - p0): the step's keys, or the sequence's own new key
          const int64_t row = (fresh0 + j - p0) * fresh_stride + static_cast<int64_t>(kv) * D + c;
          if (fresh_vector) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const float4 kq = __ldg(reinterpret_cast<const float4*>(a.k_new + row) + half);
              const float4 vq = __ldg(reinterpret_cast<const float4*>(a.v_new + row) + half);
              kv8[u][0][4 * half] = kq.x, kv8[u][0][4 * half + 1] = kq.y, kv8[u][0][4 * half + 2] = kq.z,
              kv8[u][0][4 * half + 3] = kq.w;
              kv8[u][1][4 * half] = vq.x, kv8[u][1][4 * half + 1] = vq.y, kv8[u][1][4 * half + 2] = vq.z,
              kv8[u][1][4 * half + 3] = vq.w;
            }
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) kv8[u][0][e] = a.k_new[row + e], kv8[u][1][e] = a.v_new[row + e];
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * kFlashThreads + tid;
        if (i >= total) break;
        const int r = i / chunks, c = (i % chunks) * 8;
        float4* dk = reinterpret_cast<float4*>(s_k + r * L.stride + c);  // rows of D + 4 floats: 16-byte aligned
        float4* dv = reinterpret_cast<float4*>(s_v + r * L.stride + c);
        dk[0] = make_float4(kv8[u][0][0], kv8[u][0][1], kv8[u][0][2], kv8[u][0][3]);
        dk[1] = make_float4(kv8[u][0][4], kv8[u][0][5], kv8[u][0][6], kv8[u][0][7]);
        dv[0] = make_float4(kv8[u][1][0], kv8[u][1][1], kv8[u][1][2], kv8[u][1][3]);
        dv[1] = make_float4(kv8[u][1][4], kv8[u][1][5], kv8[u][1][6], kv8[u][1][7]);
      }
    }
    __syncthreads();

    // S share over this warp's head-dim slice: [16 rows, kKeys].
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if (codes_tile) {
      for (int b0 = d0; b0 < d0 + slice; b0 += 32) {  // one 32-element scale block at a time
        float t[kKeyTiles][4];
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) t[n][0] = t[n][1] = t[n][2] = t[n][3] = 0.0f;
#pragma unroll 1
        for (int kk = b0; kk < b0 + 32; kk += 16) {
          uint32_t qa[kPieces][4];
          load_a_fragment<kPieces>(s_q + row0 * L.stride + kk + 2 * q, L.stride, qa);
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
            const float* kr = s_k + (n * 8 + g) * L.stride + kk + 2 * q;
            const uint32_t k0 = bf16_pair(kr[0], kr[1]), k1 = bf16_pair(kr[8], kr[9]);
#pragma unroll
            for (int i = 0; i < kPieces; ++i) mma_bf16(t[n], qa[i], k0, k1);
          }
        }
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[n][c] += t[n][c] * s_k_scale[(n * 8 + 2 * q + (c & 1)) * n_scale_blocks + b0 / 32];
      }
    }
    for (int kk = d0; kk < (codes_tile ? d0 : d0 + slice); kk += 16) {
      uint32_t qa[kPieces][4];
      load_a_fragment<kPieces>(s_q + row0 * L.stride + kk + 2 * q, L.stride, qa);
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        const float* kr = s_k + (n * 8 + g) * L.stride + kk + 2 * q;
        uint32_t p[2][kPieces], kb_frag[kPieces][2];
        split_pair<kPieces>(kr[0], kr[1], p[0]);
        split_pair<kPieces>(kr[8], kr[9], p[1]);
#pragma unroll
        for (int i = 0; i < kPieces; ++i) kb_frag[i][0] = p[0][i], kb_frag[i][1] = p[1][i];
        mma_pieces<kPieces>(s[n], qa, kb_frag);
      }
    }
    if (L.DW > 1) {  // sum the DW shares in slice order: every warp of the group gets the same S
      float* mine = s_part + warp * 16 * kKeys;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        mine[g * kKeys + n * 8 + 2 * q] = s[n][0];
        mine[g * kKeys + n * 8 + 2 * q + 1] = s[n][1];
        mine[(g + 8) * kKeys + n * 8 + 2 * q] = s[n][2];
        mine[(g + 8) * kKeys + n * 8 + 2 * q + 1] = s[n][3];
      }
      __syncthreads();
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int w = 0; w < L.DW; ++w) {
          const float* share = s_part + (qw * L.DW + w) * 16 * kKeys;
          sum[0] += share[g * kKeys + n * 8 + 2 * q];
          sum[1] += share[g * kKeys + n * 8 + 2 * q + 1];
          sum[2] += share[(g + 8) * kKeys + n * 8 + 2 * q];
          sum[3] += share[(g + 8) * kKeys + n * 8 + 2 * q + 1];
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) s[n][c] = sum[c];
      }
    }

    // Online softmax: scale, mask (causal and sliding window), running max and sum per row.
    float corr[2];
    online_softmax_tile<kKeyTiles, false>(s, kb, key_end, pos, a.window, a.scale, q, m, l, corr);
#pragma unroll
    for (int j = 0; j < kMaxOutTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[j][c] *= corr[c / 2];

    // O += P V over this warp's head-dim slice; P's accumulator layout is the A fragment's. Codes
    // tiles: per 32-column block, P times each key's V scale, then the block's 4 output tiles.
    if (codes_tile) {
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        const float* v0 = s_v + (ks * 16 + 2 * q) * L.stride + d0 + g;
#pragma unroll
        for (int jb = 0; jb < kMaxOutTiles / 4; ++jb) {
          if (4 * jb >= out_tiles) break;
          const int block = (d0 + 32 * jb) / 32;
          // keys of this thread's P values: ks * 16 + 2q + {0, 1} and + 8
          const float* vs = s_v_scale + (ks * 16 + 2 * q) * n_scale_blocks + block;
          const float sv[4] = {vs[0], vs[n_scale_blocks], vs[8 * n_scale_blocks], vs[9 * n_scale_blocks]};
          uint32_t pa[kPieces][4];
          split_a_fragment<kPieces>(s[2 * ks][0] * sv[0], s[2 * ks][1] * sv[1], s[2 * ks][2] * sv[0],
                                    s[2 * ks][3] * sv[1], s[2 * ks + 1][0] * sv[2], s[2 * ks + 1][1] * sv[3],
                                    s[2 * ks + 1][2] * sv[2], s[2 * ks + 1][3] * sv[3], pa);
#pragma unroll
          for (int t4 = 0; t4 < 4; ++t4) {
            const int j = 4 * jb + t4;
            const float* v = v0 + j * 8;
            const uint32_t b0 = bf16_pair(v[0], v[L.stride]), b1 = bf16_pair(v[8 * L.stride], v[9 * L.stride]);
#pragma unroll
            for (int i = 0; i < kPieces; ++i) mma_bf16(o[j], pa[i], b0, b1);
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < (codes_tile ? 0 : kKeys / 16); ++ks) {
      uint32_t pa[kPieces][4];
      split_a_fragment<kPieces>(s[2 * ks][0], s[2 * ks][1], s[2 * ks][2], s[2 * ks][3], s[2 * ks + 1][0],
                                s[2 * ks + 1][1], s[2 * ks + 1][2], s[2 * ks + 1][3], pa);
      const float* v0 = s_v + (ks * 16 + 2 * q) * L.stride + d0 + g;
#pragma unroll
      for (int j = 0; j < kMaxOutTiles; ++j) {
        if (j >= out_tiles) break;
        const float* v = v0 + j * 8;
        uint32_t p[2][kPieces], vb[kPieces][2];
        split_pair<kPieces>(v[0], v[L.stride], p[0]);
        split_pair<kPieces>(v[8 * L.stride], v[9 * L.stride], p[1]);
#pragma unroll
        for (int i = 0; i < kPieces; ++i) vb[i][0] = p[0][i], vb[i][1] = p[1][i];
        mma_pieces<kPieces>(o[j], pa, vb);
      }
    }
  }

  // Normalise and store this warp's slice of its rows; or, split, the unnormalised slice and (one
  // lane per row) the row's max and sum, as the SIMT kernel's partials: [D] then m, l.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += gpu::shfl_xor(l[r], 1);
    l[r] += gpu::shfl_xor(l[r], 2);
  }
  if (a.n_splits > 1) {  // group_queries only: row r is head kv * group + r
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (row0 + 8 * r >= n_rows) continue;
      const int64_t head = static_cast<int64_t>(seq) * a.n_heads + kv * group + row0 + 8 * r;
      float* part = a.partial + (head * a.n_splits + blockIdx.z) * (D + 2);
#pragma unroll
      for (int j = 0; j < kMaxOutTiles; ++j) {
        if (j >= out_tiles) break;
        part[d0 + j * 8 + 2 * q] = o[j][2 * r];
        part[d0 + j * 8 + 2 * q + 1] = o[j][2 * r + 1];
      }
      if (dw == 0 && q == 0) part[D] = m[r], part[D + 1] = l[r];
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row0 + 8 * r >= n_rows) continue;
    float* out = a.out + query_offset(row0 + 8 * r) + d0;
#pragma unroll
    for (int j = 0; j < kMaxOutTiles; ++j) {
      if (j >= out_tiles) break;
      out[j * 8 + 2 * q] = o[j][2 * r] / l[r];
      out[j * 8 + 2 * q + 1] = o[j][2 * r + 1] / l[r];
    }
  }
}

template <DType C, int kKeys, int kPieces>
cudaError_t launch_flash(const AttentionArgs& a, cudaStream_t stream) {
  const FlashLayout L = FlashLayout::of(a.head_dim, a.group_queries);
  const size_t smem = flash_smem_bytes<kKeys>(L);
  auto kernel = flash_attention_kernel<C, kKeys, kPieces>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid = a.group_queries ? dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_kv_heads),
                                           static_cast<unsigned>(a.n_splits))
                                    : dim3(static_cast<unsigned>((a.n_tokens + L.rows - 1) / L.rows),
                                           static_cast<unsigned>(a.n_heads));
  return launch_kernel(kernel, grid, kFlashThreads, smem, stream, a);
}

// 32-key tiles, or 16 for head dims over 256: K and V tiles of ~64 KB leave room for two blocks
// per SM.
constexpr int tile_keys(int64_t head_dim) { return head_dim > 256 ? 16 : 32; }

template <DType C, int kPieces>
cudaError_t launch_flash_tiles(const AttentionArgs& a, cudaStream_t stream) {
  if (tile_keys(a.head_dim) == 16) return launch_flash<C, 16, kPieces>(a, stream);
  return launch_flash<C, 32, kPieces>(a, stream);
}

// One piece (bf16 values): prompts reach it only where flash_bf16_applies refused the shape; the
// backend gives the decode group kernel 3 pieces (AttentionArgs::pieces), and attention_bench
// times the group kernel at one piece too.
template <DType C>
cudaError_t launch_flash_cache(const AttentionArgs& a, cudaStream_t stream) {
  if (a.pieces == 3) return launch_flash_tiles<C, 3>(a, stream);
  if (a.pieces == 1) return launch_flash_tiles<C, 1>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

bool flash_attention_applies(int64_t n_tokens, int64_t head_dim) {
  if (n_tokens < kFlashMinTokens || head_dim <= 0 || head_dim > 512) return false;
  const int DW = FlashLayout::of(static_cast<int>(head_dim)).DW;  // each warp's slice: whole 16-wide k-steps
  return head_dim % (16 * DW) == 0 && head_dim / DW <= 8 * kMaxOutTiles;
}

bool flash_decode_applies(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 || head_dim > 512 || head_dim % 64) return false;
  return n_heads / n_kv_heads <= FlashLayout::of(static_cast<int>(head_dim), true).rows;
}

int64_t flash_decode_tile_keys(int64_t head_dim) { return tile_keys(head_dim); }

cudaError_t launch_flash_attention(const AttentionArgs& a, cudaStream_t stream) {
  // The backend decided once, when it gave the bf16 kernel its scratch (flash_bf16_applies).
  if (a.pieces == 1 && a.scratch) return launch_flash_bf16(a, stream);
  if (a.n_splits < 1 || (a.n_splits > 1 && !a.group_queries) || a.n_heads % a.n_kv_heads) return cudaErrorInvalidValue;
  if (a.group_queries ? !flash_decode_applies(a.n_heads, a.n_kv_heads, a.head_dim)
                      : a.k_row_caches || !flash_attention_applies(a.n_tokens, a.head_dim))
    return cudaErrorInvalidValue;
  switch (a.cache_type) {
    case DType::f32: return launch_flash_cache<DType::f32>(a, stream);
    case DType::bf16: return launch_flash_cache<DType::bf16>(a, stream);
    case DType::q8_0: return launch_flash_cache<DType::q8_0>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

#else  // HIP: no mma.sync; prefill keeps the SIMT attention kernel

bool flash_attention_applies(int64_t, int64_t) { return false; }
bool flash_decode_applies(int64_t, int64_t, int64_t) { return false; }
int64_t flash_decode_tile_keys(int64_t) { return 0; }
cudaError_t launch_flash_attention(const AttentionArgs&, cudaStream_t) { return cudaErrorInvalidValue; }

#endif

}  // namespace fl::cuda
