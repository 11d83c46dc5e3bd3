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
#include <atomic>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/imma_pieces.cuh"
#include "backend/cuda/linear_attention.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/mma_sync.cuh"  // cp.async
#endif

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

// g = -exp(a_log) * softplus(a + dt_bias), the delta rule's log-decay (both kernels that make it).
__device__ __forceinline__ float delta_rule_log_decay(float a, float dt_bias, float a_log) {
  const float x = a + dt_bias;
  const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch's softplus (threshold 20)
  return -expf(a_log) * softplus;
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
    g[t * g_stride + n] = delta_rule_log_decay(a_tn, weight_element(dt_bias, n), weight_element(a_log, n));
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

// transformers' l2norm of one token's q and k rows (dk each, in shared memory, in place), by one
// warp: x * rsqrt(sum(x^2) + eps), then (queries only) * scale. Each lane sums and rescales the
// elements i = lane, lane + 32, ... (those it wrote: no barrier needed before).
__device__ __forceinline__ void l2_normalise_qk(float* qs, float* ks, int dk, int lane, float q_scale, float l2_eps) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int i = lane; i < dk; i += kWarp) {
    q_sq += qs[i] * qs[i];
    k_sq += ks[i] * ks[i];
  }
  q_sq = warp_sum(q_sq);
  k_sq = warp_sum(k_sq);
  const float q_inv = 1.0f / sqrtf(q_sq + l2_eps), k_inv = 1.0f / sqrtf(k_sq + l2_eps);
  for (int i = lane; i < dk; i += kWarp) {
    qs[i] = qs[i] * q_inv * q_scale;
    ks[i] = ks[i] * k_inv;
  }
}

// One token of the delta rule for one state column held by kSplit threads (st[r] = S[s + r kSplit]
// [j]; qs, ks the token's normalised q and k; v the column's value): the state moves on and the
// column's output o = S^T q comes back in every thread of the column. Both delta rule kernels
// run it, so they agree bit for bit.
template <int kSplit>
__device__ __forceinline__ float delta_rule_token(float (&st)[kDeltaRows], const float* qs, const float* ks,
                                                  float decay, float beta, float v, int s, int dk) {
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
  const float delta = (v - kv_mem) * beta;
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = s + r * kSplit;
    if (i < dk) {
      st[r] += ks[i] * delta;
      o += st[r] * qs[i];
    }
  }
  return column_sum<kSplit>(o);
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
      for (int i = lane; i < dk; i += kWarp) qs[i] = qt[i], ks[i] = kt[i];
      l2_normalise_qk(qs, ks, dk, lane, a.q_scale, a.l2_eps);
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
      const float o = delta_rule_token<kSplit>(st, qs, ks, s_decay[u], s_beta[u], s_v[u * kCols + col], s, dk);
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

#if !defined(FIRELINE_GPU_HIP)
// ---- the delta rule, chunked (prompts) ----
//
// The chunked form of backend/cpu/cpu_linear_attention.cpp, in its order of operations, as two
// kernels per slab of chunks:
// - delta_chunk_prepare_kernel, one block per (chunk, value head), every chunk at once: the
//   chunk's normalised q and k, cumulative decays, the unit lower-triangular system (I + A) solved
//   by forward substitution for U and W (one column per thread), the masked decayed scores
//   (Q K^T) * Gamma, and the decayed q and k, into the slab's scratch (ChunkFactors). None of it
//   depends on the state, so the work that makes a chunk (~0.8 M multiply-adds per head) runs
//   on all SMs together.
// - delta_chunk_scan_kernel, one block per (32 state columns, value head), chunk after chunk:
//   V' = U - W S, O = (e^gamma Q) S + attn V', S <- e^gamma_L S + (e^(gamma_L - gamma) K)^T V'.
//   State columns are independent in all three, so a block holds its columns of S in shared
//   memory for the whole slab and reads the chunk's factors once per chunk.
// Per token and head this is a few dk x dv products per 64 tokens where the recurrence makes a
// chain of 64 dependent steps: the recurrence kept Qwen3.5-4B's 4096-token prompt 147 ms in the
// delta rule (26 % of its prefill, H200).
constexpr int kChunkThreads = 256;  // prepare: one thread per column of U or W (dv + dk <= 256)
constexpr int kScanThreads = 512;
constexpr int kScanWarps = kScanThreads / kWarp;
constexpr int kScanCols = kWarp;                                // state columns per scan block: one per lane
constexpr int kScanRows = kDeltaChunkMax / kScanWarps;          // chunk rows per warp (4)
constexpr int kScanStateRows = kDeltaChunkMaxDim / kScanWarps;  // state rows per warp in the update (8)
static_assert(kDeltaChunkMax % 4 == 0 && kDeltaChunkMax % kScanWarps == 0, "chunk tiles are whole float4s and warps");
static_assert(2 * kDeltaChunkMaxDim <= kChunkThreads, "prepare: a thread per column of U and of W");
// Chunks per slab, at most (and at most ~64 MB of factors: Qwen3.5's 32 heads of 128 x 128 take
// 4.7 MB per chunk, so 14 chunks).
constexpr int64_t kMaxSlabChunks = 16;

