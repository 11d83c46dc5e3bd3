#pragma once
// The weight-format registry: for every DType that can hold weights or KV rows, its layout
// constants and the reference ("_ref") row codecs that define the format (docs/formats.md).
// Backends' fast paths are tested against these.
//
// A row of k values is always encoded on its own (row-safe packing): ceil(k / block_elems)
// blocks, the tail block padded with code 0. Padded lanes are never read back: dequantize and
// dot stop at k, and the encoder reads exactly k input floats.
//
// Every codec throws fl::Error for k <= 0 or a null pointer. Inputs are expected to be finite;
// a NaN or infinity produces some code (never undefined behaviour, never an out-of-range write)
// but its decoded value is meaningless.
#include <cstdint>

#include "core/dtype.h"

namespace fl {

enum class QuantKind : uint8_t {
  plain,      // f32 / f16 / bf16: one element per block, no scale
  symmetric,  // w = q * scale                (Q8_0)
  affine,     // w = q * scale + min          (HFQ4, HFQ6)
};

struct QuantFormat {
  DType dtype;
  QuantKind kind;
  int32_t block_elems;  // weights per block (group size); 1 for plain types
  int32_t block_bytes;  // bytes per block
  int32_t code_bits;    // bits per stored code (element bits for plain types)
  // Encode k floats into row_bytes(dtype, k) bytes.
  void (*quantize_row)(const float* src, void* dst, int64_t k);
  // Decode a row of k values to floats; writes exactly dst[0, k).
  void (*dequantize_row)(const void* src, float* dst, int64_t k);
  // sum_i deq(row)[i] * x[i] over k values, f32 accumulation in index order: bit for bit the
  // same as dequantize_row followed by a plain sequential dot.
  float (*dot_row)(const void* row, const float* x, int64_t k);
};

// The registry entry for `dtype`; throws fl::Error for types without row codecs (i32, ...) and
// for values outside the DType enum.
const QuantFormat& quant_format(DType dtype);
bool has_quant_format(DType dtype);

// ---- the reference codecs (also reachable through the registry) ----
void quantize_row_f32_ref(const float* src, void* dst, int64_t k);
void dequantize_row_f32_ref(const void* src, float* dst, int64_t k);
float dot_row_f32_ref(const void* row, const float* x, int64_t k);

void quantize_row_f16_ref(const float* src, void* dst, int64_t k);
void dequantize_row_f16_ref(const void* src, float* dst, int64_t k);
float dot_row_f16_ref(const void* row, const float* x, int64_t k);

void quantize_row_bf16_ref(const float* src, void* dst, int64_t k);
void dequantize_row_bf16_ref(const void* src, float* dst, int64_t k);
float dot_row_bf16_ref(const void* row, const float* x, int64_t k);

// ggml Q8_0, byte-compatible with ggml's quantize_row_q8_0_ref.
void quantize_row_q8_0_ref(const float* src, void* dst, int64_t k);
void dequantize_row_q8_0_ref(const void* src, float* dst, int64_t k);
float dot_row_q8_0_ref(const void* row, const float* x, int64_t k);

// hipfire HFQ4-G256, HFQ4-G128 and HFQ6-G256, byte-compatible with hipfire's quantizer.
void quantize_row_hfq4_g256_ref(const float* src, void* dst, int64_t k);
void dequantize_row_hfq4_g256_ref(const void* src, float* dst, int64_t k);
float dot_row_hfq4_g256_ref(const void* row, const float* x, int64_t k);

void quantize_row_hfq4_g128_ref(const float* src, void* dst, int64_t k);
void dequantize_row_hfq4_g128_ref(const void* src, float* dst, int64_t k);
float dot_row_hfq4_g128_ref(const void* row, const float* x, int64_t k);

void quantize_row_hfq6_g256_ref(const float* src, void* dst, int64_t k);
void dequantize_row_hfq6_g256_ref(const void* src, float* dst, int64_t k);
float dot_row_hfq6_g256_ref(const void* row, const float* x, int64_t k);

}  // namespace fl
