// The reference codecs of every weight format (src/quant): layout, encoder rules, error bounds,
// row-safe packing (tail padding with code 0, nothing read or written past k) and golden bytes.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/layouts.h"
#include "quant/quant.h"

namespace fl {
namespace {

const DType kAllFormats[] = {DType::f32,  DType::f16,       DType::bf16,      DType::q8_0,
                             DType::hfq4_g256, DType::hfq4_g128, DType::hfq6_g256};
const DType kBlockFormats[] = {DType::q8_0, DType::hfq4_g256, DType::hfq4_g128, DType::hfq6_g256};
const int64_t kRowLengths[] = {1, 31, 32, 33, 127, 128, 129, 255, 256, 257, 704, 2112, 2816};

// ---- an independent reading of the block layouts (docs/formats.md) ----

// In every blocked format the codes of a block form a little-endian bit stream: lane i occupies
// bits [i * bits, (i + 1) * bits). (For HFQ4 that is "weight 2i in the low nibble of byte i";
// for HFQ6 it is the 4-codes-in-3-bytes packing.)
uint32_t code_at(const uint8_t* codes, int lane, int bits) {
  uint32_t value = 0;
  for (int b = 0; b < bits; ++b) {
    int bit = lane * bits + b;
    value |= static_cast<uint32_t>((codes[bit / 8] >> (bit % 8)) & 1) << b;
  }
  return value;
}

float f32_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);  // little-endian host (x86-64, aarch64)
  return f;
}

struct BlockView {
  int group, bits, block_bytes, codes_offset;
  bool affine;
};

BlockView block_view(DType t) {
  switch (t) {
    case DType::q8_0: return {32, 8, 34, 2, false};
    case DType::hfq4_g256: return {256, 4, 136, 8, true};
    case DType::hfq4_g128: return {128, 4, 72, 8, true};
    case DType::hfq6_g256: return {256, 6, 200, 8, true};
    default: ADD_FAILURE() << "not a blocked format"; return {};
  }
}

// Decoded value of lane i of a block, straight from the layout description.
float layout_value(DType t, const uint8_t* block, int lane) {
  BlockView v = block_view(t);
  uint32_t code = code_at(block + v.codes_offset, lane, v.bits);
  if (!v.affine) {
    uint16_t d16 = static_cast<uint16_t>(block[0] | block[1] << 8);
    return static_cast<float>(static_cast<int8_t>(code)) * f16_to_f32(d16);
  }
  return static_cast<float>(code) * f32_at(block) + f32_at(block + 4);
}

// ---- test data ----

enum class Dist { normal, uniform, constant, outlier, offset, tiny, mixed };
const Dist kDists[] = {Dist::normal, Dist::uniform, Dist::constant, Dist::outlier, Dist::offset, Dist::tiny, Dist::mixed};
const char* dist_name(Dist d) {
  const char* names[] = {"normal", "uniform", "constant", "outlier", "offset", "tiny", "mixed"};
  return names[static_cast<int>(d)];
}

std::vector<float> make_row(Dist dist, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    switch (dist) {
      case Dist::normal: row[i] = normal(rng); break;
      case Dist::uniform: row[i] = uniform(rng); break;
      case Dist::constant: row[i] = -0.375f; break;
      case Dist::outlier: row[i] = 0.01f * normal(rng); break;
      case Dist::offset: row[i] = 100.0f + uniform(rng); break;
      case Dist::tiny: row[i] = 1e-5f * normal(rng); break;
      case Dist::mixed: row[i] = normal(rng) * std::exp2(static_cast<float>(i % 13) - 6.0f); break;
    }
  }
  if (dist == Dist::outlier) row[static_cast<size_t>(rng() % k)] = 50.0f;
  return row;
}

