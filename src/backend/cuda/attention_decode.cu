// Decode attention by KV head over a Q8_0 cache: one query row's G query heads of one KV head
// read each cached K and V row once, from shared memory, for head dims 256 and 512 (Gemma 4,
// Qwen3.5). It replaces, for decode rows, the SIMT kernel (one block per query head: the group's
// rows read G times) and the tensor-core group kernel (prefill's template: 150 KB of code, 255
// registers, ~4700 instructions per warp and 32-key tile; 53 us for a Gemma 4 26B global layer at
// 4k, where its 8.9 MB of K/V take 2 us at the H200's bandwidth).
//
// Work split (flash decoding): grid = (query row x KV head, split). A block takes a contiguous run
// of the row's visible keys and walks its cached part in tiles of kTileKeys keys: the tile's raw K
// and V rows (34-byte Q8_0 blocks) are copied to shared memory by cp.async, the next tile's copy in
// flight while this one is used. Per tile, with 4 warps:
//   scores   warp w takes head-dim slab w % kSlabs (128 elements, 4 per lane) of every head, for
//            every kKeySets-th key; a transposed butterfly sums kKeysAtOnce keys x G heads (32
//            values) over the warp at once (31 shuffles, where a warp_sum each took 160), and
//            the slabs' sums meet in shared memory;
//   softmax  warp w owns heads w, w + 4, ...: lane j holds key j's score (kTileKeys is 32), keeps
//            the running max and sum, and writes p and the rescale factor of the running output;
//   values   warp w adds p * V for its slab's 4 elements per lane, all G heads, its keys.
// The step's own key (an f32 row, not yet in the cache) seeds the running softmax of the block
// whose run ends at it. Output: normalised (one split) or a partial (values, max, sum) per query
// head that attention_merge_kernel combines, in the SIMT kernel's layout.
//
// The numbers are the f32 ones up to summation order: q is scaled first, each 32-element block's
// dot is taken over the int8 codes and multiplied by the block's scale, exp is expf.
//
// On the tensor cores (kMma: AttentionArgs::tensor_cores, 4 or 8 query heads per KV head): the
// SIMT form spends ~6.6k instructions per warp and 32-key tile on a Gemma 4 global layer (8 heads
// of 512: 16 FMAs per code and the butterflies), so it is bound by issue, not by its 17 KB of K/V
// per tile. Here warp w owns a quarter of the head dim (a slab of D / 4: 2 or 4 Q8_0 blocks) for
// all the tile's keys, and both products are bf16 m16n8k16 mma.sync with f32 sums:
//   scores  S[key][head] = K q^T: the tile's 32 keys are two 16-row A tiles of int8 codes (exact
//           in bf16), the G heads the 8 columns of B (q in three bf16 pieces, all of an f32's 24
//           bits; columns past G are zero). Each 32-element block (two k-steps) goes into a fresh
//           accumulator that is then multiplied by the key's block scale: the SIMT form's per-block
//           dot, summed in another order. The four slabs' parts meet in shared memory as before.
//   values  O[d][head] += V^T P': A = the slab's V codes with d as rows and keys as k, B = p times
//           the key's V block scale (three pieces). A block's 32 elements are its two 16-row m-tiles
//           in the order d = 4 (r % 8) + 2 (r / 8) + tile, so one 4-byte word of a key's row holds
//           a lane's rows g and g + 8 of both tiles.
// So a row's results differ from the SIMT form's in summation order only (the op harness's
// budget). ~1.6k instructions per warp and tile where the SIMT form takes ~6.6k (G = 8, D = 512).
//
// From the projections (kFromProjections, one sequence's decode row): the launch also does the
// work of the two kernels before it, the head norms with RoPE (rms_norm_rope_group_kernel) and the
// KV write (kv_write_kernel): each block norms its KV head's G query rows (and, the block holding
// the step's own key, that key and value) one row per warp, into the idle second tile buffer,
// with the separate kernels' arithmetic in their order, so the results are their bits; the
// fresh row's block stores K and V into the cache. On the 26B-A4B's replayed step the norm
// kernel took ~3.2 us a layer between the q/k/v product and the attention (thirty-seventh
// session's timeline), for ~10 KB of work.
#include <atomic>
#include <cfloat>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_prefetch.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/head_rows.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/mma_sync.cuh"  // cp.async, mma.sync, bf16 pieces and codes
#endif

