#pragma once
// The one place that knows whether the GPU backend is built by nvcc (CUDA) or by hipcc (HIP, for
// AMD GPUs). The backend's sources keep CUDA's spelling (cudaStream_t, cudaMemcpyAsync, ...); a
// HIP build (FIRELINE_GPU_HIP, set by CMake's FIRELINE_HIP option) maps each runtime name the
// backend uses to its HIP twin here, and device code reaches warp intrinsics and half/bf16
// conversions through fl::gpu below. A CUDA name that is missing here fails the HIP compile in CI
// (ctest -L hip); add its mapping here, never an #ifdef in a kernel.
//
// Warp width: fl::gpu::kWarpSize is FIRELINE_GPU_WARP, fixed at build time because host code
// sizes launches with it. CUDA: 32. HIP: 32 (RDNA's wave32, the default) or 64 (CMake's
// FIRELINE_HIP_WAVE64, which also passes -mwavefrontsize64; GCN/CDNA GPUs have only wave64). A
// device pass whose real wavefront size differs stops at the static_assert below, so host and
// device always agree. Kernels must be correct for both widths: index lanes and size reductions
// with kWarp, never a literal 32.
//
// Hopper: FIRELINE_GPU_HOPPER is 1 only in nvcc's device pass for sm_90a, where wgmma, TMA and
// the other sm_90a-only instructions exist; it is 0 on the host, for sm_80 and for HIP. Code
// using them goes in `#if FIRELINE_GPU_HOPPER` with a portable fallback in the `#else` branch,
// which every other target compiles; host code that sizes a launch differently for the Hopper
// path decides by the device's compute capability at run time (cudaDeviceProp::major == 9).
// Define FIRELINE_GPU_HOPPER=0 (CMAKE_CUDA_FLAGS) to run the fallbacks on a Hopper GPU.
#include <cstdint>

#if defined(FIRELINE_GPU_HIP)
#include <hip/hip_runtime.h>
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#endif
#else
#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#endif

#ifndef FIRELINE_GPU_WARP
#define FIRELINE_GPU_WARP 32
#endif
#if !defined(FIRELINE_GPU_HIP) && FIRELINE_GPU_WARP != 32
#error "FIRELINE_GPU_WARP must be 32 for CUDA"
#endif
#if defined(FIRELINE_GPU_HIP) && defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE)
static_assert(__AMDGCN_WAVEFRONT_SIZE == FIRELINE_GPU_WARP,
              "this GPU target's wavefront size differs from FIRELINE_GPU_WARP: GCN/CDNA targets run only "
              "wave64 (configure with -DFIRELINE_HIP_WAVE64=ON)");
#endif

#ifndef FIRELINE_GPU_HOPPER
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FIRELINE_GPU_HOPPER 1
#else
#define FIRELINE_GPU_HOPPER 0
#endif
#endif

#if defined(FIRELINE_GPU_HIP)
// Runtime API, CUDA name -> HIP name: only what the backend uses.
// errors
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaGetLastError hipGetLastError
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
// devices
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrMemoryClockRate hipDeviceAttributeMemoryClockRate
#define cudaDevAttrGlobalMemoryBusWidth hipDeviceAttributeMemoryBusWidth
// (ROCm 5.2's hipDeviceAttributeSharedMemPerBlockOptin is CUDA-only: the per-block maximum answers)
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeMaxSharedMemoryPerBlock
#define cudaSetDevice hipSetDevice
// memory
#define cudaFree hipFree
#define cudaMalloc hipMalloc
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaMemGetInfo hipMemGetInfo
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemsetAsync hipMemsetAsync
// streams
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
// events
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventRecord hipEventRecord
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
// graphs: CUDA 12 and later spell instantiation (exec, graph, flags), HIP's WithFlags variant
#define cudaGraph_t hipGraph_t
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExec_t hipGraphExec_t
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphInstantiate hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamEndCapture hipStreamEndCapture
#endif

namespace fl::gpu {

constexpr int kWarpSize = FIRELINE_GPU_WARP;

// For messages, and Backend::name() ("cuda" or "hip"; make_backend accepts "cuda" for either).
#if defined(FIRELINE_GPU_HIP)
constexpr const char* kRuntimeName = "HIP";
constexpr const char* kBackendName = "hip";
#else
constexpr const char* kRuntimeName = "CUDA";
constexpr const char* kBackendName = "cuda";
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)

