#pragma once
// Decoders for the ggml "k-quant" formats that GGUF files from llama.cpp use and fireline does
// not run: Q4_K and Q6_K. `fireline quantize` dequantizes them to f32 on import and quantizes
// again under its own policy. Written from ggml's format description (ggml-common.h block
// structs): 256 weights per super-block, rows a whole number of super-blocks (k % 256 == 0).
//
// Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
//   4-bit codes. Eight sub-blocks of 32: w = d * sc[j] * q - dmin * m[j]. Codes come in four
//   64-weight chunks of 32 bytes: weight i of the chunk's first half is the low nibble of byte i,
//   of its second half the high nibble. Scales/mins j < 4: sc = s[j] & 63, m = s[j + 4] & 63;
//   j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, m = (s[j + 4] >> 4) | (s[j] >> 6) << 4.
// Q6_K, 210 bytes: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16 d.
//   Sixteen sub-blocks of 16: w = d * scale[j] * (q - 32). Two 128-weight halves; in a half, for
//   l < 32 with ql/qh advanced by 64/32 bytes per half:
//     q[l]      = (ql[l]      & 15) | ((qh[l] >> 0) & 3) << 4
//     q[l + 32] = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4
//     q[l + 64] = (ql[l]      >> 4) | ((qh[l] >> 4) & 3) << 4
//     q[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4
//   and weight l + 32 * t of the half uses scale[8 * half + l / 16 + 2 * t].
#include <cstdint>

namespace fl {

constexpr int kQkK = 256;
constexpr int kQ4KBlockBytes = 144;
constexpr int kQ6KBlockBytes = 210;

// Decode a row of k weights (k % 256 == 0, else fl::Error).
void dequantize_row_q4_k(const void* src, float* dst, int64_t k);
void dequantize_row_q6_k(const void* src, float* dst, int64_t k);

}  // namespace fl
