// AVX2 + FMA + F16C kernels for cpu_matmul (compiled with -mavx2 -mfma -mf16c; called only
// after a CPU check). Two kinds of kernel:
// - Factored (HFQ4, Q8_0: the formats models are run in). A block's dot product is taken as
//   scale * sum(q x) + min * sum(x): the codes are converted to floats and multiplied into x
//   straight from registers, the scale is applied once per block, and the min once per block
//   and token against a precomputed sum of x. x is prepared once per call (prepare_x): padded
//   to whole blocks with zeros, block sums taken, and for HFQ4 each 16 values de-interleaved
//   into even then odd positions, the order in which one 8-byte load of codes yields them (low
//   nibbles = even weights, high nibbles = odd). Independent accumulators per token hide the
//   FMA latency, which bound the one-token case of the decode-to-buffer kernel below (a single
//   chain: one 8-lane FMA per 4 cycles); they are the same for any number of tokens, so a
//   token's result does not depend on the others in the call.
// - Decode to buffer (f32, f16, bf16, HFQ6): decode one group into an aligned buffer of floats,
//   then multiply-accumulate it into one 8-lane accumulator per token of a tile of up to 8
//   tokens. The decoders reproduce the reference decode exactly (q * scale, then + min).
// Either way only the order of the sums differs from the reference, within cpu_matmul_test's
// tolerance (1e-5 of sum |w x|).
//
// No standard-library templates or shared inline functions are used here (see
// cpu_matmul_avx2.h): everything is a static function of this file or an intrinsic.
#include "backend/cpu/cpu_matmul_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "quant/layouts.h"

namespace fl::avx2 {
namespace {

constexpr int kMaxTile = 8;       // tokens per pass over a row
constexpr int kPlainChunk = 256;  // values decoded per step for f16/bf16 rows

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// Lanes [0, r) set, for a masked load of the last r < 8 values of a group.
alignas(32) const int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
inline __m256i tail_mask(int r) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - r)); }

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 affine(__m256i codes, __m256 scale, __m256 min) {
  return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale), min);
}

// ---- decoders: values [k0, k0 + n) of a row (n <= group), returned as a float pointer ----
// Blocked formats decode the whole group (its bytes always exist); the caller reads only n.
// Plain formats decode exactly n values (a row has no bytes past K).

struct DecodeF32 {
  static constexpr int group = kPlainChunk;
  static const float* decode(const uint8_t* row, int64_t, int64_t k0, int, float*) {
    return reinterpret_cast<const float*>(row) + k0;
  }
};

struct DecodeF16 {
  static constexpr int group = kPlainChunk;
  static const float* decode(const uint8_t* row, int64_t, int64_t k0, int n, float* buf) {
    const uint8_t* p = row + 2 * k0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_store_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
    for (; i < n; ++i) buf[i] = _cvtsh_ss(load_u16(p + 2 * i));
    return buf;
  }
};

struct DecodeBF16 {
  static constexpr int group = kPlainChunk;
  static const float* decode(const uint8_t* row, int64_t, int64_t k0, int n, float* buf) {
    const uint8_t* p = row + 2 * k0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
      _mm256_store_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    for (; i < n; ++i) {
      uint32_t bits = static_cast<uint32_t>(load_u16(p + 2 * i)) << 16;
      std::memcpy(buf + i, &bits, 4);
    }
    return buf;
  }
};

struct DecodeHfq6 {
  using L = layout::Hfq6G256;
  static constexpr int group = L::group;
  static const float* decode(const uint8_t* row, int64_t b, int64_t, int, float* buf) {
    const uint8_t* block = row + b * L::block_bytes;
    const __m256 scale = _mm256_set1_ps(load_f32(block + L::scale_offset));
    const __m256 min = _mm256_set1_ps(load_f32(block + L::min_offset));
    // Every 3 bytes are a 24-bit little-endian word holding 4 codes at bits 0, 6, 12, 18.
    const __m256i shifts = _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18);
    const __m256i low6 = _mm256_set1_epi32(0x3f);
    const uint8_t* c = block + L::codes_offset;
    for (int i = 0; i < L::group; i += 8, c += 6) {
      const int32_t w0 = c[0] | c[1] << 8 | c[2] << 16;
      const int32_t w1 = c[3] | c[4] << 8 | c[5] << 16;
      __m256i words = _mm256_setr_epi32(w0, w0, w0, w0, w1, w1, w1, w1);
      __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(words, shifts), low6);
      _mm256_store_ps(buf + i, affine(codes, scale, min));
    }
    return buf;
  }
};

// ---- the row kernel ----

