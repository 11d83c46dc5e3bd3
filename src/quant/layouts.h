#pragma once
// Byte layouts of the quantized weight formats (docs/formats.md, DESIGN §4). These are wire
// contracts shared with hipfire's HFQM files and ggml's Q8_0, so every offset is spelled out
// here once and used by the reference codecs (src/quant) and by every backend's decoder.
//
// All multi-byte fields are little-endian. A row of K weights is packed into ceil(K / group)
// blocks; the last block of a row holds K mod group real values and code 0 in the rest.
// Constants only (no inline functions), so that SIMD translation units built with other target
// flags can include it without risking mixed-ISA copies of shared inline code.
#include <cstdint>

namespace fl::layout {

// ggml Q8_0: [f16 scale d][32 x int8 q], w = q * d, d = max|w| / 127.
struct Q8_0 {
  static constexpr int group = 32;
  static constexpr int scale_offset = 0;  // f16
  static constexpr int codes_offset = 2;  // int8[32]
  static constexpr int block_bytes = 34;
  static constexpr int qmax = 127;
};

// hipfire HFQ (affine): [f32 scale][f32 min][codes], w = q * scale + min,
// scale = (max - min) / levels (1.0 when max == min), q in [0, levels].
template <int Group, int Bits>
struct Hfq {
  static constexpr int group = Group;
  static constexpr int bits = Bits;
  static constexpr int levels = (1 << Bits) - 1;
  static constexpr int scale_offset = 0;  // f32
  static constexpr int min_offset = 4;    // f32
  static constexpr int codes_offset = 8;
  static constexpr int code_bytes = Group * Bits / 8;
  static constexpr int block_bytes = codes_offset + code_bytes;
};

// 4-bit codes: byte i holds weight 2i in its low nibble and weight 2i+1 in its high nibble.
using Hfq4G256 = Hfq<256, 4>;
using Hfq4G128 = Hfq<128, 4>;
// 6-bit codes, 4 per 3 bytes: for codes (q0, q1, q2, q3) of weights 4j..4j+3,
//   b0 = q0 | (q1 & 3) << 6,  b1 = q1 >> 2 | (q2 & 15) << 4,  b2 = q2 >> 4 | q3 << 2.
using Hfq6G256 = Hfq<256, 6>;

static_assert(Q8_0::block_bytes == Q8_0::codes_offset + Q8_0::group);
static_assert(Hfq4G256::block_bytes == 136);
static_assert(Hfq4G128::block_bytes == 72);
static_assert(Hfq6G256::block_bytes == 200);

}  // namespace fl::layout