namespace fl::cuda {

#if !defined(FIRELINE_GPU_HIP)
namespace {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kTileKeys = 32;  // one key per lane in the softmax step
static_assert(kWarp == 32, "the lane layout below is for 32-lane warps");

// Sums each of N values (N a power of two <= 32) over the warp: the first log2(N) exchanges halve
// the values a lane carries (it keeps the half its lane bit selects, plus its partner's share of
// that half), then a plain reduction. Value i ends in lane i * (32 / N) (and its neighbours up
// to the next such lane). N - 1 + 5 - log2(N) shuffles in all. Written as a recursion on the
// width so that every index is a constant (a loop over the levels put the values in local memory).
template <int kWidth, int kOffset, int N>
__device__ __forceinline__ void halve_values(float (&v)[N], int lane) {
  if constexpr (kWidth > 1) {
    const bool upper = lane & kOffset;
#pragma unroll
    for (int i = 0; i < kWidth / 2; ++i) {
      const float keep = upper ? v[i + kWidth / 2] : v[i];
      const float send = upper ? v[i] : v[i + kWidth / 2];
      v[i] = keep + gpu::shfl_xor(send, kOffset);
    }
    halve_values<kWidth / 2, kOffset / 2>(v, lane);
  }
}
template <int N>
__device__ __forceinline__ float warp_sums_transposed(float (&v)[N]) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N is a power of two up to 32");
  halve_values<N, 16>(v, threadIdx.x % 32);
  float r = v[0];
#pragma unroll
  for (int offset = 16 / N; offset > 0; offset /= 2) r += gpu::shfl_xor(r, offset);
  return r;
}

// Four int8 codes (one word) as exact floats: the xor makes them offset binary, a byte permute
// sets each under the exponent of 2^23 and a subtract leaves the code (RawChunk<q8_0>'s trick).
__device__ __forceinline__ void decode_codes4(uint32_t word, float (&c)[4]) {
  word ^= 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7650u + i)) - 8388736.0f;
}

// The mma form's operands (offset_codes_as_bf16, int8_pair_to_bf16x2: mma_sync.cuh). The two
// codes at p (2-byte aligned: codes sit 2 bytes into 34-byte blocks) as a bf16 pair.
__device__ __forceinline__ uint32_t codes_as_bf16(const uint8_t* p) {
  return int8_pair_to_bf16x2(*reinterpret_cast<const uint16_t*>(p));
}
// Four bytes at a 2-byte aligned address (a block's codes start 2 bytes past a word for even
// blocks).
__device__ __forceinline__ uint32_t load_u32_at_halfword(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}

// Where a lane's 4 elements of a Q8_0 row are: element d0 = 128 * slab + 4 * lane lies in block
// b = d0 / 32 at byte 34 b + 2 + 4 (lane % 8): word-aligned for odd b, 2 bytes past a word for
// even b (34-byte blocks), so the codes come from two words and a funnel shift.
struct LaneSlice {
  int word;   // first word holding the codes
  int shift;  // bits to shift the word pair right: 0 or 16
  int scale;  // byte offset of the block's f16 scale
  __device__ LaneSlice(int slab, int lane) {
    const int b = slab * 4 + lane / 8, byte = 34 * b + 2 + 4 * (lane % 8);
    word = byte / 4;
    shift = (byte % 4) * 8;
    scale = 34 * b;
  }
  // The codes (as floats) and the scale of this lane's 4 elements of a row in shared memory.
  __device__ __forceinline__ float load(const uint8_t* row, float (&c)[4]) const {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(row);
    decode_codes4(__funnelshift_r(words[word], words[word + 1], shift), c);
    return f16_bits_to_float(*reinterpret_cast<const uint16_t*>(row + scale));
  }
};

template <int D, int G, bool kMma = false>
struct DecodeLayout {
  static constexpr int kRowBytes = D / 32 * 34;
  // warps across the head dim: slabs of 128 elements (4 per lane), or of D / 4 on the tensor cores
  static constexpr int kSlabs = kMma ? kDecodeWarps : D / 128;
  static constexpr int kSlabDims = D / kSlabs;
  static constexpr int kKeySets = kDecodeWarps / kSlabs;  // warps across a tile's keys
  // Keys per transposed sum: 32 values (keys x heads) fill the warp, so one butterfly of 5 levels
  // sums several keys and its shuffles overlap; a key at a time (8 values for G = 8) left each
  // warp a chain of ~200 cycles per key.
  static constexpr int kKeysAtOnce = 32 / G < kTileKeys / kKeySets ? 32 / G : kTileKeys / kKeySets;
  // score parts [kSlabs][G][kScoreStride]: the butterfly's lane u * G + h stores key j0 + u of
  // head h, banks h * kKeysAtOnce + u, all distinct; the mma's lane (g, t) stores keys g (+ 8)
  // of heads 2t or 2t + 1, banks 4 h + g, distinct at a stride of 36
  static constexpr int kScoreStride = kMma ? 36 : kTileKeys + kKeysAtOnce;
  static constexpr int kHeadsPerWarp = (G + kDecodeWarps - 1) / kDecodeWarps;  // softmax owners
  static constexpr int kTileBytes = 2 * kTileKeys * kRowBytes;                 // K rows, then V rows
  // shared memory: 2 tiles | score parts [kSlabs][G][kScoreStride] | p [kTileKeys][G] | factor [G]
  static constexpr size_t kSmemBytes = 2 * kTileBytes + sizeof(float) * (kSlabs * G * kScoreStride + kTileKeys * G + G);
  static_assert(D % 256 == 0 && kSlabs <= kDecodeWarps, "head dims 256 and 512");
  static_assert(kRowBytes % 16 == 0, "rows copied in 16-byte pieces");
  static_assert(kMma || kTileKeys % (kKeySets * kKeysAtOnce) == 0, "whole key steps per tile");
  static_assert(!kMma || (kTileKeys == 32 && (G == 4 || G == 8) && kSlabDims % 32 == 0),
                "the mma form: two 16-key tiles, 8 columns for the heads, whole Q8_0 blocks per slab");
  // the key sets' outputs meet in the tile buffers at the end
  static_assert((kKeySets - 1) * G * D * sizeof(float) <= 2 * kTileBytes, "merge space");
};

