// The Backend interface's default op implementations: composites of other ops, or the host
// route, for backends without a faster form.
#include "backend/backend.h"

#include <vector>

#include "core/error.h"

namespace fl {

void check_copy_on_device(const Tensor& dst, const Tensor& src) {
  if (!dst.is_contiguous() || !src.is_contiguous() || dst.nbytes() != src.nbytes())
    fail("copy_on_device: {} and {} must be contiguous and of one size", dst.describe(), src.describe());
}

void Backend::copy_on_device(Tensor dst, const Tensor& src) {
  check_copy_on_device(dst, src);
  std::vector<uint8_t> bytes(static_cast<size_t>(src.nbytes()));
  copy_to_host(bytes.data(), src);
  copy_to_device(dst, bytes.data());
}

void Backend::matmul_group(std::span<const Tensor> outs, const Tensor& x, std::span<const Tensor* const> weights) {
  if (outs.size() != weights.size()) fail("matmul_group: {} outputs for {} weights", outs.size(), weights.size());
  for (size_t i = 0; i < outs.size(); ++i) matmul(outs[i], x, *weights[i]);
}

void Backend::matmul_gated(Tensor out, Tensor up, const Tensor& x, const Tensor& gate_w, const Tensor& up_w,
                           Activation act) {
  const Tensor outs[] = {out, up};
  const Tensor* weights[] = {&gate_w, &up_w};
  matmul_group(outs, x, weights);
  gated_activation(out, out, up, act);
}

void Backend::rms_norm_rope_group(std::span<const HeadNorm> parts, float eps, const Tensor& positions,
                                  const Tensor& inv_freq) {
  if (parts.empty() || parts.size() > 4) fail("rms_norm_rope_group: {} parts (1 to 4)", parts.size());
  for (const HeadNorm& p : parts) {
    if (p.source) {  // (out of place: the norm into x, then RoPE there)
      rms_norm(p.x, *p.source, p.weight, p.gain, eps);
      if (p.rope) rope(p.x, positions, inv_freq);
    } else if (p.rope) {
      rms_norm_rope(p.x, p.weight, p.gain, eps, positions, inv_freq);
    } else {
      rms_norm(p.x, p.x, p.weight, p.gain, eps);
    }
  }
}

void Backend::check_residual_update(const Tensor& h, const ResidualUpdate& u) {
  if (u.terms.empty() || u.terms.size() > 2 || u.norms.size() > 4)
    fail("residual_update: {} terms (1 or 2) and {} norms (at most 4)", u.terms.size(), u.norms.size());
  for (const ResidualTerm& t : u.terms)
    if (t.x.data == h.data) fail("residual_update: a term is h itself");
  for (const StreamNorm& n : u.norms) {
    if (n.out.data == h.data) fail("residual_update: a norm would overwrite h");
    for (const ResidualTerm& t : u.terms)
      if (n.out.data == t.x.data) fail("residual_update: a norm would overwrite a term");
  }
}

void Backend::residual_update(Tensor h, const ResidualUpdate& u) {
  check_residual_update(h, u);
  for (const ResidualTerm& t : u.terms)
    if (t.normed) rms_norm(t.x, t.x, t.weight, t.gain, u.eps);
  const Tensor& branch = u.terms[0].x;
  for (size_t i = 1; i < u.terms.size(); ++i) add(branch, branch, u.terms[i].x);
  if (u.merge_weight) rms_norm(branch, branch, u.merge_weight, u.merge_gain, u.eps);
  add(h, h, branch);
  if (u.layer_scalar) scale_by(h, *u.layer_scalar);
  for (const StreamNorm& n : u.norms) {
    rms_norm(n.out, h, n.weight, n.gain, u.eps);
    if (n.scale != 1.0f) scale(n.out, n.scale);
  }
}

void Backend::attention_rows(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                             std::span<const KvView> caches, const Tensor& positions, const AttentionParams& params) {
  const int64_t B = static_cast<int64_t>(caches.size());
  if (q.ndim < 1 || q.dim(0) != B || out.dim(0) != B || k_new.dim(0) != B || v_new.dim(0) != B || positions.numel() != B)
    fail("attention_rows: {} caches for q {}, k {}, positions {}", B, q.describe(), k_new.describe(), positions.describe());
  for (int64_t i = 0; i < B; ++i)
    attention(out.slice(i, i + 1), q.slice(i, i + 1), k_new.slice(i, i + 1), v_new.slice(i, i + 1), caches[i],
              positions.slice(i, i + 1), params);
}

void Backend::kv_write_rows(std::span<const KvView> caches, const Tensor& k, const Tensor& v, const Tensor& positions) {
  const int64_t B = static_cast<int64_t>(caches.size());
  if (k.ndim < 1 || k.dim(0) != B || v.dim(0) != B || positions.numel() != B)
    fail("kv_write_rows: {} caches for k {}, v {}, positions {}", B, k.describe(), v.describe(), positions.describe());
  for (int64_t i = 0; i < B; ++i) kv_write(caches[i], k.slice(i, i + 1), v.slice(i, i + 1), positions.slice(i, i + 1));
}

void Backend::attention_from_projections(Tensor out, std::span<const HeadNorm> norms, float eps,
                                         const Tensor& positions, const Tensor& inv_freq, const KvView& cache,
                                         const AttentionParams& params) {
  if (norms.size() != 3) fail("attention_from_projections: {} head norms (q, k and v: 3)", norms.size());
  if (norms[0].x.ndim != 3 || norms[0].x.dim(0) != 1)
    fail("attention_from_projections: one decode row, got q {}", norms[0].x.describe());
  const Tensor &q = norms[0].x, &k = norms[1].x, &v = norms[2].x;
  rms_norm_rope_group(norms, eps, positions, inv_freq);
  run_side_by_side(
      *this, [&] { kv_write(cache, k, v, positions); }, [&] { attention(out, q, k, v, cache, positions, params); });
}

void Backend::check_moe_keep_experts(const Tensor& ids, const Tensor& weights, int64_t first, int64_t count) {
  if (ids.dtype != DType::i32 || weights.dtype != DType::f32 || !ids.is_contiguous() || !weights.is_contiguous() ||
      ids.numel() != weights.numel())
    fail("moe_keep_experts: expected contiguous ids i32 and weights f32 of one shape, got {} and {}", ids.describe(),
         weights.describe());
  if (first < 0 || count < 1 || first + count > INT32_MAX)
    fail("moe_keep_experts: experts [{}, {}) are no range", first, first + count);
}

void Backend::moe_keep_experts(Tensor ids, Tensor weights, int64_t first, int64_t count) {
  check_moe_keep_experts(ids, weights, first, count);
  std::vector<int32_t> id(static_cast<size_t>(ids.numel()));
  std::vector<float> w(static_cast<size_t>(weights.numel()));
  if (id.empty()) return;
  copy_to_host(id.data(), ids);
  copy_to_host(w.data(), weights);
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] >= first && id[i] < first + count) {
      id[i] -= static_cast<int32_t>(first);
    } else {
      id[i] = -1;
      w[i] = 0.0f;
    }
  }
  copy_to_device(ids, id.data());
  copy_to_device(weights, w.data());
}

