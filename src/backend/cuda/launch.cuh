#pragma once
// Every kernel of the backend is launched through launch_kernel below, and every kernel begins
// with enter_kernel() (or an L2 prefetch of weights, its own or the next kernel's, then
// enter_kernel()).
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
// overlaps), and so are a step's positions and per-row cache tables, so reading those and
// prefetching weights before enter_kernel() is allowed. An L2 prefetch of other memory (decode
// attention pulls the KV rows that earlier steps wrote) is a hint that changes no result: L2 is
// where the GPU's memory is coherent, and the data is read only after the wait.
//
// Other GPUs (sm_80, HIP) launch normally and enter_kernel() compiles to nothing.
// FIRELINE_GPU_PDL=0 (CMAKE_CUDA_FLAGS) turns the early launches off, for measuring them.
#include <cstddef>
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/l2_prefetch_slice.h"

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

// Byte ranges of weights a kernel pulls into L2 before its enter_kernel() (norm gains: a few rows
// of a few kilobytes each, on pages far apart, whose first touch after the wait cost a DRAM round
// trip per pass). Filled on the host (add_l2_span); the kernel's threads, across all its blocks,
// take the ranges' 128-byte lines in turn (prefetch_spans_l2).
struct L2Spans {
  static constexpr int kMax = 8;
  const char* first_line[kMax];  // rounded down to a 128-byte line
  int64_t lines[kMax];
  int n = 0;
};
inline void add_l2_span(L2Spans& spans, const void* p, int64_t bytes) {
  if (!p || bytes <= 0 || spans.n == L2Spans::kMax) return;
  const auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127};
  const auto end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  spans.first_line[spans.n] = reinterpret_cast<const char*>(begin);
  spans.lines[spans.n] = static_cast<int64_t>((end - begin + 127) / 128);
  ++spans.n;
}

#if defined(__CUDACC__) || defined(__HIPCC__)
__device__ __forceinline__ void prefetch_spans_l2(const L2Spans& spans) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int s = 0; s < spans.n; ++s)
    for (int64_t i = first; i < spans.lines[s]; i += stride) prefetch_l2(spans.first_line[s] + i * 128);
}

// Pulls this block's slice of [p, p + bytes) into L2 (l2_prefetch_slice: the span's 16-byte-
// aligned interior, a slice per block of the grid in block order). On sm_90 a few threads each
// issue one bulk prefetch of up to 32 KB (cp.async.bulk.prefetch.L2: the copy engine walks the
// lines, so a 100 KB slice costs four instructions, not a line per thread). Elsewhere each thread
// asks for at most 8 of the slice's 128-byte lines: a line per instruction would put thousands
// before a one-block kernel's wait. Weights only (see above).
__device__ __forceinline__ void prefetch_slice_l2(const uint8_t* p, int64_t bytes) {
  const uint64_t blocks = static_cast<uint64_t>(gridDim.x) * gridDim.y * gridDim.z;
  const uint64_t block =
      blockIdx.x + static_cast<uint64_t>(gridDim.x) * (blockIdx.y + static_cast<uint64_t>(gridDim.y) * blockIdx.z);
  const ByteRange r = l2_prefetch_slice(reinterpret_cast<uint64_t>(p), bytes, block, blocks);
#if !defined(FIRELINE_GPU_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint64_t kPiece = 32768;
  for (uint64_t at = r.first + threadIdx.x * kPiece; at < r.last; at += blockDim.x * kPiece) {
    const uint32_t n = static_cast<uint32_t>(r.last - at < kPiece ? r.last - at : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(at), "r"(n) : "memory");
  }
#else
  // (a line holding `first` holds a byte of the span, so rounding down stays inside its pages)
  uint64_t at = (r.first & ~uint64_t{127}) + threadIdx.x * 128;
  for (int i = 0; i < 8 && at < r.last; ++i, at += blockDim.x * 128) prefetch_l2(reinterpret_cast<const void*>(at));
#endif
}
#endif

// How many launches have carried an L2 prefetch of another kernel's weights (the decode attention
// and residual update hints, BackendOptions::attention_prefetch_mb / update_prefetch_mb): for
// tests that check a hint reached a kernel. count_l2_prefetch_launch: the launchers' side.
int64_t l2_prefetch_launches();
void count_l2_prefetch_launch();

// The current device's streaming multiprocessor count and compute capability major, asked once
// per device.
struct DeviceTraits {
  int sm_count = 0;
  int major = 0;
  int max_block_smem = 0;  // bytes of shared memory one block may opt in to (sm_80: 163 KB, sm_90: 227 KB)
};
DeviceTraits current_device_traits();

// Whether the current device runs the kernels that exist only in sm_90a code (thread-block
// clusters, bulk copies): a 9.0 device, and a build that carries sm_90a code.
inline bool sm90a_kernels_available() {
#if defined(FIRELINE_CUDA_SM90A)
  return current_device_traits().major == 9;
#else
  return false;
#endif
}

// Whether launches on the current device may start early (PDL: sm_90 and later, CUDA only).
inline bool early_launch_enabled() {
#if defined(FIRELINE_GPU_HIP) || !FIRELINE_GPU_PDL
  return false;
#else
  return current_device_traits().major >= 9;
#endif
}

#if defined(__CUDACC__) || defined(__HIPCC__)
#if !defined(FIRELINE_GPU_HIP)
// launch_kernel below, with the grid's blocks in clusters of cluster_blocks along x where it is
// not 0 (sm_90: the blocks of a cluster run at once, on SMs of one GPC, and reach each other's
// shared memory; the caller checks that the device and the build have clusters). CUDA only.
template <typename... Params, typename... Args>
cudaError_t launch_kernel_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  unsigned cluster_blocks, Args... args) {
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (cluster_blocks > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster_blocks;
    attrs[n].val.clusterDim.y = 1;
    attrs[n++].val.clusterDim.z = 1;
  }
  if (early_launch_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = static_cast<unsigned>(n);
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}
#endif

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the previous kernel of
// the stream completes where early_launch_enabled(). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args... args) {
#if defined(FIRELINE_GPU_HIP) || !FIRELINE_GPU_PDL
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
#else
  return launch_kernel_cluster(kernel, grid, block, smem, stream, 0u, args...);
#endif
}
#endif

}  // namespace fl::cuda
