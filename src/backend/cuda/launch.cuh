#pragma once
// Every kernel of the backend is launched through launch_kernel below, and every kernel begins
// with enter_kernel() (or an L2 prefetch of its weights, then enter_kernel()).
//
// Why: a batch-1 decode step is hundreds of small kernels (26B-A4B: ~800 per token), each a few
// microseconds, and between two kernels of a stream the GPU normally drains the first grid,
// flushes, and only then starts launching the second. On Hopper (sm_90), programmatic dependent
// launch (PDL) lets the next kernel's blocks be scheduled while the current one still runs:
// launch_kernel marks each launch as allowed to start early, and the kernel's first statement,
// enter_kernel(), (1) waits until the previous kernel of the stream has completed and its writes
// are visible (griddepcontrol.wait: a no-op when the launch was not early), then (2) lets the
// next kernel start launching (griddepcontrol.launch_dependents). So at most two kernels overlap,
// the second one only in code before its wait, which touches no memory another kernel writes:
// the result is the same as with plain launches, bit for bit. Graph capture keeps these
// programmatic edges, so replayed decode steps get the overlap too.
//
// The rule this depends on: NO kernel may read or write memory that another kernel writes
// before its enter_kernel(). Weights are written only by uploads (copies, which PDL never
// overlaps), so prefetching them before enter_kernel() is allowed.
//
// Other GPUs (sm_80, HIP) launch normally and enter_kernel() compiles to nothing.
// FIRELINE_GPU_PDL=0 (CMAKE_CUDA_FLAGS) turns the early launches off, for measuring them.
#include <cstddef>

#include "backend/cuda/gpu_runtime.h"

#ifndef FIRELINE_GPU_PDL
#define FIRELINE_GPU_PDL 1
#endif

namespace fl::cuda {

#if defined(__CUDACC__) || defined(__HIPCC__)
__device__ __forceinline__ void enter_kernel() {
#if !defined(FIRELINE_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Fetches the 128-byte line holding `p` into L2 without waiting for it (weights only: see above).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if !defined(FIRELINE_GPU_HIP) && defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#else
  (void)p;
#endif
}
#endif

// The current device's streaming multiprocessor count and compute capability major, asked once
// per device.
struct DeviceTraits {
  int sm_count = 0;
  int major = 0;
};
DeviceTraits current_device_traits();

// Whether launches on the current device may start early (PDL: sm_90 and later, CUDA only).
inline bool early_launch_enabled() {
#if defined(FIRELINE_GPU_HIP) || !FIRELINE_GPU_PDL
  return false;
#else
  return current_device_traits().major >= 9;
#endif
}

#if defined(__CUDACC__) || defined(__HIPCC__)
// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the previous kernel of
// the stream completes where early_launch_enabled(). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args... args) {
#if defined(FIRELINE_GPU_HIP) || !FIRELINE_GPU_PDL
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
#else
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = early;
  config.numAttrs = early_launch_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
#endif
}
#endif

}  // namespace fl::cuda
