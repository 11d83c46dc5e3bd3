// Plain float rows: f32 as is, f16 and bf16 rounded to nearest even (core/half.h).
#include "core/half.h"
#include "quant/codec_util.h"
#include "quant/quant.h"

namespace fl {

using detail::check_row_args;

void quantize_row_f32_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_f32_ref", src, dst, k);
  float* out = static_cast<float*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = src[i];
}
void dequantize_row_f32_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_f32_ref", src, dst, k);
  const float* in = static_cast<const float*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = in[i];
}
float dot_row_f32_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_f32_ref", row, x, k);
  const float* w = static_cast<const float*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += w[i] * x[i];
  return sum;
}

void quantize_row_f16_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_f16_ref", src, dst, k);
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = f32_to_f16(src[i]);
}
void dequantize_row_f16_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_f16_ref", src, dst, k);
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = f16_to_f32(in[i]);
}
float dot_row_f16_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_f16_ref", row, x, k);
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += f16_to_f32(w[i]) * x[i];
  return sum;
}

void quantize_row_bf16_ref(const float* src, void* dst, int64_t k) {
  check_row_args("quantize_row_bf16_ref", src, dst, k);
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = f32_to_bf16(src[i]);
}
void dequantize_row_bf16_ref(const void* src, float* dst, int64_t k) {
  check_row_args("dequantize_row_bf16_ref", src, dst, k);
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(in[i]);
}
float dot_row_bf16_ref(const void* row, const float* x, int64_t k) {
  check_row_args("dot_row_bf16_ref", row, x, k);
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += bf16_to_f32(w[i]) * x[i];
  return sum;
}

}  // namespace fl