void Backend::moe_route_experts(Tensor out, const Tensor& x, const Tensor& x_router, const Tensor& router,
                                const Tensor* per_expert_scale, Tensor logits, Tensor weights, Tensor ids,
                                const Tensor& gate_up, const Tensor& down, Activation act) {
  matmul(logits, x_router, router);
  moe_route(weights, ids, logits, per_expert_scale);
  moe_experts(out, x, gate_up, down, ids, weights, act);
}

void Backend::causal_conv1d_rows(Tensor out, const Tensor& x, const Tensor& weight, std::span<const Tensor> states,
                                 Activation act) {
  const int64_t B = static_cast<int64_t>(states.size());
  if (x.ndim != 2 || x.dim(0) != B || out.ndim != 2 || out.dim(0) != B)
    fail("causal_conv1d_rows: {} states for x {} and out {}", B, x.describe(), out.describe());
  for (int64_t i = 0; i < B; ++i) causal_conv1d(out.slice(i, i + 1), x.slice(i, i + 1), weight, states[i], act);
}

void Backend::gated_delta_rule_rows(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                    const Tensor& beta, std::span<const Tensor> states, const DeltaRuleParams& params) {
  const int64_t B = static_cast<int64_t>(states.size());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k, &v, &g, &beta})
    if (t->ndim < 2 || t->dim(0) != B)
      fail("gated_delta_rule_rows: {} states for an input of shape {}", B, t->describe());
  for (int64_t i = 0; i < B; ++i)
    gated_delta_rule(out.slice(i, i + 1), q.slice(i, i + 1), k.slice(i, i + 1), v.slice(i, i + 1), g.slice(i, i + 1),
                     beta.slice(i, i + 1), states[i], params);
}

Tensor head_columns(const Tensor& rows, int64_t col0, int64_t heads, int64_t dim) {
  Tensor out = rows.narrow(1, col0, heads * dim);
  const int64_t row_stride = out.stride[0], col_stride = out.stride[1];
  out.ndim = 3;
  out.shape = {out.shape[0], heads, dim, 0};
  out.stride = {row_stride, dim * col_stride, col_stride, 0};
  return out;
}

