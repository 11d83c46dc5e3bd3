// AVX-512 (F, BW, VL) kernels for cpu_matmul: the factored kernel of cpu_matmul_factored.h
// (every weight format) at 16 lanes (compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c;
// called only after a CPU check). On a core with full-width 512-bit units (Zen 5; Intel server
// cores) each instruction does twice the AVX2 kernel's work; the instruction stream is otherwise
// the same: one 16-byte code load widened to 16 lanes gives 32 HFQ4 weights, low nibbles the even
// ones and high nibbles the odd ones. At one input row on the 2-core build machine (Zen 5 class):
// HFQ4 59 GMAC/s against AVX2's 41, Q8_0 42 against 27 (see Q8_0Codes).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/cpu_matmul_simd.h"
#include "core/dtype.h"
#include "quant/layouts.h"

namespace fl::avx512 {
namespace {

struct Isa {
  using V = __m512;
  static constexpr int lanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  // A fixed pairwise order (halves, then quarters, ...): the same for every row.
  static float hsum(V v) {
    __m256 s8 =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
  }
  static void nibble_pairs(const uint8_t* p, V& even, V& odd) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    even = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0f)));
    odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
  }
  static void f16_values(const uint8_t* p, V& first, V& second) {
    first = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    second = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  }
  static void bf16_values(const uint8_t* p, V& first, V& second) {
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    first = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    second = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  }
  // 32 codes from 24 bytes: codes 0-15 from the 16 bytes at p - 4 and codes 16-31 from the 16
  // at p + 8, each in all four 128-bit lanes; lane L of a half gathers the 3 bytes of its group of
  // four codes, and each 32-bit element shifts its own code down (0, 6, 12, 18 bits).
  static void six_bit_codes(const uint8_t* p, V& first, V& second) {
    const __m512i take = _mm512_set_epi32(0xff0f0e0d, 0xff0f0e0d, 0xff0f0e0d, 0xff0f0e0d,   // lane 3: bytes 13-15
                                          0xff0c0b0a, 0xff0c0b0a, 0xff0c0b0a, 0xff0c0b0a,   // lane 2: 10-12
                                          0xff090807, 0xff090807, 0xff090807, 0xff090807,   // lane 1: 7-9
                                          0xff060504, 0xff060504, 0xff060504, 0xff060504);  // lane 0: 4-6
    const __m512i shifts = _mm512_set_epi32(18, 12, 6, 0, 18, 12, 6, 0, 18, 12, 6, 0, 18, 12, 6, 0);
    const __m512i low6 = _mm512_set1_epi32(0x3f);
    const __m512i a = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p - 4)));
    const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    first = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(a, take), shifts), low6));
    second = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(b, take), shifts), low6));
  }
  static void signed_bytes(const uint8_t* p, V& first, V& second) {
    first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  }
};

#define FIRELINE_MATMUL_FACTORED_ISA
#include "backend/cpu/cpu_matmul_factored.h"

}  // namespace

bool supports(int w_type) { return factored_supports(w_type); }

int64_t prepared_floats(const simd::MatmulArgs& a) { return factored_prepared_floats(a); }

void prepare_x(const simd::MatmulArgs& a, float* prepared) { factored_prepare_x(a, prepared); }

void matmul_rows(const simd::MatmulArgs& a, const float* prepared, int64_t m_begin, int64_t m_end) {
  factored_matmul_rows(a, prepared, m_begin, m_end);
}

}  // namespace fl::avx512