__host__ __device__ constexpr int pad4(int x) { return (x + 3) / 4 * 4; }

// acc += w . v, element by element in order (the CPU's summation order over four terms).
__device__ __forceinline__ void accumulate4(float& acc, const float4& w, const float (&v)[4]) {
  acc += w.x * v[0];
  acc += w.y * v[1];
  acc += w.z * v[2];
  acc += w.w * v[3];
}

// Rows first_row .. first_row + 3 of this lane's column in a [rows][32] tile.
__device__ __forceinline__ void column4(const float* tile, int first_row, int lane, float (&v)[4]) {
#pragma unroll
  for (int x = 0; x < 4; ++x) v[x] = tile[(first_row + x) * kScanCols + lane];
}

// One (chunk, value head)'s factors: rows past the chunk's tokens and columns past dk are zeros,
// so the scan runs whole tiles without bounds. qd, w and kdt are adjacent (one copy stages them).
struct ChunkFactors {
  float* qd;     // [kC][dkp]: e^gamma_i q_i (normalised, scaled)
  float* w;      // [kC][dkp]: W = (I + A)^-1 diag(beta e^gamma) K
  float* kdt;    // [dkp][kC]: (e^(gamma_L - gamma_i) k_i)^T
  float* u;      // [kC][dv]:  U = (I + A)^-1 diag(beta) V
  float* attn;   // [kC][kC]:  (q_i . k_j) e^(gamma_i - gamma_j) for j <= i, else 0
  float* decay;  // [1]:       e^gamma_L
};
__host__ __device__ constexpr int64_t chunk_factor_floats(int dk, int dv) {
  return int64_t{kDeltaChunkMax} * (3 * pad4(dk) + dv + kDeltaChunkMax) + 4;  // a multiple of 4: float4 aligned
}

struct DeltaChunkArgs {
  DeltaRuleArgs rule;
  float* factors;       // the slab's ChunkFactors, [chunk of the slab][value head]
  int64_t first_chunk;  // the slab's first chunk within the call
  int n_chunks;         // chunks in the slab
  int chunk;            // tokens per chunk (the call's last chunk may have fewer)
};

__device__ __forceinline__ ChunkFactors chunk_factors(const DeltaChunkArgs& c, int slab_chunk, int n) {
  constexpr int kC = kDeltaChunkMax;
  const int dkp = pad4(c.rule.dk);
  ChunkFactors f;
  f.qd =
      c.factors + (static_cast<int64_t>(slab_chunk) * c.rule.n_v_heads + n) * chunk_factor_floats(c.rule.dk, c.rule.dv);
  f.w = f.qd + kC * dkp;
  f.kdt = f.w + kC * dkp;
  f.u = f.kdt + dkp * kC;
  f.attn = f.u + kC * c.rule.dv;
  f.decay = f.attn + kC * kC;
  return f;
}

size_t prepare_smem_bytes(int dk, int chunk) {
  return sizeof(float) *
         (static_cast<size_t>(2 * chunk) * (pad4(dk) + 4) + kDeltaChunkMax * kDeltaChunkMax + 4 * chunk);
}
size_t scan_smem_bytes(int dk) {
  const size_t dkp = pad4(dk);
  return sizeof(float) *
         (dkp * kScanCols + 3 * kDeltaChunkMax * dkp + kDeltaChunkMax * kDeltaChunkMax + kDeltaChunkMax * kScanCols);
}

