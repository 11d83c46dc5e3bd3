// The CPU oracle's Gated DeltaNet ops (backend/cpu/cpu_linear_attention.cpp) against independent
// double-precision references written from the spec (../shared/reference/models-gemma4-qwen35.md
// §3.3.1), not from the code under test: the conv as a sum over a zero-padded history, the delta
// rule in its closed form S_t = a_t (I - b_t k k^T) S_{t-1} + b_t k v^T. And the two forms of the
// delta rule against each other: chunked (prompts) and recurrent (decode) must leave the same
// state and outputs, whatever the chunk length and however the tokens are split across calls.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"

namespace fl {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return make_tensor(v.data(), DType::f32, shape);
}

// Columns [col0, col0 + heads * dim) of [T, width] rows as a strided [T, heads, dim] view.
Tensor heads_of(std::vector<float>& rows, int64_t T, int64_t width, int64_t col0, int64_t heads, int64_t dim) {
  Tensor t = make_tensor(rows.data() + col0, DType::f32, {T, heads, dim});
  t.stride = {width * 4, dim * 4, 4, 0};
  return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

float max_abs(const std::vector<float>& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

class LinearAttentionOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::mt19937 rng_{1234};
};

// ---- causal conv ----

TEST_F(LinearAttentionOps, CausalConvIsASumOverZeroPaddedHistoryAndCarriesItsWindow) {
  const int64_t T = 11, C = 5, K = 4;
  std::vector<float> x = randn(T * C, rng_), w = randn(C * K, rng_, 0.5f);
  // reference: out[t, c] = silu(sum_j w[c, j] x[t - 3 + j, c]), x[< 0] = 0
  std::vector<float> want(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - (K - 1) + j;
        if (s >= 0) acc += static_cast<double>(w[c * K + j]) * x[s * C + c];
      }
      want[t * C + c] = static_cast<float>(acc / (1 + std::exp(-acc)));
    }
  // whole sequence in one call, then split into calls of 1, 2, 5 and 3 tokens
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{T}, std::vector<int64_t>{1, 2, 5, 3}}) {
    std::vector<float> state((K - 1) * C, 0.0f), out(T * C, -1.0f);
    int64_t at = 0;
    for (int64_t n : split) {
      Tensor o = view(out, {T, C}).slice(at, at + n), in = view(x, {T, C}).slice(at, at + n);
      cpu_->causal_conv1d(o, in, view(w, {C, K}), view(state, {K - 1, C}), Activation::silu);
      at += n;
    }
    EXPECT_LE(max_abs_diff(out, want), 1e-5f) << "split into " << split.size() << " calls";
    // the window is the last K - 1 inputs
    std::vector<float> last(x.end() - (K - 1) * C, x.end());
    EXPECT_EQ(state, last);
  }
}

TEST_F(LinearAttentionOps, CausalConvRejectsBadShapesAndAliasing) {
  std::vector<float> x(3 * 4), out(3 * 4), w(4 * 4), state(3 * 4), small_state(2 * 4);
  EXPECT_THROW(cpu_->causal_conv1d(view(out, {3, 4}), view(x, {3, 4}), view(w, {4, 4}), view(small_state, {2, 4}),
                                   Activation::silu),
               Error);
  EXPECT_THROW(cpu_->causal_conv1d(view(x, {3, 4}), view(x, {3, 4}), view(w, {4, 4}), view(state, {3, 4}),
                                   Activation::silu),
               Error);
  EXPECT_THROW(cpu_->causal_conv1d(view(out, {3, 4}), view(x, {3, 4}), view(w, {4, 4}), view(state, {3, 4}),
                                   Activation::gelu_tanh),
               Error);
}

// ---- gates ----