// The step's fresh head rows normed by one warp each, as rms_norm_rope_group_kernel does with a
// block of 256 threads (norm_threads for D = 256 and 512): lane j holds elements j + 32 i.
// Thread t of that block holds elements t and t + 256 (its squares added in that order), its
// warp w = t / 32 sums them with warp_sum, and block_sum's butterfly over lanes 0-7 then adds
// the 8 warp sums as ((w0 + w4) + (w2 + w6)) + ((w1 + w5) + (w3 + w7)) (bitwise the same in every
// lane: each level adds the same two values). Element j + 32 i sits in warp i % 8, pass i / 8.
template <int D>
struct FreshRow {
  static constexpr int kPer = D / 32;  // elements per lane
  static_assert(D == 256 || D == 512, "rms_norm_rope_group_kernel's 256 threads hold one or two elements each");

  __device__ static float rms_inverse(const float (&x)[kPer], float eps) {
    float warp_sums[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      float sum_sq = 0.0f;
#pragma unroll
      for (int pass = 0; pass < D / 256; ++pass) sum_sq += x[w + 8 * pass] * x[w + 8 * pass];
      warp_sums[w] = warp_sum(sum_sq);
    }
    const float total = ((warp_sums[0] + warp_sums[4]) + (warp_sums[2] + warp_sums[6])) +
                        ((warp_sums[1] + warp_sums[5]) + (warp_sums[3] + warp_sums[7]));
    return rms_inverse_of_sum(total, D, eps);
  }

  // dst[e] (shared memory) = the normed, gained and rotated x: apply_gain(x * inv), then
  // rotate_pair on (e, e + half) for e < half. half % 32 == 0, so a pair is one lane's: each
  // lane reads back only what it wrote.
  __device__ static void store(float* dst, const float (&x)[kPer], const float (&gain)[kPer], float inv, bool rope,
                               int half, const float (&sin_e)[kPer / 2], const float (&cos_e)[kPer / 2], int lane) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) dst[lane + 32 * i] = x[i] * inv * gain[i];
    if (!rope) return;
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) {
      const int e = lane + 32 * i;
      if (e < half) rotate_pair(dst[e], dst[e + half], sin_e[i], cos_e[i], dst[e], dst[e + half]);
    }
  }
};

// Copies the K and V rows of keys first_key .. first_key + rows - 1 (ring rows first_row on,
// wrapping at cache_rows) into a tile buffer, 16 bytes per copy, and commits the group.
template <int kRowBytes>
__device__ __forceinline__ void copy_tile(uint8_t* tile, const uint8_t* k_rows, const uint8_t* v_rows,
                                          int64_t first_row, int rows, int64_t cache_rows, int64_t row_stride) {
  constexpr int kPieces = kRowBytes / 16, kUnits = 2 * kTileKeys * kPieces;
  // Not unrolled: unrolled, the compiler kept every copy's addresses in registers across tiles
  // (164 registers for D = 512 and 2 heads; 17 copies per thread and tile).
#pragma unroll 1
  for (int step = 0; step < (kUnits + kDecodeThreads - 1) / kDecodeThreads; ++step) {
    const int i = step * kDecodeThreads + static_cast<int>(threadIdx.x);
    const int which = i / (kTileKeys * kPieces), r = (i / kPieces) % kTileKeys, piece = i % kPieces;
    if (i < kUnits && r < rows) {
      int64_t row = first_row + r;
      if (row >= cache_rows) row -= cache_rows;     // a split's keys are fewer than the ring's rows
      if (row >= cache_rows) row = cache_rows - 1;  // (or a position past a linear cache: stay inside)
      cp_async_16(tile + (which * kTileKeys + r) * kRowBytes + piece * 16,
                  (which ? v_rows : k_rows) + row * row_stride + piece * 16);
    }
  }
  cp_async_commit();
}

