// hipfire's affine HFQ formats: HFQ4-G256, HFQ4-G128, HFQ6-G256 (layouts in quant/layouts.h).
//
// Encoder, as hipfire's quantizer computes it (so our bytes match its files):
//   min, max over the group's real values (the tail group of a row has fewer than G);
//   range = max - min; scale = range / L (L = 15 or 63), or 1.0 when range is 0;
//   inv = 1 / scale, or 0 when range is 0 (every code is then 0 and the group decodes to min);
//   q = floor((w - min) * inv + 0.5), clamped to [0, L]; padded lanes get code 0.
// Decoder: w = q * scale + min (a rounded product, then a rounded sum; no FMA).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/codec_util.h"
#include "quant/layouts.h"
#include "quant/quant.h"

namespace fl {
namespace {

using detail::check_row_args;

float bits_as_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t float_as_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// floor(t) of t = (w - min) * inv + 0.5 >= 0.5, clamped to [0, levels]. Written with
// comparisons so that a NaN gives 0 instead of undefined behaviour (hipfire's saturating
// `as u8` cast does the same).
uint8_t affine_code(float w, float min, float inv, int levels) {
  const float t = (w - min) * inv + 0.5f;
  if (!(t > 0.0f)) return 0;
  if (t >= static_cast<float>(levels)) return static_cast<uint8_t>(levels);
  return static_cast<uint8_t>(t);
}

void pack_codes(const uint8_t* q, uint8_t* out, int group, int bits) {
  if (bits == 4) {
    for (int i = 0; i < group / 2; ++i) out[i] = static_cast<uint8_t>(q[2 * i] | q[2 * i + 1] << 4);
    return;
  }
  // 6 bits: 4 codes in 3 bytes, low bits first.
  for (int j = 0; j < group / 4; ++j, q += 4, out += 3) {
    out[0] = static_cast<uint8_t>(q[0] | (q[1] & 0x3) << 6);
    out[1] = static_cast<uint8_t>(q[1] >> 2 | (q[2] & 0xf) << 4);
    out[2] = static_cast<uint8_t>(q[2] >> 4 | q[3] << 2);
  }
}

// Code of lane i of a block's code bytes.
uint8_t unpack_code(const uint8_t* codes, int i, int bits) {
  if (bits == 4) return (codes[i / 2] >> (4 * (i & 1))) & 0xf;
  const uint8_t* b = codes + 3 * (i / 4);
  switch (i & 3) {
    case 0: return b[0] & 0x3f;
    case 1: return static_cast<uint8_t>(b[0] >> 6 | (b[1] & 0xf) << 2);
    case 2: return static_cast<uint8_t>(b[1] >> 4 | (b[2] & 0x3) << 4);
    default: return b[2] >> 2;
  }
}

template <typename L>
void quantize_row_hfq(const char* codec, const float* src, void* dst, int64_t k) {
  check_row_args(codec, src, dst, k);
  uint8_t* out = static_cast<uint8_t*>(dst);
  uint8_t q[L::group];
  for (int64_t k0 = 0; k0 < k; k0 += L::group, out += L::block_bytes) {
    const int n = static_cast<int>(std::min<int64_t>(L::group, k - k0));
    const float* x = src + k0;
    // fmin/fmax skip NaNs, like the f32::min/max fold in hipfire's encoder.
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; ++i) {
      lo = std::fmin(lo, x[i]);
      hi = std::fmax(hi, x[i]);
    }
    const float range = hi - lo;
    const float scale = range > 0.0f ? range / static_cast<float>(L::levels) : 1.0f;
    const float inv = range > 0.0f ? 1.0f / scale : 0.0f;
    detail::store_le32(out + L::scale_offset, float_as_bits(scale));
    detail::store_le32(out + L::min_offset, float_as_bits(lo));
    for (int i = 0; i < L::group; ++i) q[i] = i < n ? affine_code(x[i], lo, inv, L::levels) : 0;
    pack_codes(q, out + L::codes_offset, L::group, L::bits);
  }
}

template <typename L>
void decode_hfq_block(const uint8_t* block, float* out, int n) {
  const float scale = bits_as_float(detail::load_le32(block + L::scale_offset));
  const float min = bits_as_float(detail::load_le32(block + L::min_offset));
  const uint8_t* codes = block + L::codes_offset;
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(unpack_code(codes, i, L::bits)) * scale + min;
}

template <typename L>
void dequantize_row_hfq(const char* codec, const void* src, float* dst, int64_t k) {
  check_row_args(codec, src, dst, k);
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (int64_t k0 = 0; k0 < k; k0 += L::group, in += L::block_bytes)
    decode_hfq_block<L>(in, dst + k0, static_cast<int>(std::min<int64_t>(L::group, k - k0)));
}

template <typename L>
float dot_row_hfq(const char* codec, const void* row, const float* x, int64_t k) {
  check_row_args(codec, row, x, k);
  return detail::dot_by_blocks<L::group>(static_cast<const uint8_t*>(row), L::block_bytes, x, k,
                                         decode_hfq_block<L>);
}

}  // namespace

void quantize_row_hfq4_g256_ref(const float* src, void* dst, int64_t k) {
  quantize_row_hfq<layout::Hfq4G256>("quantize_row_hfq4_g256_ref", src, dst, k);
}
void dequantize_row_hfq4_g256_ref(const void* src, float* dst, int64_t k) {
  dequantize_row_hfq<layout::Hfq4G256>("dequantize_row_hfq4_g256_ref", src, dst, k);
}
float dot_row_hfq4_g256_ref(const void* row, const float* x, int64_t k) {
  return dot_row_hfq<layout::Hfq4G256>("dot_row_hfq4_g256_ref", row, x, k);
}

void quantize_row_hfq4_g128_ref(const float* src, void* dst, int64_t k) {
  quantize_row_hfq<layout::Hfq4G128>("quantize_row_hfq4_g128_ref", src, dst, k);
}
void dequantize_row_hfq4_g128_ref(const void* src, float* dst, int64_t k) {
  dequantize_row_hfq<layout::Hfq4G128>("dequantize_row_hfq4_g128_ref", src, dst, k);
}
float dot_row_hfq4_g128_ref(const void* row, const float* x, int64_t k) {
  return dot_row_hfq<layout::Hfq4G128>("dot_row_hfq4_g128_ref", row, x, k);
}

void quantize_row_hfq6_g256_ref(const float* src, void* dst, int64_t k) {
  quantize_row_hfq<layout::Hfq6G256>("quantize_row_hfq6_g256_ref", src, dst, k);
}
void dequantize_row_hfq6_g256_ref(const void* src, float* dst, int64_t k) {
  dequantize_row_hfq<layout::Hfq6G256>("dequantize_row_hfq6_g256_ref", src, dst, k);
}
float dot_row_hfq6_g256_ref(const void* row, const float* x, int64_t k) {
  return dot_row_hfq<layout::Hfq6G256>("dot_row_hfq6_g256_ref", row, x, k);
}

}  // namespace fl