TEST_F(LinearAttentionOps, GatesAreLogDecayAndSigmoid) {
  const int64_t T = 3, nV = 4;
  std::vector<float> a = {0.3f, -1.0f, 25.0f, 0.0f, 2.0f, -30.0f, 0.5f, 1.0f, -0.2f, 0.1f, 19.0f, -5.0f};
  std::vector<float> b = randn(T * nV, rng_), a_log = {0.1f, -2.0f, 1.5f, 0.0f}, dt = {0.5f, -0.5f, 0.0f, 2.0f};
  std::vector<float> g(T * nV), beta(T * nV);
  cpu_->delta_rule_gates(view(g, {T, nV}), view(beta, {T, nV}), view(a, {T, nV}), view(b, {T, nV}),
                         view(a_log, {nV}), view(dt, {nV}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < nV; ++n) {
      const double x = static_cast<double>(a[t * nV + n]) + dt[n];
      const double softplus = x > 20 ? x : std::log1p(std::exp(x));
      EXPECT_NEAR(g[t * nV + n], -std::exp(static_cast<double>(a_log[n])) * softplus, 1e-5 * (1 + std::fabs(x)));
      EXPECT_LE(g[t * nV + n], 0.0f);
      EXPECT_NEAR(beta[t * nV + n], 1.0 / (1.0 + std::exp(-static_cast<double>(b[t * nV + n]))), 1e-6);
    }
  // in place, as the model calls it
  std::vector<float> a2 = a, b2 = b;
  cpu_->delta_rule_gates(view(a2, {T, nV}), view(b2, {T, nV}), view(a2, {T, nV}), view(b2, {T, nV}),
                         view(a_log, {nV}), view(dt, {nV}));
  EXPECT_EQ(a2, g);
  EXPECT_EQ(b2, beta);
}

// ---- the delta rule ----

struct DeltaCase {
  int64_t T, nK, nV, dk, dv;
  std::vector<float> qkv;  // [T, 2 nK dk + nV dv]: q, k, v of every token side by side
  std::vector<float> g, beta, state;
  int64_t width() const { return 2 * nK * dk + nV * dv; }
};

DeltaCase make_case(std::mt19937& rng, int64_t T, int64_t nK, int64_t nV, int64_t dk, int64_t dv, bool warm_state) {
  DeltaCase c{T, nK, nV, dk, dv, {}, {}, {}, {}};
  c.qkv = randn(T * c.width(), rng);
  std::uniform_real_distribution<float> decay(-2.5f, -0.005f), strength(0.0f, 1.0f);
  c.g.resize(T * nV);
  c.beta.resize(T * nV);
  for (auto& x : c.g) x = decay(rng);
  for (auto& x : c.beta) x = strength(rng);
  c.state = warm_state ? randn(nV * dk * dv, rng, 0.3f) : std::vector<float>(nV * dk * dv, 0.0f);
  return c;
}

// Runs one form over tokens [t0, t1) of the case; returns the outputs [t1 - t0, nV, dv].
std::vector<float> run_form(Backend& b, DeltaCase& c, std::vector<float>& state, int64_t t0, int64_t t1, bool chunked,
                            int chunk = 64) {
  const int64_t n = t1 - t0, W = c.width();
  std::vector<float> out(n * c.nV * c.dv, NAN);
  Tensor all = make_tensor(c.qkv.data(), DType::f32, {c.T, W});
  std::vector<float> rows(all.ptr<float>() + t0 * W, all.ptr<float>() + t1 * W);
  Tensor q = heads_of(rows, n, W, 0, c.nK, c.dk), k = heads_of(rows, n, W, c.nK * c.dk, c.nK, c.dk),
         v = heads_of(rows, n, W, 2 * c.nK * c.dk, c.nV, c.dv);
  Tensor g = view(c.g, {c.T, c.nV}).slice(t0, t1), beta = view(c.beta, {c.T, c.nV}).slice(t0, t1);
  DeltaRuleParams p;
  p.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
  p.chunk = chunk;
  Tensor o = view(out, {n, c.nV, c.dv}), s = view(state, {c.nV, c.dk, c.dv});
  if (chunked)
    b.gated_delta_rule_chunked(o, q, k, v, g, beta, s, p);
  else
    b.gated_delta_rule(o, q, k, v, g, beta, s, p);
  return out;
}

// The spec's closed form in double: S_t = a (I - b k k^T) S_{t-1} + b k v^T; o_t = S_t^T q.
std::vector<float> reference(const DeltaCase& c, std::vector<double>& S) {
  const int64_t W = c.width(), group = c.nV / c.nK;
  std::vector<float> out(c.T * c.nV * c.dv);
  auto normalized = [&](const float* x, double scale) {
    double sum = 0;
    for (int64_t i = 0; i < c.dk; ++i) sum += static_cast<double>(x[i]) * x[i];
    std::vector<double> y(c.dk);
    for (int64_t i = 0; i < c.dk; ++i) y[i] = x[i] / std::sqrt(sum + 1e-6) * scale;
    return y;
  };
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t n = 0; n < c.nV; ++n) {
      const int64_t m = n / group;
      const float* row = c.qkv.data() + t * W;
      std::vector<double> q = normalized(row + m * c.dk, 1.0 / std::sqrt(static_cast<double>(c.dk)));
      std::vector<double> k = normalized(row + c.nK * c.dk + m * c.dk, 1.0);
      const float* v = row + 2 * c.nK * c.dk + n * c.dv;
      const double a = std::exp(static_cast<double>(c.g[t * c.nV + n])), b = c.beta[t * c.nV + n];
      double* s = S.data() + n * c.dk * c.dv;
      std::vector<double> ks(c.dv, 0.0);  // k^T S
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) ks[j] += k[i] * s[i * c.dv + j];
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) s[i * c.dv + j] = a * (s[i * c.dv + j] - b * k[i] * ks[j]) + b * k[i] * v[j];
      for (int64_t j = 0; j < c.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < c.dk; ++i) o += s[i * c.dv + j] * q[i];
        out[(t * c.nV + n) * c.dv + j] = static_cast<float>(o);
      }
    }
  return out;
}