// Largest |w - deq| the format allows for lane i of a row (see docs/formats.md, error bounds).
// `src` is the row, `block` the encoded block holding lane i, [g0, g1) the group's real lanes.
double error_bound(DType t, const float* src, int64_t g0, int64_t g1, const uint8_t* block, int64_t i) {
  const double eps = std::ldexp(1.0, -23);
  switch (t) {
    case DType::f32: return 0.0;
    case DType::f16: return std::max(std::ldexp(static_cast<double>(std::fabs(src[i])), -11), std::ldexp(1.0, -25));
    case DType::bf16: return std::ldexp(std::fabs(src[i]), -8);
    case DType::q8_0: {
      float amax = 0.0f;
      for (int64_t j = g0; j < g1; ++j) amax = std::max(amax, std::fabs(src[j]));
      const double d = amax / 127.0f;  // the f32 scale the encoder divides by
      const double d16 = f16_to_f32(static_cast<uint16_t>(block[0] | block[1] << 8));  // the stored one
      return d * (0.5 + 1e-4) + 127.0 * std::fabs(d - d16) + eps * amax;
    }
    default: {
      float lo = src[g0], hi = src[g0];
      for (int64_t j = g0; j < g1; ++j) lo = std::min(lo, src[j]), hi = std::max(hi, src[j]);
      const double scale = f32_at(block), range = static_cast<double>(hi) - lo;
      if (range == 0.0) return 0.0;  // a constant group decodes exactly
      return scale * (0.5 + 1e-4) + 4.0 * eps * (range + std::max(std::fabs(lo), std::fabs(hi)));
    }
  }
}

std::string where(DType t, Dist d, int64_t k) {
  return std::string(dtype_name(t)) + " " + dist_name(d) + " k=" + std::to_string(k);
}

// ---- registry ----

TEST(QuantRegistry, EveryFormatHasAnEntryMatchingItsDType) {
  for (DType t : kAllFormats) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    ASSERT_TRUE(has_quant_format(t));
    const QuantFormat& f = quant_format(t);
    EXPECT_EQ(f.dtype, t);
    EXPECT_EQ(f.block_elems, dtype_traits(t).block_elems);
    EXPECT_EQ(f.block_bytes, dtype_traits(t).block_bytes);
    EXPECT_TRUE(f.quantize_row && f.dequantize_row && f.dot_row);
    EXPECT_EQ(f.kind == QuantKind::plain, !dtype_traits(t).quantized);
  }
  EXPECT_EQ(quant_format(DType::q8_0).kind, QuantKind::symmetric);
  EXPECT_EQ(quant_format(DType::hfq6_g256).kind, QuantKind::affine);
  EXPECT_EQ(quant_format(DType::hfq6_g256).code_bits, 6);
  EXPECT_EQ(quant_format(DType::hfq4_g128).code_bits, 4);
}

TEST(QuantRegistry, RejectsTypesWithoutCodecsAndUnknownIds) {
  for (DType t : {DType::i32, DType::i64, DType::u8}) {
    EXPECT_FALSE(has_quant_format(t));
    EXPECT_THROW(quant_format(t), Error);
  }
  const DType bogus = static_cast<DType>(200);
  EXPECT_FALSE(has_quant_format(bogus));
  try {
    quant_format(bogus);
    FAIL() << "no error for an unknown dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown element type id 200"), std::string::npos) << e.what();
  }
}

TEST(QuantRegistry, CodecsRejectEmptyRowsAndNullBuffers) {
  for (DType t : kAllFormats) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const QuantFormat& f = quant_format(t);
    std::vector<float> x(64, 1.0f);
    std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes(t, 64)));
    for (int64_t k : {int64_t{0}, int64_t{-1}, int64_t{-4096}}) {
      EXPECT_THROW(f.quantize_row(x.data(), bytes.data(), k), Error);
      EXPECT_THROW(f.dequantize_row(bytes.data(), x.data(), k), Error);
      EXPECT_THROW(f.dot_row(bytes.data(), x.data(), k), Error);
    }
    EXPECT_THROW(f.quantize_row(nullptr, bytes.data(), 8), Error);
    EXPECT_THROW(f.quantize_row(x.data(), nullptr, 8), Error);
    EXPECT_THROW(f.dequantize_row(nullptr, x.data(), 8), Error);
    EXPECT_THROW(f.dequantize_row(bytes.data(), nullptr, 8), Error);
    EXPECT_THROW(f.dot_row(nullptr, x.data(), 8), Error);
    EXPECT_THROW(f.dot_row(bytes.data(), nullptr, 8), Error);
  }
}

TEST(QuantRegistry, LayoutConstantsMatchTheDocumentedSizes) {
  EXPECT_EQ(layout::Q8_0::block_bytes, 34);
  EXPECT_EQ(layout::Hfq4G256::block_bytes, 136);
  EXPECT_EQ(layout::Hfq4G128::block_bytes, 72);
  EXPECT_EQ(layout::Hfq6G256::block_bytes, 200);
  EXPECT_EQ(layout::Hfq6G256::levels, 63);
  EXPECT_EQ(layout::Hfq4G128::levels, 15);
}

