// Gated DeltaNet kernels (Qwen3.5 linear attention). Each mirrors the CPU oracle
// (backend/cpu/cpu_linear_attention.cpp) in f32, in the same order of operations where that is
// cheap to keep; sums over a head's dk rows are reassociated (lane groups, then shuffles).
//
// The delta rule runs as a recurrence over the call's tokens inside one launch. Block (tile, n)
// owns value head n's state columns [tile * kCols, tile * kCols + kCols) of S [dk, dv]; the
// kSplit threads of one column hold its rows i = s, s + kSplit, ... in registers, so the state
// is read from memory once and written back once per call, however many tokens the call has.
// Per token, the block normalises q_t and k_t of its key head into shared memory (every block
// of the head recomputes them: dk values, cheaper than another launch), then each column
// reduces S^T k and S^T q over its kSplit threads with warp shuffles.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/linear_attention.cuh"

namespace fl::cuda {
namespace {

constexpr int kThreads = 256;      // element-wise kernels and the conv
constexpr int kConvTokens = 8;     // conv: tokens per thread (one channel each)
constexpr int kDeltaThreads = 64;  // delta rule: threads per block
constexpr int kDeltaRows = 32;     // delta rule: state rows per thread, so dk <= kSplit * kDeltaRows

static_assert(kDeltaThreads % kWarp == 0, "the delta rule's block is whole warps");
static_assert(kDeltaRows * 32 >= kDeltaRuleMaxDk, "kSplit <= 32 must cover the largest dk");

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

bool is_weight_format(DType type) {
  return dispatch_weight_format(type, [](auto) {});
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- causal conv ----

// Thread: channel c for up to kConvTokens consecutive tokens. Row w of the window [state; x] is
// state row w for w < K - 1, else x row w - (K - 1).
template <DType F>
__global__ void causal_conv1d_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                     const float* state, int64_t state_stride, const uint8_t* weight,
                                     int64_t weight_row_bytes, int64_t n_tokens, int64_t channels, int64_t K) {
  enter_kernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const uint8_t* taps = weight + c * weight_row_bytes;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kConvTokens;
  const int64_t t1 = min(t0 + kConvTokens, n_tokens);
  for (int64_t t = t0; t < t1; ++t) {
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t w = t + j;
      const float in = w < K - 1 ? state[w * state_stride + c] : x[(w - (K - 1)) * x_stride + c];
      // rounded twice, as the oracle's acc += w * x (compiled without FMA contraction)
      acc = gpu::mul_add_unfused(load_weight_t<F>(taps, j), in, acc);
    }
    out[t * out_stride + c] = acc / (1.0f + expf(-acc));  // silu
  }
}

// After every output has read the old window: state row r takes window row T + r. One thread
// per channel walks r upwards, so each old state row is read before it is overwritten (T >= 1:
// row r is written at step r, read at step r - T < r).
__global__ void causal_conv1d_state_kernel(float* state, int64_t state_stride, const float* x, int64_t x_stride,
                                           int64_t n_tokens, int64_t channels, int64_t K) {
  enter_kernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  for (int64_t r = 0; r < K - 1; ++r) {
    const int64_t w = n_tokens + r;
    state[r * state_stride + c] = w < K - 1 ? state[w * state_stride + c] : x[(w - (K - 1)) * x_stride + c];
  }
}

// One decode row per sequence: thread = channel c of row blockIdx.y, with the sequence's own
// state. The window is read into registers first, so the thread can then shift its channel's
// state in place (no other thread touches it): one launch where causal_conv1d takes two per
// sequence.
template <DType F>
__global__ void causal_conv1d_rows_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                          float* const* states, int64_t state_stride, const uint8_t* weight,
                                          int64_t weight_row_bytes, int64_t channels, int64_t K) {
  enter_kernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, t = blockIdx.y;
  if (c >= channels) return;
  float* state = states[t];
  float window[kConvRowsMaxKernel];
  for (int64_t j = 0; j < K; ++j) window[j] = j < K - 1 ? state[j * state_stride + c] : x[t * x_stride + c];
  const uint8_t* taps = weight + c * weight_row_bytes;
  float acc = 0.0f;
  for (int64_t j = 0; j < K; ++j) acc = gpu::mul_add_unfused(load_weight_t<F>(taps, j), window[j], acc);
  out[t * out_stride + c] = acc / (1.0f + expf(-acc));  // silu, as causal_conv1d_kernel
  for (int64_t r = 0; r < K - 1; ++r) state[r * state_stride + c] = window[r + 1];
}