void Backend::gated_delta_net_rows(Tensor out, Tensor conv, const Tensor& qkv, const Tensor& z, Tensor a, Tensor b,
                                   std::span<const Tensor> conv_states, std::span<const Tensor> delta_states,
                                   const DeltaNetStep& step) {
  const char* op = "gated_delta_net_rows";
  const int64_t R = static_cast<int64_t>(conv_states.size());
  if (!step.conv_taps || !step.a_log || !step.dt_bias || !step.norm) fail("{}: a weight of the step is missing", op);
  if (R == 0 || static_cast<int64_t>(delta_states.size()) != R || delta_states[0].ndim != 3)
    fail("{}: {} conv states and {} delta states (one of each per row, [nV, dk, dv] delta)", op, R,
         delta_states.size());
  const int64_t nV = delta_states[0].dim(0), dk = delta_states[0].dim(1), dv = delta_states[0].dim(2);
  const int64_t C = qkv.ndim == 2 ? qkv.dim(1) : 0, qk_cols = C - nV * dv;
  if (qkv.ndim != 2 || qkv.dim(0) != R || qk_cols <= 0 || qk_cols % (2 * dk) != 0)
    fail("{}: qkv {} is not [{}, 2 nK x {} + {} x {}]", op, qkv.describe(), R, dk, nV, dv);
  const int64_t nK = qk_cols / (2 * dk);
  if (out.ndim != 3 || out.dim(0) != R || out.dim(1) != nV || out.dim(2) != dv)
    fail("{}: out {} is not [{}, {}, {}]", op, out.describe(), R, nV, dv);
  if (z.ndim != 2 || z.dim(0) != R || z.dim(1) != nV * dv)
    fail("{}: z {} is not [{}, {}]", op, z.describe(), R, nV * dv);
  const Tensor q = head_columns(conv, 0, nK, dk), k = head_columns(conv, nK * dk, nK, dk),
               v = head_columns(conv, 2 * nK * dk, nV, dv);
  if (R == 1) {
    // One sequence: the decay and beta gates (from a and b) beside the convolution (of q, k, v),
    // independent until the delta rule reads both.
    run_side_by_side(
        *this, [&] { delta_rule_gates(a, b, a, b, *step.a_log, *step.dt_bias); },
        [&] { causal_conv1d(conv, qkv, *step.conv_taps, conv_states[0], Activation::silu); });
    gated_delta_rule(out, q, k, v, a, b, delta_states[0], step.rule);
  } else {
    delta_rule_gates(a, b, a, b, *step.a_log, *step.dt_bias);  // (in order: the rows ops share one state table)
    causal_conv1d_rows(conv, qkv, *step.conv_taps, conv_states, Activation::silu);
    gated_delta_rule_rows(out, q, k, v, a, b, delta_states, step.rule);
  }
  // y = RMSNorm_w(o) * silu(z) per value head
  Tensor heads = out.reshape({R * nV, dv});
  rms_norm(heads, heads, step.norm, NormGain::weight, step.norm_eps);
  gated_activation(heads, z.reshape({R * nV, dv}), heads, Activation::silu);
}

void Backend::check_sample_args(const Tensor& out_id, const Tensor& logits) {
  if (!logits.is_contiguous() || logits.dtype != DType::f32 || logits.numel() == 0 || out_id.dtype != DType::i32 ||
      out_id.numel() != 1)
    fail("sample: expected logits f32 [V] and out_id i32 [1], got {} and {}", logits.describe(), out_id.describe());
}

void Backend::sample(Tensor out_id, Tensor logits, const SampleSpec& spec) {
  check_sample_args(out_id, logits);
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  copy_to_host(host.data(), logits);
  int32_t id = -1;
  try {
    id = sample_logits_reference(host, spec);
  } catch (const Error&) {  // every token banned: reported through the id, as on the GPU
  }
  copy_to_device(logits, host.data());
  copy_to_device(out_id, &id);
}

void Backend::sample_rows(Tensor out_ids, Tensor logits, std::span<const SampleSpec> specs) {
  const auto B = static_cast<int64_t>(specs.size());
  if (logits.ndim != 2 || logits.dim(0) != B || out_ids.numel() != B)
    fail("sample_rows: expected logits [{}, V] and out_ids [{}] for {} specs, got {} and {}", B, B, B,
         logits.describe(), out_ids.describe());
  const Tensor ids = out_ids.reshape({B});
  for (int64_t i = 0; i < B; ++i) sample(ids.slice(i, i + 1), logits.slice(i, i + 1).reshape({logits.dim(1)}), specs[i]);
}

int32_t sample_id(Backend& backend, Tensor out_id, Tensor logits, const SampleSpec& spec) {
  backend.sample(out_id, logits, spec);
  int32_t id = -1;
  backend.copy_to_host(&id, out_id);
  return id;
}

int32_t sample_token(Backend& backend, Tensor out_id, Tensor logits, const SampleSpec& spec) {
  const int32_t id = sample_id(backend, out_id, logits, spec);
  if (id < 0) fail("sampler: every token is banned");
  return id;
}

}  // namespace fl
