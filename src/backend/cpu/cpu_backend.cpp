// The CPU oracle: every op as plain loops with f32 accumulation, written to mirror the
// transformers code it replaces, line by line where the order of operations matters for
// rounding. Threads split independent output rows only, so results do not depend on the thread
// count. Other backends are tested against this file. The exceptions to "plain loops" are matmul,
// which runs cpu_matmul's fastest available path (AVX2 where the CPU has it), and attention, which
// runs cpu_attention's grouped path (a KV head's query heads together); tests/quant holds each to
// its plain reference loop.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_linear_attention.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_rows.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl {
namespace {

using cpu::as_rows;
using cpu::check_same_shape;
using cpu::f32_rows;
using cpu::Rows;

// A 1-D weight (norm gain, scale vector) as floats.
std::vector<float> load_vector(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  Rows r = as_rows(t, "load_vector");
  const QuantFormat& f = quant_format(t.dtype);
  for (int64_t i = 0; i < r.rows; ++i) f.dequantize_row(r.row<void>(i), out.data() + i * r.cols, r.cols);
  return out;
}

float gelu_tanh(float x) {
  // torch.nn.functional.gelu(approximate="tanh"), in f32
  const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float kKappa = 0.044715f;
  float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

class CpuBuffer final : public DeviceBuffer {
 public:
  explicit CpuBuffer(size_t bytes) : buffer_(bytes) {}
  void* data() const override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  HostBuffer buffer_;
};

class CpuBackend final : public Backend {
  // Wall time of one op while profiling (`fireline bench --profile`). CPU ops run to completion
  // on the calling thread, so the clock around a call is the op's time. An op called inside a
  // timed op (moe_experts' matmuls, scale_by's scale) counts in the outer op only. `bytes()` is
  // what the op must move at least (weights, KV rows, activations), as the CUDA backend counts;
  // it is evaluated only while profiling and only after the op returned, so it sees operands the
  // op has validated (an op that throws is not recorded).
  template <typename Bytes>
  class OpClock {
   public:
    OpClock(CpuBackend& backend, const char* op, Bytes bytes)
        : backend_(backend), op_(op), bytes_(bytes), exceptions_(std::uncaught_exceptions()) {
      if (!backend_.profiling_) return;
      outermost_ = backend_.clock_depth_++ == 0;
      if (outermost_) start_ = std::chrono::steady_clock::now();
    }
    ~OpClock() {
      if (!backend_.profiling_) return;
      --backend_.clock_depth_;
      if (!outermost_ || std::uncaught_exceptions() > exceptions_) return;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
      auto& ops = backend_.profile_;
      auto it = std::find_if(ops.begin(), ops.end(), [&](const OpProfile& p) { return p.op == op_; });
      if (it == ops.end()) it = ops.insert(ops.end(), OpProfile{op_});
      it->calls += 1;
      it->ms += ms;
      it->bytes += static_cast<double>(bytes_());
    }
    OpClock(const OpClock&) = delete;
    OpClock& operator=(const OpClock&) = delete;

   private:
    CpuBackend& backend_;
    const char* op_;
    Bytes bytes_;
    int exceptions_;
    bool outermost_ = false;
    std::chrono::steady_clock::time_point start_;
  };

 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  // MemAvailable: what the kernel can give without swapping (a KV cache past it was zero-filled
  // into an OOM kill, with no message). Unknown without /proc.
  std::optional<size_t> free_memory() const override {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    while (std::getline(meminfo, line)) {
      unsigned long long kib = 0;
      if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return static_cast<size_t>(kib) * 1024;
    }
    return std::nullopt;
  }
  Tensor upload_weight(const Tensor& host) override { return host; }
  void copy_to_device(Tensor dst, const void* src) override { std::memcpy(dst.data, src, dst.nbytes()); }
  void copy_to_host(void* dst, const Tensor& src) override { std::memcpy(dst, src.data, src.nbytes()); }
  void copy_on_device(Tensor dst, const Tensor& src) override {
    check_copy_on_device(dst, src);
    std::memmove(dst.data, src.data, static_cast<size_t>(src.nbytes()));
  }
  void synchronize() override {}

  // Turning profiling on or off between ops only: a clock open across the switch would unbalance
  // the nesting depth (bench switches it outside forward calls).
  void set_profiling(bool on) override {
    profiling_ = on;
    clock_depth_ = 0;
  }
  std::vector<OpProfile> take_profile() override { return std::exchange(profile_, {}); }

  std::unique_ptr<CapturedSteps> capture(const std::function<void()>& body) override {
    struct Rerun final : CapturedSteps {
      std::function<void()> body;
      void replay() override { body(); }
    };
    auto steps = std::make_unique<Rerun>();
    steps->body = body;
    return steps;
  }

  void embed(Tensor out, const Tensor& table, const Tensor& ids, float scale) override {
    OpClock clock(*this, "embed", [&] { return ids.numel() * (table.row_bytes() + 4.0 * table.cols()); });
    Rows o = f32_rows(out, "embed");
    Rows tab = as_rows(table, "embed");
    if (ids.dtype != DType::i32 || ids.numel() != o.rows) fail("embed: ids must be i32[{}]", o.rows);
    if (tab.cols != o.cols) fail("embed: table width {} != output width {}", tab.cols, o.cols);
    const QuantFormat& f = quant_format(table.dtype);
    const int32_t* id = ids.ptr<int32_t>();
    for (int64_t t = 0; t < o.rows; ++t) {
      if (id[t] < 0 || id[t] >= tab.rows) fail("embed: token id {} is outside the vocabulary [0, {})", id[t], tab.rows);
      float* dst = o.row(t);
      f.dequantize_row(tab.row<void>(id[t]), dst, o.cols);
      for (int64_t i = 0; i < o.cols; ++i) dst[i] *= scale;
    }
  }

  void rms_norm(Tensor out, const Tensor& x, const Tensor* weight, NormGain gain, float eps) override {
    OpClock clock(*this, "rms_norm", [&] { return 8.0 * x.numel(); });
    Rows o = f32_rows(out, "rms_norm"), in = f32_rows(x, "rms_norm");
    check_same_shape(o, in, "rms_norm");
    std::vector<float> w;
    if (gain != NormGain::none) {
      if (!weight || weight->numel() != in.cols) fail("rms_norm: gain weight must have {} elements", in.cols);
      w = load_vector(*weight);
      if (gain == NormGain::one_plus_weight)
        for (float& v : w) v = 1.0f + v;
    }
    for (int64_t r = 0; r < in.rows; ++r) {
      const float* src = in.row(r);
      float* dst = o.row(r);
      float sum_sq = 0.0f;
      for (int64_t i = 0; i < in.cols; ++i) sum_sq += src[i] * src[i];
      // transformers: x * pow(mean(x^2) + eps, -0.5), then * weight
      float inv = std::pow(sum_sq / static_cast<float>(in.cols) + eps, -0.5f);
      for (int64_t i = 0; i < in.cols; ++i) {
        float v = src[i] * inv;
        dst[i] = w.empty() ? v : v * w[i];
      }
    }
  }

  void matmul(Tensor out, const Tensor& x, const Tensor& weight) override {
    OpClock clock(*this, "matmul", [&] { return weight_bytes(weight) + 4.0 * (x.numel() + out.numel()); });
    Rows o = f32_rows(out, "matmul"), in = f32_rows(x, "matmul");
    Rows w = as_rows(weight, "matmul");
    if (in.cols != w.cols || o.cols != w.rows || o.rows != in.rows)
      fail("matmul: cannot multiply x {} by weight {} into {}", x.describe(), weight.describe(), out.describe());
    // Packed rows are consumed directly, one group at a time (cpu_matmul.h); its reference
    // path is the plain dequantize-row-then-dot loop, and tests hold the fast paths to it.
    MatmulOperands op;
    op.w_type = weight.dtype;
    op.w = w.base;
    op.w_stride = w.stride;
    op.M = w.rows;
    op.K = in.cols;
    op.x = in.row(0);
    op.x_stride = in.stride;
    op.T = in.rows;
    op.out = o.row(0);
    op.out_stride = o.stride;
    matmul_rows(op);
  }

  void rope(Tensor x, const Tensor& positions, const Tensor& inv_freq) override {
    OpClock clock(*this, "rope", [&] { return 8.0 * x.numel(); });
    if (x.ndim != 3) fail("rope: expected x [T, heads, D], got {}", x.describe());
    Rows r = f32_rows(x, "rope");
    const int64_t T = x.dim(0), heads = x.dim(1), D = x.dim(2);
    if (positions.dtype != DType::i32 || positions.numel() != T) fail("rope: positions must be i32[{}]", T);
    if (inv_freq.dtype != DType::f32 || inv_freq.numel() * 2 > D) fail("rope: inv_freq must be f32[<= {}]", D / 2);
    const int64_t half = inv_freq.numel();
    const float* freq = inv_freq.ptr<float>();
    const int32_t* pos = positions.ptr<int32_t>();
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = 0; t < T; ++t) {
      // transformers: freqs = inv_freq * position in f32, then cos/sin in f32
      for (int64_t i = 0; i < half; ++i) {
        float angle = freq[i] * static_cast<float>(pos[t]);
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = r.row(t * heads + h);
        for (int64_t i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          v[i] = a * cos_v[i] - b * sin_v[i];
          v[i + half] = b * cos_v[i] + a * sin_v[i];
        }
      }
    }
  }

  void gated_activation(Tensor out, const Tensor& gate, const Tensor& up, Activation act) override {
    OpClock clock(*this, "gated_activation", [&] { return 12.0 * out.numel(); });
    Rows o = f32_rows(out, "gated_activation"), g = f32_rows(gate, "gated_activation"), u = f32_rows(up, "gated_activation");
    check_same_shape(o, g, "gated_activation");
    check_same_shape(o, u, "gated_activation");
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t i = 0; i < o.cols; ++i) {
        float a = g.row(r)[i];
        o.row(r)[i] = (act == Activation::gelu_tanh ? gelu_tanh(a) : silu(a)) * u.row(r)[i];
      }
  }

