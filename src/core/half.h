#pragma once
// IEEE binary16 (f16) and bfloat16 (bf16) conversions on the host. Both round to nearest even,
// as PyTorch's .to(torch.float16/bfloat16) does, so values we write match what transformers
// would have stored.
#include <cstdint>
#include <cstring>

namespace fl {

inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits = f32_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_f32(sign);
    // subnormal: value = mantissa * 2^-24
    float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  if (exponent == 31) return bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
  return bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t bits = f32_to_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // result is subnormal or zero: round abs * 2^24 to an integer, ties to even
    float value = bits_to_f32(abs) * 16777216.0f;
    uint32_t q = static_cast<uint32_t>(value);
    float remainder = value - static_cast<float>(q);
    if (remainder > 0.5f || (remainder == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  abs += rounding;
  return static_cast<uint16_t>(sign | (((abs >> 23) - 112u) << 10) | ((abs >> 13) & 0x3ffu));
}

}  // namespace fl
