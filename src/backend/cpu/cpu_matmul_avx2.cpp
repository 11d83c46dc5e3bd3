// AVX2 + FMA + F16C kernels for cpu_matmul (compiled with -mavx2 -mfma -mf16c; called only
// after a CPU check). Two kinds of kernel:
// - Factored (HFQ4, Q8_0, and f32/f16/bf16 as blocks of scale 1): cpu_matmul_factored.h over
//   this file's Isa, 8 lanes. A block's dot product is scale * sum(q x) + min * sum(x), the codes
//   converted straight into four FMA chains per token against x prepared once per call. Four
//   chains hide the FMA latency, which bound the one-token case of the decode-to-buffer kernel
//   below (one chain: one 8-lane FMA per 4 cycles); they are the same for any number of tokens,
//   so a token's result does not depend on the others in the call.
// - Decode to buffer (HFQ6): decode one group into an aligned buffer of floats, then
//   multiply-accumulate it into one 8-lane accumulator per token of a tile of up to 8 tokens.
//   The decoder reproduces the reference decode exactly (q * scale, then + min).
// Either way only the order of the sums differs from the reference, within cpu_matmul_test's
// tolerance (1e-5 of sum |w x|).
//
// No standard-library templates or shared inline functions are used here (see
// cpu_matmul_simd.h): everything is a static function of this file or an intrinsic.
#include "backend/cpu/cpu_matmul_simd.h"

#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "quant/layouts.h"

namespace fl::avx2 {
namespace {

constexpr int kMaxTile = 8;  // tokens per pass over a row

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
void tile_rows(const simd::MatmulArgs& a, int64_t m0, int64_t m1, int64_t t0) {
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
void rows_for_format(const simd::MatmulArgs& a, int64_t m0, int64_t m1) {
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

// ---- factored kernels (HFQ4, Q8_0): cpu_matmul_factored.h over AVX2 ----

struct Isa {
  using V = __m256;
  static constexpr int lanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static float hsum(V v) { return horizontal_sum(v); }
  static float f16_to_f32(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
  // Eight bytes, each widened to a 32-bit lane: its low nibble an even weight, its high nibble
  // (already zero-extended) the next odd one.
  static void nibble_pairs(const uint8_t* p, V& even, V& odd) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    even = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)));
    odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
  }
  static void signed_bytes(const uint8_t* p, V& first, V& second) {
    first = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    second = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
  }
  static void f16_values(const uint8_t* p, V& first, V& second) {
    first = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    second = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  }
  // bf16 is the top half of an f32: widen each to 32 bits and shift it up.
  static void bf16_values(const uint8_t* p, V& first, V& second) {
    const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    first = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    second = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
  }
};

#define FIRELINE_MATMUL_FACTORED_ISA
#include "backend/cpu/cpu_matmul_factored.h"

}  // namespace

int64_t prepared_floats(const simd::MatmulArgs& a) { return factored_prepared_floats(a); }

void prepare_x(const simd::MatmulArgs& a, float* prepared) { factored_prepare_x(a, prepared); }

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

void matmul_rows(const simd::MatmulArgs& a, const float* prepared, int64_t m_begin, int64_t m_end) {
  if (factored_matmul_rows(a, prepared, m_begin, m_end)) return;
  switch (static_cast<DType>(a.w_type)) {
    case DType::hfq6_g256: rows_for_format<DecodeHfq6>(a, m_begin, m_end); break;
    default: break;  // excluded by supports()
  }
}

}  // namespace fl::avx2
