#pragma once
// Hopper's warpgroup tensor-core instructions (wgmma, sm_90a only), for the GEMM's Hopper kernel
// (matmul_mma.cu). A warpgroup is 4 consecutive warps (128 threads) that issue one wgmma together;
// it runs asynchronously: issued, committed as a group, and waited for, while the warps go on
// converting the next operands. Operand A (64 x 16, bf16) comes from registers in mma.sync's A
// fragment layout per warp (warp w of the group holds rows 16 w .. 16 w + 15); operand B (16 x N)
// is read by the tensor cores from shared memory through a descriptor. The accumulators D
// (64 x N, f32) stay in registers: warp w, lane (g = lane / 4, q = lane % 4) holds
// d[4 j + c] = D[16 w + g + 8 (c / 2)][8 j + 2 q + c % 2].
//
// Everything compiles for sm_80 and the host too (bodies under FIRELINE_GPU_HOPPER, trapping or
// empty elsewhere): the launcher takes the Hopper kernel only on a 9.0 device in a build that
// carries sm_90a code (CMake's FIRELINE_CUDA_SM90A).
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"

namespace fl::cuda {

// A shared-memory operand in the canonical layout without swizzle: "core matrices" of 8 rows x 16
// bytes stored as 128 contiguous bytes; `k_stride` bytes from one core matrix to the next along K
// (the leading dimension), `row_stride` bytes to the next 8 rows (the strided dimension). Fields
// in 16-byte units: start address bits 0-13, leading offset 16-29, stride offset 32-45; swizzle
// mode (bits 62-63) 0.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* smem, uint32_t k_stride, uint32_t row_stride) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr >> 4) & 0x3fff) | (static_cast<uint64_t>((k_stride >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((row_stride >> 4) & 0x3fff) << 32);
}

// Orders this warpgroup's register writes (A fragments, accumulators) before the wgmma that read them.
__device__ __forceinline__ void wgmma_fence() {
#if FIRELINE_GPU_HOPPER
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FIRELINE_GPU_HOPPER
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed wgmma groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if FIRELINE_GPU_HOPPER
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Pins accumulators in place around the asynchronous wgmma: the compiler sees them as rewritten
// here, so it neither moves their reads above a wait nor their last writes below an issue.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Transaction barriers (mbarrier) for bulk copies: a copy made by the async proxy (as wgmma reads)
// signals its bytes on a barrier in shared memory; threads wait for the barrier's phase to flip.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if FIRELINE_GPU_HOPPER
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(arrivals)
               : "memory");
#endif
}
// Makes initialised barriers visible to the async proxy (before any copy signals them).
__device__ __forceinline__ void fence_mbarrier_init() {
#if FIRELINE_GPU_HOPPER
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives (one of the barrier's arrivals) and expects `bytes` more of copies before the phase ends.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if FIRELINE_GPU_HOPPER
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
#endif
}
// Waits until the barrier's phase of parity `parity` (0, 1, 0, ... for its uses) has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
#if FIRELINE_GPU_HOPPER
  asm volatile(
      "{\n.reg .pred done;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared by the async proxy,
// completing on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
#if FIRELINE_GPU_HOPPER
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(global), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
#endif
}

// d[64 x 64] (+)= a[64 x 16] * b[16 x 64]: a from registers, b (K-major) from shared memory.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                   bool accumulate) {
#if FIRELINE_GPU_HOPPER
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %37, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(static_cast<uint32_t>(accumulate)), "l"(b_desc));
#else
  __trap();
#endif
}

// d[64 x 128] (+)= a[64 x 16] * b[16 x 128]: a from registers, b (K-major) from shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                    bool accumulate) {
#if FIRELINE_GPU_HOPPER
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(static_cast<uint32_t>(accumulate)), "l"(b_desc));
#else
  __trap();
#endif
}

}  // namespace fl::cuda
