#pragma once
// Device-side helpers shared by the kernels: element loads for every weight format, warp and
// block reductions. Kernels see weights as raw bytes plus a format code (DType), rows packed as
// DESIGN §4 says: ceil(K / G) blocks per row, tail padded, so any lane may read the padded bytes
// of the last block but must mask values with k >= K.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernel_types.cuh"
#include "backend/cuda/launch.cuh"
#include "core/dtype.h"

namespace fl::cuda {

// Lanes per warp (CUDA) or wavefront (HIP): 32, or 64 for a wave64 HIP build (gpu_runtime.h).
constexpr int kWarp = gpu::kWarpSize;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += gpu::shfl_xor(v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, gpu::shfl_xor(v, offset));
  return v;
}

// act(gate) * up, a gated MLP's activation: GELU (tanh form) or SiLU. One definition for
// gated_activation_kernel and the gated matvec's epilogue (matmul.cu), so that the fused and the
// separate forms give the same bits.
__device__ __forceinline__ float gated_value(float gate, float up, Act act) {
  float a;
  if (act == Act::gelu_tanh) {
    const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    const float kKappa = 0.044715f;
    a = 0.5f * gate * (1.0f + tanhf(kBeta * (gate + kKappa * gate * gate * gate)));
  } else {
    a = gate / (1.0f + expf(-gate));
  }
  return a * up;
}

// transformers' RMSNorm factor pow(mean(x^2) + eps, -0.5) from a row's sum of squares (the norm
// kernels and the fused DeltaNet step's output norm).
__device__ __forceinline__ float rms_inverse_of_sum(float sum_sq, int64_t cols, float eps) {
  return powf(sum_sq / static_cast<float>(cols) + eps, -0.5f);
}

// Sum over the whole block (blockDim.x a multiple of kWarp, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[1024 / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

using gpu::bf16_bits_to_float;
using gpu::f16_bits_to_float;

__device__ __forceinline__ float load_f32_unaligned(const uint8_t* p) {
  uint32_t v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
               static_cast<uint32_t>(p[3]) << 24;
  return __uint_as_float(v);
}
__device__ __forceinline__ uint16_t load_u16_unaligned(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// code * scale + min rounded twice, as the reference decoder does: the compiler would otherwise
// fuse it into one FMA and the GPU's weights would differ from the CPU oracle's in the last bit.
__device__ __forceinline__ float affine(float code, float scale, float min) {
  return gpu::mul_add_unfused(code, scale, min);
}

// Element k of a packed row of format F. Reads only the bytes of k's block.
template <DType F>
__device__ __forceinline__ float load_weight_t(const uint8_t* row, int64_t k) {
  if constexpr (F == DType::f32) {
    return reinterpret_cast<const float*>(row)[k];
  } else if constexpr (F == DType::f16) {
    return f16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
  } else if constexpr (F == DType::bf16) {
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
  } else if constexpr (F == DType::q8_0) {  // 34 B: f16 scale, 32 x int8
    const uint8_t* b = row + (k / 32) * 34;
    return f16_bits_to_float(load_u16_unaligned(b)) * static_cast<float>(static_cast<int8_t>(b[2 + k % 32]));
  } else if constexpr (F == DType::hfq4_g256 || F == DType::hfq4_g128) {
    // f32 scale, f32 min, nibbles: weight 2i in the low nibble of byte i, 2i+1 in the high one
    constexpr int kGroup = F == DType::hfq4_g256 ? 256 : 128;
    const uint8_t* b = row + (k / kGroup) * (8 + kGroup / 2);
    const int i = static_cast<int>(k % kGroup);
    const int code = (b[8 + i / 2] >> ((i & 1) * 4)) & 15;
    return affine(static_cast<float>(code), load_f32_unaligned(b), load_f32_unaligned(b + 4));
  } else if constexpr (F == DType::hfq6_g256) {  // f32 scale, f32 min, 4 codes in 3 bytes
    const uint8_t* b = row + (k / 256) * 200;
    const int i = static_cast<int>(k % 256);
    const uint8_t* p = b + 8 + (i / 4) * 3;
    int code;
    switch (i & 3) {
      case 0: code = p[0] & 63; break;
      case 1: code = (p[0] >> 6) | ((p[1] & 15) << 2); break;
      case 2: code = (p[1] >> 4) | ((p[2] & 3) << 4); break;
      default: code = p[2] >> 2; break;
    }
    return affine(static_cast<float>(code), load_f32_unaligned(b), load_f32_unaligned(b + 4));
  } else {
    return 0.0f;
  }
}

// Small non-negative integer to float without I2F: the conversion unit issues 16 per clock per
// Hopper SM (a quarter of the integer ALU), which at a full-bandwidth 4-bit matvec would be the
// bottleneck; 2^23 + c as a bit pattern minus 2^23 is one LOP3 and one FADD, and exact.
__device__ __forceinline__ float small_uint_to_float(uint32_t c) {
  return __uint_as_float(0x4B000000u | c) - 8388608.0f;
}

// The raw bytes of eight consecutive weights k0 .. k0 + 7 of a packed row of format F (k0 a
// multiple of 8) and their block's scale, loaded with the widest loads each format's alignment
// allows: the codes of one lane come from three or four halfwords (HFQ6, Q8_0). HFQ4 matvecs
// read 16 codes per lane on their own path (matmul.cu); other formats here load element by
// element (the generic template). Loading and decoding are separate steps so that a kernel can issue the loads of
// several chunks (and rows) before the first decode, keeping many requests in flight per lane.
// Values past the row's end come from the padded tail block (quantized formats) or are zero
// (plain formats); callers mask k >= K.
template <DType F>
struct RawChunk {  // plain formats (f32, f16, bf16), and HFQ4: decoded at load, element by element
  float v[8];
  __device__ __forceinline__ void load(const uint8_t* row, int64_t k0, int64_t K) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = k0 + j < K ? load_weight_t<F>(row, k0 + j) : 0.0f;
  }
  __device__ __forceinline__ void decode(float w[8]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = v[j];
  }
};

