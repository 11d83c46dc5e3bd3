#pragma once
// Gated DeltaNet (Qwen3.5 linear attention): causal conv with a carried window, the delta-rule
// gates, the gated delta rule itself, and the sigmoid output gate (linear_attention.cu). The
// contracts are the Backend entries of the same names (backend/backend.h); the CPU oracle is
// backend/cpu/cpu_linear_attention.cpp.
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks shapes and names the op. No fmt or other heavy
// host headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

namespace fl::cuda {

// out[t, c] = silu(sum_j weight[c, j] * window[t + j][c]) over the window [state; x], then the
// state takes the last K - 1 rows of that window. x, out [T, C] and state [K - 1, C] are f32
// rows with element strides; weight rows are weight_row_bytes apart in weight_type. Two
// launches: the state may only change once every output has read it.
cudaError_t launch_causal_conv1d(float* out, int64_t out_stride, const float* x, int64_t x_stride, float* state,
                                 int64_t state_stride, const void* weight, DType weight_type,
                                 int64_t weight_row_bytes, int64_t n_tokens, int64_t channels, int64_t kernel,
                                 cudaStream_t stream);

// causal_conv1d for n_rows sequences of one row each (batched decode): row t of x/out continues
// the state at states[t] (a device array; every state [K - 1, channels] with state_stride). The
// same arithmetic as launch_causal_conv1d for one token; one launch.
constexpr int64_t kConvRowsMaxKernel = 8;
cudaError_t launch_causal_conv1d_rows(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                      float* const* states, int64_t state_stride, const void* weight, DType weight_type,
                                      int64_t weight_row_bytes, int64_t n_rows, int64_t channels, int64_t kernel,
                                      cudaStream_t stream);

// A small weight vector of any format: element n is column n % cols of row n / cols.
struct WeightVector {
  const void* data = nullptr;
  DType type = DType::f32;
  int64_t cols = 0, row_bytes = 0;
};

// g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b), over [T, nV] rows with element
// strides (g may alias a, beta may alias b: each element is read before it is written).
cudaError_t launch_delta_rule_gates(float* g, int64_t g_stride, float* beta, int64_t beta_stride, const float* a,
                                    int64_t a_stride, const float* b, int64_t b_stride, WeightVector a_log,
                                    WeightVector dt_bias, int64_t n_tokens, int64_t n_v_heads, cudaStream_t stream);

// An f32 activation [T, heads, dim] with element strides per token and per head.
template <typename T>
struct HeadsArg {
  T* data = nullptr;
  int64_t token_stride = 0, head_stride = 0;
};

struct DeltaRuleArgs {
  HeadsArg<float> out;              // [T, nV, dv]
  HeadsArg<const float> q, k, v;  // q, k [T, nK, dk]; v [T, nV, dv]
  const float* g = nullptr;
  const float* beta = nullptr;  // [T, nV] rows
  int64_t g_stride = 0, beta_stride = 0;
  float* state = nullptr;  // [nV, dk, dv], contiguous
  // Batched decode: token t is its own sequence's one row, continuing the state at
  // state_table[t] (a device array; `state` unused). The same arithmetic as one token alone.
  float* const* state_table = nullptr;
  int64_t n_tokens = 0;
  int n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
  float q_scale = 1.0f, l2_eps = 1e-6f;
};
// The largest key head size the recurrent kernel holds in registers.
constexpr int kDeltaRuleMaxDk = 1024;
// The recurrent gated delta rule over all T tokens in one launch (see linear_attention.cu).
cudaError_t launch_gated_delta_rule(const DeltaRuleArgs& args, cudaStream_t stream);

// The chunked form (Backend::gated_delta_rule_chunked) of the same function: two kernels per
// slab of chunks (linear_attention.cu). It holds a chunk's tiles in shared memory, so it takes
// chunks of at most kDeltaChunkMax tokens and head sizes of at most kDeltaChunkMaxDim (Qwen3.5:
// 64 tokens, dk = dv = 128); elsewhere (and in HIP builds) the caller runs the recurrence.
constexpr int kDeltaChunkMax = 64;
constexpr int kDeltaChunkMaxDim = 128;
bool delta_rule_chunked_applies(int64_t dk, int64_t dv, int64_t chunk);
// How a call goes through its tokens: slabs of slab_chunks chunks (at most 16 and ~64 MB of
// factors, at least one chunk), two launches each, the slab's factors in `scratch_bytes`.
struct DeltaChunkPlan {
  int64_t chunks = 0;       // in the call
  int64_t slab_chunks = 0;  // per slab
  int64_t slabs = 0;
  size_t chunk_bytes = 0;    // one chunk's factors, every value head
  size_t scratch_bytes = 0;  // slab_chunks * chunk_bytes
};
DeltaChunkPlan plan_delta_rule_chunked(const DeltaRuleArgs& args, int chunk);
// args.state_table must be null (one sequence); `scratch` holds plan.scratch_bytes.
cudaError_t launch_gated_delta_rule_chunked(const DeltaRuleArgs& args, int chunk, const DeltaChunkPlan& plan,
                                            float* scratch, cudaStream_t stream);

// The decode step of a Gated DeltaNet mixer's core in one launch (Backend::gated_delta_net_rows):
// for each row t, one token of its own sequence, the gates from a and b, the causal conv (silu)
// of the qkv row over the conv state's window, the delta rule, then per value head the RMS norm
// with a plain gain and the silu(z) gate: out[t, n, :] = rms(o) * norm * silu(z[t, n, :]). Each
// step is the arithmetic of the separate kernels (launch_delta_rule_gates, causal_conv1d,
// gated_delta_rule, rms_norm, gated_activation); only the norm's sum of squares goes in another
// order. The states move as those kernels move them.
struct DeltaNetStepArgs {
  float* out = nullptr;  // [R, nV * dv]
  const float* qkv = nullptr;  // [R, C]: q [nK * dk] | k [nK * dk] | v [nV * dv], before the conv
  const float* z = nullptr;    // [R, nV * dv]
  const float* a = nullptr;    // [R, nV]: the decay's input
  const float* b = nullptr;    // [R, nV]: beta's input
  int64_t out_stride = 0, qkv_stride = 0, z_stride = 0, a_stride = 0, b_stride = 0;
  const void* conv_weight = nullptr;  // [C, K]
  DType conv_type = DType::f32;
  int64_t conv_row_bytes = 0;
  int conv_kernel = 0;                  // K
  WeightVector a_log, dt_bias, norm;  // [nV], [nV], [dv]
  // One row: its states. Several rows: device arrays of row t's states (`*_state` unused).
  float* conv_state = nullptr;   // [K - 1, C], rows conv_state_stride apart
  float* delta_state = nullptr;  // [nV, dk, dv], contiguous
  float* const* conv_table = nullptr;
  float* const* delta_table = nullptr;
  int64_t conv_state_stride = 0;
  int64_t n_rows = 0;
  int n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
  float q_scale = 1.0f, l2_eps = 1e-6f, norm_eps = 1e-6f;
  // One row: also cut out into the integer matvec's pieces for out_proj's `pieces_group`-wide
  // weight groups (imma_pieces.cuh), where a key head's value heads are one such group
  // (delta_net_step_cuts_pieces). Null: no pieces.
  void* pieces = nullptr;
  int pieces_group = 0;
};
// Whether this device and build run the fused step (sm_90 and sm_90a code: it is a cluster of
// blocks per key head), and whether the fused kernel takes these shapes (dk <= 128, conv kernel
// <= kConvRowsMaxKernel, a key head's value heads' columns in at most 8 blocks of <= 64).
bool delta_net_step_available();
bool delta_net_step_fits(const DeltaNetStepArgs& args);
bool delta_net_step_cuts_pieces(const DeltaNetStepArgs& args);
// cudaErrorInvalidValue where it does not fit or is not available; a refused cluster launch
// returns its error too (the caller then runs the separate kernels).
cudaError_t launch_delta_net_step(const DeltaNetStepArgs& args, cudaStream_t stream);
int64_t delta_net_step_launches();  // fused launches so far (tests)

// x *= sigmoid(gate): gate [R, N] (per_row false) or [R, 1] (per_row true); element strides.
cudaError_t launch_sigmoid_gate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride, bool per_row,
                                int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace fl::cuda