// ---- bytes per row ----

TEST(QuantRowBytes, CeilGroupsTimesBlockBytes) {
  // The Gemma 4 shapes that broke the flat packer (DESIGN §4).
  EXPECT_EQ(row_bytes(DType::hfq4_g128, 704), 432);   // 6 groups (5.5 rounded up)
  EXPECT_EQ(row_bytes(DType::hfq4_g128, 2112), 1224);  // 17 groups (16.5 rounded up)
  EXPECT_EQ(row_bytes(DType::hfq4_g256, 2816), 1496);  // 11 groups
  EXPECT_EQ(row_bytes(DType::hfq6_g256, 2816), 2200);
  EXPECT_EQ(row_bytes(DType::q8_0, 1), 34);
  EXPECT_EQ(row_bytes(DType::q8_0, 33), 68);
  EXPECT_EQ(row_bytes(DType::q8_0, 256), 272);  // one KV head of 256 values
  EXPECT_EQ(row_bytes(DType::bf16, 127), 254);
  for (DType t : kAllFormats)
    for (int64_t k : kRowLengths) {
      const QuantFormat& f = quant_format(t);
      EXPECT_EQ(row_bytes(t, k), (k + f.block_elems - 1) / f.block_elems * f.block_bytes) << where(t, Dist::normal, k);
    }
}

// ---- round trips on every odd length and distribution ----

TEST(QuantRoundTrip, ErrorWithinBoundPaddingZeroNothingPastK) {
  constexpr size_t kPad = 300;          // poisoned floats after the row, guard bytes after the codes
  constexpr uint8_t kGuardByte = 0xa5;
  const float kGuardFloat = -777.25f;
  uint32_t seed = 1;
  for (DType t : kAllFormats) {
    const QuantFormat& f = quant_format(t);
    for (int64_t k : kRowLengths) {
      for (Dist dist : kDists) {
        SCOPED_TRACE(where(t, dist, k));
        std::vector<float> row = make_row(dist, k, seed++);
        const size_t nbytes = static_cast<size_t>(row_bytes(t, k));

        // The encoder reads exactly k floats: huge poison after them must not change a byte.
        std::vector<float> poisoned = row;
        for (size_t i = 0; i < kPad; ++i) poisoned.push_back(i % 2 ? 1e30f : -1e30f);
        std::vector<uint8_t> bytes(nbytes + kPad, kGuardByte);
        f.quantize_row(poisoned.data(), bytes.data(), k);
        for (size_t i = nbytes; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], kGuardByte) << "encoder wrote past the row";

        // The decoder writes exactly k floats.
        std::vector<float> deq(static_cast<size_t>(k) + kPad, kGuardFloat);
        f.dequantize_row(bytes.data(), deq.data(), k);
        for (size_t i = static_cast<size_t>(k); i < deq.size(); ++i) ASSERT_EQ(deq[i], kGuardFloat) << "decoder wrote past k";

        if (f.kind == QuantKind::plain) {
          for (int64_t i = 0; i < k; ++i)
            ASSERT_LE(std::fabs(static_cast<double>(row[i]) - deq[i]), error_bound(t, row.data(), i, i + 1, nullptr, i))
                << "lane " << i;
        } else {
          const BlockView v = block_view(t);
          for (int64_t g0 = 0, b = 0; g0 < k; g0 += v.group, ++b) {
            const int64_t g1 = std::min<int64_t>(k, g0 + v.group);
            const uint8_t* block = bytes.data() + b * v.block_bytes;
            float lo = row[g0], hi = row[g0], amax = 0.0f;
            for (int64_t i = g0; i < g1; ++i) {
              lo = std::min(lo, row[i]), hi = std::max(hi, row[i]), amax = std::max(amax, std::fabs(row[i]));
              // The layout description decodes to the same value, bit for bit.
              ASSERT_EQ(layout_value(t, block, static_cast<int>(i - g0)), deq[i]) << "lane " << i;
              ASSERT_LE(std::fabs(static_cast<double>(row[i]) - deq[i]), error_bound(t, row.data(), g0, g1, block, i))
                  << "lane " << i;
            }
            // Padded lanes hold code 0.
            for (int lane = static_cast<int>(g1 - g0); lane < v.group; ++lane)
              ASSERT_EQ(code_at(block + v.codes_offset, lane, v.bits), 0u) << "padded lane " << lane << " of block " << b;
            if (v.affine) {
              // Header: min over the group's real values only; scale = range / L, or 1 for a constant group.
              const int levels = (1 << v.bits) - 1;
              ASSERT_EQ(f32_at(block + 4), lo);
              ASSERT_EQ(f32_at(block), hi > lo ? (hi - lo) / static_cast<float>(levels) : 1.0f);
              for (int64_t i = g0; i < g1; ++i) {
                const uint32_t code = code_at(block + v.codes_offset, static_cast<int>(i - g0), v.bits);
                if (row[i] == lo) {
                  ASSERT_EQ(code, 0u);
                }
                if (row[i] == hi && hi > lo) {
                  ASSERT_EQ(code, static_cast<uint32_t>(levels));
                }
              }
            } else {
              ASSERT_EQ(static_cast<uint16_t>(block[0] | block[1] << 8), f32_to_f16(amax / 127.0f));
              for (int64_t i = g0; i < g1; ++i) {
                if (std::fabs(row[i]) == amax && amax > 0.0f) {
                  ASSERT_EQ(std::abs(static_cast<int8_t>(block[2 + i - g0])), 127);
                }
              }
            }
          }
        }
        if (dist == Dist::constant && f.kind == QuantKind::affine) {
          for (int64_t i = 0; i < k; ++i) ASSERT_EQ(deq[i], row[i]);
        }

        // The reference dot is dequantize + sequential dot, bit for bit, and reads no x past k.
        std::vector<float> x = make_row(Dist::normal, k, seed++);
        float expected = 0.0f;
        for (int64_t i = 0; i < k; ++i) expected += deq[i] * x[i];
        x.resize(static_cast<size_t>(k) + kPad, NAN);
        ASSERT_EQ(f.dot_row(bytes.data(), x.data(), k), expected);
      }
    }
  }
}

