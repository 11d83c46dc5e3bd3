// The CPU oracle's Gated DeltaNet ops. Each mirrors the transformers 5.17 torch code named in
// its comment, in f32, in the same order of operations where that order decides the rounding.
#include "backend/cpu/cpu_linear_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl::cpu {
namespace {

// An f32 activation as rows: leading dims folded, rows `stride` bytes apart.
struct Matrix {
  char* base = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
  float* row(int64_t r) const { return reinterpret_cast<float*>(base + r * stride); }
};

Matrix matrix_of(const Tensor& t, const char* op, const char* what) {
  if (t.device != Device::cpu) fail("{}: {} {} is not in host memory", op, what, t.describe());
  if (t.dtype != DType::f32) fail("{}: {} must be f32, got {}", op, what, t.describe());
  if (t.ndim < 1) fail("{}: {} must have at least one dimension", op, what);
  Matrix m{static_cast<char*>(t.data), t.rows(), t.cols(), t.cols() * 4};
  if (t.ndim >= 2) {
    if (t.stride[t.ndim - 1] != 4) fail("{}: innermost dimension of {} {} is not contiguous", op, what, t.describe());
    m.stride = t.stride[t.ndim - 2];
    for (int i = t.ndim - 3; i >= 0; --i)
      if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1])
        fail("{}: the leading dimensions of {} {} cannot be folded into rows", op, what, t.describe());
  }
  return m;
}

// An f32 activation [T, heads, dim] with arbitrary token and head strides (a narrow() view of a
// fused projection, e.g. the q, k or v part of the convolved q/k/v rows).
struct Heads {
  char* base = nullptr;
  int64_t tokens = 0, heads = 0, dim = 0, token_stride = 0, head_stride = 0;
  float* at(int64_t t, int64_t h) const { return reinterpret_cast<float*>(base + t * token_stride + h * head_stride); }
};

Heads heads_of(const Tensor& t, const char* op, const char* what) {
  if (t.device != Device::cpu) fail("{}: {} {} is not in host memory", op, what, t.describe());
  if (t.dtype != DType::f32 || t.ndim != 3) fail("{}: {} must be f32 [tokens, heads, dim], got {}", op, what, t.describe());
  if (t.stride[2] != 4) fail("{}: innermost dimension of {} {} is not contiguous", op, what, t.describe());
  return {static_cast<char*>(t.data), t.shape[0], t.shape[1], t.shape[2], t.stride[0], t.stride[1]};
}

// A small weight (conv taps, A_log, dt_bias) of any weight dtype as floats, row-major.
std::vector<float> weight_values(const Tensor& w, const char* op) {
  if (w.device != Device::cpu || !w.is_contiguous()) fail("{}: weight {} must be a contiguous host tensor", op, w.describe());
  const QuantFormat& f = quant_format(w.dtype);
  std::vector<float> out(static_cast<size_t>(w.numel()));
  const int64_t cols = w.cols();
  for (int64_t r = 0; r < w.rows(); ++r)
    f.dequantize_row(static_cast<const char*>(w.data) + r * w.row_bytes(), out.data() + r * cols, cols);
  return out;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20)
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// transformers' l2norm: x * rsqrt(sum(x^2) + eps), then (queries only) * scale.
void l2_normalize(const float* x, float* out, int64_t n, float eps, float scale) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * scale;
}

// Shapes shared by both forms of the delta rule, checked once.
struct DeltaRuleShapes {
  Heads q, k, v, out;
  Matrix g, beta;
  float* state = nullptr;
  int64_t T = 0, nK = 0, nV = 0, dk = 0, dv = 0;
};

