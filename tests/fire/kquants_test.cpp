// Q4_K and Q6_K decoding on hand-built blocks. The blocks are packed here from the format
// description by asking, for each weight, which byte and bits hold it (the decoder walks the
// block the other way round), with scales and codes chosen to hit every bit of every field.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "io/ggml_kquants.h"

namespace fl {
namespace {

struct Q4KParams {
  float d, dmin;
  uint8_t scale[8], min[8];  // 6-bit
  uint8_t code[256];         // 4-bit
};

std::vector<uint8_t> pack_q4_k(const Q4KParams& p) {
  std::vector<uint8_t> b(kQ4KBlockBytes, 0);
  const uint16_t d = f32_to_f16(p.d), dmin = f32_to_f16(p.dmin);
  std::memcpy(&b[0], &d, 2);
  std::memcpy(&b[2], &dmin, 2);
  uint8_t* s = &b[4];
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {  // low 6 bits of bytes j (scale) and j + 4 (min)
      s[j] |= p.scale[j];
      s[j + 4] |= p.min[j];
    } else {  // low/high nibble of byte j + 4; the top two bits in bytes j - 4 (scale) and j (min)
      s[j + 4] |= (p.scale[j] & 15) | (p.min[j] & 15) << 4;
      s[j - 4] |= (p.scale[j] >> 4) << 6;
      s[j] |= (p.min[j] >> 4) << 6;
    }
  }
  for (int i = 0; i < 256; ++i) {
    const int chunk = i / 64, l = i % 64;
    uint8_t& byte = b[16 + 32 * chunk + l % 32];
    byte |= l < 32 ? p.code[i] : p.code[i] << 4;
  }
  return b;
}

TEST(KQuants, Q4KDecodesHandBuiltBlocks) {
  Q4KParams p{};
  p.d = 0.5f;
  p.dmin = 0.25f;
  const uint8_t scales[8] = {1, 63, 17, 32, 48, 5, 33, 62};  // high bits set on j >= 4 too
  const uint8_t mins[8] = {0, 7, 63, 16, 31, 60, 1, 47};
  std::memcpy(p.scale, scales, 8);
  std::memcpy(p.min, mins, 8);
  for (int i = 0; i < 256; ++i) p.code[i] = static_cast<uint8_t>((i * 7 + i / 32) % 16);
  Q4KParams p2 = p;  // a second block with other scales, to check blocks advance
  p2.d = -2.0f;
  p2.dmin = 1.0f;
  for (int j = 0; j < 8; ++j) std::swap(p2.scale[j], p2.min[j]);

  std::vector<uint8_t> row = pack_q4_k(p);
  std::vector<uint8_t> second = pack_q4_k(p2);
  row.insert(row.end(), second.begin(), second.end());
  std::vector<float> out(512, -999.0f);
  dequantize_row_q4_k(row.data(), out.data(), 512);
  for (int blk = 0; blk < 2; ++blk) {
    const Q4KParams& q = blk ? p2 : p;
    for (int i = 0; i < 256; ++i) {
      const int j = i / 32;  // sub-block
      const float want = q.d * q.scale[j] * q.code[i] - q.dmin * q.min[j];
      EXPECT_EQ(out[blk * 256 + i], want) << "block " << blk << " weight " << i;
    }
  }
}

struct Q6KParams {
  float d;
  int8_t scale[16];
  uint8_t code[256];  // 6-bit, value = code - 32
};

std::vector<uint8_t> pack_q6_k(const Q6KParams& p) {
  std::vector<uint8_t> b(kQ6KBlockBytes, 0);
  uint8_t* ql = &b[0];
  uint8_t* qh = &b[128];
  for (int i = 0; i < 256; ++i) {
    const int half = i / 128, r = i % 128, t = r / 32, l = r % 32;  // t-th group of 32 in the half
    const uint8_t q = p.code[i];
    // Low 4 bits: groups 0/1 in the low nibbles of ql[l] / ql[l + 32], groups 2/3 in the high ones.
    uint8_t& low = ql[64 * half + l + (t % 2) * 32];
    low |= t < 2 ? (q & 15) : (q & 15) << 4;
    // High 2 bits: group t in bits 2t..2t+1 of qh[l].
    qh[32 * half + l] |= (q >> 4) << (2 * t);
  }
  std::memcpy(&b[192], p.scale, 16);
  const uint16_t d = f32_to_f16(p.d);
  std::memcpy(&b[208], &d, 2);
  return b;
}

TEST(KQuants, Q6KDecodesHandBuiltBlocks) {
  Q6KParams p{};
  p.d = 0.125f;
  const int8_t scales[16] = {1, -1, 127, -128, 3, 5, -7, 11, 13, -17, 19, 23, -29, 31, 37, -41};
  std::memcpy(p.scale, scales, 16);
  for (int i = 0; i < 256; ++i) p.code[i] = static_cast<uint8_t>((i * 37 + 5) % 64);
  p.code[0] = 0;   // -32
  p.code[1] = 63;  // +31
  Q6KParams p2 = p;
  p2.d = -3.0f;
  for (int i = 0; i < 256; ++i) p2.code[i] = static_cast<uint8_t>(63 - p.code[i]);

  std::vector<uint8_t> row = pack_q6_k(p);
  std::vector<uint8_t> second = pack_q6_k(p2);
  row.insert(row.end(), second.begin(), second.end());
  std::vector<float> out(512, -999.0f);
  dequantize_row_q6_k(row.data(), out.data(), 512);
  for (int blk = 0; blk < 2; ++blk) {
    const Q6KParams& q = blk ? p2 : p;
    for (int i = 0; i < 256; ++i) {
      const float want = q.d * q.scale[i / 16] * (static_cast<int>(q.code[i]) - 32);
      EXPECT_EQ(out[blk * 256 + i], want) << "block " << blk << " weight " << i;
    }
  }
}

TEST(KQuants, RowsMustBeWholeSuperBlocks) {
  std::vector<uint8_t> block(kQ6KBlockBytes, 0);
  std::vector<float> out(256);
  EXPECT_THROW(dequantize_row_q4_k(block.data(), out.data(), 100), Error);
  EXPECT_THROW(dequantize_row_q6_k(block.data(), out.data(), 0), Error);
}

}  // namespace
}  // namespace fl
