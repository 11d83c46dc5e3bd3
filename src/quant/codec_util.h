#pragma once
// Helpers shared by the reference codecs in this folder (not part of the public API).
#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace fl::detail {

// Every codec entry point rejects impossible arguments the same way.
inline void check_row_args(const char* codec, const void* in, const void* out, int64_t k) {
  if (k <= 0) fail("{}: row length must be positive (got {})", codec, k);
  if (!in || !out) fail("{}: null buffer for a row of {} values", codec, k);
}

// Explicit little-endian field access: the formats are little-endian on every host.
inline void store_le16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline uint16_t load_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// The reference dot of a blocked format: decode one block at a time into a small buffer and
// accumulate in index order, so the result equals dequantize_row + sequential dot bit for bit.
// decode(block_ptr, out, n) writes the first n values of one block.
template <int Group, typename Decode>
float dot_by_blocks(const uint8_t* row, int block_bytes, const float* x, int64_t k, Decode decode) {
  float values[Group];
  float sum = 0.0f;
  for (int64_t k0 = 0, b = 0; k0 < k; k0 += Group, ++b) {
    const int n = static_cast<int>(std::min<int64_t>(Group, k - k0));
    decode(row + b * block_bytes, values, n);
    for (int i = 0; i < n; ++i) sum += values[i] * x[k0 + i];
  }
  return sum;
}

}  // namespace fl::detail
