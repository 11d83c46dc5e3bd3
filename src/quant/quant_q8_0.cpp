// Q8_0 (ggml): blocks of 32 weights, [f16 d][32 x int8 q], w = q * d.
//
// The encoder follows ggml's quantize_row_q8_0_ref so that our bytes match llama.cpp's:
// d = amax / 127 in f32, the stored scale is d rounded to f16 (nearest even), and the codes are
// roundf(w * (1 / d)) -- the reciprocal of the *unrounded* f32 d, rounding half away from zero.
// The decoder uses the stored (f16) scale, so the error bound is d/2 + 127 |d - f16(d)| rather
// than d/2 (docs/formats.md). A zero block stores d = 0 and all codes 0.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/codec_util.h"
#include "quant/layouts.h"
#include "quant/quant.h"

namespace fl {
namespace {

using L = layout::Q8_0;
using detail::check_row_args;

// roundf, then saturate to int8; NaN becomes 0 (a plain cast would be undefined behaviour).
int8_t round_to_int8(float v) {
  const float r = std::round(v);
  if (r >= 127.0f) return 127;
  if (r >= -128.0f) return static_cast<int8_t>(r);
  return r < 0.0f ? -128 : 0;
}

void decode_block(const uint8_t* block, float* out, int n) {
  const float d = f16_to_f32(detail::load_le16(block + L::scale_offset));
  const int8_t* q = reinterpret_cast<const int8_t*>(block + L::codes_offset);
  if (n == L::group) {
    // A whole block from a local copy: a fixed trip count over codes that cannot alias `out`,
    // which compilers vectorise at -O2 (int8 codes read in place may alias the floats).
    int8_t codes[L::group];
    std::memcpy(codes, q, sizeof codes);
    for (int i = 0; i < L::group; ++i) out[i] = static_cast<float>(codes[i]) * d;
    return;
  }
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * d;
}

}  // namespace

void quantize_row_q8_0_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_q8_0_ref", src, dst, k);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t k0 = 0; k0 < k; k0 += L::group, out += L::block_bytes) {
    const int n = static_cast<int>(std::min<int64_t>(L::group, k - k0));
    const float* x = src + k0;
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / static_cast<float>(L::qmax);
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    detail::store_le16(out + L::scale_offset, f32_to_f16(d));
    int8_t* q = reinterpret_cast<int8_t*>(out + L::codes_offset);
    for (int i = 0; i < L::group; ++i) q[i] = i < n ? round_to_int8(x[i] * inv_d) : 0;
  }
}

void dequantize_row_q8_0_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_q8_0_ref", src, dst, k);
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (int64_t k0 = 0; k0 < k; k0 += L::group, in += L::block_bytes)
    decode_block(in, dst + k0, static_cast<int>(std::min<int64_t>(L::group, k - k0)));
}

float dot_row_q8_0_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_q8_0_ref", row, x, k);
  return detail::dot_by_blocks<L::group>(static_cast<const uint8_t*>(row), L::block_bytes, x, k, decode_block);
}

}  // namespace fl