template <>
struct RawChunk<DType::hfq6_g256> {  // f32 scale, f32 min, 8 codes of 6 bits in three halfwords
  uint16_t p[3];
  float scale, min;
  __device__ __forceinline__ void load(const uint8_t* row, int64_t k0, int64_t) {
    const uint8_t* block = row + (k0 / 256) * 200;
    const int i = static_cast<int>(k0 % 256) / 8;
    const uint16_t* src = reinterpret_cast<const uint16_t*>(block + 8 + 6 * i);
    p[0] = src[0];
    p[1] = src[1];
    p[2] = src[2];
    scale = *reinterpret_cast<const float*>(block);
    min = *reinterpret_cast<const float*>(block + 4);
  }
  __device__ __forceinline__ void decode(float w[8]) const {
    const uint64_t codes = static_cast<uint64_t>(p[0]) | static_cast<uint64_t>(p[1]) << 16 | static_cast<uint64_t>(p[2]) << 32;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[j] = affine(small_uint_to_float(static_cast<uint32_t>(codes >> (6 * j)) & 63u), scale, min);
  }
};

template <>
struct RawChunk<DType::q8_0> {  // f16 scale, then 32 int8 codes per block; 8 of them here
  uint16_t p[4];
  uint16_t scale_bits;
  __device__ __forceinline__ void load(const uint8_t* row, int64_t k0, int64_t) {
    const uint8_t* block = row + (k0 / 32) * 34;
    const int within = static_cast<int>(k0 % 32);
    scale_bits = *reinterpret_cast<const uint16_t*>(block);
    const uint16_t* src = reinterpret_cast<const uint16_t*>(block + 2 + within);
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = src[j];
  }
  __device__ __forceinline__ float scale() const { return f16_bits_to_float(scale_bits); }
  // The 8 codes as floats, unscaled. int8 as offset binary, (c ^ 0x80) - 128 == c exactly: the xor
  // runs on 4 codes at once, then a byte permute sets each code under the exponent of 2^23
  // (0x4B0000xx is 2^23 + xx) and one subtract leaves c.
  __device__ __forceinline__ void decode_codes(float w[8]) const {
    const uint32_t words[2] = {(p[0] | static_cast<uint32_t>(p[1]) << 16) ^ 0x80808080u,
                               (p[2] | static_cast<uint32_t>(p[3]) << 16) ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = __uint_as_float(__byte_perm(words[i / 4], 0x4B000000u, 0x7650u + i % 4)) - 8388736.0f;
  }
  __device__ __forceinline__ void decode(float w[8]) const {
    decode_codes(w);
    const float s = scale();
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] *= s;
  }
};

// Eight consecutive weights k0 .. k0 + 7 of a packed row, loaded and decoded in one step.
template <DType F>
__device__ __forceinline__ void decode8(const uint8_t* row, int64_t k0, int64_t K, float w[8]) {
  RawChunk<F> raw;
  raw.load(row, k0, K);
  raw.decode(w);
}

// The same with the format known only at run time (norm gains, embeddings: not hot paths).
__device__ __forceinline__ float load_weight(const uint8_t* row, int64_t k, DType type) {
  switch (type) {
    case DType::f32: return load_weight_t<DType::f32>(row, k);
    case DType::f16: return load_weight_t<DType::f16>(row, k);
    case DType::bf16: return load_weight_t<DType::bf16>(row, k);
    case DType::q8_0: return load_weight_t<DType::q8_0>(row, k);
    case DType::hfq4_g256: return load_weight_t<DType::hfq4_g256>(row, k);
    case DType::hfq4_g128: return load_weight_t<DType::hfq4_g128>(row, k);
    case DType::hfq6_g256: return load_weight_t<DType::hfq6_g256>(row, k);
    default: return 0.0f;
  }
}

// Calls f(std::integral_constant<DType, F>{}) for the weight format `type`; false if unknown.
template <typename Fn>
bool dispatch_weight_format(DType type, Fn&& f) {
  switch (type) {
    case DType::f32: f(std::integral_constant<DType, DType::f32>{}); return true;
    case DType::f16: f(std::integral_constant<DType, DType::f16>{}); return true;
    case DType::bf16: f(std::integral_constant<DType, DType::bf16>{}); return true;
    case DType::q8_0: f(std::integral_constant<DType, DType::q8_0>{}); return true;
    case DType::hfq4_g256: f(std::integral_constant<DType, DType::hfq4_g256>{}); return true;
    case DType::hfq4_g128: f(std::integral_constant<DType, DType::hfq4_g128>{}); return true;
    case DType::hfq6_g256: f(std::integral_constant<DType, DType::hfq6_g256>{}); return true;
    default: return false;
  }
}

}  // namespace fl::cuda
