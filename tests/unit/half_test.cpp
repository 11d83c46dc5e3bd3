#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "core/half.h"

namespace fl {
namespace {

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even one, 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // sqrt(2816) = 53.066 is stored as 53.0 by a bf16 checkpoint (models-gemma4-qwen35.md §2.3)
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::sqrt(2816.0f))), 53.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, F16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(f32_to_f16(5.9604644775390625e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604644775390625e-8f);
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
}

// Every f16 bit pattern converts to f32 and back unchanged (NaNs stay NaN).
TEST(Half, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = f16_to_f32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      ASSERT_EQ(f32_to_f16(f), bits) << "bits " << bits;
    }
  }
}

// Random floats: the f16 result is the nearest representable value.
TEST(Half, F16IsNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    float y = f16_to_f32(f32_to_f16(x));
    if (std::isinf(y)) {
      EXPECT_GE(std::fabs(x), 65504.0f);
      continue;
    }
    uint16_t b = f32_to_f16(x);
    float up = f16_to_f32(static_cast<uint16_t>(b + 1)), down = f16_to_f32(static_cast<uint16_t>(b - 1));
    if (!std::isnan(up) && !std::isinf(up)) {
      EXPECT_LE(std::fabs(x - y), std::fabs(x - up));
    }
    if (!std::isnan(down) && !std::isinf(down) && (b & 0x7fff)) {
      EXPECT_LE(std::fabs(x - y), std::fabs(x - down));
    }
  }
}

}  // namespace
}  // namespace fl