  void add(Tensor out, const Tensor& a, const Tensor& b) override {
    OpClock clock(*this, "add/scale/softcap", [&] { return 12.0 * out.numel(); });
    Rows o = f32_rows(out, "add"), x = f32_rows(a, "add"), y = f32_rows(b, "add");
    check_same_shape(o, x, "add");
    check_same_shape(o, y, "add");
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t i = 0; i < o.cols; ++i) o.row(r)[i] = x.row(r)[i] + y.row(r)[i];
  }

  void scale(Tensor x, float s) override {
    OpClock clock(*this, "add/scale/softcap", [&] { return 8.0 * x.numel(); });
    Rows r = f32_rows(x, "scale");
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j) r.row(i)[j] *= s;
  }

  void scale_by(Tensor x, const Tensor& scalar) override {
    OpClock clock(*this, "add/scale/softcap", [&] { return 8.0 * x.numel(); });
    if (scalar.numel() != 1) fail("scale_by: expected a 1-element scalar, got {}", scalar.describe());
    scale(x, load_vector(scalar)[0]);
  }

  void softcap(Tensor x, float cap) override {
    OpClock clock(*this, "add/scale/softcap", [&] { return 8.0 * x.numel(); });
    Rows r = f32_rows(x, "softcap");
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j) r.row(i)[j] = std::tanh(r.row(i)[j] / cap) * cap;
  }

  void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                 const Tensor& positions, const AttentionParams& p) override {
    OpClock clock(*this, "attention", [&] { return attention_bytes(q, cache, positions, p); });
    cpu::attention(out, q, k_new, v_new, cache, positions, p, cpu::AttentionPath::grouped, ThreadPool::global());
  }

  void kv_write(const KvView& cache, const Tensor& k, const Tensor& v, const Tensor& positions) override {
    OpClock clock(*this, "kv_write", [&] { return 4.0 * (k.numel() + v.numel()); });
    Rows kr = f32_rows(k, "kv_write"), vr = f32_rows(v, "kv_write");
    Rows kc = as_rows(cache.k, "kv_write"), vc = as_rows(cache.v, "kv_write");
    const int64_t T = k.dim(0), n_kv = k.dim(1), D = k.dim(2);
    if (cache.k.dim(1) != n_kv || cache.k.dim(2) != D) fail("kv_write: k {} does not fit cache {}", k.describe(), cache.k.describe());
    if (positions.numel() != T) fail("kv_write: positions must be i32[{}]", T);
    const QuantFormat& kf = quant_format(cache.k.dtype);
    const QuantFormat& vf = quant_format(cache.v.dtype);
    const int32_t* pos = positions.ptr<int32_t>();
    const int64_t n_rows = cache.n_rows();
    for (int64_t t = 1; t < T; ++t)
      if (pos[t] != pos[0] + t) fail("kv_write: positions must be consecutive");
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = pos[t] % n_rows;
      for (int64_t h = 0; h < n_kv; ++h) {
        kf.quantize_row(kr.row(t * n_kv + h), kc.row<void>(row * n_kv + h), D);
        vf.quantize_row(vr.row(t * n_kv + h), vc.row<void>(row * n_kv + h), D);
      }
    }
  }

  void moe_route(Tensor weights, Tensor ids, const Tensor& logits, const Tensor* per_expert_scale) override {
    OpClock clock(*this, "moe_route", [&] { return 4.0 * logits.numel(); });
    Rows l = f32_rows(logits, "moe_route"), w = f32_rows(weights, "moe_route");
    if (ids.dtype != DType::i32) fail("moe_route: ids must be i32");
    Rows id = as_rows(ids, "moe_route");
    const int64_t T = l.rows, E = l.cols, K = w.cols;
    if (w.rows != T || id.rows != T || id.cols != K || K > E) fail("moe_route: bad shapes");
    std::vector<float> scale_e;
    if (per_expert_scale) {
      if (per_expert_scale->numel() != E) fail("moe_route: per_expert_scale must have {} elements", E);
      scale_e = load_vector(*per_expert_scale);
    }
    std::vector<float> prob(E);
    std::vector<int32_t> order(E);
    for (int64_t t = 0; t < T; ++t) {
      const float* logit = l.row(t);
      float max_logit = *std::max_element(logit, logit + E);
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) sum += (prob[e] = std::exp(logit[e] - max_logit));
      for (int64_t e = 0; e < E; ++e) prob[e] /= sum;
      std::iota(order.begin(), order.end(), 0);
      // highest probability first; ties keep the lower expert id first
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
      float top_sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) top_sum += prob[order[j]];
      for (int64_t j = 0; j < K; ++j) {
        float v = prob[order[j]] / top_sum;
        if (!scale_e.empty()) v *= scale_e[order[j]];
        w.row(t)[j] = v;
        id.row<int32_t>(t)[j] = order[j];
      }
    }
  }

  void moe_experts(Tensor out, const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids,
                   const Tensor& weights, Activation act) override {
    OpClock clock(*this, "moe_experts", [&] { return moe_expert_bytes(gate_up, down, ids) + 8.0 * x.numel(); });
    Rows o = f32_rows(out, "moe_experts"), in = f32_rows(x, "moe_experts"), w = f32_rows(weights, "moe_experts");
    Rows id = as_rows(ids, "moe_experts");
    check_same_shape(o, in, "moe_experts");
    if (gate_up.ndim != 3 || down.ndim != 3) fail("moe_experts: expert tensors must be 3-D");
    const int64_t E = gate_up.dim(0), I2 = gate_up.dim(1), H = in.cols, I = I2 / 2, K = id.cols;
    if (gate_up.dim(2) != H || down.dim(0) != E || down.dim(1) != H || down.dim(2) != I || I2 != 2 * I)
      fail("moe_experts: gate_up {} and down {} do not fit hidden size {}", gate_up.describe(), down.describe(), H);
    for (int64_t t = 0; t < o.rows; ++t) std::fill(o.row(t), o.row(t) + H, 0.0f);
    // The pairs grouped by expert, so that each expert's tokens are multiplied together and its
    // weights read once per call, not once per pair. Experts are taken in ascending id, so each
    // token's terms are added in the same order as its pairs taken one by one (sorted by id;
    // top-k routing never lists an expert twice for a token), and matmul computes a token's row
    // alike whatever other tokens share it: a token's result is the same alone or in a batch.
    std::vector<std::vector<std::pair<int64_t, float>>> tokens_of(static_cast<size_t>(E));  // (token, weight)
    for (int64_t t = 0; t < o.rows; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = id.row<int32_t>(t)[j];
        if (e == -1) continue;  // another rank's expert (moe_keep_experts)
        if (e < 0 || e >= E) fail("moe_experts: expert id {} out of range [0, {})", e, E);
        tokens_of[e].emplace_back(t, w.row(t)[j]);
      }
    std::vector<float> xs, hidden, act_buf, y;
    for (int64_t e = 0; e < E; ++e) {
      const auto& pairs = tokens_of[e];
      const int64_t n = static_cast<int64_t>(pairs.size());
      if (n == 0) continue;
      xs.resize(static_cast<size_t>(n * H));
      hidden.resize(static_cast<size_t>(n * I2));
      act_buf.resize(static_cast<size_t>(n * I));
      y.resize(static_cast<size_t>(n * H));
      for (int64_t i = 0; i < n; ++i) std::memcpy(xs.data() + i * H, in.row(pairs[i].first), H * sizeof(float));
      matmul(make_tensor(hidden.data(), DType::f32, {n, I2}), make_tensor(xs.data(), DType::f32, {n, H}),
             gate_up.select(e));  // [n, 2I]: gate then up
      for (int64_t i = 0; i < n; ++i) {
        const float* h = hidden.data() + i * I2;
        float* a = act_buf.data() + i * I;
        for (int64_t c = 0; c < I; ++c) a[c] = (act == Activation::gelu_tanh ? gelu_tanh(h[c]) : silu(h[c])) * h[I + c];
      }
      matmul(make_tensor(y.data(), DType::f32, {n, H}), make_tensor(act_buf.data(), DType::f32, {n, I}),
             down.select(e));  // [n, H]
      for (int64_t i = 0; i < n; ++i) {
        float* dst = o.row(pairs[i].first);
        const float* src = y.data() + i * H;
        const float weight = pairs[i].second;
        for (int64_t c = 0; c < H; ++c) dst[c] += src[c] * weight;
      }
    }
  }

  // Gated DeltaNet ops: cpu_linear_attention.cpp.
  void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act) override {
    OpClock clock(*this, "causal_conv1d", [&] { return 8.0 * x.numel() + 8.0 * state.numel() + weight_bytes(weight); });
    cpu::causal_conv1d(out, x, weight, state, act);
  }
  void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                        const Tensor& dt_bias) override {
    OpClock clock(*this, "delta_rule_gates", [&] { return 16.0 * a.numel(); });
    cpu::delta_rule_gates(g, beta, a, b, a_log, dt_bias);
  }
  void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    OpClock clock(*this, "gated_delta_rule",
                  [&] { return 4.0 * (q.numel() + k.numel() + 2.0 * v.numel()) + 8.0 * state.numel(); });
    cpu::gated_delta_rule(out, q, k, v, g, beta, state, params);
  }
  void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    OpClock clock(*this, "gated_delta_rule",
                  [&] { return 4.0 * (q.numel() + k.numel() + 2.0 * v.numel()) + 8.0 * state.numel(); });
    cpu::gated_delta_rule_chunked(out, q, k, v, g, beta, state, params);
  }
  void sigmoid_gate(Tensor x, const Tensor& gate) override {
    OpClock clock(*this, "sigmoid_gate", [&] { return 8.0 * x.numel() + 4.0 * gate.numel(); });
    cpu::sigmoid_gate(x, gate);
  }

  void argmax(Tensor out_ids, const Tensor& logits) override {
    OpClock clock(*this, "argmax", [&] { return 4.0 * logits.numel(); });
    Rows l = f32_rows(logits, "argmax");
    if (out_ids.dtype != DType::i32 || out_ids.numel() != l.rows) fail("argmax: out_ids must be i32[{}]", l.rows);
    for (int64_t r = 0; r < l.rows; ++r) {
      const float* row = l.row(r);
      out_ids.ptr<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + l.cols) - row);
    }
  }

 private:
  // Bytes of a (possibly strided) weight: its rows' packed bytes, not the gaps between them.
  static double weight_bytes(const Tensor& w) { return static_cast<double>(w.rows()) * w.row_bytes(); }
  // The KV rows the T queries read (each once per KV head: a kernel sharing them between the
  // heads of a group needs no more) plus q and out.
  static double attention_bytes(const Tensor& q, const KvView& cache, const Tensor& positions,
                                const AttentionParams& p) {
    if (positions.numel() == 0 || cache.k.ndim != 3) return 8.0 * q.numel();
    const int64_t end = positions.ptr<int32_t>()[0] + positions.numel();  // positions past the last query
    const int64_t rows = std::min<int64_t>(p.window > 0 ? p.window : end, std::min(end, cache.n_rows()));
    return rows * cache.k.dim(1) *
               (fl::row_bytes(cache.k.dtype, cache.k.dim(2)) + fl::row_bytes(cache.v.dtype, cache.v.dim(2))) +
           8.0 * q.numel();
  }
  // The experts the pairs select, each counted once (a kernel reading an expert once for all its
  // tokens needs no more); ids of -1 are other ranks' pairs.
  static double moe_expert_bytes(const Tensor& gate_up, const Tensor& down, const Tensor& ids) {
    if (gate_up.ndim != 3 || down.ndim != 3 || ids.dtype != DType::i32) return 0.0;
    const int64_t E = gate_up.dim(0);
    std::vector<char> used(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int32_t e = ids.ptr<int32_t>()[i];
      if (e >= 0 && e < E) used[e] = 1;
    }
    const double per_expert = static_cast<double>(gate_up.dim(1)) * fl::row_bytes(gate_up.dtype, gate_up.dim(2)) +
                              static_cast<double>(down.dim(1)) * fl::row_bytes(down.dtype, down.dim(2));
    return per_expert * std::count(used.begin(), used.end(), 1);
  }

  bool profiling_ = false;
  int clock_depth_ = 0;
  std::vector<OpProfile> profile_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace fl
