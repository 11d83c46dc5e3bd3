#pragma once
// The weight-format registry: for every DType, the reference ("_ref") row codecs that define the
// format. Backends' fast paths are tested against these. A row of k values is always encoded on
// its own (row-safe packing): ceil(k / block_elems) blocks, the tail block padded with code 0,
// and padded lanes are never read back.
#include <cstdint>

#include "core/dtype.h"

namespace fl {

struct QuantFormat {
  DType dtype;
  // Encode k floats into row_bytes(dtype, k) bytes. Null for types that are not weights (i32...).
  void (*quantize_row)(const float* src, void* dst, int64_t k);
  // Decode a row of k values to floats.
  void (*dequantize_row)(const void* src, float* dst, int64_t k);
  // sum_i row[i] * x[i] over k values, f32 accumulation in index order.
  float (*dot_row)(const void* row, const float* x, int64_t k);
};

// The registry entry for `dtype`; throws fl::Error for types without row codecs.
const QuantFormat& quant_format(DType dtype);
bool has_quant_format(DType dtype);

}  // namespace fl