TEST(QuantRoundTrip, PaddedLanesAreNeverRead) {
  // Set every padded code to all ones: decoding and dotting the k real lanes must not change.
  for (DType t : kBlockFormats) {
    const QuantFormat& f = quant_format(t);
    const BlockView v = block_view(t);
    for (int64_t k : kRowLengths) {
      if (k % v.group == 0) continue;
      SCOPED_TRACE(where(t, Dist::normal, k));
      std::vector<float> row = make_row(Dist::normal, k, 99);
      std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes(t, k)));
      f.quantize_row(row.data(), bytes.data(), k);
      std::vector<uint8_t> dirty = bytes;
      uint8_t* codes = dirty.data() + dirty.size() - v.block_bytes + v.codes_offset;
      for (int bit = static_cast<int>(k % v.group) * v.bits; bit < v.group * v.bits; ++bit)
        codes[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_NE(dirty, bytes);
      std::vector<float> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
      f.dequantize_row(bytes.data(), a.data(), k);
      f.dequantize_row(dirty.data(), b.data(), k);
      EXPECT_EQ(a, b);
      std::vector<float> x = make_row(Dist::uniform, k, 7);
      EXPECT_EQ(f.dot_row(bytes.data(), x.data(), k), f.dot_row(dirty.data(), x.data(), k));
    }
  }
}

TEST(QuantRoundTrip, RowsAreEncodedIndependently) {
  // Row-safe packing: the bytes of a row depend on that row only (a flat packer would let the
  // tail group of row 0 take values from row 1).
  for (DType t : kBlockFormats) {
    const QuantFormat& f = quant_format(t);
    for (int64_t k : {int64_t{704}, int64_t{2112}, int64_t{129}}) {
      SCOPED_TRACE(where(t, Dist::normal, k));
      std::vector<float> rows = make_row(Dist::normal, 2 * k, 5);
      rows[static_cast<size_t>(k)] = 1000.0f;  // row 1 starts with an outlier
      const size_t nbytes = static_cast<size_t>(row_bytes(t, k));
      std::vector<uint8_t> together(2 * nbytes), alone(nbytes);
      for (int r = 0; r < 2; ++r) f.quantize_row(rows.data() + r * k, together.data() + r * nbytes, k);
      std::vector<float> row0(rows.begin(), rows.begin() + k);
      f.quantize_row(row0.data(), alone.data(), k);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin()));
    }
  }
}

// ---- golden bytes (tests/quant/golden_bytes.py derives them independently) ----