// ---- gates ----

__device__ __forceinline__ float weight_element(const WeightVector& w, int64_t n) {
  return load_weight(static_cast<const uint8_t*>(w.data) + (n / w.cols) * w.row_bytes, n % w.cols, w.type);
}

__global__ void delta_rule_gates_kernel(float* g, int64_t g_stride, float* beta, int64_t beta_stride, const float* a,
                                        int64_t a_stride, const float* b, int64_t b_stride, WeightVector a_log,
                                        WeightVector dt_bias, int64_t n_tokens, int64_t n_v_heads) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_tokens * n_v_heads;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / n_v_heads, n = i % n_v_heads;
    // both inputs are read before either output is written: g may alias a, beta may alias b
    const float a_tn = a[t * a_stride + n], b_tn = b[t * b_stride + n];
    const float x = a_tn + weight_element(dt_bias, n);
    const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch's softplus (threshold 20)
    g[t * g_stride + n] = -expf(weight_element(a_log, n)) * softplus;
    beta[t * beta_stride + n] = sigmoid(b_tn);
  }
}

// ---- the delta rule ----

// Sum over the kSplit consecutive lanes of one column (kSplit divides the warp width).
template <int kSplit>
__device__ __forceinline__ float column_sum(float v) {
#pragma unroll
  for (int offset = kSplit / 2; offset > 0; offset /= 2) v += gpu::shfl_xor(v, offset);
  return v;
}

// Grid (ceil(dv / kCols), nV, 1 or one per state-table row), kDeltaThreads threads: thread tid
// serves column j = blockIdx.x * kCols + tid / kSplit and rows i = tid % kSplit + r * kSplit,
// r < kDeltaRows.
// Threads past dv or rows past dk compute on zeros and store nothing.
//
// Tokens go in stages of `stage`: the block's warps L2-normalise the stage's q and k rows (one
// warp per token) into shared memory with the stage's decays, betas and v columns, then every
// thread runs the stage's tokens back to back with no barrier, only its column's shuffles. (One
// token per iteration with the norms reduced across the block cost two barriers per token: the
// Qwen3.5 prompt's delta rule ran at ~2 us per token and layer.)
template <int kSplit>
__global__ void __launch_bounds__(kDeltaThreads) gated_delta_rule_kernel(DeltaRuleArgs a, int stage) {
  enter_kernel();
  constexpr int kCols = kDeltaThreads / kSplit;
  constexpr int kWarps = kDeltaThreads / kWarp;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int s = tid % kSplit;
  const int col = tid / kSplit, j = blockIdx.x * kCols + col;
  const int n = blockIdx.y;
  const int m = n / (a.n_v_heads / a.n_k_heads);
  const int dk = a.dk, dv = a.dv;
  const bool has_col = j < dv;
  // One sequence's tokens [0, n_tokens), or (state_table) token blockIdx.z alone on its own state.
  const int64_t first_token = a.state_table ? blockIdx.z : 0, end_token = a.state_table ? first_token + 1 : a.n_tokens;
  float* S = (a.state_table ? a.state_table[blockIdx.z] : a.state) + static_cast<int64_t>(n) * dk * dv;
  extern __shared__ float staged[];
  float* s_qk = staged;                         // [stage][2][dk]: normalised q (scaled), k
  float* s_decay = s_qk + stage * 2 * dk;       // [stage]: exp(g)
  float* s_beta = s_decay + stage;              // [stage]
  float* s_v = s_beta + stage;                  // [stage][kCols]: the block's v columns

  float st[kDeltaRows];  // st[r] = S[s + r * kSplit][j]
#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = s + r * kSplit;
    st[r] = has_col && i < dk ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }

  for (int64_t t0 = first_token; t0 < end_token; t0 += stage) {
    const int n_stage = static_cast<int>(end_token - t0 < stage ? end_token - t0 : stage);
    __syncthreads();  // every thread is done with the previous stage
    for (int u = warp; u < n_stage; u += kWarps) {
      const int64_t t = t0 + u;
      const float* qt = a.q.data + t * a.q.token_stride + m * a.q.head_stride;
      const float* kt = a.k.data + t * a.k.token_stride + m * a.k.head_stride;
      float* qs = s_qk + u * 2 * dk;
      float* ks = qs + dk;
      float q_sq = 0.0f, k_sq = 0.0f;
      for (int i = lane; i < dk; i += kWarp) {
        const float qv = qt[i], kv = kt[i];
        qs[i] = qv;
        ks[i] = kv;
        q_sq += qv * qv;
        k_sq += kv * kv;
      }
      q_sq = warp_sum(q_sq);
      k_sq = warp_sum(k_sq);
      // transformers' l2norm: x * rsqrt(sum(x^2) + eps), then (queries only) * scale
      const float q_inv = 1.0f / sqrtf(q_sq + a.l2_eps), k_inv = 1.0f / sqrtf(k_sq + a.l2_eps);
      for (int i = lane; i < dk; i += kWarp) {  // each lane rescales the elements it stored
        qs[i] = qs[i] * q_inv * a.q_scale;
        ks[i] = ks[i] * k_inv;
      }
      if (lane == 0) s_decay[u] = expf(a.g[t * a.g_stride + n]), s_beta[u] = a.beta[t * a.beta_stride + n];
    }
    for (int e = tid; e < n_stage * kCols; e += kDeltaThreads) {
      const int u = e / kCols, c = e % kCols, jc = blockIdx.x * kCols + c;
      s_v[e] = jc < dv ? a.v.data[(t0 + u) * a.v.token_stride + static_cast<int64_t>(n) * a.v.head_stride + jc] : 0.0f;
    }
    __syncthreads();

    for (int u = 0; u < n_stage; ++u) {
      const float* qs = s_qk + u * 2 * dk;
      const float* ks = qs + dk;
      const float decay = s_decay[u], b = s_beta[u], v = s_v[u * kCols + col];
      // S <- exp(g) S;  kv_mem = S^T k
      float kv_mem = 0.0f;
#pragma unroll
      for (int r = 0; r < kDeltaRows; ++r) {
        const int i = s + r * kSplit;
        if (i < dk) {
          st[r] *= decay;
          kv_mem += st[r] * ks[i];
        }
      }
      kv_mem = column_sum<kSplit>(kv_mem);
      // e = beta (v - S^T k);  S <- S + k e^T;  o = S^T q
      const float delta = (v - kv_mem) * b;
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kDeltaRows; ++r) {
        const int i = s + r * kSplit;
        if (i < dk) {
          st[r] += ks[i] * delta;
          o += st[r] * qs[i];
        }
      }
      o = column_sum<kSplit>(o);
      const int64_t t = t0 + u;
      if (has_col && s == 0) a.out.data[t * a.out.token_stride + static_cast<int64_t>(n) * a.out.head_stride + j] = o;
    }
  }