__global__ void __launch_bounds__(kChunkThreads, 2) delta_chunk_prepare_kernel(DeltaChunkArgs c) {
  enter_kernel();
  constexpr int kC = kDeltaChunkMax;
  constexpr int kWarps = kChunkThreads / kWarp;
  const DeltaRuleArgs& a = c.rule;
  const int dk = a.dk, dv = a.dv, dkp = pad4(dk), ks = dkp + 4, C = c.chunk;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int n = blockIdx.y, m = n / (a.n_v_heads / a.n_k_heads);
  const int64_t t0 = (c.first_chunk + blockIdx.x) * C;
  const int L = static_cast<int>(a.n_tokens - t0 < C ? a.n_tokens - t0 : C);
  extern __shared__ float smem[];
  // Rows of dkp + 4 floats, zeros past dk: a lane's 16-byte loads from row j hit other banks
  // than its 7 neighbours' in the same quarter-warp (rows 4 banks apart).
  float* kn = smem;            // [C][dkp + 4]: normalised k
  float* qn = kn + C * ks;     // [C][dkp + 4]: normalised, scaled q
  float* A = qn + C * ks;      // [kC][kC]: (beta_i k_i . k_j) e^(gamma_i - gamma_j) for j < i < L, else 0
  float* gamma = A + kC * kC;  // [C]: cumulative log decay within the chunk
  float* beta = gamma + C;
  float* exp_gamma = beta + C;
  float* exp_to_end = exp_gamma + C;  // e^(gamma_L - gamma_i)
  const ChunkFactors f = chunk_factors(c, blockIdx.x, n);

  for (int i = warp; i < L; i += kWarps) {  // transformers' l2norm, as the recurrence does it
    const float* qt = a.q.data + (t0 + i) * a.q.token_stride + m * a.q.head_stride;
    const float* kt = a.k.data + (t0 + i) * a.k.token_stride + m * a.k.head_stride;
    float q_sq = 0.0f, k_sq = 0.0f;
    for (int d = lane; d < dk; d += kWarp) {
      const float qv = qt[d], kv = kt[d];
      qn[i * ks + d] = qv;
      kn[i * ks + d] = kv;
      q_sq += qv * qv;
      k_sq += kv * kv;
    }
    q_sq = warp_sum(q_sq);
    k_sq = warp_sum(k_sq);
    const float q_inv = 1.0f / sqrtf(q_sq + a.l2_eps), k_inv = 1.0f / sqrtf(k_sq + a.l2_eps);
    for (int d = lane; d < dk; d += kWarp) {
      qn[i * ks + d] = qn[i * ks + d] * q_inv * a.q_scale;
      kn[i * ks + d] = kn[i * ks + d] * k_inv;
    }
    for (int d = dk + lane; d < dkp; d += kWarp) qn[i * ks + d] = kn[i * ks + d] = 0.0f;
  }
  if (tid == 0) {  // the CPU's running sum, in token order
    float cum = 0.0f;
    for (int i = 0; i < L; ++i) gamma[i] = (cum += a.g[(t0 + i) * a.g_stride + n]);
  }
  for (int i = tid; i < L; i += kChunkThreads) beta[i] = a.beta[(t0 + i) * a.beta_stride + n];
  __syncthreads();
  for (int i = tid; i < L; i += kChunkThreads) {
    exp_gamma[i] = expf(gamma[i]);
    exp_to_end[i] = expf(gamma[L - 1] - gamma[i]);
  }
  // A (strictly lower) and the scores (lower with the diagonal); a warp takes 32 j of one row i.
  for (int e = tid; e < kC * kC; e += kChunkThreads) {
    const int i = e / kC, j = e % kC;
    float system = 0.0f, score = 0.0f;
    if (i < L && j <= i) {
      const float b = beta[i];
      const float4 *ki = reinterpret_cast<const float4*>(kn + i * ks),
                   *kj = reinterpret_cast<const float4*>(kn + j * ks),
                   *qi = reinterpret_cast<const float4*>(qn + i * ks);
      float kk = 0.0f, qk = 0.0f;
      for (int d4 = 0; d4 < dkp / 4; ++d4) {  // d ascending; the padding adds zeros
        const float4 x = ki[d4], y = kj[d4], q = qi[d4];
        kk += x.x * b * y.x;
        kk += x.y * b * y.y;
        kk += x.z * b * y.z;
        kk += x.w * b * y.w;
        qk += q.x * y.x;
        qk += q.y * y.y;
        qk += q.z * y.z;
        qk += q.w * y.w;
      }
      const float decay = expf(gamma[i] - gamma[j]);
      if (j < i) system = kk * decay;
      score = qk * decay;
    }
    A[e] = system;
    f.attn[e] = score;
  }
  __syncthreads();
  // Forward substitution with the unit lower-triangular (I + A), one column of U (threads < dv)
  // or of W (the next dk threads) per thread, held in registers: row i is its right-hand side
  // (diag(beta) V or diag(beta e^gamma) K) minus A[i][j] times the rows already solved, j
  // ascending. Unrolled over all 64 rows: rows past the chunk have zero right-hand sides and A
  // rows, and stay zero. (With the column in shared memory each step waited on a load.)
  if (tid < dv + dk) {
    const bool is_u = tid < dv;
    const int d = tid - dv;
    float x[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i)
      x[i] = i >= L ? 0.0f
             : is_u ? a.v.data[(t0 + i) * a.v.token_stride + static_cast<int64_t>(n) * a.v.head_stride + tid] * beta[i]
                    : kn[i * ks + d] * beta[i] * exp_gamma[i];
#pragma unroll
    for (int i = 1; i < kC; ++i) {
      float v = x[i];
#pragma unroll
      for (int j = 0; j < i; ++j) v -= A[i * kC + j] * x[j];
      x[i] = v;
    }
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (is_u)
        f.u[i * dv + tid] = x[i];
      else
        f.w[i * dkp + d] = x[i];
    }
  }
  for (int e = tid; e < kC * dkp; e += kChunkThreads) {
    const int i = e / dkp, d = e % dkp;
    f.qd[e] = i < L && d < dk ? qn[i * ks + d] * exp_gamma[i] : 0.0f;
    if (d >= dk) f.w[e] = 0.0f;  // W's padding columns (the substitution wrote d < dk)
  }
  for (int e = tid; e < dkp * kC; e += kChunkThreads) {
    const int d = e / kC, i = e % kC;
    f.kdt[e] = i < L && d < dk ? kn[i * ks + d] * exp_to_end[i] : 0.0f;
  }
  if (tid == 0) *f.decay = exp_gamma[L - 1];
}

