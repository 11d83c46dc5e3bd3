// The CPU oracle: every op as plain loops with f32 accumulation, written to mirror the
// transformers code it replaces, line by line where the order of operations matters for
// rounding. Threads split independent output rows only, so results do not depend on the thread
// count. Other backends are tested against this file. The one exception to "plain loops" is
// matmul, which runs cpu_matmul's fastest available path (AVX2 where the CPU has it); that path
// is held to cpu_matmul's plain reference loop by tests/quant.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_linear_attention.h"
#include "backend/cpu/cpu_matmul.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl {
namespace {

// A tensor seen as rows of contiguous elements: all leading dims folded into `rows`.
struct Rows {
  char* base = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // bytes between rows
  DType dtype = DType::f32;

  template <typename T = float>
  T* row(int64_t r) const {
    return reinterpret_cast<T*>(base + r * stride);
  }
};

Rows as_rows(const Tensor& t, const char* op) {
  if (t.device != Device::cpu) fail("{}: tensor {} is not in host memory", op, t.describe());
  Rows r;
  r.base = static_cast<char*>(t.data);
  r.dtype = t.dtype;
  r.cols = t.cols();
  r.rows = t.rows();
  if (t.ndim <= 1) {
    r.stride = t.row_bytes();
    return r;
  }
  r.stride = t.stride[t.ndim - 2];
  if (!dtype_traits(t.dtype).quantized && t.stride[t.ndim - 1] != dtype_traits(t.dtype).block_bytes)
    fail("{}: innermost dimension of {} is not contiguous", op, t.describe());
  // Leading dims must fold: each stride equals the next one times its extent.
  for (int i = t.ndim - 3; i >= 0; --i)
    if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1])
      fail("{}: the leading dimensions of {} cannot be folded into rows", op, t.describe());
  return r;
}

Rows f32_rows(const Tensor& t, const char* op) {
  if (t.dtype != DType::f32) fail("{}: expected an f32 activation, got {}", op, t.describe());
  return as_rows(t, op);
}