DeltaRuleShapes check_delta_rule(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& g, const Tensor& beta, const Tensor& state) {
  DeltaRuleShapes s;
  s.q = heads_of(q, op, "q");
  s.k = heads_of(k, op, "k");
  s.v = heads_of(v, op, "v");
  s.out = heads_of(out, op, "out");
  s.g = matrix_of(g, op, "g");
  s.beta = matrix_of(beta, op, "beta");
  s.T = s.q.tokens, s.nK = s.q.heads, s.dk = s.q.dim, s.nV = s.v.heads, s.dv = s.v.dim;
  if (s.k.tokens != s.T || s.k.heads != s.nK || s.k.dim != s.dk)
    fail("{}: k {} does not match q {}", op, k.describe(), q.describe());
  if (s.v.tokens != s.T || s.out.tokens != s.T || s.out.heads != s.nV || s.out.dim != s.dv)
    fail("{}: v {} and out {} must both be [{}, nV, dv]", op, v.describe(), out.describe(), s.T);
  if (s.nK <= 0 || s.nV % s.nK) fail("{}: {} value heads cannot share {} key heads", op, s.nV, s.nK);
  if (s.g.rows != s.T || s.g.cols != s.nV || s.beta.rows != s.T || s.beta.cols != s.nV)
    fail("{}: g {} and beta {} must be [{}, {}]", op, g.describe(), beta.describe(), s.T, s.nV);
  if (state.device != Device::cpu || state.dtype != DType::f32 || !state.is_contiguous() || state.ndim != 3 ||
      state.shape[0] != s.nV || state.shape[1] != s.dk || state.shape[2] != s.dv)
    fail("{}: state {} must be contiguous f32 [{}, {}, {}]", op, state.describe(), s.nV, s.dk, s.dv);
  s.state = state.ptr<float>();
  return s;
}

}  // namespace

void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act) {
  const char* op = "causal_conv1d";
  Matrix o = matrix_of(out, op, "out"), in = matrix_of(x, op, "x"), st = matrix_of(state, op, "state");
  const int64_t T = in.rows, C = in.cols, K = weight.cols();
  if (o.rows != T || o.cols != C) fail("{}: out {} does not match x {}", op, out.describe(), x.describe());
  if (weight.rows() != C || K < 1) fail("{}: weight {} must be [{}, kernel]", op, weight.describe(), C);
  if (st.rows != K - 1 || (K > 1 && st.cols != C))
    fail("{}: state {} must be [{}, {}]", op, state.describe(), K - 1, C);
  if (out.data == x.data) fail("{}: out must not alias x", op);
  if (act != Activation::silu) fail("{}: only silu follows the convolution", op);
  const std::vector<float> w = weight_values(weight, op);
  // Row j of the window [state; x] is state row j for j < K - 1, else x row j - (K - 1).
  auto window = [&](int64_t j) { return j < K - 1 ? st.row(j) : in.row(j - (K - 1)); };
  // transformers: F.conv1d over [state; x] (cross-correlation, taps oldest first), then silu.
  for (int64_t t = 0; t < T; ++t) {
    float* dst = o.row(t);
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * window(t + j)[c];
      dst[c] = silu(acc);
    }
  }
  // The new window: the last K - 1 rows of [state; x]. Ascending order reads each old state row
  // before it is overwritten (row r takes window row T + r >= r).
  for (int64_t r = 0; r < K - 1; ++r) std::memmove(st.row(r), window(T + r), C * sizeof(float));
}

void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                      const Tensor& dt_bias) {
  const char* op = "delta_rule_gates";
  Matrix go = matrix_of(g, op, "g"), bo = matrix_of(beta, op, "beta");
  Matrix ai = matrix_of(a, op, "a"), bi = matrix_of(b, op, "b");
  const int64_t T = ai.rows, nV = ai.cols;
  for (const Matrix* m : {&go, &bo, &bi})
    if (m->rows != T || m->cols != nV) fail("{}: g, beta, a and b must all be [{}, {}]", op, T, nV);
  if (a_log.numel() != nV || dt_bias.numel() != nV)
    fail("{}: A_log {} and dt_bias {} must have {} elements", op, a_log.describe(), dt_bias.describe(), nV);
  const std::vector<float> A = weight_values(a_log, op), dt = weight_values(dt_bias, op);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < nV; ++n) {
      // transformers: g = -A_log.float().exp() * softplus(a.float() + dt_bias); beta = b.sigmoid()
      const float a_tn = ai.row(t)[n], b_tn = bi.row(t)[n];
      go.row(t)[n] = -std::exp(A[n]) * softplus(a_tn + dt[n]);
      bo.row(t)[n] = sigmoid(b_tn);
    }
}