template <int D, int G, bool kFromProjections, bool kMma>
__global__ void __launch_bounds__(kDecodeThreads) attention_decode_kernel(AttentionArgs a) {
  using L = DecodeLayout<D, G, kMma>;
  using Fresh = FreshRow<D>;
  // the fresh rows [G + 2][D] (q heads, k, v) in the second tile buffer, idle until tile 0's turn
  static_assert(!kFromProjections || (G + 2) * D * sizeof(float) <= L::kTileBytes, "fresh rows fit a tile buffer");
  extern __shared__ __align__(16) uint8_t smem[];
  float* score_parts = reinterpret_cast<float*>(smem + 2 * L::kTileBytes);  // [kSlabs][G][kScoreStride]
  float* probs = score_parts + L::kSlabs * G * L::kScoreStride;             // [kTileKeys][G]
  float* factor = probs + kTileKeys * G;                                    // [G]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slab = warp % L::kSlabs, key_set = warp / L::kSlabs;
  const int t = blockIdx.x / a.n_kv_heads, kv = blockIdx.x % a.n_kv_heads;
  const bool per_row = a.k_row_caches != nullptr;
  const int64_t query_pos = per_row ? a.positions[t] : a.positions[0] + t;
  const int64_t first = a.window > 0 ? max(int64_t{0}, query_pos - a.window + 1) : 0;
  const int64_t n_visible = query_pos - first + 1;
  const int64_t chunk = (n_visible + a.n_splits - 1) / a.n_splits;
  const int64_t begin = first + blockIdx.y * chunk;
  const int64_t end = min(begin + chunk, query_pos + 1);
  const int64_t n_cached = max(int64_t{0}, min(end, query_pos) - begin);  // keys before the step's own
  const bool has_fresh = begin <= query_pos && query_pos < end;
  const int n_tiles = static_cast<int>((n_cached + kTileKeys - 1) / kTileKeys);
  const int64_t row_stride = static_cast<int64_t>(a.n_kv_heads) * a.cache_row_bytes;
  const uint8_t* k_rows = (per_row ? a.k_row_caches[t] : a.k_cache) + kv * a.cache_row_bytes;
  const uint8_t* v_rows = (per_row ? a.v_row_caches[t] : a.v_cache) + kv * a.cache_row_bytes;
  const int64_t first_row = n_cached > 0 ? begin % a.cache_rows : 0;
  // Earlier steps wrote these rows: the first tile's pulled into L2 while the previous kernel runs.
  prefetch_cached_keys(k_rows, v_rows, begin, begin + min(n_cached, int64_t{kTileKeys}), a.cache_rows, row_stride,
                       a.cache_row_bytes);
  // And the next product's weights (o_proj), while this latency-bound kernel leaves DRAM idle.
  if (a.l2_prefetch_bytes > 0) prefetch_slice_l2(a.l2_prefetch, a.l2_prefetch_bytes);
  const int64_t q_head0 = static_cast<int64_t>(t) * a.n_heads + static_cast<int64_t>(kv) * G;
  const int64_t fresh = (static_cast<int64_t>(t) * a.n_kv_heads + kv) * D;  // this row's fresh K / V
  // From the projections: the q and k gains and this lane's RoPE angles (elements lane + 32 i)
  // come from weights and the position, so they are read before the wait.
  float q_gain[Fresh::kPer], k_gain[Fresh::kPer], sin_e[Fresh::kPer / 2], cos_e[Fresh::kPer / 2];
  if constexpr (kFromProjections) {
    const HeadNormPart& qn = a.fresh_norms[0];
    const HeadNormPart& kn = a.fresh_norms[1];
#pragma unroll
    for (int i = 0; i < Fresh::kPer; ++i) {
      q_gain[i] = gain_factor(static_cast<const uint8_t*>(qn.weight), qn.weight_type, qn.gain, lane + 32 * i);
      k_gain[i] = gain_factor(static_cast<const uint8_t*>(kn.weight), kn.weight_type, kn.gain, lane + 32 * i);
    }
    const float pos = static_cast<float>(query_pos);
#pragma unroll
    for (int i = 0; i < Fresh::kPer / 2; ++i) {
      const int e = lane + 32 * i;
      sin_e[i] = 0.0f, cos_e[i] = 1.0f;
      if (e < a.rope_half) sincosf(a.inv_freq[e] * pos, &sin_e[i], &cos_e[i]);
    }
  }
  enter_kernel();
  if (n_tiles > 0)
    copy_tile<L::kRowBytes>(smem, k_rows, v_rows, first_row, static_cast<int>(min(n_cached, int64_t{kTileKeys})),
                            a.cache_rows, row_stride);

  // The rows the block reads: q's G heads [G][D], the fresh K and V [D] (from the projections:
  // normed here into the second tile buffer).
  const float* q_rows = a.q + q_head0 * D;
  const float* k_fresh = a.k_new + fresh;
  const float* v_fresh = a.v_new + fresh;
  if constexpr (kFromProjections) {
    float* rows = reinterpret_cast<float*>(smem + L::kTileBytes);  // [G + 2][D]
    constexpr int kRowsPerWarp = (G + 2 + kDecodeWarps - 1) / kDecodeWarps;
    const int n_rows = G + (has_fresh ? 2 : 0);
    float x[kRowsPerWarp][Fresh::kPer];  // every row's loads in flight before any arithmetic
#pragma unroll
    for (int m = 0; m < kRowsPerWarp; ++m) {
      const int r = warp + kDecodeWarps * m;
      if (r >= n_rows) break;
      const float* src = r < G ? q_rows + r * D : r == G ? k_fresh : v_fresh;
#pragma unroll
      for (int i = 0; i < Fresh::kPer; ++i) x[m][i] = src[lane + 32 * i];
    }
#pragma unroll
    for (int m = 0; m < kRowsPerWarp; ++m) {
      const int r = warp + kDecodeWarps * m;
      if (r >= n_rows) break;
      const int part = r < G ? 0 : r - G + 1;  // q, k, v
      const float inv = Fresh::rms_inverse(x[m], a.norm_eps);
      if (part == 2) {  // v: no gain, no RoPE (decode_from_projections_applies)
        float ones[Fresh::kPer];
#pragma unroll
        for (int i = 0; i < Fresh::kPer; ++i) ones[i] = 1.0f;
        Fresh::store(rows + r * D, x[m], ones, inv, false, 0, sin_e, cos_e, lane);
      } else if (part == 0) {  // (two calls: an array chosen at run time went to local memory)
        Fresh::store(rows + r * D, x[m], q_gain, inv, a.fresh_norms[0].rope, a.rope_half, sin_e, cos_e, lane);
      } else {
        Fresh::store(rows + r * D, x[m], k_gain, inv, a.fresh_norms[1].rope, a.rope_half, sin_e, cos_e, lane);
      }
    }
    __syncthreads();
    q_rows = rows;
    k_fresh = rows + G * D;
    v_fresh = rows + (G + 1) * D;
    if (has_fresh) {  // the step's K and V into their cache row: D / 32 Q8_0 blocks each, a warp per block
      const int64_t offset = (query_pos % a.cache_rows) * row_stride + static_cast<int64_t>(kv) * a.cache_row_bytes;
      for (int b = warp; b < 2 * (D / 32); b += kDecodeWarps) {
        const int which = b / (D / 32), block = b % (D / 32);
        store_q8_0_lane((which ? a.v_cache_write : a.k_cache_write) + offset + block * 34,
                        rows[(G + which) * D + block * 32 + lane], lane, true);
      }
    }
  }

  // (q, the fresh rows and out are read and written element by element: once per block, and
  // views of any alignment are allowed.)
  // SIMT: this warp's slab of each head's query, scaled, [G][4], and its output for its keys.
  // mma: q's slab as B fragments of the score products (k-step, piece, register), and the output
  // as C fragments of the value products (m-tile: 16 rows of d, 8 columns of heads).
  constexpr int kSteps = L::kSlabDims / 16;  // (mma) k-steps of the scores, m-tiles of the values
  const int d0 = kMma ? slab * L::kSlabDims : slab * 128 + lane * 4;
  const int g = lane / 4, t4 = lane % 4;  // (mma) the fragments' group and thread in group
  // (mma) the head-dim element of row g of value m-tile mt (row g + 8: that + 2): m-tile 2 b + j of
  // the slab's block b holds element 4 g + j of the block in row g and 4 g + 2 + j in row g + 8
  auto row_element = [&](int mt) { return d0 + 32 * (mt / 2) + 4 * g + mt % 2; };
  float q[kMma ? 1 : G][4], acc[kMma ? 1 : G][4];
  uint32_t q_frag[kMma ? kSteps : 1][3][2];
  float o[kMma ? kSteps : 1][4];
  if constexpr (!kMma) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) q[h][e] = q_rows[h * D + d0 + e] * a.scale;
    }
  } else {
    // B (16 x 8, k = d, n = head): lane (g, t4) holds head g's elements 2 t4, 2 t4 + 1 and those
    // + 8 of each k-step; heads past G are zero columns.
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (g < G) {
        const float* qh = q_rows + g * D + d0 + 16 * ks + 2 * t4;
        x[0] = qh[0] * a.scale, x[1] = qh[1] * a.scale, x[2] = qh[8] * a.scale, x[3] = qh[9] * a.scale;
      }
      uint32_t lo[3], hi[3];
      split_pair<3>(x[0], x[1], lo);
      split_pair<3>(x[2], x[3], hi);
#pragma unroll
      for (int p = 0; p < 3; ++p) q_frag[ks][p][0] = lo[p], q_frag[ks][p][1] = hi[p];
    }
  }
  // The running softmax of the heads this warp owns (h = warp + 4 i), seeded by the fresh key.
  float m_run[L::kHeadsPerWarp], l_run[L::kHeadsPerWarp];