TEST_F(LinearAttentionOps, RecurrentAndChunkedFormsMatchTheClosedFormRecurrence) {
  // nV = 2 nK: value heads 0,1 read key head 0 and 2,3 key head 1 (transformers' repeat_interleave)
  for (bool warm : {false, true})
    for (int64_t T : {1, 3, 64, 65, 150}) {
      SCOPED_TRACE(testing::Message() << "T " << T << (warm ? " warm state" : " zero state"));
      DeltaCase c = make_case(rng_, T, 2, 4, 16, 8, warm);
      std::vector<double> S(c.state.begin(), c.state.end());
      const std::vector<float> want = reference(c, S);
      const std::vector<float> want_state(S.begin(), S.end());
      for (bool chunked : {false, true}) {
        std::vector<float> state = c.state;
        const std::vector<float> got = run_form(*cpu_, c, state, 0, T, chunked);
        EXPECT_LE(max_abs_diff(got, want), 2e-5f * std::max(1.0f, max_abs(want))) << (chunked ? "chunked" : "recurrent");
        EXPECT_LE(max_abs_diff(state, want_state), 2e-5f * std::max(1.0f, max_abs(want_state)))
            << (chunked ? "chunked" : "recurrent") << " final state";
      }
    }
}

TEST_F(LinearAttentionOps, ChunkedFormDoesNotDependOnChunkLengthOrCallSplits) {
  DeltaCase c = make_case(rng_, 150, 1, 3, 32, 16, true);
  std::vector<float> state_ref = c.state;
  const std::vector<float> want = run_form(*cpu_, c, state_ref, 0, c.T, false);
  for (int chunk : {1, 5, 64, 200}) {
    std::vector<float> state = c.state;
    const std::vector<float> got = run_form(*cpu_, c, state, 0, c.T, true, chunk);
    EXPECT_LE(max_abs_diff(got, want), 2e-5f * std::max(1.0f, max_abs(want))) << "chunk " << chunk;
    EXPECT_LE(max_abs_diff(state, state_ref), 2e-5f * std::max(1.0f, max_abs(state_ref))) << "chunk " << chunk;
  }
  // a prompt fed as 100 + 1 + 49 tokens: chunked, recurrent, chunked
  std::vector<float> state = c.state, got = run_form(*cpu_, c, state, 0, 100, true);
  for (auto [t0, t1, chunked] : {std::tuple<int64_t, int64_t, bool>{100, 101, false}, {101, 150, true}}) {
    std::vector<float> more = run_form(*cpu_, c, state, t0, t1, chunked);
    got.insert(got.end(), more.begin(), more.end());
  }
  EXPECT_LE(max_abs_diff(got, want), 2e-5f * std::max(1.0f, max_abs(want)));
  EXPECT_LE(max_abs_diff(state, state_ref), 2e-5f * std::max(1.0f, max_abs(state_ref)));
}

TEST_F(LinearAttentionOps, DeltaRuleResultsDoNotDependOnTheThreadCount) {
  // heads are split over threads; each head's arithmetic is fixed, so repeated runs are bit-equal
  DeltaCase c = make_case(rng_, 70, 2, 8, 16, 16, true);
  std::vector<float> s1 = c.state, s2 = c.state;
  EXPECT_EQ(run_form(*cpu_, c, s1, 0, c.T, true), run_form(*cpu_, c, s2, 0, c.T, true));
  EXPECT_EQ(s1, s2);
}

