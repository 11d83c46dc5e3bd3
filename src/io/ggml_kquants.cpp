#include "io/ggml_kquants.h"

#include "core/error.h"
#include "core/half.h"

namespace fl {
namespace {

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

void check_k(int64_t k, const char* format) {
  if (k <= 0 || k % kQkK != 0) fail("{}: row length {} is not a positive multiple of {}", format, k, kQkK);
}

// Sub-block j's 6-bit scale and min from the 12 packed bytes.
void q4_k_scale_min(int j, const uint8_t* s, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

}  // namespace

void dequantize_row_q4_k(const void* src, float* dst, int64_t k) {
  check_k(k, "Q4_K");
  const uint8_t* block = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < k / kQkK; ++b, block += kQ4KBlockBytes) {
    const float d = f16_to_f32(load_u16(block));
    const float dmin = f16_to_f32(load_u16(block + 2));
    const uint8_t* scales = block + 4;
    const uint8_t* codes = block + 16;
    float* y = dst + b * kQkK;
    for (int chunk = 0; chunk < 4; ++chunk) {  // 64 weights: sub-blocks 2*chunk and 2*chunk+1
      uint8_t sc0, m0, sc1, m1;
      q4_k_scale_min(2 * chunk, scales, sc0, m0);
      q4_k_scale_min(2 * chunk + 1, scales, sc1, m1);
      const float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
      const uint8_t* q = codes + 32 * chunk;
      for (int l = 0; l < 32; ++l) y[64 * chunk + l] = d0 * static_cast<float>(q[l] & 15) - min0;
      for (int l = 0; l < 32; ++l) y[64 * chunk + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - min1;
    }
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t k) {
  check_k(k, "Q6_K");
  const uint8_t* block = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < k / kQkK; ++b, block += kQ6KBlockBytes) {
    const float d = f16_to_f32(load_u16(block + 208));
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block + 64 * half;
      const uint8_t* qh = block + 128 + 32 * half;
      const int8_t* sc = scales + 8 * half;
      float* y = dst + b * kQkK + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q0 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q1 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        y[l] = d * static_cast<float>(sc[is] * q0);
        y[l + 32] = d * static_cast<float>(sc[is + 2] * q1);
        y[l + 64] = d * static_cast<float>(sc[is + 4] * q2);
        y[l + 96] = d * static_cast<float>(sc[is + 6] * q3);
      }
    }
  }
}

}  // namespace fl