struct Golden {
  DType dtype;
  std::vector<float> row;
  std::vector<uint8_t> prefix;  // the bytes up to the last nonzero one; the rest must be zero
};

TEST(QuantGolden, SmallRowsMatchTheIndependentDerivation) {
  const Golden cases[] = {
      // d = 1.0 exactly, so the codes show roundf's half-away-from-zero: -2.5 -> -3, 0.5 -> 1.
      {DType::q8_0, {127, -2.5f, 0.5f, 1.5f, -0.5f, 3.49f, -127}, {0x00, 0x3c, 0x7f, 0xfd, 0x01, 0x02, 0xff, 0x03, 0x81}},
      {DType::q8_0, {0.1f, -0.2f, 0.3f}, {0xd6, 0x18, 0x2a, 0xab, 0x7f}},
      // x * (1/d) gives -29 here where x / d would give -28 (ggml multiplies by the reciprocal).
      {DType::q8_0, {0x1.2b4396p+2f, -0x1.0ca174p+0f}, {0xb6, 0x28, 0x7f, 0xe3}},
      // Two blocks: the second starts at byte 34 and holds one real value.
      {DType::q8_0,
       {-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1,
        0,   1,   2,   3,   4,   5,   6,   7,  8,  9,  10, 11, 12, 13, 14, 15, 2},
       {0x08, 0x30, 0x81, 0x89, 0x91, 0x99, 0xa1, 0xa9, 0xb1, 0xb9, 0xc0, 0xc8, 0xd0,
        0xd8, 0xe0, 0xe8, 0xf0, 0xf8, 0x00, 0x08, 0x10, 0x18, 0x20, 0x28, 0x30, 0x38,
        0x40, 0x47, 0x4f, 0x57, 0x5f, 0x67, 0x6f, 0x77, 0x08, 0x24, 0x7f}},
      // scale = 0.2f, min = -1; codes 0, 5, 8, 15, 12.
      {DType::hfq4_g128, {-1, 0, 0.5f, 2, 1.3f}, {0xcd, 0xcc, 0x4c, 0x3e, 0x00, 0x00, 0x80, 0xbf, 0x50, 0xf8, 0x0c}},
      // (w - min) * (1/scale) gives code 14 here where (w - min) / scale would give 15.
      {DType::hfq4_g128,
       {-0x1.633334p+2f, 0x1.99999ap-4f, -0x1.69d07p-4f},
       {0x74, 0xda, 0xc0, 0x3e, 0x9a, 0x99, 0xb1, 0xc0, 0xf0, 0x0e}},
      {DType::hfq4_g256, {0, 1, 2, 3}, {0xcd, 0xcc, 0x4c, 0x3e, 0x00, 0x00, 0x00, 0x00, 0x50, 0xfa}},
      // Constant group: scale 1.0, min 1.5, every code 0.
      {DType::hfq4_g256, {1.5f, 1.5f, 1.5f}, {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0xc0, 0x3f}},
      // scale = 0.1f; codes 0, 63, 32, 10 | 1, 20 packed 4 per 3 bytes.
      {DType::hfq6_g256,
       {0, 6.3f, 3.15f, 1, 0.05f, 2},
       {0xcd, 0xcc, 0xcc, 0x3d, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x0f, 0x2a, 0x01, 0x05}},
      {DType::f16, {1, -2, 0.1f, 65504, 1e-7f}, {0x00, 0x3c, 0x00, 0xc0, 0x66, 0x2e, 0xff, 0x7b, 0x02}},
      {DType::bf16, {1, -2, 0.1f, 3.0e38f}, {0x80, 0x3f, 0x00, 0xc0, 0xcd, 0x3d, 0x62, 0x7f}},
      {DType::f32, {1, -2, 0.1f}, {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0xcd, 0xcc, 0xcc, 0x3d}},
  };
  for (const Golden& g : cases) {
    const int64_t k = static_cast<int64_t>(g.row.size());
    SCOPED_TRACE(where(g.dtype, Dist::normal, k));
    std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes(g.dtype, k)), 0xee);
    quant_format(g.dtype).quantize_row(g.row.data(), bytes.data(), k);
    ASSERT_GE(bytes.size(), g.prefix.size());
    std::vector<uint8_t> expected = g.prefix;
    expected.resize(bytes.size(), 0);
    EXPECT_EQ(bytes, expected);
  }
}

}  // namespace
}  // namespace fl