// Block (tile, n): state columns tile * 32 + lane of value head n; warp w (of 16) computes chunk
// rows w + 16 r of V' and O, then state rows w + 16 r of the update.
__global__ void __launch_bounds__(kScanThreads) delta_chunk_scan_kernel(DeltaChunkArgs c) {
  enter_kernel();
  constexpr int kC = kDeltaChunkMax;
  const DeltaRuleArgs& a = c.rule;
  const int dk = a.dk, dv = a.dv, dkp = pad4(dk), C = c.chunk;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n = blockIdx.y, col = blockIdx.x * kScanCols + lane;
  const bool has_col = col < dv;
  float* S = a.state + static_cast<int64_t>(n) * dk * dv;
  extern __shared__ float4 smem4[];
  float* s = reinterpret_cast<float*>(smem4);  // [dkp][32]: the block's state columns
  float* qd = s + dkp * kScanCols;             // [kC][dkp]
  float* w = qd + kC * dkp;                    // [kC][dkp]
  float* kdt = w + kC * dkp;                   // [dkp][kC]
  float* attn = kdt + dkp * kC;                // [kC][kC]
  float* vp = attn + kC * kC;                  // [kC][32]: V' = U - W S, the block's columns
  for (int d = warp; d < dkp; d += kScanWarps) s[d * kScanCols + lane] = has_col && d < dk ? S[d * dv + col] : 0.0f;

  for (int ch = 0; ch < c.n_chunks; ++ch) {
    const int64_t t0 = (c.first_chunk + ch) * C;
    const int L = static_cast<int>(a.n_tokens - t0 < C ? a.n_tokens - t0 : C);
    const ChunkFactors f = chunk_factors(c, ch, n);
    __syncthreads();  // the previous chunk is done with the tiles (and its state rows are stored)
    // Staged with cp.async, every copy in flight at once, in two groups: qd and w (needed first),
    // then kdt and the scores, which arrive while V' is computed. (Plain copies waited for L2 once
    // per 16 bytes copied per thread.)
    for (int e = threadIdx.x; e < 2 * kC * dkp / 4; e += kScanThreads) cp_async_16(qd + 4 * e, f.qd + 4 * e);
    cp_async_commit();
    for (int e = threadIdx.x; e < dkp * kC / 4; e += kScanThreads) cp_async_16(kdt + 4 * e, f.kdt + 4 * e);
    for (int e = threadIdx.x; e < kC * kC / 4; e += kScanThreads) cp_async_16(attn + 4 * e, f.attn + 4 * e);
    cp_async_commit();
    const float chunk_decay = *f.decay;
    cp_async_wait<1>();
    __syncthreads();

    // V' = U - W S and the inter-chunk part of O, (e^gamma Q) S: d ascending, as the CPU sums.
    float ws[kScanRows], inter[kScanRows];
#pragma unroll
    for (int r = 0; r < kScanRows; ++r) ws[r] = inter[r] = 0.0f;
    for (int d4 = 0; d4 < dkp / 4; ++d4) {
      float sv[4];
      column4(s, 4 * d4, lane, sv);
#pragma unroll
      for (int r = 0; r < kScanRows; ++r) {
        const int i = warp + r * kScanWarps;
        const float4 wv = reinterpret_cast<const float4*>(w + i * dkp)[d4];
        const float4 qv = reinterpret_cast<const float4*>(qd + i * dkp)[d4];
        accumulate4(ws[r], wv, sv);
        accumulate4(inter[r], qv, sv);
      }
    }
#pragma unroll
    for (int r = 0; r < kScanRows; ++r) {  // rows past the chunk: U and W are zeros there, so is V'
      const int i = warp + r * kScanWarps;
      vp[i * kScanCols + lane] = (has_col ? f.u[i * dv + col] : 0.0f) - ws[r];
    }
    cp_async_wait<0>();
    __syncthreads();

    // O = inter + lower((Q K^T) Gamma) V', j ascending, the warp's rows together; the scores are
    // zero above the diagonal and V' past the chunk, so those terms add exact zeros.
    for (int j4 = 0; j4 < (L + 3) / 4; ++j4) {
      float v[4];
      column4(vp, 4 * j4, lane, v);
#pragma unroll
      for (int r = 0; r < kScanRows; ++r) {
        const float4 p = reinterpret_cast<const float4*>(attn + (warp + r * kScanWarps) * kC)[j4];
        accumulate4(inter[r], p, v);
      }
    }
#pragma unroll
    for (int r = 0; r < kScanRows; ++r) {
      const int i = warp + r * kScanWarps;
      if (has_col && i < L)
        a.out.data[(t0 + i) * a.out.token_stride + static_cast<int64_t>(n) * a.out.head_stride + col] = inter[r];
    }

    // S <- e^gamma_L S + (e^(gamma_L - gamma) K)^T V', i ascending (zeros past the chunk add 0)
    float acc[kScanStateRows];
#pragma unroll
    for (int r = 0; r < kScanStateRows; ++r) {
      const int d = warp + r * kScanWarps;
      acc[r] = d < dkp ? s[d * kScanCols + lane] * chunk_decay : 0.0f;
    }
    for (int i4 = 0; i4 < kC / 4; ++i4) {
      float v[4];
      column4(vp, 4 * i4, lane, v);
#pragma unroll
      for (int r = 0; r < kScanStateRows; ++r) {
        const int d = warp + r * kScanWarps;
        if (d >= dkp) break;
        const float4 kv = reinterpret_cast<const float4*>(kdt + d * kC)[i4];
        accumulate4(acc[r], kv, v);
      }
    }
#pragma unroll
    for (int r = 0; r < kScanStateRows; ++r) {
      const int d = warp + r * kScanWarps;
      if (d < dkp) s[d * kScanCols + lane] = acc[r];
    }
  }
  __syncthreads();
  for (int d = warp; d < dk; d += kScanWarps)
    if (has_col) S[d * dv + col] = s[d * kScanCols + lane];
}
#endif  // !FIRELINE_GPU_HIP

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