#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = s + r * kSplit;
    if (has_col && i < dk) S[static_cast<int64_t>(i) * dv + j] = st[r];
  }
}

template <int kSplit>
cudaError_t launch_delta_rule_split(const DeltaRuleArgs& a, cudaStream_t stream) {
  constexpr int kCols = kDeltaThreads / kSplit;
  if (a.state_table && a.n_tokens > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.dv + kCols - 1) / kCols), static_cast<unsigned>(a.n_v_heads),
                  a.state_table ? static_cast<unsigned>(a.n_tokens) : 1u);
  // Tokens per stage: at most 32, and at most ~32 KB of shared memory (4096 / dk tokens), so the
  // launch stays under the 48 KB a block gets without opting in, whatever dk.
  int64_t stage64 = 4096 / a.dk < 1 ? 1 : 4096 / a.dk;
  if (stage64 > 32) stage64 = 32;
  if (stage64 > a.n_tokens) stage64 = a.n_tokens;
  if (a.state_table) stage64 = 1;  // each block runs one token
  const int stage = static_cast<int>(stage64);
  const size_t smem = sizeof(float) * static_cast<size_t>(stage) * (2 * a.dk + 2 + kCols);
  return launch_kernel(gated_delta_rule_kernel<kSplit>, grid, kDeltaThreads, smem, stream, a, stage);
}

// ---- sigmoid gate ----

__global__ void sigmoid_gate_kernel(float* x, int64_t x_stride, const float* gate, int64_t gate_stride, bool per_row,
                                    int64_t rows, int64_t cols) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float gv = gate[r * gate_stride + (per_row ? 0 : c)];
    x[r * x_stride + c] = x[r * x_stride + c] * sigmoid(gv);
  }
}

}  // namespace