// transformers: torch_recurrent_gated_delta_rule.
void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const Tensor& beta, Tensor state, const DeltaRuleParams& p) {
  const DeltaRuleShapes s = check_delta_rule("gated_delta_rule", out, q, k, v, g, beta, state);
  const int64_t group = s.nV / s.nK, dk = s.dk, dv = s.dv;
  ThreadPool::global().parallel_for(s.nV, [&](int64_t begin, int64_t end) {
    std::vector<float> qn(dk), kn(dk), kv_mem(dv), delta(dv);
    for (int64_t n = begin; n < end; ++n) {
      float* S = s.state + n * dk * dv;  // S[i * dv + j], i < dk, j < dv
      const int64_t m = n / group;
      for (int64_t t = 0; t < s.T; ++t) {
        l2_normalize(s.q.at(t, m), qn.data(), dk, p.l2_eps, p.q_scale);
        l2_normalize(s.k.at(t, m), kn.data(), dk, p.l2_eps, 1.0f);
        const float* vt = s.v.at(t, n);
        const float decay = std::exp(s.g.row(t)[n]), b = s.beta.row(t)[n];
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
        std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) kv_mem[j] += S[i * dv + j] * kn[i];
        for (int64_t j = 0; j < dv; ++j) delta[j] = (vt[j] - kv_mem[j]) * b;
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += kn[i] * delta[j];
        float* o = s.out.at(t, n);
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) o[j] += S[i * dv + j] * qn[i];
      }
    }
  });
}

