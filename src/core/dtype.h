#pragma once
// Element types and block layouts. Plain types have one element per "block". Quantized
// formats pack a row of K weights into ceil(K / block_elems) blocks of block_bytes each; the
// tail block of a row is padded (row-safe packing, DESIGN §4), so a row never shares a block
// with the next row. The quantize/dequantize code for each format lives in src/quant.
#include <cstdint>
#include <optional>
#include <string_view>

namespace fl {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  i32,
  i64,
  u8,
  q8_0,       // 34 B / 32: f16 scale, 32 x int8 (ggml Q8_0)
  hfq4_g256,  // 136 B / 256: f32 scale, f32 min, 128 B nibbles
  hfq4_g128,  // 72 B / 128: same with 128-weight groups
  hfq6_g256,  // 200 B / 256: f32 scale, f32 min, 192 B (4 codes per 3 bytes)
};

struct DTypeTraits {
  std::string_view name;
  int32_t block_elems;  // weights per block (1 for plain types)
  int32_t block_bytes;  // bytes per block
  bool quantized;
};

// False for a value outside the enum (e.g. a corrupt type id cast by a file reader).
bool is_known_dtype(DType type);
const DTypeTraits& dtype_traits(DType type);
inline std::string_view dtype_name(DType type) { return dtype_traits(type).name; }
std::optional<DType> dtype_from_name(std::string_view name);  // "f32", "bf16", "q8_0", ...

// Types a model weight may have (float or one of the quantized formats; not integer data).
inline bool is_weight_type(DType type) {
  return type != DType::i32 && type != DType::i64 && type != DType::u8;
}

// Weights per group of an HFQ4 format (256 or 128); 0 for every other type (the CUDA backend
// picks the integer matvec's and the fused experts' kernel instances by it).
constexpr int hfq4_group_size(DType type) {
  return type == DType::hfq4_g256 ? 256 : type == DType::hfq4_g128 ? 128 : 0;
}

// Bytes one row of k elements occupies, with the tail block padded.
inline int64_t row_bytes(DType type, int64_t k) {
  const DTypeTraits& t = dtype_traits(type);
  return (k + t.block_elems - 1) / t.block_elems * t.block_bytes;
}

}  // namespace fl