// acc[j] += v[0, n) * x_j[k0, k0 + n) for the NT tokens of the tile; x is never read past n.
template <int NT>
inline void accumulate(const float* v, int n, const float* const* x, int64_t k0, __m256* acc) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_loadu_ps(v + i);
    for (int j = 0; j < NT; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[j] + k0 + i), acc[j]);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 w = _mm256_maskload_ps(v + i, mask);
    for (int j = 0; j < NT; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_maskload_ps(x[j] + k0 + i, mask), acc[j]);
  }
}

template <int NT, typename Decode>
void tile_rows(const MatmulArgs& a, int64_t m0, int64_t m1, int64_t t0) {
  const float* x[NT];
  float* out[NT];
  for (int j = 0; j < NT; ++j) {
    x[j] = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.x) + (t0 + j) * a.x_stride);
    out[j] = reinterpret_cast<float*>(reinterpret_cast<char*>(a.out) + (t0 + j) * a.out_stride);
  }
  alignas(32) float buf[Decode::group];
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* row = a.w + m * a.w_stride;
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t k0 = 0, b = 0; k0 < a.K; k0 += Decode::group, ++b) {
      const int n = static_cast<int>(min64(Decode::group, a.K - k0));
      accumulate<NT>(Decode::decode(row, b, k0, n, buf), n, x, k0, acc);
    }
    for (int j = 0; j < NT; ++j) out[j][m] = horizontal_sum(acc[j]);
  }
}

template <typename Decode>
void rows_for_format(const MatmulArgs& a, int64_t m0, int64_t m1) {
  // Row blocks keep a weight row hot in L1 while every token tile passes over it.
  constexpr int64_t kRowBlock = 16;
  for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
    const int64_t r1 = min64(m1, r0 + kRowBlock);
    for (int64_t t0 = 0; t0 < a.T; t0 += kMaxTile) {
      switch (min64(kMaxTile, a.T - t0)) {
        case 1: tile_rows<1, Decode>(a, r0, r1, t0); break;
        case 2: tile_rows<2, Decode>(a, r0, r1, t0); break;
        case 3: tile_rows<3, Decode>(a, r0, r1, t0); break;
        case 4: tile_rows<4, Decode>(a, r0, r1, t0); break;
        case 5: tile_rows<5, Decode>(a, r0, r1, t0); break;
        case 6: tile_rows<6, Decode>(a, r0, r1, t0); break;
        case 7: tile_rows<7, Decode>(a, r0, r1, t0); break;
        default: tile_rows<8, Decode>(a, r0, r1, t0); break;
      }
    }
  }
}

// ---- factored kernels (HFQ4, Q8_0) ----

// Codes of one block, 16 values per step, as two 8-lane float vectors in prepared-x order.
template <typename L>
struct Hfq4Codes {
  static constexpr int group = L::group;
  static constexpr int block_bytes = L::block_bytes;
  static constexpr bool interleaved = true;  // x de-interleaved per 16 values
  static constexpr bool has_min = true;
  static float scale(const uint8_t* block) { return load_f32(block + L::scale_offset); }
  static float min(const uint8_t* block) { return load_f32(block + L::min_offset); }
  // Values 16 i .. 16 i + 15: eight bytes, each widened to a 32-bit lane; its low nibble is an
  // even weight, its high nibble (already zero-extended) the next odd one.
  static void step(const uint8_t* block, int i, __m256& even, __m256& odd) {
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + L::codes_offset + 8 * i)));
    even = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)));
    odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
  }
};

struct Q8_0Codes {
  using L = layout::Q8_0;
  static constexpr int group = L::group;
  static constexpr int block_bytes = L::block_bytes;
  static constexpr bool interleaved = false;
  static constexpr bool has_min = false;
  static float scale(const uint8_t* block) { return _cvtsh_ss(load_u16(block + L::scale_offset)); }
  static float min(const uint8_t*) { return 0.0f; }
  static void step(const uint8_t* block, int i, __m256& first, __m256& second) {
    const uint8_t* codes = block + L::codes_offset + 16 * i;
    first = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
    second = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8))));
  }
};

constexpr int kFactoredStep = 16;  // values per Codes::step
// Four FMA chains per token hide the FMA's latency (~4 cycles, two pipes) when one token is
// multiplied; the same four for any number of tokens, so that a token's sum is computed the same
// way whatever else is in the call (batched rows equal lone ones bit for bit on the CPU).
constexpr int kFactoredChains = 4;
// Tokens per pass over a row: 2 x 4 accumulators + 2 totals + the codes and x fit the 16 AVX2
// registers; a third token's chains would spill.
constexpr int kFactoredTile = 2;

// The prepared x of `Codes`'s format: per token, `padded` floats (K rounded up to whole blocks,
// zeros past K, HFQ4 de-interleaved) then `blocks` block sums of the real values.
struct PreparedLayout {
  int64_t blocks, padded, floats_per_token;
};