// ---- the fused decode step (launch_delta_net_step) ----

constexpr int kStepSplit = 4;                         // threads per state column, as kSplit = 4 above
constexpr int kStepMaxDk = kStepSplit * kDeltaRows;   // 128
constexpr int kStepMaxBlocks = 8;                     // a portable cluster
constexpr int kStepWindow = static_cast<int>(kConvRowsMaxKernel);
constexpr int kStepMaxGroup = 256;  // out_proj's weight group the step cuts pieces for (128 or 256)

// The columns per block: the fewest of 16, 32, 64 that fit a key head's value heads in one
// cluster (Qwen3.5-4B: 2 value heads per key head of dv = 128 -> 32 columns, 8 blocks of 128
// threads, 128 blocks in all). Fewer columns, more blocks: the state's read is spread wider.
int step_columns(int ratio, int dv) {
  for (int cols : {16, 32, 64})
    if (int64_t{ratio} * ((dv + cols - 1) / cols) <= kStepMaxBlocks) return cols;
  return 0;
}

// Grid (ratio * tiles, nK, rows) in clusters of ratio * tiles blocks along x: the cluster of key
// head m and row t holds every block that reads m's q and k, so the conv state's q/k channels can
// move as soon as all of them have read their window (the cluster barrier), and a value head's
// tiles add up its norm's sum of squares through distributed shared memory. Block (i, m, t):
// value head n = m * ratio + i / tiles, columns (i % tiles) * kCols + [0, kCols); thread tid:
// column tid / 4 and state rows tid % 4 + 4 r, as gated_delta_rule_kernel<4>.
//
// An exception to launch.cuh's rule: the block's state columns, its conv windows' state rows,
// the taps and the gate weights are read BEFORE enter_kernel(), to overlap the projection that
// runs before. Only this kernel (at the layer's previous step), prefill's kernels and copies
// write those states, and each such write is at least two launches back: a launch starts early
// only once the one before it has passed its own wait, i.e. once every launch before that one
// has completed. The previous launch (the projections) writes neither state; the backend never
// launches two steps back to back (CudaBackend::gated_delta_net_rows runs the separate kernels for
// a step that follows a step with no other op between).
template <DType F, int kCols>
__global__ void __launch_bounds__(kCols* kStepSplit) delta_net_step_kernel(DeltaNetStepArgs a) {
#if FIRELINE_GPU_HOPPER
  constexpr int kThreads = kCols * kStepSplit;
  constexpr int kQkPerThread = 2 * kStepMaxDk / kThreads;  // q and k channels of the key head per thread
  __shared__ float s_qk[2 * kStepMaxDk];                   // q (normalised and scaled), then k (normalised)
  __shared__ float s_v[kCols];                             // the conv's v for the block's columns
  __shared__ float s_col_sq[kCols];                        // o^2 per column
  __shared__ float s_tile_sq[kStepMaxBlocks];              // [block of the cluster]: its columns' o^2 summed
  __shared__ __align__(16) float s_group[kStepMaxGroup];   // block 0, with pieces: the key head's outputs
  cluster_arrive_relaxed();  // this block has started: its s_tile_sq may be written (waited for below)
  const int tid = threadIdx.x, s = tid % kStepSplit, col = tid / kStepSplit;
  const int dk = a.dk, dv = a.dv, nK = a.n_k_heads, ratio = a.n_v_heads / a.n_k_heads, K = a.conv_kernel;
  const int tiles = (dv + kCols - 1) / kCols, rank = static_cast<int>(blockIdx.x);
  const int n_blocks = static_cast<int>(gridDim.x), first_of_head = rank - rank % tiles;
  const int m = static_cast<int>(blockIdx.y), n = m * ratio + rank / tiles, col0 = (rank % tiles) * kCols;
  const int j = col0 + col;
  const bool has_col = j < dv;
  const int64_t t = blockIdx.z;
  float* S = (a.delta_table ? a.delta_table[t] : a.delta_state) + static_cast<int64_t>(n) * dk * dv;
  float* conv_state = a.conv_table ? a.conv_table[t] : a.conv_state;
  const float* x = a.qkv + t * a.qkv_stride;
  const uint8_t* taps = static_cast<const uint8_t*>(a.conv_weight);
  // Channel of the key head's q/k element e < 2 dk, and of the block's v column jv.
  auto qk_channel = [&](int e) { return static_cast<int64_t>(e < dk ? m * dk + e : nK * dk + m * dk + (e - dk)); };
  const int jv = col0 + tid;
  const bool has_v = tid < kCols && jv < dv;
  const int64_t v_channel = static_cast<int64_t>(2) * nK * dk + static_cast<int64_t>(n) * dv + jv;

  // Before the wait: the state columns, windows and taps (the comment above says why).
  float st[kDeltaRows];  // st[r] = S[s + 4 r][j]
#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = s + r * kStepSplit;
    st[r] = has_col && i < dk ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }
  float qk_window[kQkPerThread][kStepWindow], qk_taps[kQkPerThread][kStepWindow];