cudaError_t launch_causal_conv1d(float* out, int64_t out_stride, const float* x, int64_t x_stride, float* state,
                                 int64_t state_stride, const void* weight, DType weight_type,
                                 int64_t weight_row_bytes, int64_t n_tokens, int64_t channels, int64_t kernel,
                                 cudaStream_t stream) {
  if (n_tokens == 0 || channels == 0) return cudaSuccess;
  if (!is_weight_format(weight_type) || kernel < 1) return cudaErrorInvalidValue;
  const int64_t token_blocks = (n_tokens + kConvTokens - 1) / kConvTokens;
  if (token_blocks > 65535) return cudaErrorInvalidValue;  // > 524k tokens in one call
  const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads), static_cast<unsigned>(token_blocks));
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_weight_format(weight_type, [&](auto format) {
    err = launch_kernel(causal_conv1d_kernel<decltype(format)::value>, grid, kThreads, 0, stream, out, out_stride, x,
                        x_stride, state, state_stride, static_cast<const uint8_t*>(weight), weight_row_bytes, n_tokens,
                        channels, kernel);
  });
  if (err != cudaSuccess || kernel == 1) return err;
  return launch_kernel(causal_conv1d_state_kernel, static_cast<unsigned>((channels + kThreads - 1) / kThreads),
                       kThreads, 0, stream, state, state_stride, x, x_stride, n_tokens, channels, kernel);
}

cudaError_t launch_causal_conv1d_rows(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                      float* const* states, int64_t state_stride, const void* weight, DType weight_type,
                                      int64_t weight_row_bytes, int64_t n_rows, int64_t channels, int64_t kernel,
                                      cudaStream_t stream) {
  if (n_rows == 0 || channels == 0) return cudaSuccess;
  if (!is_weight_format(weight_type) || kernel < 1 || kernel > kConvRowsMaxKernel || n_rows > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads), static_cast<unsigned>(n_rows));
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_weight_format(weight_type, [&](auto format) {
    err = launch_kernel(causal_conv1d_rows_kernel<decltype(format)::value>, grid, kThreads, 0, stream, out, out_stride,
                        x, x_stride, states, state_stride, static_cast<const uint8_t*>(weight), weight_row_bytes,
                        channels, kernel);
  });
  return err;
}

cudaError_t launch_delta_rule_gates(float* g, int64_t g_stride, float* beta, int64_t beta_stride, const float* a,
                                    int64_t a_stride, const float* b, int64_t b_stride, WeightVector a_log,
                                    WeightVector dt_bias, int64_t n_tokens, int64_t n_v_heads, cudaStream_t stream) {
  if (n_tokens * n_v_heads == 0) return cudaSuccess;
  if (!is_weight_format(a_log.type) || !is_weight_format(dt_bias.type) || a_log.cols < 1 || dt_bias.cols < 1)
    return cudaErrorInvalidValue;
  return launch_kernel(delta_rule_gates_kernel, blocks_for(n_tokens * n_v_heads), kThreads, 0, stream, g, g_stride,
                       beta, beta_stride, a, a_stride, b, b_stride, a_log, dt_bias, n_tokens, n_v_heads);
}

cudaError_t launch_gated_delta_rule(const DeltaRuleArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0 || a.n_v_heads == 0 || a.dv == 0) return cudaSuccess;
  if (a.n_k_heads <= 0 || a.n_v_heads % a.n_k_heads || a.n_v_heads > 65535) return cudaErrorInvalidValue;
  // the fewest threads per column whose registers hold all dk rows
  if (a.dk <= 4 * kDeltaRows) return launch_delta_rule_split<4>(a, stream);
  if (a.dk <= 8 * kDeltaRows) return launch_delta_rule_split<8>(a, stream);
  if (a.dk <= 16 * kDeltaRows) return launch_delta_rule_split<16>(a, stream);
  if (a.dk <= 32 * kDeltaRows) return launch_delta_rule_split<32>(a, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_sigmoid_gate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride, bool per_row,
                                int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return launch_kernel(sigmoid_gate_kernel, blocks_for(rows * cols), kThreads, 0, stream, x, x_stride, gate,
                       gate_stride, per_row, rows, cols);
}

}  // namespace fl::cuda
