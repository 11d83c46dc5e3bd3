#pragma once
// Thread-block cluster primitives (sm_90): the cluster barrier and stores into another block's
// shared memory (distributed shared memory). Only for kernels whose bodies sit under
// FIRELINE_GPU_HOPPER and that are launched through launch_kernel_cluster (launch.cuh) on 9.0
// devices from builds with sm_90a code; elsewhere this header declares nothing.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"

namespace fl::cuda {

#if FIRELINE_GPU_HOPPER
// The cluster barrier in two halves, so that a block's arrival can go ahead of its wait. The
// relaxed arrival orders no memory: a kernel's first one says only "this block has started, its
// shared memory may be written" (a block must not receive remote stores before it runs).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// The address of the shared-memory word at `local`'s offset in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_shared_address(const void* local, uint32_t rank) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  return remote;
}
// v into the shared-memory word(s) at `local`'s offset in block `rank` of the cluster.
__device__ __forceinline__ void store_cluster_float2(float2* local, uint32_t rank, float2 v) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(cluster_shared_address(local, rank)), "f"(v.x),
               "f"(v.y)
               : "memory");
}
__device__ __forceinline__ void store_cluster_float(float* local, uint32_t rank, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(cluster_shared_address(local, rank)), "f"(v) : "memory");
}
#endif

}  // namespace fl::cuda