#pragma unroll
  for (int p = 0; p < kQkPerThread; ++p) {
    const int e = tid + p * kThreads;
#pragma unroll
    for (int w = 0; w < kStepWindow; ++w) {
      const bool used = e < 2 * dk && w < K;
      qk_window[p][w] = used && w < K - 1 ? conv_state[w * a.conv_state_stride + qk_channel(e)] : 0.0f;
      qk_taps[p][w] = used ? load_weight_t<F>(taps + qk_channel(e) * a.conv_row_bytes, w) : 0.0f;
    }
  }
  float v_window[kStepWindow], v_taps[kStepWindow];
#pragma unroll
  for (int w = 0; w < kStepWindow; ++w) {
    const bool used = has_v && w < K;
    v_window[w] = used && w < K - 1 ? conv_state[w * a.conv_state_stride + v_channel] : 0.0f;
    v_taps[w] = used ? load_weight_t<F>(taps + v_channel * a.conv_row_bytes, w) : 0.0f;
  }
  const float dt_bias = weight_element(a.dt_bias, n), a_log = weight_element(a.a_log, n);
  const float norm_gain = has_col ? weight_element(a.norm, j) : 0.0f;
  enter_kernel();
  // What the projection wrote, asked for all at once: one L2 round trip, not one per use.
  float qk_in[kQkPerThread];
#pragma unroll
  for (int p = 0; p < kQkPerThread; ++p) {
    const int e = tid + p * kThreads;
    qk_in[p] = e < 2 * dk ? x[qk_channel(e)] : 0.0f;
  }
  const float v_in = has_v ? x[v_channel] : 0.0f;
  const float a_in = a.a[t * a.a_stride + n], b_in = a.b[t * a.b_stride + n];
  const float zj = has_col && s == 0 ? a.z[t * a.z_stride + static_cast<int64_t>(n) * dv + j] : 0.0f;

  // The conv (causal_conv1d_kernel's arithmetic): the key head's q and k, the block's v columns.
  // The last window row is this token's input.
  auto conv_silu = [&](const float (&window)[kStepWindow], const float (&tap)[kStepWindow], float in) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kStepWindow; ++w)
      if (w < K) acc = gpu::mul_add_unfused(tap[w], w < K - 1 ? window[w] : in, acc);
    return acc / (1.0f + expf(-acc));
  };
#pragma unroll
  for (int p = 0; p < kQkPerThread; ++p) {
    const int e = tid + p * kThreads;
    if (e < 2 * dk) s_qk[e] = conv_silu(qk_window[p], qk_taps[p], qk_in[p]);
  }
  if (has_v) {
    s_v[tid] = conv_silu(v_window, v_taps, v_in);
    // This block alone reads this channel: its window moves on now.
#pragma unroll
    for (int r = 0; r + 1 < kStepWindow; ++r)  // (constant indices: the window stays in registers)
      if (r < K - 1) conv_state[r * a.conv_state_stride + v_channel] = r + 1 < K - 1 ? v_window[r + 1] : v_in;
  } else if (tid < kCols) {
    s_v[tid] = 0.0f;
  }
  // The gates (delta_rule_gates_kernel's arithmetic), then exp(g) as the delta rule takes it.
  const float decay = expf(delta_rule_log_decay(a_in, dt_bias, a_log));
  const float beta = sigmoid(b_in);
  __syncthreads();
  if (tid < kWarp) l2_normalise_qk(s_qk, s_qk + dk, dk, tid, a.q_scale, a.l2_eps);
  __syncthreads();

  // The delta rule for one token (gated_delta_rule_kernel's arithmetic).
  const float o = delta_rule_token<kStepSplit>(st, s_qk, s_qk + dk, decay, beta, s_v[col], s, dk);

  // The value head's sum of o^2: the block's columns in order, then its tiles' sums in order
  // (every block of the head adds the same slots: the same bits).
  if (s == 0) s_col_sq[col] = has_col ? o * o : 0.0f;
  __syncthreads();
  cluster_wait();  // every block of the cluster has started (the arrival at the top)
  if (tid < kWarp) {
    float tile_sq = 0.0f;
    for (int c = tid; c < kCols; c += kWarp) tile_sq += s_col_sq[c];
    tile_sq = warp_sum(tile_sq);
    if (tid < n_blocks) store_cluster_float(&s_tile_sq[rank], static_cast<uint32_t>(tid), tile_sq);
  }
  __syncwarp();  // (the barrier is .aligned: every lane of a warp at it together)
  cluster_arrive();
  cluster_wait();
  float head_sq = 0.0f;
  for (int i = 0; i < tiles; ++i) head_sq += s_tile_sq[first_of_head + i];
  const float inv = rms_inverse_of_sum(head_sq, dv, a.norm_eps);
  if (has_col && s == 0) {
    const float y = o * inv * norm_gain;
    const float gated = gated_value(zj, y, Act::silu);  // silu(z) * y, as gated_activation
    a.out[t * a.out_stride + static_cast<int64_t>(n) * dv + j] = gated;
    // the key head's value heads are one weight group of out_proj: gathered in block 0 to be cut
    if (a.pieces) store_cluster_float(&s_group[(rank / tiles) * dv + j], 0, gated);
  }
  // Every block of the cluster has read its q/k windows (the barrier): the key head's q/k channels
  // move on, from the windows every block holds in registers, slot p written by block p (modulo
  // the cluster's blocks). Row r takes row r + 1, the last row this token's input.