// transformers: torch_chunk_gated_delta_rule. Per value head and chunk of L <= C tokens, with
// cumulative log-decay gamma_i = sum_{s <= i} g_s and Gamma_ij = exp(gamma_i - gamma_j):
//   A = strict_lower((diag(beta) K K^T) * Gamma);  U = (I + A)^-1 diag(beta) V;
//   W = (I + A)^-1 diag(beta e^gamma) K;  V' = U - W S;
//   O = diag(e^gamma) Q S + lower((Q K^T) * Gamma) V';  S <- e^gamma_L S + (diag(e^(gamma_L - gamma)) K)^T V'.
// transformers pads the last chunk with zero keys, values and decays; they add exact zeros, so a
// short last chunk here computes the same numbers without them.
void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, Tensor state, const DeltaRuleParams& p) {
  const DeltaRuleShapes s = check_delta_rule("gated_delta_rule_chunked", out, q, k, v, g, beta, state);
  if (p.chunk < 1) fail("gated_delta_rule_chunked: chunk must be positive (got {})", p.chunk);
  const int64_t group = s.nV / s.nK, dk = s.dk, dv = s.dv, C = p.chunk;
  ThreadPool::global().parallel_for(s.nV, [&](int64_t begin, int64_t end) {
    std::vector<float> Q(C * dk), K(C * dk), U(C * dv), W(C * dk), A(C * C), gamma(C), vnew(C * dv);
    std::vector<float> S_next(dk * dv);
    for (int64_t n = begin; n < end; ++n) {
      float* S = s.state + n * dk * dv;
      const int64_t m = n / group;
      for (int64_t c0 = 0; c0 < s.T; c0 += C) {
        const int64_t L = std::min<int64_t>(C, s.T - c0);
        float cum = 0.0f;
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = c0 + i;
          l2_normalize(s.q.at(t, m), &Q[i * dk], dk, p.l2_eps, p.q_scale);
          l2_normalize(s.k.at(t, m), &K[i * dk], dk, p.l2_eps, 1.0f);
          gamma[i] = (cum += s.g.row(t)[n]);
        }
        // A[i][j] = (beta_i k_i . k_j) Gamma_ij for j < i
        for (int64_t i = 0; i < L; ++i) {
          const float b = s.beta.row(c0 + i)[n];
          for (int64_t j = 0; j < i; ++j) {
            float dot = 0.0f;
            for (int64_t d = 0; d < dk; ++d) dot += K[i * dk + d] * b * K[j * dk + d];
            A[i * C + j] = dot * std::exp(gamma[i] - gamma[j]);
          }
        }
        // Forward substitution with the unit lower-triangular (I + A): row i of the solution is
        // the right-hand side minus A[i][j] times the rows already solved.
        for (int64_t i = 0; i < L; ++i) {
          const float b = s.beta.row(c0 + i)[n];
          const float* vt = s.v.at(c0 + i, n);
          const float decay = std::exp(gamma[i]);
          for (int64_t j = 0; j < dv; ++j) U[i * dv + j] = vt[j] * b;
          for (int64_t d = 0; d < dk; ++d) W[i * dk + d] = K[i * dk + d] * b * decay;
          for (int64_t j = 0; j < i; ++j) {
            const float a = A[i * C + j];
            for (int64_t e = 0; e < dv; ++e) U[i * dv + e] -= a * U[j * dv + e];
            for (int64_t d = 0; d < dk; ++d) W[i * dk + d] -= a * W[j * dk + d];
          }
        }
        // V' = U - W S
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < dv; ++j) {
            float ws = 0.0f;
            for (int64_t d = 0; d < dk; ++d) ws += W[i * dk + d] * S[d * dv + j];
            vnew[i * dv + j] = U[i * dv + j] - ws;
          }
        // O = (e^gamma Q) S + lower((Q K^T) Gamma) V'
        for (int64_t i = 0; i < L; ++i) {
          float* o = s.out.at(c0 + i, n);
          const float decay = std::exp(gamma[i]);
          for (int64_t j = 0; j < dv; ++j) {
            float inter = 0.0f;
            for (int64_t d = 0; d < dk; ++d) inter += Q[i * dk + d] * decay * S[d * dv + j];
            o[j] = inter;
          }
          for (int64_t j = 0; j <= i; ++j) {
            float dot = 0.0f;
            for (int64_t d = 0; d < dk; ++d) dot += Q[i * dk + d] * K[j * dk + d];
            const float attn = dot * std::exp(gamma[i] - gamma[j]);
            for (int64_t e = 0; e < dv; ++e) o[e] += attn * vnew[j * dv + e];
          }
        }
        // S <- e^gamma_L S + (e^(gamma_L - gamma) K)^T V'
        const float chunk_decay = std::exp(gamma[L - 1]);
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t j = 0; j < dv; ++j) S_next[d * dv + j] = S[d * dv + j] * chunk_decay;
        for (int64_t i = 0; i < L; ++i) {
          const float decay = std::exp(gamma[L - 1] - gamma[i]);
          for (int64_t d = 0; d < dk; ++d) {
            const float kd = K[i * dk + d] * decay;
            for (int64_t j = 0; j < dv; ++j) S_next[d * dv + j] += kd * vnew[i * dv + j];
          }
        }
        std::memcpy(S, S_next.data(), dk * dv * sizeof(float));
      }
    }
  });
}

void sigmoid_gate(Tensor x, const Tensor& gate) {
  const char* op = "sigmoid_gate";
  Matrix xs = matrix_of(x, op, "x"), gs = matrix_of(gate, op, "gate");
  if (gs.rows != xs.rows || (gs.cols != xs.cols && gs.cols != 1))
    fail("{}: gate {} must be [{}, {}] or [{}, 1]", op, gate.describe(), xs.rows, xs.cols, xs.rows);
  const bool per_row = gs.cols == 1 && xs.cols != 1;
  for (int64_t r = 0; r < xs.rows; ++r) {
    float* dst = xs.row(r);
    const float* gr = gs.row(r);
    // transformers: attn_output * torch.sigmoid(gate); sigmoid(shared_expert_gate(x)) * shared
    for (int64_t i = 0; i < xs.cols; ++i) dst[i] = dst[i] * sigmoid(per_row ? gr[0] : gr[i]);
  }
}

}  // namespace fl::cpu