void check_same_shape(const Rows& a, const Rows& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    fail("{}: shape mismatch ({} x {} vs {} x {})", op, a.rows, a.cols, b.rows, b.cols);
}

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
  void synchronize() override {}

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
    Rows o = f32_rows(out, "add"), x = f32_rows(a, "add"), y = f32_rows(b, "add");
    check_same_shape(o, x, "add");
    check_same_shape(o, y, "add");
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t i = 0; i < o.cols; ++i) o.row(r)[i] = x.row(r)[i] + y.row(r)[i];
  }

  void scale(Tensor x, float s) override {
    Rows r = f32_rows(x, "scale");
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j) r.row(i)[j] *= s;
  }

  void scale_by(Tensor x, const Tensor& scalar) override {
    if (scalar.numel() != 1) fail("scale_by: expected a 1-element scalar, got {}", scalar.describe());
    scale(x, load_vector(scalar)[0]);
  }

  void softcap(Tensor x, float cap) override {
    Rows r = f32_rows(x, "softcap");
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j) r.row(i)[j] = std::tanh(r.row(i)[j] / cap) * cap;
  }

  void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                 const Tensor& positions, const AttentionParams& p) override {
    const int64_t T = q.dim(0), D = p.head_dim;
    if (q.ndim != 3 || q.dim(1) != p.n_heads || q.dim(2) != D) fail("attention: q {} does not match the params", q.describe());
    if (k_new.ndim != 3 || k_new.dim(0) != T || k_new.dim(1) != p.n_kv_heads || k_new.dim(2) != D)
      fail("attention: k {} does not match the params", k_new.describe());
    if (positions.dtype != DType::i32 || positions.numel() != T) fail("attention: positions must be i32[{}]", T);
    if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads) fail("attention: {} heads over {} KV heads", p.n_heads, p.n_kv_heads);
    Rows o = f32_rows(out, "attention"), qr = f32_rows(q, "attention");
    Rows kn = f32_rows(k_new, "attention"), vn = f32_rows(v_new, "attention");
    Rows kc = as_rows(cache.k, "attention"), vc = as_rows(cache.v, "attention");
    const QuantFormat& kf = quant_format(cache.k.dtype);
    const QuantFormat& vf = quant_format(cache.v.dtype);
    const int64_t n_rows = cache.n_rows();
    const int32_t* pos = positions.ptr<int32_t>();
    const int64_t p0 = pos[0];
    for (int64_t t = 1; t < T; ++t)
      if (pos[t] != p0 + t) fail("attention: positions must be consecutive");
    const int group = p.n_heads / p.n_kv_heads;
    if (p.window > 0 && n_rows < std::min<int64_t>(p.window - 1, p0))
      fail("attention: a cache of {} rows cannot hold a window of {}", n_rows, p.window);
    if (p.window == 0 && p0 > n_rows) fail("attention: position {} is past the {}-row cache", p0, n_rows);

    ThreadPool::global().parallel_for(T * p.n_heads, [&](int64_t begin, int64_t end) {
      std::vector<float> scores, key(D), value(D), acc(D);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / p.n_heads, h = item % p.n_heads, g = h / group;
        const int64_t query_pos = p0 + t;
        const int64_t first = p.window > 0 ? std::max<int64_t>(0, query_pos - p.window + 1) : 0;
        const float* qv = qr.row(t * p.n_heads + h);
        auto load = [&](int64_t j, bool want_value, float* dst) {
          if (j >= p0) {
            const Rows& src = want_value ? vn : kn;
            std::memcpy(dst, src.row((j - p0) * p.n_kv_heads + g), D * sizeof(float));
          } else {
            const Rows& src = want_value ? vc : kc;
            (want_value ? vf : kf).dequantize_row(src.row<void>((j % n_rows) * p.n_kv_heads + g), dst, D);
          }
        };
        scores.resize(static_cast<size_t>(query_pos - first + 1));
        float max_score = -INFINITY;
        for (int64_t j = first; j <= query_pos; ++j) {
          load(j, false, key.data());
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qv[d] * key[d];
          float s = dot * p.scale;
          scores[j - first] = s;
          max_score = std::max(max_score, s);
        }
        float denom = 0.0f;
        for (float& s : scores) {
          s = std::exp(s - max_score);
          denom += s;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = first; j <= query_pos; ++j) {
          load(j, true, value.data());
          float w = scores[j - first] / denom;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * value[d];
        }
        std::memcpy(o.row(t * p.n_heads + h), acc.data(), D * sizeof(float));
      }
    });
  }

  void kv_write(const KvView& cache, const Tensor& k, const Tensor& v, const Tensor& positions) override {
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
    Rows o = f32_rows(out, "moe_experts"), in = f32_rows(x, "moe_experts"), w = f32_rows(weights, "moe_experts");
    Rows id = as_rows(ids, "moe_experts");
    check_same_shape(o, in, "moe_experts");
    if (gate_up.ndim != 3 || down.ndim != 3) fail("moe_experts: expert tensors must be 3-D");
    const int64_t E = gate_up.dim(0), I2 = gate_up.dim(1), H = in.cols, I = I2 / 2, K = id.cols;
    if (gate_up.dim(2) != H || down.dim(0) != E || down.dim(1) != H || down.dim(2) != I || I2 != 2 * I)
      fail("moe_experts: gate_up {} and down {} do not fit hidden size {}", gate_up.describe(), down.describe(), H);
    for (int64_t t = 0; t < o.rows; ++t) std::fill(o.row(t), o.row(t) + H, 0.0f);
    std::vector<float> hidden(I2), act_buf(I), y(H);
    for (int64_t t = 0; t < o.rows; ++t) {
      std::vector<std::pair<int32_t, float>> chosen;
      for (int64_t j = 0; j < K; ++j) chosen.emplace_back(id.row<int32_t>(t)[j], w.row(t)[j]);
      std::sort(chosen.begin(), chosen.end());
      for (auto [e, weight] : chosen) {
        if (e == -1) continue;  // another rank's expert (moe_keep_experts)
        if (e < 0 || e >= E) fail("moe_experts: expert id {} out of range [0, {})", e, E);
        Tensor xt = x.slice(t, t + 1);
        Tensor h_view = make_tensor(hidden.data(), DType::f32, {1, I2});
        matmul(h_view, xt, gate_up.select(e));
        for (int64_t i = 0; i < I; ++i)
          act_buf[i] = (act == Activation::gelu_tanh ? gelu_tanh(hidden[i]) : silu(hidden[i])) * hidden[I + i];
        Tensor a_view = make_tensor(act_buf.data(), DType::f32, {1, I});
        Tensor y_view = make_tensor(y.data(), DType::f32, {1, H});
        matmul(y_view, a_view, down.select(e));
        float* dst = o.row(t);
        for (int64_t i = 0; i < H; ++i) dst[i] += y[i] * weight;
      }
    }
  }

  // Gated DeltaNet ops: cpu_linear_attention.cpp.
  void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act) override {
    cpu::causal_conv1d(out, x, weight, state, act);
  }
  void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                        const Tensor& dt_bias) override {
    cpu::delta_rule_gates(g, beta, a, b, a_log, dt_bias);
  }
  void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    cpu::gated_delta_rule(out, q, k, v, g, beta, state, params);
  }
  void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    cpu::gated_delta_rule_chunked(out, q, k, v, g, beta, state, params);
  }
  void sigmoid_gate(Tensor x, const Tensor& gate) override { cpu::sigmoid_gate(x, gate); }

  void argmax(Tensor out_ids, const Tensor& logits) override {
    Rows l = f32_rows(logits, "argmax");
    if (out_ids.dtype != DType::i32 || out_ids.numel() != l.rows) fail("argmax: out_ids must be i32[{}]", l.rows);
    for (int64_t r = 0; r < l.rows; ++r) {
      const float* row = l.row(r);
      out_ids.ptr<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + l.cols) - row);
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace fl