#pragma unroll
  for (int i = 0; i < L::kHeadsPerWarp; ++i) {
    const int h = warp + kDecodeWarps * i;
    m_run[i] = -FLT_MAX;
    l_run[i] = 0.0f;
    if (h < G && has_fresh) {
      const float* qh = q_rows + h * D;
      float dot = 0.0f;
      for (int d = lane; d < D; d += 32) dot += qh[d] * a.scale * k_fresh[d];
      m_run[i] = warp_sum(dot);
      l_run[i] = 1.0f;
    }
  }
  // The output starts as the fresh value row (p = 1), in key set 0 only.
  if constexpr (!kMma) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (has_fresh && key_set == 0)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = v_fresh[d0 + e];
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][e] = v[e];
  } else {
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt) {
      const int d = row_element(mt);
      const float v_lo = has_fresh ? v_fresh[d] : 0.0f, v_hi = has_fresh ? v_fresh[d + 2] : 0.0f;
      o[mt][0] = v_lo, o[mt][1] = v_lo, o[mt][2] = v_hi, o[mt][3] = v_hi;
    }
  }

  const LaneSlice slice(kMma ? 0 : slab, lane);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int rows = static_cast<int>(min(int64_t{kTileKeys}, n_cached - static_cast<int64_t>(tile) * kTileKeys));
    cp_async_wait<0>();
    __syncthreads();  // this tile has landed, and every warp is done with the other buffer
    if (tile + 1 < n_tiles) {
      int64_t next_row = first_row + static_cast<int64_t>(tile + 1) * kTileKeys;
      if (next_row >= a.cache_rows) next_row -= a.cache_rows;  // copy_tile keeps any row inside the cache
      copy_tile<L::kRowBytes>(
          smem + ((tile + 1) & 1) * L::kTileBytes, k_rows, v_rows, next_row,
          static_cast<int>(min(int64_t{kTileKeys}, n_cached - static_cast<int64_t>(tile + 1) * kTileKeys)),
          a.cache_rows, row_stride);
    }
    const uint8_t* k_tile = smem + (tile & 1) * L::kTileBytes;
    const uint8_t* v_tile = k_tile + kTileKeys * L::kRowBytes;

    // Scores: this slab's share of q . k. Keys past `rows` read stale bytes; their sums are never
    // read.
    if constexpr (!kMma) {
      // kKeysAtOnce keys x G heads per transposed sum
      constexpr int kValues = L::kKeysAtOnce * G, kLanesPerValue = 32 / kValues;
      for (int j0 = key_set * L::kKeysAtOnce; j0 < rows; j0 += L::kKeySets * L::kKeysAtOnce) {
        float s[kValues];
#pragma unroll
        for (int u = 0; u < L::kKeysAtOnce; ++u) {
          float c[4];
          const float scale = slice.load(k_tile + (j0 + u) * L::kRowBytes, c);
#pragma unroll
          for (int h = 0; h < G; ++h)
            s[u * G + h] = scale * (q[h][0] * c[0] + q[h][1] * c[1] + q[h][2] * c[2] + q[h][3] * c[3]);
        }
        const float sum = warp_sums_transposed<kValues>(s);
        if (lane % kLanesPerValue == 0) {
          const int value = lane / kLanesPerValue, u = value / G, h = value % G;
          score_parts[(slab * G + h) * L::kScoreStride + j0 + u] = sum;
        }
      }
    } else {
      // A (16 x 16, rows = keys, k = d): lane (g, t4) holds keys g and g + 8, elements 2 t4, + 1
      // and those + 8: two codes by one 2-byte load each.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint8_t* key_lo = k_tile + (16 * mt + g) * L::kRowBytes;
        const uint8_t* key_hi = key_lo + 8 * L::kRowBytes;
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int b = 0; b < L::kSlabDims / 32; ++b) {
          const int block = d0 / 32 + b, codes = 34 * block + 2 + 2 * t4;
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int at = codes + 16 * half;
            const uint32_t a_frag[4] = {codes_as_bf16(key_lo + at), codes_as_bf16(key_hi + at),
                                        codes_as_bf16(key_lo + at + 8), codes_as_bf16(key_hi + at + 8)};
#pragma unroll
            for (int p = 0; p < 3; ++p) mma_bf16(part, a_frag, q_frag[2 * b + half][p][0], q_frag[2 * b + half][p][1]);
          }
          const float scale_lo = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(key_lo + 34 * block));
          const float scale_hi = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(key_hi + 34 * block));
          s[0] += part[0] * scale_lo, s[1] += part[1] * scale_lo;
          s[2] += part[2] * scale_hi, s[3] += part[3] * scale_hi;
        }
        // C: rows keys g, g + 8; columns heads 2 t4, 2 t4 + 1
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int h = 2 * t4 + c;
          if (h < G) {
            score_parts[(slab * G + h) * L::kScoreStride + 16 * mt + g] = s[c];
            score_parts[(slab * G + h) * L::kScoreStride + 16 * mt + g + 8] = s[2 + c];
          }
        }
      }
    }
    __syncthreads();

    // Softmax: lane j takes key j of each head this warp owns.