template <typename C>
PreparedLayout prepared_layout(int64_t K) {
  const int64_t blocks = (K + C::group - 1) / C::group;
  // Whole 8-float lines per token keep every token's values 32-byte aligned.
  const int64_t per_token = (blocks * C::group + blocks + 7) / 8 * 8;
  return {blocks, blocks * C::group, per_token};
}

template <typename C>
void prepare_tokens(const MatmulArgs& a, float* prepared) {
  const PreparedLayout l = prepared_layout<C>(a.K);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* x = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.x) + t * a.x_stride);
    float* xp = prepared + t * l.floats_per_token;
    float* sums = xp + l.padded;
    for (int64_t k = 0; k < l.padded; k += kFactoredStep) {
      for (int i = 0; i < kFactoredStep; ++i) {
        // value k + i of the step sits at position i (natural order) or, de-interleaved, even
        // values first: position i / 2 for even i, 8 + i / 2 for odd i.
        const int slot = C::interleaved ? (i % 2) * 8 + i / 2 : i;
        xp[k + slot] = k + i < a.K ? x[k + i] : 0.0f;
      }
    }
    for (int64_t b = 0; b < l.blocks; ++b) {
      float s = 0.0f;
      for (int64_t k = b * C::group; k < min64((b + 1) * C::group, a.K); ++k) s += x[k];
      sums[b] = s;
    }
  }
}

// acc[j][c] += codes * x_j over values [16 i, 16 i + 16) of block b, into chains c and c + 1.
template <int NT, int A, typename C>
inline void factored_step(const uint8_t* block, int i, const float* const* xb, int c, __m256 (*acc)[A]) {
  __m256 first, second;
  C::step(block, i, first, second);
  for (int j = 0; j < NT; ++j) {
    const float* x = xb[j] + kFactoredStep * i;
    acc[j][c % A] = _mm256_fmadd_ps(first, _mm256_loadu_ps(x), acc[j][c % A]);
    acc[j][(c + 1) % A] = _mm256_fmadd_ps(second, _mm256_loadu_ps(x + 8), acc[j][(c + 1) % A]);
  }
}

// Blocks [b0, b1) of rows [m0, m1) against the NT prepared tokens xt, continuing each (row,
// token)'s running sums in total / min_total (indexed by m - m0): calls over consecutive block
// ranges perform exactly the operations of one call over all blocks, in the same order.
template <int NT, typename C>
void factored_blocks(const PreparedLayout& l, const MatmulArgs& a, const float* const* xt, int64_t m0, int64_t m1,
                     int64_t b0, int64_t b1, __m256 (*total)[NT], float (*min_total)[NT]) {
  constexpr int A = kFactoredChains;
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* row = a.w + m * a.w_stride;
    __m256 row_total[NT];
    for (int j = 0; j < NT; ++j) row_total[j] = total[m - m0][j];
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* block = row + b * C::block_bytes;
      // Steps holding real values; the rest of a tail block meets zeros in x and is skipped.
      const int steps = static_cast<int>((min64(C::group, a.K - b * C::group) + kFactoredStep - 1) / kFactoredStep);
      const float* xb[NT];
      for (int j = 0; j < NT; ++j) xb[j] = xt[j] + b * C::group;
      __m256 acc[NT][A];
      for (int j = 0; j < NT; ++j)
        for (int c = 0; c < A; ++c) acc[j][c] = _mm256_setzero_ps();
      int i = 0;
      for (; i + 1 < steps; i += 2) {
        factored_step<NT, A, C>(block, i, xb, 0, acc);
        factored_step<NT, A, C>(block, i + 1, xb, 2, acc);
      }
      if (i < steps) factored_step<NT, A, C>(block, i, xb, 0, acc);
      const __m256 scale = _mm256_set1_ps(C::scale(block));
      for (int j = 0; j < NT; ++j) {
        __m256 sum = acc[j][0];
        for (int c = 1; c < A; ++c) sum = _mm256_add_ps(sum, acc[j][c]);
        row_total[j] = _mm256_fmadd_ps(scale, sum, row_total[j]);
        if (C::has_min) min_total[m - m0][j] += C::min(block) * xt[j][l.padded + b];
      }
    }
    for (int j = 0; j < NT; ++j) total[m - m0][j] = row_total[j];
  }
}