// A vote's result: one bit per lane. HIP's ballot is 64 bits wide even in wave32.
#if defined(FIRELINE_GPU_HIP)
using LaneMask = unsigned long long;
#else
using LaneMask = unsigned;
#endif

// Warp-wide shuffles and votes. Every lane of the warp must take part (all kernels call them in
// converged code): HIP 5.x has no masked (_sync) variants, and CUDA's are called with all lanes.
#if defined(FIRELINE_GPU_HIP)
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) { return __shfl_xor(v, lane_mask); }
template <typename T>
__device__ __forceinline__ T shfl_down(T v, unsigned delta) { return __shfl_down(v, delta); }
template <typename T>
__device__ __forceinline__ T shfl_up(T v, unsigned delta) { return __shfl_up(v, delta); }
template <typename T>
__device__ __forceinline__ T shfl(T v, int src_lane) { return __shfl(v, src_lane); }
__device__ __forceinline__ LaneMask ballot(bool pred) { return __ballot(pred); }
__device__ __forceinline__ bool any(bool pred) { return __any(pred); }
__device__ __forceinline__ bool all(bool pred) { return __all(pred); }
#else
constexpr unsigned kAllLanes = 0xffffffffu;
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) { return __shfl_xor_sync(kAllLanes, v, lane_mask); }
template <typename T>
__device__ __forceinline__ T shfl_down(T v, unsigned delta) { return __shfl_down_sync(kAllLanes, v, delta); }
template <typename T>
__device__ __forceinline__ T shfl_up(T v, unsigned delta) { return __shfl_up_sync(kAllLanes, v, delta); }
template <typename T>
__device__ __forceinline__ T shfl(T v, int src_lane) { return __shfl_sync(kAllLanes, v, src_lane); }
__device__ __forceinline__ LaneMask ballot(bool pred) { return __ballot_sync(kAllLanes, pred); }
__device__ __forceinline__ bool any(bool pred) { return __any_sync(kAllLanes, pred); }
__device__ __forceinline__ bool all(bool pred) { return __all_sync(kAllLanes, pred); }
#endif

// a * b + c rounded twice, never contracted into one FMA: the CPU oracle rounds twice. HIP's
// __fmul_rn / __fadd_rn are plain operators that hipcc may fuse, so HIP turns contraction off
// for this one expression instead.
__device__ __forceinline__ float mul_add_unfused(float a, float b, float c) {
#if defined(FIRELINE_GPU_HIP)
#pragma clang fp contract(off)
  return a * b + c;
#else
  return __fadd_rn(__fmul_rn(a, b), c);
#endif
}

// The pause between a spin loop's polls of a counter (a block waiting for other blocks' counts):
// the spinning warp leaves its SM's issue slots to the warps with work. __nanosleep's time is a
// bound, not a promise: at 64 and at 256 ns alike the fused experts' 264 blocks polled ~4 times
// per ns in all (H100, ncu; thirty-sixth session).
__device__ __forceinline__ void pause_between_polls() {
#if defined(FIRELINE_GPU_HIP)
  __builtin_amdgcn_s_sleep(8);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(256);
#endif
}

// Loads of data that other blocks of the same launch wrote (read after their release and this
// block's acquire), around the caches that may hold stale lines: CUDA's ld.global.cg (L2 only;
// not the read-only path), HIP's volatile loads.
__device__ __forceinline__ float load_other_blocks(const float* p) {
#if defined(FIRELINE_GPU_HIP)
  return *reinterpret_cast<const volatile float*>(p);
#else
  return __ldcg(p);
#endif
}
__device__ __forceinline__ float4 load_other_blocks(const float4* p) {
#if defined(FIRELINE_GPU_HIP)
  const volatile float* v = reinterpret_cast<const volatile float*>(p);
  return make_float4(v[0], v[1], v[2], v[3]);
#else
  return __ldcg(p);
#endif
}

// Bytes of the pair (b:a) picked by the selector's four nibbles (0-3: a's bytes, 4-7: b's), as
// CUDA's PRMT; HIP has the same intrinsic.
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
  return __byte_perm(a, b, selector);
}

// IEEE half and bfloat16 as raw bits (the backend stores both as uint16_t).
__device__ __forceinline__ float f16_bits_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t float_to_f16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
// Round to nearest even, as the host's f32_to_bf16 (core/half.h).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float v) {
#if defined(FIRELINE_GPU_HIP)
  const uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#else
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#endif
}

#endif  // __CUDACC__ || __HIPCC__

}  // namespace fl::gpu