#pragma unroll
    for (int i = 0; i < L::kHeadsPerWarp; ++i) {
      const int h = warp + kDecodeWarps * i;
      if (h >= G) break;
      float s = -FLT_MAX;
      if (lane < rows) {
        s = 0.0f;
#pragma unroll
        for (int sl = 0; sl < L::kSlabs; ++sl) s += score_parts[(sl * G + h) * L::kScoreStride + lane];
      }
      const float m_new = fmaxf(m_run[i], warp_max(s));
      const float p = lane < rows ? expf(s - m_new) : 0.0f;
      const float f = expf(m_run[i] - m_new);
      l_run[i] = l_run[i] * f + warp_sum(p);
      m_run[i] = m_new;
      probs[lane * G + h] = p;
      if (lane == 0) factor[h] = f;
    }
    __syncthreads();

    // Values: rescale the running output, then add p * v over this warp's keys.
    if constexpr (!kMma) {
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float f = factor[h];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] *= f;
      }
#pragma unroll 4
      for (int j = key_set; j < rows; j += L::kKeySets) {
        float c[4];
        const float scale = slice.load(v_tile + j * L::kRowBytes, c);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float w = probs[j * G + h] * scale;
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[h][e] += w * c[e];
        }
      }
    } else {
      const float f0 = 2 * t4 < G ? factor[2 * t4] : 1.0f, f1 = 2 * t4 + 1 < G ? factor[2 * t4 + 1] : 1.0f;
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) o[mt][0] *= f0, o[mt][1] *= f1, o[mt][2] *= f0, o[mt][3] *= f1;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        // B (16 x 8, k = keys, n = heads): lane (g, t4) holds head g's p of keys 2 t4, + 1, + 8, + 9.
        // Keys past `rows` have p = 0 and a stale scale: the product is not taken (0 * inf).
        const int key0 = 16 * ks + 2 * t4;
        const int keys[4] = {key0, key0 + 1, key0 + 8, key0 + 9};
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = g < G ? probs[keys[i] * G + g] : 0.0f;
#pragma unroll
        for (int b = 0; b < L::kSlabDims / 32; ++b) {
          const int block = d0 / 32 + b;
          float w[4];
          uint32_t words[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint8_t* row = v_tile + keys[i] * L::kRowBytes;
            const float scale = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(row + 34 * block));
            w[i] = p[i] != 0.0f ? p[i] * scale : 0.0f;
            // elements 4 g .. 4 g + 3 of the block: rows g (tiles 0, 1) and g + 8 (tiles 0, 1)
            words[i] = load_u32_at_halfword(row + 34 * block + 2 + 4 * g) ^ 0x80808080u;
          }
          uint32_t lo[3], hi[3];
          split_pair<3>(w[0], w[1], lo);
          split_pair<3>(w[2], w[3], hi);
          // A (16 x 16, rows = d, k = keys) of m-tile 2 b + j: bytes j (row g) and 2 + j (row g + 8)
          const uint32_t a0[4] = {offset_codes_as_bf16<0>(words[0], words[1]), offset_codes_as_bf16<2>(words[0], words[1]),
                                  offset_codes_as_bf16<0>(words[2], words[3]), offset_codes_as_bf16<2>(words[2], words[3])};
          const uint32_t a1[4] = {offset_codes_as_bf16<1>(words[0], words[1]), offset_codes_as_bf16<3>(words[0], words[1]),
                                  offset_codes_as_bf16<1>(words[2], words[3]), offset_codes_as_bf16<3>(words[2], words[3])};