// Rows are taken in blocks of kRowBlock and tokens in tiles of NT. With more than one tile, K is
// cut in chunks of kChunkValues: a chunk of x for the tile (8 KB) and of the row block's weights
// (~9 KB of HFQ4) stay in L1 while every row of the block passes over them; unchunked, two
// tokens' whole x (22 KB at K = 2816) and 16 rows (24 KB) overflowed L1 and both streamed from L2
// once per row (28 GMAC/s on the 2-core build machine at 8 tokens; chunked, 41). One tile (decode)
// reads each row whole, in order: the weights are then one sequential stream from memory, which
// the chunks' 16 interleaved streams slowed 2.3x.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kChunkValues = 1024;

template <int NT, typename C>
void factored_tile(const MatmulArgs& a, const float* prepared, int64_t m0, int64_t m1, int64_t t0) {
  const PreparedLayout l = prepared_layout<C>(a.K);
  const int64_t chunk_blocks = a.T <= kFactoredTile ? l.blocks : kChunkValues / C::group;
  const float* xt[NT];
  for (int j = 0; j < NT; ++j) xt[j] = prepared + (t0 + j) * l.floats_per_token;
  __m256 total[kRowBlock][NT];
  float min_total[kRowBlock][NT];
  for (int64_t r = 0; r < m1 - m0; ++r)
    for (int j = 0; j < NT; ++j) total[r][j] = _mm256_setzero_ps(), min_total[r][j] = 0.0f;
  for (int64_t b0 = 0; b0 < l.blocks; b0 += chunk_blocks)
    factored_blocks<NT, C>(l, a, xt, m0, m1, b0, min64(l.blocks, b0 + chunk_blocks), total, min_total);
  for (int j = 0; j < NT; ++j) {
    float* out = reinterpret_cast<float*>(reinterpret_cast<char*>(a.out) + (t0 + j) * a.out_stride);
    for (int64_t m = m0; m < m1; ++m) out[m] = horizontal_sum(total[m - m0][j]) + min_total[m - m0][j];
  }
}

template <typename C>
void factored_rows(const MatmulArgs& a, const float* prepared, int64_t m0, int64_t m1) {
  static_assert(kChunkValues % C::group == 0, "a chunk holds whole blocks");
  for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
    const int64_t r1 = min64(m1, r0 + kRowBlock);
    for (int64_t t0 = 0; t0 < a.T; t0 += kFactoredTile) {
      if (a.T - t0 >= 2)
        factored_tile<2, C>(a, prepared, r0, r1, t0);
      else
        factored_tile<1, C>(a, prepared, r0, r1, t0);
    }
  }
}

}  // namespace

int64_t prepared_floats(const MatmulArgs& a) {
  switch (static_cast<DType>(a.w_type)) {
    case DType::q8_0: return a.T * prepared_layout<Q8_0Codes>(a.K).floats_per_token;
    case DType::hfq4_g256: return a.T * prepared_layout<Hfq4Codes<layout::Hfq4G256>>(a.K).floats_per_token;
    case DType::hfq4_g128: return a.T * prepared_layout<Hfq4Codes<layout::Hfq4G128>>(a.K).floats_per_token;
    default: return 0;
  }
}

void prepare_x(const MatmulArgs& a, float* prepared) {
  switch (static_cast<DType>(a.w_type)) {
    case DType::q8_0: prepare_tokens<Q8_0Codes>(a, prepared); break;
    case DType::hfq4_g256: prepare_tokens<Hfq4Codes<layout::Hfq4G256>>(a, prepared); break;
    case DType::hfq4_g128: prepare_tokens<Hfq4Codes<layout::Hfq4G128>>(a, prepared); break;
    default: break;
  }
}

bool supports(int w_type) {
  switch (static_cast<DType>(w_type)) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q8_0:
    case DType::hfq4_g256:
    case DType::hfq4_g128:
    case DType::hfq6_g256: return true;
    default: return false;
  }
}

void matmul_rows(const MatmulArgs& a, const float* prepared, int64_t m_begin, int64_t m_end) {
  switch (static_cast<DType>(a.w_type)) {
    case DType::f32: rows_for_format<DecodeF32>(a, m_begin, m_end); break;
    case DType::f16: rows_for_format<DecodeF16>(a, m_begin, m_end); break;
    case DType::bf16: rows_for_format<DecodeBF16>(a, m_begin, m_end); break;
    case DType::q8_0: factored_rows<Q8_0Codes>(a, prepared, m_begin, m_end); break;
    case DType::hfq4_g256: factored_rows<Hfq4Codes<layout::Hfq4G256>>(a, prepared, m_begin, m_end); break;
    case DType::hfq4_g128: factored_rows<Hfq4Codes<layout::Hfq4G128>>(a, prepared, m_begin, m_end); break;
    case DType::hfq6_g256: rows_for_format<DecodeHfq6>(a, m_begin, m_end); break;
    default: break;  // excluded by supports()
  }
}

}  // namespace fl::avx2
