#include "quant/quant.h"

#include "core/error.h"
#include "quant/layouts.h"

namespace fl {
namespace {

constexpr QuantFormat kFormats[] = {
    {DType::f32, QuantKind::plain, 1, 4, 32, quantize_row_f32_ref, dequantize_row_f32_ref, dot_row_f32_ref},
    {DType::f16, QuantKind::plain, 1, 2, 16, quantize_row_f16_ref, dequantize_row_f16_ref, dot_row_f16_ref},
    {DType::bf16, QuantKind::plain, 1, 2, 16, quantize_row_bf16_ref, dequantize_row_bf16_ref, dot_row_bf16_ref},
    {DType::q8_0, QuantKind::symmetric, layout::Q8_0::group, layout::Q8_0::block_bytes, 8, quantize_row_q8_0_ref,
     dequantize_row_q8_0_ref, dot_row_q8_0_ref},
    {DType::hfq4_g256, QuantKind::affine, layout::Hfq4G256::group, layout::Hfq4G256::block_bytes, 4,
     quantize_row_hfq4_g256_ref, dequantize_row_hfq4_g256_ref, dot_row_hfq4_g256_ref},
    {DType::hfq4_g128, QuantKind::affine, layout::Hfq4G128::group, layout::Hfq4G128::block_bytes, 4,
     quantize_row_hfq4_g128_ref, dequantize_row_hfq4_g128_ref, dot_row_hfq4_g128_ref},
    {DType::hfq6_g256, QuantKind::affine, layout::Hfq6G256::group, layout::Hfq6G256::block_bytes, 6,
     quantize_row_hfq6_g256_ref, dequantize_row_hfq6_g256_ref, dot_row_hfq6_g256_ref},
};

const QuantFormat* lookup(DType dtype) {
  for (const QuantFormat& f : kFormats)
    if (f.dtype == dtype) return &f;
  return nullptr;
}

}  // namespace

const QuantFormat& quant_format(DType dtype) {
  if (!is_known_dtype(dtype)) fail("unknown element type id {}", static_cast<int>(dtype));
  const QuantFormat* f = lookup(dtype);
  if (!f) fail("element type {} has no row codec (it cannot hold weights or KV rows)", dtype_name(dtype));
  return *f;
}

bool has_quant_format(DType dtype) { return lookup(dtype) != nullptr; }

}  // namespace fl