#pragma unroll
          for (int pc = 0; pc < 3; ++pc) {
            mma_bf16(o[2 * b], a0, lo[pc], hi[pc]);
            mma_bf16(o[2 * b + 1], a1, lo[pc], hi[pc]);
          }
        }
      }
    }
  }

  // The key sets' outputs meet in the (now idle) tile buffers; each owner warp publishes its
  // heads' max and sum.
  float* merged = reinterpret_cast<float*>(smem);  // [kKeySets - 1][G][D]
  float* head_max = factor;                        // reuses [G]: every warp is past the last tile
  float* head_sum = probs;
  __syncthreads();
  if constexpr (!kMma) {
    if (key_set > 0)
#pragma unroll
      for (int h = 0; h < G; ++h)
        *reinterpret_cast<float4*>(merged + ((key_set - 1) * G + h) * D + d0) =
            make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
  }
#pragma unroll
  for (int i = 0; i < L::kHeadsPerWarp; ++i) {
    const int h = warp + kDecodeWarps * i;
    if (h < G && lane == 0) head_max[h] = m_run[i], head_sum[h] = l_run[i];
  }
  __syncthreads();
  if constexpr (kMma) {
    // C of m-tile mt: rows d and d + 2 (above), columns heads 2 t4 and 2 t4 + 1
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int h = 2 * t4 + c;
      if (h >= G) break;
      const int64_t head = q_head0 + h;
      const float inv = a.n_splits == 1 ? 1.0f / head_sum[h] : 1.0f;
      float* dst = a.n_splits == 1 ? a.out + head * D : a.partial + (head * a.n_splits + blockIdx.y) * (D + 2);
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
        const int d = row_element(mt);
        dst[d] = o[mt][c] * inv;
        dst[d + 2] = o[mt][2 + c] * inv;
      }
      if (a.n_splits > 1 && slab == 0 && g == 0) dst[D] = head_max[h], dst[D + 1] = head_sum[h];
    }
    return;
  } else {
    if (key_set != 0) return;
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int other = 1; other < L::kKeySets; ++other) {
        const float4 v = *reinterpret_cast<const float4*>(merged + ((other - 1) * G + h) * D + d0);
        acc[h][0] += v.x, acc[h][1] += v.y, acc[h][2] += v.z, acc[h][3] += v.w;
      }
      const int64_t head = q_head0 + h;
      if (a.n_splits == 1) {
        const float inv = 1.0f / head_sum[h];
#pragma unroll
        for (int e = 0; e < 4; ++e) a.out[head * D + d0 + e] = acc[h][e] * inv;
      } else {
        float* part = a.partial + (head * a.n_splits + blockIdx.y) * (D + 2);
#pragma unroll
        for (int e = 0; e < 4; ++e) part[d0 + e] = acc[h][e];
        if (slab == 0 && lane == 0) part[D] = head_max[h], part[D + 1] = head_sum[h];
      }
    }
  }
}

template <int D, int G, bool kFromProjections = false, bool kMma = false>
cudaError_t launch_decode(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = DecodeLayout<D, G, kMma>::kSmemBytes;
  auto kernel = attention_decode_kernel<D, G, kFromProjections, kMma>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(a.n_tokens * a.n_kv_heads), static_cast<unsigned>(a.n_splits));
  const cudaError_t launched = launch_kernel(kernel, grid, kDecodeThreads, smem, stream, a);
  if (launched == cudaSuccess && a.l2_prefetch_bytes > 0) count_l2_prefetch_launch();
  return launched;
}

