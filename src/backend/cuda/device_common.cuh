#pragma once
// Device-side helpers shared by the kernels: element loads for every weight format, warp and
// block reductions. Kernels see weights as raw bytes plus a format code (DType), rows packed as
// DESIGN §4 says: ceil(K / G) blocks per row, tail padded, so any lane may read the padded bytes
// of the last block but must mask values with k >= K.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/gpu_runtime.h"
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

// Eight consecutive weights k0 .. k0 + 7 of a packed row of format F (k0 a multiple of 8), with
// the widest loads each format's alignment allows: the 4- or 6-bit codes of one lane come from
// one aligned word (HFQ4) or three halfwords (HFQ6, Q8_0). Values past the row's end come from
// the padded tail block (quantized formats) or are zero (plain formats); callers mask k >= K.
template <DType F>
__device__ __forceinline__ void decode8(const uint8_t* row, int64_t k0, int64_t K, float w[8]) {
  if constexpr (F == DType::hfq4_g256 || F == DType::hfq4_g128) {
    constexpr int kGroup = F == DType::hfq4_g256 ? 256 : 128;
    const uint8_t* block = row + (k0 / kGroup) * (8 + kGroup / 2);
    const int i = static_cast<int>(k0 % kGroup) / 8;
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(block + 8 + 4 * i);
    const float scale = *reinterpret_cast<const float*>(block), min = *reinterpret_cast<const float*>(block + 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = affine(static_cast<float>((codes >> (4 * j)) & 15u), scale, min);
  } else if constexpr (F == DType::hfq6_g256) {
    const uint8_t* block = row + (k0 / 256) * 200;
    const int i = static_cast<int>(k0 % 256) / 8;
    const uint16_t* p = reinterpret_cast<const uint16_t*>(block + 8 + 6 * i);
    const uint64_t codes = static_cast<uint64_t>(p[0]) | static_cast<uint64_t>(p[1]) << 16 | static_cast<uint64_t>(p[2]) << 32;
    const float scale = *reinterpret_cast<const float*>(block), min = *reinterpret_cast<const float*>(block + 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = affine(static_cast<float>((codes >> (6 * j)) & 63u), scale, min);
  } else if constexpr (F == DType::q8_0) {
    const uint8_t* block = row + (k0 / 32) * 34;
    const int within = static_cast<int>(k0 % 32);
    const float scale = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(block));
    const uint16_t* p = reinterpret_cast<const uint16_t*>(block + 2 + within);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = static_cast<float>(static_cast<int8_t>(p[j] & 0xff)) * scale;
      w[2 * j + 1] = static_cast<float>(static_cast<int8_t>(p[j] >> 8)) * scale;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = k0 + j < K ? load_weight_t<F>(row, k0 + j) : 0.0f;
  }
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
