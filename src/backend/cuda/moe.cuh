#pragma once
// Mixture-of-experts routing and combination (moe.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernel_types.cuh"
#include "core/dtype.h"

namespace fl::cuda {

// Softmax over logits [T, E], top_k (highest first, lower id on ties), renormalise, times
// per_expert_scale (optional).
cudaError_t launch_moe_route(float* weights, int32_t* ids, const float* logits, int64_t n_tokens, int64_t n_experts,
                             int64_t top_k, const void* per_expert_scale, DType scale_type, cudaStream_t stream);
// out[t, :] = sum_j weights[t, j] * y[t * top_k + j, :], summed in ascending expert id order.
cudaError_t launch_moe_combine(float* out, int64_t out_stride, const float* y, const float* weights,
                               const int32_t* ids, int64_t n_tokens, int64_t top_k, int64_t cols, cudaStream_t stream);

// Expert parallelism (Backend::moe_keep_experts), in place over n pairs: ids in [first, first +
// count) become id - first; any other pair gets id -1 and weight 0.
cudaError_t launch_moe_keep_experts(int32_t* ids, float* weights, int64_t n, int32_t first, int32_t count,
                                    cudaStream_t stream);

// The routed experts of a few decode tokens in one launch (moe_decode.cu; BackendOptions::
// fused_experts): out[t] = sum over the token's experts in ascending id order of weight *
// down_e(act(gate_e x[t]) * up_e x[t]), the same bits as the matvec path's four kernels. HFQ4
// stacks: gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I].
constexpr int64_t kMaxMoeDecodeTokens = 4;      // a token's down items re-stage its activations
constexpr int64_t kMaxMoeDecodeTopK = 16;
constexpr size_t kMoeDecodeMaxSharedBytes = 46 * 1024;  // a token's activations [K, I] f32, padded
                                                        // (+ static: under 48 KB)
// MoeDecodeArgs::counters: 4 counters, each alone on a 128-byte line (kMoeDecodeCounterStride
// words apart): every block's thread 0 polls them (~54k polls in one 26B-A4B launch on the H100),
// and on one line the polls shared an L2 slice with the ticket and done atomics. With the
// activations' staging (moe_decode.cu) the launch went 57.8 -> 55.1 us (thirty-sixth session).
constexpr int kMoeDecodeCounterStride = 32;
constexpr int kMoeDecodeCounters = 4 * kMoeDecodeCounterStride;  // int32 words
struct MoeDecodeArgs {
  float* out = nullptr;  // [T, H], row stride out_stride
  int64_t out_stride = 0;
  const float* x = nullptr;  // [T, H], row stride x_stride
  int64_t x_stride = 0;
  struct Stack {
    const uint8_t* data = nullptr;
    DType type = DType::f32;
    int64_t row_bytes = 0, expert_bytes = 0;
  };
  Stack gate_up, down;
  const int32_t* ids = nullptr;    // [T, K]: an expert of the stack, or -1 (another rank's: skipped)
  const float* weights = nullptr;  // [T, K]
  // The routing in the same launch (route.router set; ids and weights above unused): logits [T, E]
  // = router x_route[t] with the f32 rows kernels' bits, then ids and weights [T, K] as
  // launch_moe_route makes them, written out for the caller and used by the items.
  struct Route {
    const uint8_t* router = nullptr;  // [E, H] HFQ4, the gate_up stack's format; nullptr: no routing here
    DType type = DType::f32;
    int64_t row_bytes = 0, E = 0;
    const float* x = nullptr;  // [T, H], row stride x_stride
    int64_t x_stride = 0;
    float* logits = nullptr;   // [T, E]
    int32_t* ids = nullptr;    // [T, K]
    float* weights = nullptr;  // [T, K]
    const uint8_t* per_expert_scale = nullptr;  // [E], or nullptr
    DType scale_type = DType::f32;
  };
  Route route{};
  float* activated = nullptr;      // scratch [T K, I]
  // kMoeDecodeCounters int32 in GPU memory, 128-byte aligned, zero before the first launch; each
  // launch leaves them zero. Launches that share them must not overlap (one stream).
  int32_t* counters = nullptr;
  int64_t T = 0, K = 0, H = 0, I = 0;
  Act act = Act::gelu_tanh;
  int blocks_per_sm = 2;  // the grid's blocks per SM: 1 or 2 (fewer where fewer fit)
};
// Whether launch_moe_experts_decode takes these stacks and sizes (HFQ4 G128/G256 stacks, 1..4
// tokens, top_k <= 16, a token's activations within 46 KB of shared memory).
bool moe_experts_decode_supports(DType gate_up, DType down, int64_t T, int64_t K, int64_t I);
// Whether it also routes (MoeDecodeArgs::route) for a router of this format over E experts: the
// gate_up stack's format, up to 512 experts (launch_moe_route's one-warp form).
bool moe_experts_decode_routes(DType router, DType gate_up, int64_t E, int64_t K);
size_t moe_experts_decode_shared_bytes(int64_t K, int64_t I);
cudaError_t launch_moe_experts_decode(const MoeDecodeArgs& a, cudaStream_t stream);
int64_t moe_experts_decode_launches();  // successful launches in this process (tests)

}  // namespace fl::cuda
