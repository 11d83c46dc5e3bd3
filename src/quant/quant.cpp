#include "quant/quant.h"

#include <array>
#include <optional>

#include "core/error.h"
#include "core/half.h"

namespace fl {
namespace {

// ---- plain float types ----

void quantize_row_f32(const float* src, void* dst, int64_t k) {
  float* out = static_cast<float*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = src[i];
}
void dequantize_row_f32(const void* src, float* dst, int64_t k) {
  const float* in = static_cast<const float*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = in[i];
}
float dot_row_f32(const void* row, const float* x, int64_t k) {
  const float* w = static_cast<const float*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += w[i] * x[i];
  return sum;
}

void quantize_row_f16(const float* src, void* dst, int64_t k) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = f32_to_f16(src[i]);
}
void dequantize_row_f16(const void* src, float* dst, int64_t k) {
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = f16_to_f32(in[i]);
}
float dot_row_f16(const void* row, const float* x, int64_t k) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += f16_to_f32(w[i]) * x[i];
  return sum;
}

void quantize_row_bf16(const float* src, void* dst, int64_t k) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < k; ++i) out[i] = f32_to_bf16(src[i]);
}
void dequantize_row_bf16(const void* src, float* dst, int64_t k) {
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(in[i]);
}
float dot_row_bf16(const void* row, const float* x, int64_t k) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += bf16_to_f32(w[i]) * x[i];
  return sum;
}

const QuantFormat kFormats[] = {
    {DType::f32, quantize_row_f32, dequantize_row_f32, dot_row_f32},
    {DType::f16, quantize_row_f16, dequantize_row_f16, dot_row_f16},
    {DType::bf16, quantize_row_bf16, dequantize_row_bf16, dot_row_bf16},
};

const QuantFormat* lookup(DType dtype) {
  for (const QuantFormat& f : kFormats)
    if (f.dtype == dtype) return &f;
  return nullptr;
}

}  // namespace

const QuantFormat& quant_format(DType dtype) {
  const QuantFormat* f = lookup(dtype);
  if (!f) fail("weight format {} is not supported here", dtype_name(dtype));
  return *f;
}

bool has_quant_format(DType dtype) { return lookup(dtype) != nullptr; }

}  // namespace fl