TEST_F(LinearAttentionOps, DeltaRuleRejectsMismatchedShapes) {
  DeltaCase c = make_case(rng_, 4, 2, 3, 8, 8, false);  // 3 value heads cannot share 2 key heads
  std::vector<float> state = c.state;
  EXPECT_THROW(run_form(*cpu_, c, state, 0, 4, false), Error);
  // a state with the wrong number of value heads, and strided q/k/v with mismatched token counts
  DeltaCase ok = make_case(rng_, 4, 1, 2, 8, 8, false);
  const int64_t W = ok.width();
  Tensor q = heads_of(ok.qkv, 4, W, 0, 1, 8), k = heads_of(ok.qkv, 4, W, 8, 1, 8), v = heads_of(ok.qkv, 4, W, 16, 2, 8);
  std::vector<float> out(4 * 2 * 8), wrong_state(3 * 8 * 8), state2(2 * 8 * 8);
  EXPECT_THROW(cpu_->gated_delta_rule_chunked(view(out, {4, 2, 8}), q, k, v, view(ok.g, {4, 2}), view(ok.beta, {4, 2}),
                                              view(wrong_state, {3, 8, 8}), DeltaRuleParams{}),
               Error);
  EXPECT_THROW(cpu_->gated_delta_rule(view(out, {4, 2, 8}), q, k.slice(0, 3), v, view(ok.g, {4, 2}),
                                      view(ok.beta, {4, 2}), view(state2, {2, 8, 8}), DeltaRuleParams{}),
               Error);
  DeltaRuleParams no_chunk;
  no_chunk.chunk = 0;
  EXPECT_THROW(cpu_->gated_delta_rule_chunked(view(out, {4, 2, 8}), q, k, v, view(ok.g, {4, 2}), view(ok.beta, {4, 2}),
                                              view(state2, {2, 8, 8}), no_chunk),
               Error);
}

// ---- the decode step (gated_delta_net_rows) ----

// The default's contract: for each row its own states, the gates, the conv (silu), the delta rule,
// then per value head the RMS norm with a plain gain and silu(z). Against those ops called one row
// at a time on copies of the states: the same floats (the CPU default is the ops themselves). Two
// sequences (the rows form) and one (the gates beside the conv), 2 value heads per key head.
TEST_F(LinearAttentionOps, DecodeStepIsTheOpsInTurnForEachRow) {
  const int64_t nK = 2, nV = 4, dk = 8, dv = 6, K = 4, C = 2 * nK * dk + nV * dv;
  std::vector<float> taps = randn(C * K, rng_, 0.5f), a_log = randn(nV, rng_), dt_bias = randn(nV, rng_);
  std::vector<float> norm = randn(dv, rng_, 0.5f);
  DeltaNetStep step;
  Tensor taps_t = view(taps, {C, K}), a_log_t = view(a_log, {nV}), dt_t = view(dt_bias, {nV}),
         norm_t = view(norm, {dv});
  step.conv_taps = &taps_t, step.a_log = &a_log_t, step.dt_bias = &dt_t, step.norm = &norm_t;
  step.rule.q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t R : {2, 1}) {
    SCOPED_TRACE("rows=" + std::to_string(R));
    std::vector<float> qkv = randn(R * C, rng_, 2.0f), z = randn(R * nV * dv, rng_, 2.0f);
    std::vector<float> ab = randn(R * 2 * nV, rng_, 3.0f);
    std::vector<std::vector<float>> conv_states, delta_states;
    for (int64_t i = 0; i < R; ++i) {
      conv_states.push_back(randn((K - 1) * C, rng_));
      delta_states.push_back(randn(nV * dk * dv, rng_, 0.3f));
    }
    std::vector<std::vector<float>> conv_ref = conv_states, delta_ref = delta_states;
    // the op
    std::vector<float> out(R * nV * dv), conv(R * C), a(R * nV), b(R * nV);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t n = 0; n < nV; ++n) a[i * nV + n] = ab[i * 2 * nV + n], b[i * nV + n] = ab[i * 2 * nV + nV + n];
    std::vector<Tensor> conv_t, delta_t;
    for (int64_t i = 0; i < R; ++i) {
      conv_t.push_back(view(conv_states[i], {K - 1, C}));
      delta_t.push_back(view(delta_states[i], {nV, dk, dv}));
    }
    cpu_->gated_delta_net_rows(view(out, {R, nV, dv}), view(conv, {R, C}), view(qkv, {R, C}), view(z, {R, nV * dv}),
                               view(a, {R, nV}), view(b, {R, nV}), conv_t, delta_t, step);
    // the ops, a row at a time
    std::vector<float> want(R * nV * dv);
    for (int64_t i = 0; i < R; ++i) {
      std::vector<float> row(qkv.begin() + i * C, qkv.begin() + (i + 1) * C), conv_row(C), g(nV), beta(nV);
      std::vector<float> a_row(nV), b_row(nV), o(nV * dv),
          z_row(z.begin() + i * nV * dv, z.begin() + (i + 1) * nV * dv);
      for (int64_t n = 0; n < nV; ++n) a_row[n] = ab[i * 2 * nV + n], b_row[n] = ab[i * 2 * nV + nV + n];
      cpu_->causal_conv1d(view(conv_row, {1, C}), view(row, {1, C}), taps_t, view(conv_ref[i], {K - 1, C}),
                          Activation::silu);
      cpu_->delta_rule_gates(view(g, {1, nV}), view(beta, {1, nV}), view(a_row, {1, nV}), view(b_row, {1, nV}), a_log_t,
                             dt_t);
      cpu_->gated_delta_rule(view(o, {1, nV, dv}), heads_of(conv_row, 1, C, 0, nK, dk),
                             heads_of(conv_row, 1, C, nK * dk, nK, dk), heads_of(conv_row, 1, C, 2 * nK * dk, nV, dv),
                             view(g, {1, nV}), view(beta, {1, nV}), view(delta_ref[i], {nV, dk, dv}), step.rule);
      cpu_->rms_norm(view(o, {nV, dv}), view(o, {nV, dv}), &norm_t, NormGain::weight, step.norm_eps);
      cpu_->gated_activation(view(o, {nV, dv}), view(z_row, {nV, dv}), view(o, {nV, dv}), Activation::silu);
      std::copy(o.begin(), o.end(), want.begin() + i * nV * dv);
    }
    EXPECT_EQ(out, want);
    EXPECT_EQ(conv_states, conv_ref);
    EXPECT_EQ(delta_states, delta_ref);
    EXPECT_GT(max_abs(out), 0.0f);
  }
}