std::atomic<int64_t> g_from_projections_launches{0};  // decode_from_projections_launches
std::atomic<int64_t> g_mma_launches{0};               // decode_by_kv_head_mma_launches

// The tensor-core form where it applies (tensor_cores, 4 or 8 heads per KV head), else the SIMT one.
template <int D, int G, bool kFromProjections>
cudaError_t launch_decode_form(const AttentionArgs& a, cudaStream_t stream) {
  if constexpr (G == 4 || G == 8) {
    if (a.tensor_cores) {
      const cudaError_t err = launch_decode<D, G, kFromProjections, true>(a, stream);
      if (err == cudaSuccess) g_mma_launches.fetch_add(1, std::memory_order_relaxed);
      return err;
    }
  }
  return launch_decode<D, G, kFromProjections>(a, stream);
}

template <int D>
cudaError_t launch_decode_group(const AttentionArgs& a, cudaStream_t stream) {
  if (a.from_projections) {
    g_from_projections_launches.fetch_add(1, std::memory_order_relaxed);
    switch (a.n_heads / a.n_kv_heads) {
      case 1: return launch_decode<D, 1, true>(a, stream);
      case 2: return launch_decode<D, 2, true>(a, stream);
      case 4: return launch_decode_form<D, 4, true>(a, stream);
      case 8: return launch_decode_form<D, 8, true>(a, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (a.n_heads / a.n_kv_heads) {
    case 1: return launch_decode<D, 1>(a, stream);
    case 2: return launch_decode<D, 2>(a, stream);
    case 4: return launch_decode_form<D, 4, false>(a, stream);
    case 8: return launch_decode_form<D, 8, false>(a, stream);
    case 16:
      if constexpr (D * 16 <= 4096) return launch_decode<D, 16>(a, stream);
      return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool decode_by_kv_head_applies(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, DType cache_type) {
  if (cache_type != DType::q8_0 || (head_dim != 256 && head_dim != 512) || n_kv_heads <= 0 || n_heads % n_kv_heads)
    return false;
  // G x 4 query and G x 4 output registers per lane: 16 heads of 512 spill
  const int64_t group = n_heads / n_kv_heads;
  return (group == 1 || group == 2 || group == 4 || group == 8 || group == 16) && group * head_dim <= 4096;
}

int64_t decode_by_kv_head_tile_keys() { return kTileKeys; }

int64_t decode_from_projections_launches() { return g_from_projections_launches.load(std::memory_order_relaxed); }
int64_t decode_by_kv_head_mma_launches() { return g_mma_launches.load(std::memory_order_relaxed); }

bool decode_from_projections_applies(const AttentionArgs& a) {
  const HeadNormPart& v = a.fresh_norms[2];
  const int64_t group = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
  return decode_by_kv_head_applies(a.n_heads, a.n_kv_heads, a.head_dim, a.cache_type) && group <= 8 &&
         a.n_tokens == 1 && !a.k_row_caches && a.k_cache_write && a.v_cache_write && a.inv_freq &&
         a.rope_half >= 0 && a.rope_half % 32 == 0 && 2 * a.rope_half <= a.head_dim && v.gain == Gain::none && !v.rope &&
         !a.fresh_norms[0].src && !a.fresh_norms[1].src && !v.src;  // (rows in place: q, k_new, v_new)
}

cudaError_t launch_attention_by_kv_head(const AttentionArgs& a, cudaStream_t stream) {
  if (!decode_by_kv_head_applies(a.n_heads, a.n_kv_heads, a.head_dim, a.cache_type) || a.n_splits < 1 ||
      (a.n_splits > 1 && !a.partial) || (!a.k_row_caches && a.n_tokens != 1))
    return cudaErrorInvalidValue;
  // cp.async copies 16-byte pieces: packed rows of 272 and 544 bytes keep them aligned from an
  // aligned base
  if (a.cache_row_bytes != a.head_dim / 32 * 34) return cudaErrorInvalidValue;
  if (a.from_projections && !decode_from_projections_applies(a)) return cudaErrorInvalidValue;
  if (!a.k_row_caches && ((reinterpret_cast<uintptr_t>(a.k_cache) | reinterpret_cast<uintptr_t>(a.v_cache)) % 16))
    return cudaErrorMisalignedAddress;
  return a.head_dim == 256 ? launch_decode_group<256>(a, stream) : launch_decode_group<512>(a, stream);
}

#else  // HIP: no cp.async; decode keeps the SIMT kernel

bool decode_by_kv_head_applies(int64_t, int64_t, int64_t, DType) { return false; }
int64_t decode_by_kv_head_tile_keys() { return 0; }
bool decode_from_projections_applies(const AttentionArgs&) { return false; }
int64_t decode_from_projections_launches() { return 0; }
int64_t decode_by_kv_head_mma_launches() { return 0; }
cudaError_t launch_attention_by_kv_head(const AttentionArgs&, cudaStream_t) { return cudaErrorInvalidValue; }

#endif

}  // namespace fl::cuda