#pragma unroll
  for (int p = 0; p < kQkPerThread; ++p) {
    const int e = tid + p * kThreads;
    if (p % n_blocks != rank || e >= 2 * dk) continue;
    const int64_t c = qk_channel(e);
#pragma unroll
    for (int r = 0; r + 1 < kStepWindow; ++r)  // (constant indices: the window stays in registers)
      if (r < K - 1) conv_state[r * a.conv_state_stride + c] = r + 1 < K - 1 ? qk_window[p][r + 1] : qk_in[p];
  }
#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = s + r * kStepSplit;
    if (has_col && i < dk) S[static_cast<int64_t>(i) * dv + j] = st[r];
  }
  if (!a.pieces) return;
  // Block 0 cuts group m once every block's outputs are in its s_group (the barrier), in one warp
  // (8 consecutive elements a lane): cut_imma_group's bytes, whichever kernel cuts the values.
  __syncwarp();
  cluster_arrive();
  cluster_wait();
  if (rank != 0 || tid >= kWarp) return;
  uint8_t* pieces = static_cast<uint8_t*>(a.pieces);
  const int64_t width = static_cast<int64_t>(a.n_v_heads) * dv;  // out_proj's input
  auto cut = [&](auto group_size) {
    constexpr int kGroup = decltype(group_size)::value, kLanes = ImmaGroup<kGroup>::kLanesPerGroup;
    const int l = tid % kLanes;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = tid < kLanes ? s_group[8 * l + e] : 0.0f;
    cut_imma_group<kGroup>(v, l, m, tid < kLanes, pieces, imma_group_scales<kGroup>(pieces, width));
  };
  if (a.pieces_group == 256)
    cut(std::integral_constant<int, 256>{});
  else
    cut(std::integral_constant<int, 128>{});
#else
  (void)a;
#if !defined(FIRELINE_GPU_HIP)
  __trap();  // launched only on sm_90 devices from builds with sm_90a code
#endif
#endif
}

template <DType F, int kCols>
cudaError_t launch_delta_net_step_cols(const DeltaNetStepArgs& a, cudaStream_t stream) {
#if !defined(FIRELINE_GPU_HIP)
  const int ratio = a.n_v_heads / a.n_k_heads, blocks = ratio * ((a.dv + kCols - 1) / kCols);
  return launch_kernel_cluster(delta_net_step_kernel<F, kCols>,
                               dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.n_k_heads),
                                    static_cast<unsigned>(a.n_rows)),
                               dim3(kCols * kStepSplit), 0, stream, static_cast<unsigned>(blocks), a);
#else
  (void)a, (void)stream;
  return cudaErrorInvalidValue;
#endif
}

std::atomic<int64_t> g_delta_net_step_launches{0};
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

bool delta_rule_chunked_applies(int64_t dk, int64_t dv, int64_t chunk) {
#if defined(FIRELINE_GPU_HIP)
  (void)dk, (void)dv, (void)chunk;
  return false;  // the tiles need more shared memory than a HIP block gets
#else
  return dk >= 1 && dk <= kDeltaChunkMaxDim && dv >= 1 && dv <= kDeltaChunkMaxDim && chunk >= 1 &&
         chunk <= kDeltaChunkMax;
#endif
}

#if !defined(FIRELINE_GPU_HIP)
DeltaChunkPlan plan_delta_rule_chunked(const DeltaRuleArgs& a, int chunk) {
  DeltaChunkPlan plan;
  plan.chunks = chunk > 0 ? (a.n_tokens + chunk - 1) / chunk : 0;
  plan.chunk_bytes =
      sizeof(float) * static_cast<size_t>(chunk_factor_floats(a.dk, a.dv)) * static_cast<size_t>(a.n_v_heads);
  int64_t slab = plan.chunk_bytes > 0 ? static_cast<int64_t>((size_t{64} << 20) / plan.chunk_bytes) : 1;
  if (slab > kMaxSlabChunks) slab = kMaxSlabChunks;
  slab = slab < 1 ? 1 : slab > plan.chunks ? plan.chunks : slab;
  plan.slab_chunks = slab;
  plan.slabs = slab > 0 ? (plan.chunks + slab - 1) / slab : 0;
  plan.scratch_bytes = plan.chunk_bytes * static_cast<size_t>(slab);
  return plan;
}

