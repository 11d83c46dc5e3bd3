#pragma once
// The bf16 tensor-core pieces shared by the GEMM (matmul_mma.cu) and the prefill attention
// (attention_mma.cu): the m16n8k16 mma.sync and the split of f32 values into bf16 pieces that
// keeps both f32-exact; and the asynchronous global-to-shared copies (cp.async) that the GEMM and
// the chunked delta rule stage their tiles with. CUDA only (sm_80 and later); HIP builds never
// include it.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"

namespace fl::cuda {

// c += a * b: A 16x16 (row), B 16x8 (col) in bf16 pairs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the launchers never run tensor-core kernels below sm_80
#endif
}

// (x0, x1) -> kPieces bf16 pairs (x0 in the low half) whose sum is the pair: each piece is the
// round to nearest of what the earlier ones left, so 3 pieces hold all 24 bits of an f32
// significand (for normal values) and the residuals are exact.
template <int kPieces>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t out[kPieces]) {
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
    out[p] = *reinterpret_cast<const uint32_t*>(&v);
    x0 -= __low2float(v);
    x1 -= __high2float(v);
  }
}

// Byte i of x and byte i of y, each an int8 code in offset binary (the code xor 0x80), as a bf16
// pair, x's in the low half, exactly: the byte under the exponent of 2^23 (0x4B0000xx is 2^23 +
// xx) less 2^23 + 128 is the code as an f32, whose upper half is its bf16 (a code has at most 8
// significant bits). Byte permutes and f32 adds only: int-to-float and float-to-bf16 conversions
// issue at 16 per clock per SM on sm_80 and sm_90, an eighth of the rate of f32 adds.
template <int i>
__device__ __forceinline__ uint32_t offset_codes_as_bf16(uint32_t x, uint32_t y) {
  const float fx = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7650u + i)) - 8388736.0f;
  const float fy = __uint_as_float(__byte_perm(y, 0x4B000000u, 0x7650u + i)) - 8388736.0f;
  return __byte_perm(__float_as_uint(fx), __float_as_uint(fy), 0x7632u);
}
// Two int8 codes (the first in the low byte of `halfword`) as a bf16 pair, the first in the low half.
__device__ __forceinline__ uint32_t int8_pair_to_bf16x2(uint32_t halfword) {
  const uint32_t offset = (halfword & 0xffffu) ^ 0x8080u;
  return offset_codes_as_bf16<0>(offset, offset >> 8);
}

// What kPieces bf16 pieces of x (split_pair's cut) add up to: x itself for 3 pieces, x rounded to
// bf16 (nearest even) for one.
template <int kPieces>
__device__ __forceinline__ float pieces_value(float x) {
  float kept = 0.0f;
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    const float piece = __bfloat162float(__float2bfloat16_rn(x));
    kept += piece;
    x -= piece;
  }
  return kept;
}

// Four 8 x 8 b16 matrices from shared memory: lane i gives the address of row i % 8 of matrix
// i / 8; register j of lane t receives matrix j's row t / 4, elements 2 (t % 4) and + 1. With
// `trans`, matrix j's column t / 4, rows 2 (t % 4) and + 1 instead (B operands from row-major V).
template <bool trans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// 16 bytes global -> shared without passing through registers (zeros when !valid); the copies a
// thread issues stay in flight together until a wait.
__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(valid ? 16 : 0));
#else
  __trap();
#endif
}
// 4 or 8 bytes global -> shared (cp.async.ca: the only form for copies under 16 bytes), zeros when
// !valid. For sources that are not 16-byte aligned, as the code bytes inside an HFQ4 block are.
template <int kBytes>
__device__ __forceinline__ void cp_async_small(void* smem, const void* global, bool valid = true) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(global), "n"(kBytes),
               "r"(valid ? kBytes : 0));
#else
  __trap();
#endif
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most kPending committed groups are still in flight (this thread's copies only:
// a barrier must follow before other threads read them).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

}  // namespace fl::cuda
