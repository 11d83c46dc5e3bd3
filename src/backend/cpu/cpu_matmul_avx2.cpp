// AVX2 + FMA + F16C kernels for cpu_matmul (compiled with -mavx2 -mfma -mf16c; called only
// after a CPU check): the factored kernel of cpu_matmul_factored.h over this file's Isa, 8 lanes,
// for every weight format. A block's dot product is scale * sum(q x) + min * sum(x), the codes
// converted straight into four FMA chains per token against x prepared once per call. Four
// chains hide the FMA latency, which bound the decode-to-buffer kernel this replaced at one
// token (one chain: one 8-lane FMA per 4 cycles); they are the same for any number of tokens, so
// a token's result does not depend on the others in the call. Only the order of the sums differs
// from the reference, within cpu_matmul_test's tolerance (1e-5 of sum |w x|).
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

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- the factored kernel: cpu_matmul_factored.h over AVX2 ----

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
  // 16 codes from 12 bytes: one 16-byte load ending at the step's last byte (from p - 4), in both
  // 128-bit halves; each 32-bit lane gathers the 3 bytes of its group of four codes and shifts
  // its own code down (0, 6, 12, 18 bits).
  static void six_bit_codes(const uint8_t* p, V& first, V& second) {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p - 4)));
    const __m256i shifts = _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18);
    const __m256i low6 = _mm256_set1_epi32(0x3f);
    // codes 0-3: bytes 0-2, 4-7: 3-5, 8-11: 6-8, 12-15: 9-11 of the step (+4 for the load's start)
    const __m256i take_first = _mm256_setr_epi8(4, 5, 6, -1, 4, 5, 6, -1, 4, 5, 6, -1, 4, 5, 6, -1,  //
                                                7, 8, 9, -1, 7, 8, 9, -1, 7, 8, 9, -1, 7, 8, 9, -1);
    const __m256i take_second = _mm256_setr_epi8(10, 11, 12, -1, 10, 11, 12, -1, 10, 11, 12, -1, 10, 11, 12, -1,  //
                                                 13, 14, 15, -1, 13, 14, 15, -1, 13, 14, 15, -1, 13, 14, 15, -1);
    first =
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, take_first), shifts), low6));
    second =
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, take_second), shifts), low6));
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

bool supports(int w_type) { return factored_supports(w_type); }

void matmul_rows(const simd::MatmulArgs& a, const float* prepared, int64_t m_begin, int64_t m_end) {
  factored_matmul_rows(a, prepared, m_begin, m_end);
}

}  // namespace fl::avx2