cudaError_t launch_gated_delta_rule_chunked(const DeltaRuleArgs& a, int chunk, const DeltaChunkPlan& plan,
                                            float* scratch, cudaStream_t stream) {
  if (a.n_tokens == 0 || a.n_v_heads == 0) return cudaSuccess;
  if (!delta_rule_chunked_applies(a.dk, a.dv, chunk) || a.state_table || a.n_k_heads <= 0 ||
      a.n_v_heads % a.n_k_heads || a.n_v_heads > 65535 || plan.slab_chunks < 1 || plan.slab_chunks > kMaxSlabChunks)
    return cudaErrorInvalidValue;
  const size_t prepare_smem = prepare_smem_bytes(a.dk, chunk), scan_smem = scan_smem_bytes(a.dk);
  cudaError_t err = cudaFuncSetAttribute(delta_chunk_prepare_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(prepare_smem));
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(delta_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(scan_smem));
  for (int64_t first = 0; err == cudaSuccess && first < plan.chunks; first += plan.slab_chunks) {
    DeltaChunkArgs c;
    c.rule = a;
    c.factors = scratch;
    c.first_chunk = first;
    c.n_chunks = static_cast<int>(plan.chunks - first < plan.slab_chunks ? plan.chunks - first : plan.slab_chunks);
    c.chunk = chunk;
    err = launch_kernel(delta_chunk_prepare_kernel, dim3(static_cast<unsigned>(c.n_chunks), a.n_v_heads), kChunkThreads,
                        prepare_smem, stream, c);
    if (err == cudaSuccess)
      err = launch_kernel(delta_chunk_scan_kernel,
                          dim3(static_cast<unsigned>((a.dv + kScanCols - 1) / kScanCols), a.n_v_heads), kScanThreads,
                          scan_smem, stream, c);
  }
  return err;
}
#else
DeltaChunkPlan plan_delta_rule_chunked(const DeltaRuleArgs&, int) { return {}; }
cudaError_t launch_gated_delta_rule_chunked(const DeltaRuleArgs&, int, const DeltaChunkPlan&, float*, cudaStream_t) {
  return cudaErrorInvalidValue;
}
#endif

cudaError_t launch_sigmoid_gate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride, bool per_row,
                                int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return launch_kernel(sigmoid_gate_kernel, blocks_for(rows * cols), kThreads, 0, stream, x, x_stride, gate,
                       gate_stride, per_row, rows, cols);
}

bool delta_net_step_available() { return sm90a_kernels_available(); }

bool delta_net_step_fits(const DeltaNetStepArgs& a) {
  if (a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads || a.n_k_heads > 65535) return false;
  if (a.dk < 1 || a.dk > kStepMaxDk || a.dv < 1 || a.n_rows < 0 || a.n_rows > 65535) return false;
  if (a.conv_kernel < 2 || a.conv_kernel > kStepWindow || !is_weight_format(a.conv_type)) return false;
  return step_columns(a.n_v_heads / a.n_k_heads, a.dv) != 0;
}

bool delta_net_step_cuts_pieces(const DeltaNetStepArgs& a) {
  return a.n_rows == 1 && (a.pieces_group == 128 || a.pieces_group == kStepMaxGroup) && a.n_k_heads > 0 &&
         a.n_v_heads % a.n_k_heads == 0 && (a.n_v_heads / a.n_k_heads) * a.dv == a.pieces_group;
}

cudaError_t launch_delta_net_step(const DeltaNetStepArgs& a, cudaStream_t stream) {
  if (!delta_net_step_available() || !delta_net_step_fits(a)) return cudaErrorInvalidValue;
  if (a.pieces && !delta_net_step_cuts_pieces(a)) return cudaErrorInvalidValue;
  if (a.n_rows > 1 && (!a.conv_table || !a.delta_table)) return cudaErrorInvalidValue;  // several rows: tables
  if (a.n_rows == 0) return cudaSuccess;
  const int cols = step_columns(a.n_v_heads / a.n_k_heads, a.dv);
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_weight_format(a.conv_type, [&](auto format) {
    constexpr DType F = decltype(format)::value;
    err = cols == 16   ? launch_delta_net_step_cols<F, 16>(a, stream)
          : cols == 32 ? launch_delta_net_step_cols<F, 32>(a, stream)
                       : launch_delta_net_step_cols<F, 64>(a, stream);
  });
  if (err == cudaSuccess) g_delta_net_step_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

int64_t delta_net_step_launches() { return g_delta_net_step_launches.load(std::memory_order_relaxed); }

}  // namespace fl::cuda