TEST_F(LinearAttentionOps, DecodeStepRejectsMismatchedShapes) {
  const int64_t nK = 1, nV = 2, dk = 4, dv = 4, K = 4, C = 2 * nK * dk + nV * dv;
  std::vector<float> taps(C * K), a_log(nV), dt_bias(nV), norm(dv), qkv(C), z(nV * dv), a(nV), b(nV);
  std::vector<float> out(nV * dv), conv(C), conv_state((K - 1) * C), delta_state(nV * dk * dv), wide(C + 2);
  Tensor taps_t = view(taps, {C, K}), a_log_t = view(a_log, {nV}), dt_t = view(dt_bias, {nV}),
         norm_t = view(norm, {dv});
  DeltaNetStep step;
  step.conv_taps = &taps_t, step.a_log = &a_log_t, step.dt_bias = &dt_t, step.norm = &norm_t;
  const Tensor conv_states[] = {view(conv_state, {K - 1, C})}, delta_states[] = {view(delta_state, {nV, dk, dv})};
  auto run = [&](const Tensor& qkv_t, const Tensor& out_t, std::span<const Tensor> cs, std::span<const Tensor> ds,
                 const DeltaNetStep& s) {
    cpu_->gated_delta_net_rows(out_t, view(conv, {1, C}), qkv_t, view(z, {1, nV * dv}), view(a, {1, nV}),
                               view(b, {1, nV}), cs, ds, s);
  };
  EXPECT_NO_THROW(run(view(qkv, {1, C}), view(out, {1, nV, dv}), conv_states, delta_states, step));
  // qkv not 2 nK dk + nV dv wide; out of another shape; a conv state without its delta state
  EXPECT_THROW(run(view(wide, {1, C + 2}), view(out, {1, nV, dv}), conv_states, delta_states, step), Error);
  EXPECT_THROW(run(view(qkv, {1, C}), view(out, {1, dv, nV}), conv_states, delta_states, step), Error);
  EXPECT_THROW(run(view(qkv, {1, C}), view(out, {1, nV, dv}), conv_states, {}, step), Error);
  DeltaNetStep no_norm = step;
  no_norm.norm = nullptr;
  EXPECT_THROW(run(view(qkv, {1, C}), view(out, {1, nV, dv}), conv_states, delta_states, no_norm), Error);
}

// ---- sigmoid gate ----

TEST_F(LinearAttentionOps, SigmoidGateIsElementwiseOrPerRow) {
  std::vector<float> x = randn(6, rng_), gate = randn(6, rng_), row_gate = {0.5f, -3.0f};
  std::vector<float> y = x;
  cpu_->sigmoid_gate(view(y, {2, 3}), view(gate, {2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(y[i], x[i] / (1 + std::exp(-gate[i])), 1e-6);
  y = x;
  cpu_->sigmoid_gate(view(y, {2, 3}), view(row_gate, {2, 1}));
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(y[i], x[i] / (1 + std::exp(-row_gate[i / 3])), 1e-6);
  std::vector<float> bad(4);
  EXPECT_THROW(cpu_->sigmoid_gate(view(y, {2, 3}), view(bad, {2, 2})), Error);
}

}  // namespace
}  // namespace fl
