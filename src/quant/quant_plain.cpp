// Plain float rows: f32 as is, f16 and bf16 rounded to nearest even (core/half.h).
//
// Rows may sit at any byte address (a safetensors file need not align its tensors), so elements
// are moved with memcpy, never through a float* or uint16_t* dereference of the row.
#include <cstring>

#include "core/half.h"
#include "quant/codec_util.h"
#include "quant/quant.h"

namespace fl {

using detail::check_row_args;

namespace {
template <typename T>
T load(const uint8_t* base, int64_t i) {
  T v;
  std::memcpy(&v, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}
template <typename T>
void store(uint8_t* base, int64_t i, T v) {
  std::memcpy(base + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}
}  // namespace

void quantize_row_f32_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_f32_ref", src, dst, k);
  std::memmove(dst, src, static_cast<size_t>(k) * sizeof(float));  // in place is allowed
}
void dequantize_row_f32_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_f32_ref", src, dst, k);
  std::memmove(dst, src, static_cast<size_t>(k) * sizeof(float));  // in place is allowed
}
float dot_row_f32_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_f32_ref", row, x, k);
  const uint8_t* w = static_cast<const uint8_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += load<float>(w, i) * x[i];
  return sum;
}

void quantize_row_f16_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_f16_ref", src, dst, k);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < k; ++i) store<uint16_t>(out, i, f32_to_f16(src[i]));
}
void dequantize_row_f16_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_f16_ref", src, dst, k);
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = f16_to_f32(load<uint16_t>(in, i));
}
float dot_row_f16_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_f16_ref", row, x, k);
  const uint8_t* w = static_cast<const uint8_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += f16_to_f32(load<uint16_t>(w, i)) * x[i];
  return sum;
}

void quantize_row_bf16_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_bf16_ref", src, dst, k);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < k; ++i) store<uint16_t>(out, i, f32_to_bf16(src[i]));
}
void dequantize_row_bf16_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_bf16_ref", src, dst, k);
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(load<uint16_t>(in, i));
}
float dot_row_bf16_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_bf16_ref", row, x, k);
  const uint8_t* w = static_cast<const uint8_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += bf16_to_f32(load<uint16_t>(w, i)) * x[i];
  return sum;
}

}  // namespace fl
