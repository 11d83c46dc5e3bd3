#pragma once
// The Backend interface: one typed entry per op family. Model code builds a forward pass out of
// these calls and never knows the device or the weight format; a backend implements each op for
// every weight format it supports. The CPU backend is the oracle: every other backend is tested
// against it, op by op.
//
// Conventions
// - Shapes are outermost first: activations are [tokens, width] or [tokens, heads, head_dim].
// - Activations are f32. Weights may be any dtype with a quant format (f32, f16, bf16, q8_0,
//   hfq4/hfq6); ops dequantize on the fly.
// - 2-D views may have a row stride wider than the row (a narrow() slice); the innermost
//   dimension is always contiguous.
// - Positions are a device tensor of int32 (one per token) so that a decode step has fixed
//   arguments and can be replayed as a CUDA graph.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/sampling.h"
#include "core/tensor.h"

namespace fl {

enum class NormGain {
  none,             // rms(x)
  weight,           // rms(x) * w        (Gemma 4)
  one_plus_weight,  // rms(x) * (1 + w)  (Qwen3.5)
};

enum class Activation { gelu_tanh, silu };

// The residual stream's update at the end of a block, with the norms the next ops read, as one
// op (Backend::residual_update): a decode step runs it once per block where it ran up to five
// row kernels (branch norms, the adds, the layer scalar, the next block's input norms).
struct ResidualTerm {  // a branch output entering the stream: rms(x) * gain, or x as it is
  Tensor x;            // [R, N]; scratch afterwards (the op may overwrite it)
  const Tensor* weight = nullptr;
  NormGain gain = NormGain::none;
  bool normed = true;  // Gemma 4 norms each branch output; Qwen3.5 adds it raw
};
struct StreamNorm {  // out = rms(h) * gain * scale, from the updated h
  Tensor out;        // [R, N]
  const Tensor* weight = nullptr;
  NormGain gain = NormGain::none;
  float scale = 1.0f;
};
struct ResidualUpdate {
  std::span<const ResidualTerm> terms;   // 1 or 2, summed in order
  const Tensor* merge_weight = nullptr;  // the sum normed again with this gain (Gemma 4 MoE)
  NormGain merge_gain = NormGain::none;
  const Tensor* layer_scalar = nullptr;  // h *= scalar[0] after the add (a 1-element weight)
  std::span<const StreamNorm> norms;     // at most 4
  float eps = 1e-6f;
  // The matrix the next product reads (the MLP's gate_proj, the next layer's q_proj), or null: a
  // hint that changes no result. A GPU backend may pull its first bytes into L2 while the update,
  // a latency-bound kernel, leaves DRAM idle (BackendOptions::update_prefetch_mb).
  const Tensor* next_weights = nullptr;
};
// One head-row norm of a step's projections for Backend::rms_norm_rope_group.
struct HeadNorm {
  Tensor x;  // [T, heads, D] contiguous, normed in place
  const Tensor* weight = nullptr;
  NormGain gain = NormGain::none;
  bool rope = false;  // then rope(x, positions, inv_freq) after the norm
  // Where set, the rows come from this [T, heads, D] view (any token and head strides: Qwen3.5's
  // query half of its query/gate projection) and x receives them normed, instead of in place.
  const Tensor* source = nullptr;
};

// Storage on a backend's device. Freed when the object dies.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

// The K and V rows of one attention layer of one sequence. Row r holds the key/value of the
// token at a position p with p % n_rows == r: a sliding layer's ring has n_rows = window, a
// linear cache has n_rows = max_seq (so the row is the position).
struct KvView {
  Tensor k;  // [n_rows, n_kv_heads, head_dim]
  Tensor v;  // [n_rows, n_kv_heads, head_dim]
  int64_t n_rows() const { return k.dim(0); }
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;  // query head h uses KV head h / (n_heads / n_kv_heads)
  int head_dim = 0;
  float scale = 1.0f;  // multiplies q.k before the softmax
  int window = 0;      // 0: causal over all earlier positions; W: only the W most recent (self included)
  // The matrix the op after the attention reads (o_proj), or null: a hint that changes no result.
  // A GPU backend may pull its bytes into L2 while the attention runs, a latency-bound kernel that
  // leaves DRAM mostly idle (BackendOptions::attention_prefetch_mb).
  const Tensor* next_weights = nullptr;
};

// Device time spent in one op family over a profiled stretch (`fireline bench --profile`).
struct OpProfile {
  std::string op;
  int64_t calls = 0;
  int64_t kernels = 0;  // kernel launches those calls made
  double ms = 0;        // summed device time between the op's first and last launch
  double bytes = 0;     // bytes the op must move (weights, KV rows, activations): an estimate
};

// The gated delta rule (Gated DeltaNet linear attention, Qwen3.5), per value head n with its
// state S [dk, dv] and query/key head m = n / (n_v_heads / n_k_heads):
//   q <- q / sqrt(|q|^2 + l2_eps) * q_scale,  k <- k / sqrt(|k|^2 + l2_eps)   (per head)
//   S <- exp(g_t) S;  e = beta_t (v_t - S^T k_t);  S <- S + k_t e^T;  o_t = S^T q_t
struct DeltaRuleParams {
  float q_scale = 1.0f;  // dk^-1/2 for Qwen3.5
  float l2_eps = 1e-6f;
  int chunk = 64;        // chunked form: tokens per chunk
};

// Columns [col0, col0 + heads * dim) of rows [R, C] as [R, heads, dim] (a strided view, no copy):
// q, k and v of a Gated DeltaNet mixer's convolved projection.
Tensor head_columns(const Tensor& rows, int64_t col0, int64_t heads, int64_t dim);

// The weights and constants of a Gated DeltaNet mixer's decode step (Backend::gated_delta_net_rows).
struct DeltaNetStep {
  const Tensor* conv_taps = nullptr;  // [C, K]
  const Tensor* a_log = nullptr;      // [nV]
  const Tensor* dt_bias = nullptr;    // [nV]
  const Tensor* norm = nullptr;       // [dv]: the output norm's gain, plain (w, not 1 + w)
  float norm_eps = 1e-6f;
  DeltaRuleParams rule;
};

// A recorded sequence of ops that can be relaunched as a whole (a CUDA graph).
class CapturedSteps {
 public:
  virtual ~CapturedSteps() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // ---- memory ----
  virtual std::unique_ptr<DeviceBuffer> allocate(size_t bytes) = 0;  // zero-filled
  // Memory in bytes that loading may still allocate, or nullopt where unknown: a GPU's free device
  // memory; the CPU's available RAM (MemAvailable), which its KV cache and scratch take while its
  // weights stay in the mapped file (MemoryPlan::allocated_on).
  virtual std::optional<size_t> free_memory() const = 0;
  // The device's model name and its theoretical peak memory bandwidth, GB/s (memory clock x bus
  // width x 2), where the backend can ask its device (a GPU); nothing on the CPU.
  struct MemoryPeak {
    std::string device_model;
    double gbs = 0.0;
  };
  virtual std::optional<MemoryPeak> memory_peak() const { return std::nullopt; }
  // Makes this backend's device the calling thread's (a GPU runtime keeps the current device per
  // thread): a split model calls it on each rank's thread before the rank's work.
  virtual void bind_to_this_thread() {}
  // A device copy of a host weight view (the CPU backend returns the view itself: weights stay
  // in the mapped file).
  virtual Tensor upload_weight(const Tensor& host) = 0;
  virtual void copy_to_device(Tensor dst, const void* src) = 0;  // dst contiguous
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;   // src contiguous
  // dst = src, both on this backend's device, contiguous and of one byte size (check_copy_on_device
  // refuses others). The default goes through host memory; a GPU backend copies on the device, in
  // order with its ops.
  virtual void copy_on_device(Tensor dst, const Tensor& src);
  virtual void synchronize() = 0;
  // Records the ops `body` issues without running them, for replay(). Inside body: ops only (no
  // copies, no allocation, no synchronisation). The CPU backend simply re-runs body.
  virtual std::unique_ptr<CapturedSteps> capture(const std::function<void()>& body) = 0;

  // ---- concurrent branches ----
  // Two independent lines of ops in one forward (a MoE layer's dense MLP or shared expert and its
  // routed experts): the ops issued between branch_begin() and branch_end() form the side line,
  // the ops issued after branch_end() the main line, and branch_join() makes every later op wait
  // for both. A GPU backend may run the two lines at once (a second stream forked and joined by
  // events, kept as parallel nodes in a captured graph): a decode step is a chain of small
  // kernels that each fill the GPU only briefly, so two chains side by side finish sooner. The
  // lines must not touch each other's outputs before the join, and only ops may be issued
  // inside (no copies, allocation or synchronisation). Results are the same either way: every op
  // computes what it computes in order. Backends that run one line at a time keep the defaults,
  // which issue everything in order (side line first). Use run_side_by_side, which also cleans
  // up after an exception.
  virtual void branch_begin() {}
  virtual void branch_end() {}
  virtual void branch_join() {}
  // Closes whatever branch is open after an error (the main line then waits for the side line's
  // issued work); never throws.
  virtual void branch_abandon() noexcept {}

  // ---- ops ----
  // out[t, :] = table[ids[t], :] * scale.             out [T, H] f32; table [V, H]; ids [T] i32
  virtual void embed(Tensor out, const Tensor& table, const Tensor& ids, float scale) = 0;

  // out = rms(x) (* gain): rms(x) = x * (mean(x^2) + eps)^-1/2 over the last dim.
  // x, out [R, N] (in place allowed); weight [N] or null for NormGain::none.
  virtual void rms_norm(Tensor out, const Tensor& x, const Tensor* weight, NormGain gain, float eps) = 0;

  // Fused forms (each equal to the ops it replaces, which the defaults run; a GPU backend saves
  // launches):
  // outs[i] = x * weights[i]^T for several weights of the same input (Gemma's q/k/v and gate/up
  // projections). outs[i] [T, M_i]; x [T, K]; weights[i] [M_i, K].
  virtual void matmul_group(std::span<const Tensor> outs, const Tensor& x, std::span<const Tensor* const> weights);
  // out = act(x * gate_w^T) * (x * up_w^T): a gated MLP's input half (GELU or SiLU gate).
  // out, up [T, I]; x [T, K]; gate_w, up_w [I, K]. `up` is scratch: the default (matmul_group of
  // the two weights, then gated_activation) leaves the up projection there; a GPU that computes
  // both products in one launch leaves it untouched. Either way out holds the same numbers.
  virtual void matmul_gated(Tensor out, Tensor up, const Tensor& x, const Tensor& gate_w, const Tensor& up_w,
                            Activation act);
  // h += rms_norm(x) (* gain), x = the normed value: a block's output norm and residual add.
  // h, x [R, N].
  virtual void add_rms_norm(Tensor h, Tensor x, const Tensor* weight, NormGain gain, float eps) {
    rms_norm(x, x, weight, gain, eps);
    add(h, h, x);
  }
  // rms_norm over each head row of x [T, heads, D] in place, then rope(x, positions, inv_freq).
  virtual void rms_norm_rope(Tensor x, const Tensor* weight, NormGain gain, float eps, const Tensor& positions,
                             const Tensor& inv_freq) {
    rms_norm(x, x, weight, gain, eps);
    rope(x, positions, inv_freq);
  }
  // The head norms of one step's q, k and v (at most 4 parts, one positions / inv_freq), each as
  // rms_norm_rope (rope) or rms_norm over its head rows; a part with a source as rms_norm from
  // it into x, then rope.
  virtual void rms_norm_rope_group(std::span<const HeadNorm> parts, float eps, const Tensor& positions,
                                   const Tensor& inv_freq);
  // h = (h + branch) * layer_scalar, with branch = the sum of u.terms (each rms(x) * gain when
  // normed), normed again when u.merge_weight is set; then norms[j].out = rms(h) * gain_j * scale_j.
  // The default runs rms_norm / add / scale_by / scale in that order (the CPU oracle's numerics).
  // No term or norm output may be h, and no norm output a term.
  virtual void residual_update(Tensor h, const ResidualUpdate& u);

  // out[t, m] = sum_k x[t, k] * weight[m, k].          out [T, M]; x [T, K]; weight [M, K]
  virtual void matmul(Tensor out, const Tensor& x, const Tensor& weight) = 0;

  // Rotate-half RoPE in place. x [T, n_heads, D]; inv_freq [R/2] f32 with R <= D the rotated
  // span: for i < R/2, angle = positions[t] * inv_freq[i], and the pair (i, i + R/2) rotates.
  // Dims >= R pass through. (Gemma's proportional RoPE is R = D with zero frequencies.)
  virtual void rope(Tensor x, const Tensor& positions, const Tensor& inv_freq) = 0;

  // out = act(gate) * up, elementwise.                 all [T, N]
  virtual void gated_activation(Tensor out, const Tensor& gate, const Tensor& up, Activation act) = 0;

  virtual void add(Tensor out, const Tensor& a, const Tensor& b) = 0;  // out = a + b      [R, N]
  virtual void scale(Tensor x, float s) = 0;                           // x *= s
  virtual void scale_by(Tensor x, const Tensor& scalar) = 0;           // x *= scalar[0] (a 1-element weight)
  virtual void softcap(Tensor x, float cap) = 0;                       // x = cap * tanh(x / cap)

  // Attention of T queries at consecutive positions p0 = positions[0], ..., p0 + T - 1 of one
  // sequence. Keys/values at positions >= p0 come from k_new/v_new ([T, n_kv_heads, D]); earlier
  // ones from `cache` (written by earlier calls). Softmax in f32 over the visible keys.
  // out, q [T, n_heads, D].
  virtual void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                         const Tensor& positions, const AttentionParams& params) = 0;

  // One query each for several sequences (batched decode): row i ([B, ...] tensors) is the query
  // at positions[i] of the sequence whose cache is caches[i]; its key/value at that position are
  // k_new/v_new row i, earlier ones are in caches[i]. The same numbers as attention() row by row
  // (the default); a GPU does all rows in one launch. The caches share shape and type.
  virtual void attention_rows(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                              std::span<const KvView> caches, const Tensor& positions, const AttentionParams& params);
  // kv_write of row i of k, v into caches[i] at positions[i], for every row (the default: one
  // kv_write per row).
  virtual void kv_write_rows(std::span<const KvView> caches, const Tensor& k, const Tensor& v, const Tensor& positions);

  // Stores k, v ([T, n_kv_heads, D]) in rows positions[t] % n_rows of the cache, converting to
  // the cache's element type. Positions are consecutive; when several tokens of one call land on
  // the same ring row, the last one is what the row holds afterwards.
  virtual void kv_write(const KvView& cache, const Tensor& k, const Tensor& v, const Tensor& positions) = 0;

  // One sequence's decode row of an attention layer from its projections, norms[0..2] holding q
  // [1, n_heads, D], k and v [1, n_kv_heads, D]: what
  //   rms_norm_rope_group(norms, eps, positions, inv_freq);
  //   attention(out, q, k, v, cache, positions, params) beside kv_write(cache, k, v, positions)
  // do (the default, the write as the side line of a concurrent branch). The write must be free
  // to run beside the attention (kv_write_may_overlap_attention). q, k and v are scratch: the
  // default leaves them normed, a GPU that runs it all in one launch (BackendOptions::
  // fused_decode_attention) leaves the projections as they were; out and the cache are the same.
  virtual void attention_from_projections(Tensor out, std::span<const HeadNorm> norms, float eps,
                                          const Tensor& positions, const Tensor& inv_freq, const KvView& cache,
                                          const AttentionParams& params);

  // Mixture-of-experts routing: softmax over logits [T, E], keep the top_k, renormalise them to
  // sum to 1, then multiply by per_expert_scale[e] when given. weights [T, top_k] f32,
  // ids [T, top_k] i32, highest probability first.
  virtual void moe_route(Tensor weights, Tensor ids, const Tensor& logits, const Tensor* per_expert_scale) = 0;

  // Expert parallelism: a rank holds experts [first, first + count) of the stacks. In place, ids
  // [T, K] (i32) become indices into the rank's stack, and every pair whose expert is another
  // rank's gets id -1 and weight [T, K] (f32) 0: moe_experts over the rank's stack then runs and
  // adds only its own experts. The default copies both to the host and back (which a captured
  // graph cannot); a GPU does it in one kernel.
  virtual void moe_keep_experts(Tensor ids, Tensor weights, int64_t first, int64_t count);

  // out[t] = sum_j weights[t, j] * down[e] (act(gate_e x[t]) * up_e x[t]) with e = ids[t, j],
  // where gate_up[e] holds the gate rows then the up rows: [E, 2 I, H]; down [E, H, I].
  // Experts are summed in ascending id order (as transformers' index_add loop does). An id of -1
  // (moe_keep_experts: another rank's expert) is a pair not run at all; other ids outside [0, E)
  // are errors where the backend can see them (the CPU's), undefined on a GPU.
  virtual void moe_experts(Tensor out, const Tensor& x, const Tensor& gate_up, const Tensor& down,
                           const Tensor& ids, const Tensor& weights, Activation act) = 0;

  // A router's product, the routing and the routed experts as one op: matmul(logits, x_router,
  // router) ([T, E]), moe_route(weights, ids, logits, per_expert_scale), then moe_experts(out, x,
  // gate_up, down, ids, weights, act); logits, weights and ids are written too. The default issues
  // the three ops; a backend may run them together (CUDA: BackendOptions::fused_experts, where
  // the router's product has the f32 matvec's bits, not the integer kernel's).
  virtual void moe_route_experts(Tensor out, const Tensor& x, const Tensor& x_router, const Tensor& router,
                                 const Tensor* per_expert_scale, Tensor logits, Tensor weights, Tensor ids,
                                 const Tensor& gate_up, const Tensor& down, Activation act);

  // ---- linear attention (Gated DeltaNet) ----
  // Causal depthwise convolution over time with a carried window, then act:
  //   out[t, c] = act( sum_j weight[c, j] * x_{t - (K-1) + j}[c] ),  j < K,
  // where inputs before this call come from `state` ([K - 1, C] f32, oldest row first; zeros at
  // the start of a sequence). Afterwards state holds the last K - 1 inputs.
  // out, x [T, C] f32 (row strides allowed); weight [C, K] any weight dtype.
  virtual void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act) = 0;
  // causal_conv1d for several sequences of one row each (batched decode): row i of x and out
  // continues states[i]. The default runs causal_conv1d row by row; a GPU does all rows in one
  // launch with the same per-row numbers. The states share shape and strides.
  virtual void causal_conv1d_rows(Tensor out, const Tensor& x, const Tensor& weight, std::span<const Tensor> states,
                                  Activation act);

  // Decay and write strength of the delta rule, in f32:
  //   g[t, n] = -exp(a_log[n]) * softplus(a[t, n] + dt_bias[n]),  beta[t, n] = sigmoid(b[t, n]).
  // g, beta, a, b [T, nV] f32 (g may alias a, beta may alias b); a_log, dt_bias [nV] any dtype.
  virtual void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                                const Tensor& dt_bias) = 0;

  // The gated delta rule (DeltaRuleParams) over T consecutive tokens of one sequence, continuing
  // from `state` and leaving the state after the last token there. Two forms of the same
  // function: token by token (the recurrence, for decode), and chunk by chunk (the WY/UT form
  // transformers and FLA use for prompts: within a chunk the writes are solved as one unit
  // lower-triangular system, and the state is read and written once per chunk).
  // out [T, nV, dv] f32; q, k [T, nK, dk] and v [T, nV, dv] f32 (may be strided views of one
  // buffer); g, beta [T, nV] f32; state [nV, dk, dv] f32.
  virtual void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor state, const DeltaRuleParams& params) = 0;
  // gated_delta_rule (the recurrence) for several sequences of one row each: row i continues
  // states[i] (each row its own state: a GPU refuses two rows on one). The default runs the rows one by one; a GPU does
  // all rows in one launch with the same per-row numbers.
  virtual void gated_delta_rule_rows(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                     const Tensor& beta, std::span<const Tensor> states, const DeltaRuleParams& params);
  virtual void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& g, const Tensor& beta, Tensor state,
                                        const DeltaRuleParams& params) = 0;

  // One decode row per sequence through a Gated DeltaNet mixer's core, from its input projections
  // to out_proj's input: row i continues conv_states[i] and delta_states[i] (as in
  // causal_conv1d_rows and gated_delta_rule_rows; each row its own sequence), and
  //   g, beta = delta_rule_gates(a, b);  conv = silu(causal_conv1d(qkv));
  //   out = gated_delta_rule(q, k, v: conv's columns; g, beta);
  //   out[i, n, :] = rms_norm(out[i, n, :]) * step.norm * silu(z[i, n, :])   (per value head n).
  // out [R, nV, dv]; qkv, conv [R, C] with C = 2 nK dk + nV dv (q | k | v); z [R, nV dv]; a, b
  // [R, nV]; the delta states give nV, dk, dv. conv, a and b are scratch: the default leaves the
  // conv's output and g, beta there. The default runs those ops (one sequence: the gates beside
  // the conv, as a concurrent branch); a GPU may run the whole step in one launch
  // (BackendOptions::fused_delta_net).
  virtual void gated_delta_net_rows(Tensor out, Tensor conv, const Tensor& qkv, const Tensor& z, Tensor a, Tensor b,
                                    std::span<const Tensor> conv_states, std::span<const Tensor> delta_states,
                                    const DeltaNetStep& step);

  // x *= sigmoid(gate), with gate [R, N] (elementwise) or [R, 1] (one gate per row).  x [R, N]
  virtual void sigmoid_gate(Tensor x, const Tensor& gate) = 0;

  // out_ids[r] = argmax over logits[r, :] (lowest index on ties).   out_ids [R] i32; logits [R, V]
  virtual void argmax(Tensor out_ids, const Tensor& logits) = 0;

  // Samples one token from logits [V] f32 by the chain of backend/sampling.h and writes it to
  // out_id [1] i32, or -1 when every token is banned; `logits` are adjusted and divided in
  // place. Returns nothing to the host: sample_token below reads the id back. The default goes
  // through the host (copy out, the reference, copy the id in); the CUDA backend samples on the
  // device, so that only the id crosses. Not inside capture() (the spec is copied in).
  virtual void sample(Tensor out_id, Tensor logits, const SampleSpec& spec);
  // The same for each row of logits [B, V] by its own specs[i] (batched decode: each sequence
  // with its own sampler), into out_ids [B]. The default samples row by row; the CUDA backend
  // samples every row in one launch.
  virtual void sample_rows(Tensor out_ids, Tensor logits, std::span<const SampleSpec> specs);

 protected:
  static void check_sample_args(const Tensor& out_id, const Tensor& logits);  // sample's shapes and types
  // residual_update's counts (1-2 terms, at most 4 norms) and aliases (no term or norm output is
  // h, no norm output a term), for every backend.
  static void check_residual_update(const Tensor& h, const ResidualUpdate& u);
  // moe_keep_experts' arguments: contiguous ids i32 and weights f32 of one shape, a non-empty range.
  static void check_moe_keep_experts(const Tensor& ids, const Tensor& weights, int64_t first, int64_t count);

 public:

  // Per-op timing of eagerly launched ops (graph capture is never timed). Off by default: it adds
  // two events per op. Backends without it return nothing.
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::vector<OpProfile> take_profile() { return {}; }  // per op family, in first-call order; resets
  // Brackets the work an external profiler started with its recording off records (Nsight Compute
  // --profile-from-start off: scripts/kernel-times --batch): a GPU backend turns its runtime's
  // profiler on and off there; elsewhere nothing.
  virtual void profiler_region(bool on) { (void)on; }
};

// side() as the side line and main() as the main line of a concurrent branch (Backend::branch_begin),
// joined before it returns; the branch is abandoned (and the exception passed on) if either throws.
template <class Side, class Main>
void run_side_by_side(Backend& backend, Side&& side, Main&& main) {
  backend.branch_begin();
  try {
    side();
    backend.branch_end();
    main();
    backend.branch_join();
  } catch (...) {
    backend.branch_abandon();
    throw;
  }
}

// backend.sample(out_id, logits, spec), then the id read back (-1: every token banned).
// out_id: a device i32 [1] the caller keeps (no allocation per token).
int32_t sample_id(Backend& backend, Tensor out_id, Tensor logits, const SampleSpec& spec);
// The same, throwing fl::Error when every token is banned.
int32_t sample_token(Backend& backend, Tensor out_id, Tensor logits, const SampleSpec& spec);

// Backend::copy_on_device's argument check: throws fl::Error unless both are contiguous and of one
// byte size.
void check_copy_on_device(const Tensor& dst, const Tensor& src);

// The CPU oracle backend.
std::unique_ptr<Backend> make_cpu_backend();

// How a GPU backend feeds activations to its tensor cores in products over many tokens: the GEMM
// of a prompt's (or a decode batch's) rows, the grouped expert GEMM and the flash prefill
// attention (Q, K, P and V). The weights' 4-bit and 8-bit codes are exact in bf16 either way and
// every sum runs in f32; decode of one sequence (SIMT matvecs, decode attention) is f32 in both.
// The CPU backend, the oracle, always computes in f32 and ignores the choice.
enum class TensorCorePrecision {
  f32,   // each activation cut into three bf16 pieces: the f32 products up to summation order
  bf16,  // each activation rounded to bf16 once (one piece): 3x fewer tensor-core products in a
         // GEMM, and a bf16 attention kernel for prompts; as a bf16 checkpoint runs in transformers
};
std::string_view tensor_core_precision_name(TensorCorePrecision precision);
// "f32" or "bf16"; throws fl::Error naming the choices otherwise.
TensorCorePrecision parse_tensor_core_precision(std::string_view name);

struct BackendOptions {
  TensorCorePrecision tensor_core_precision = TensorCorePrecision::f32;
  // Run concurrent branches (Backend::branch_begin) side by side where the backend can; off: in
  // order on one stream (`fireline bench --branches on|off` for A/B timing). Results are
  // identical (tests/golden/branches_test.cpp); on by default since the H100 run of
  // bench/RESULTS.md 2026-12-05 (twenty-second session): decode +5 % (26B-A4B), +14 % (35B-A3B).
  bool concurrent_branches = true;
  // A gated MLP's gate and up products and its activation in one launch at decode (HFQ4, one
  // input row; the MoE experts' matvec path too): Backend::matmul_gated. Same numbers either way
  // (CudaOps.MatmulGatedMatchesTheTwoProductsAndTheActivation). Off by default: faster alone but
  // slower in the replayed step on an H100 (4B 395 -> 375 tok/s; bench/RESULTS.md, twenty-second
  // session), the cause not yet found (`fireline bench --gated-matvec on|off`).
  bool gated_matvec = false;
  // Decode's one-input matvecs pull their rows into L2 before waiting for the previous kernel
  // (programmatic dependent launch) when the grid fits in a wave or so. Same numbers either way.
  // Off by default: the prefetch competes with the previous kernel's own loads; without it decode
  // ran 31B +4.6 %, 4B +1.1 %, 26B-A4B +0.4 %, 35B-A3B -0.7 % (H100, interleaved A/B,
  // bench/RESULTS.md twenty-fourth session; `fireline bench --weight-prefetch on|off`).
  bool weight_prefetch = false;
  // Mixture-of-experts GEMMs (prefill, long batches: 64-pair work items) on the Hopper wgmma
  // kernel, as plain products already are, instead of mma.sync; one-piece (bf16) tensor-core
  // precision on an sm_90 GPU only. The inputs of each item are gathered into a tile of its own
  // first (a token's row copied once per expert it is routed to). Same bits either way
  // (CudaOps.Bf16TensorCoresMultiplyRoundedInputs). Off until timed (`fireline bench
  // --hopper-experts on|off`); its gathered tiles (bf16, a row per routed pair: ~1.4 GB for the
  // 26B-A4B's 30000-token prompt) are not yet in the models' memory plans.
  bool hopper_expert_gemm = false;
  // Several products of one input at many inputs (q/k/v, gate/up; prefill and batched decode) in
  // one GEMM launch: the inputs split once, every matrix's row tiles and K splits in one grid, one
  // K-split sum, instead of three launches per product. Hopper's wgmma kernel only (bf16 tensor
  // cores, an sm_90 GPU); elsewhere the products run one by one. Results move only by the order
  // of the K-split sums (the split plan counts every matrix's tiles). On by default: 26B-A4B
  // batched decode of 64 sequences +2.6 %, 4096-token prefill +2.0 % (H100, interleaved A/B,
  // bench/RESULTS.md twenty-fourth session); `fireline bench --group-gemm on|off`.
  bool group_gemm = true;
  // Decode's one-input HFQ4 matvecs on rows of 8+ blocks (plain, grouped, gated and the experts'
  // pairs) stream their weights through shared memory by bulk copies (cp.async.bulk, sm_90 GPUs
  // only), the first ones issued before the previous kernel ends, instead of holding them in
  // registers. Same bits either way (CudaOps.AsyncMatvecGivesTheSameBits). Off: it loses in the
  // replayed step (H100: 31B decode -12.8 %, Qwen3.5-4B -8.9 %, 26B-A4B -6.3 %; only one-wave
  // products with long rows gain 2-3 %; bench/RESULTS.md twenty-sixth session). `fireline bench
  // --async-matvec on|off`; matmul_bench's "a2" and "a4" lines against "0".
  bool async_matvec = false;
  // Decode's one-input plain HFQ4 products with rows of 32+ blocks whose grid is at most about
  // one wave of 4-row warps and two or more 8-row blocks per SM (the 31B's down and o_proj,
  // Qwen3.5-4B's down) run on pairs of warps that split each row's warp steps, even and odd, and
  // add the two sums lane by lane before the warp sum: twice the warps per SM for the same bytes
  // in flight. Its own order of additions (not the register kernel's bits; CudaOps.
  // SplitMatvecMatchesTheOracle). On: H100 31B decode +7 %, those products 16-19 % faster
  // (bench/RESULTS.md twenty-seventh session). `fireline bench --split-matvec on|off`;
  // matmul_bench's "s" lines against "0".
  bool split_matvec = true;
  // Decode's one-input HFQ4 products (one matrix, or a group of one input such as q/k/v; no gate
  // or experts) on the integer tensor cores (mma m16n8k32 s8, sm_80 and later; matvec_imma.cu):
  // the input cut into four int8 pieces under a per-group exponent (by the product's own launch,
  // or by the kernel that wrote it: imma_ready_pieces), the codes multiplied exactly in s32, ~0.7
  // instructions per weight where the register kernel spends ~2.9 (which bounds the large
  // products: bench/RESULTS.md twenty-seventh session). Its own numbers
  // (CudaOps.ImmaMatvecMatchesTheOracle). On: with the input's pieces cut by the kernels that
  // write it, decode gained on the H100 31B +6.5 %, Qwen3.5-4B +4.0 %, 26B-A4B +1.9 %
  // (bench/RESULTS.md twenty-eighth session; with a pieces launch per product the 31B lost 1.6 %
  // at first). `fireline bench --imma-matvec on|off`; matmul_bench's "i" lines against "0". Takes
  // the products before the split kernel, after the bulk-copy one (async_matvec).
  bool imma_matvec = true;
  // With imma_matvec: the kernels whose one-row output is such a product's next input (the
  // residual update's norms, the gated activation) also cut it into the integer pieces, and the
  // product leaves out its own pieces launch (the same bytes either way: GpuSwitches). The
  // update's pieces serve the first product of each line of a branch after it (Gemma 4's dense
  // MLP and router side by side: 26B-A4B +3.8 %, 35B-A3B +2.3 % on the H100; thirty-sixth
  // session).
  // Knocking that launch out took decode 31B +5.3 -> +9.3 %, Qwen3.5-4B +0.1 -> +10.9 % (H100,
  // bench/RESULTS.md twenty-eighth session); these producers got the 4B +1.6 -> +2.3 %, the 31B
  // nothing more at first (a cut on the update's one SM costs about a launch), and with the cheaper
  // cut 31B +6.5 %, 4B +4.0 % in all. `fireline bench --imma-ready-pieces on|off`.
  bool imma_ready_pieces = true;
  // With imma_matvec: each warp also pulls into L2 the codes of the group this many of its
  // iterations past the one it loads into registers (a prefetch holds no register; at 110-116 per
  // thread a warp holds one group's loads). 0 (default): none (H100: 26B-A4B +2.8 % at 4, 4B
  // -2.2 %, 31B -4.2 %: bench/RESULTS.md thirty-second session). Identical results.
  // `fireline bench --imma-l2-ahead N`.
  int imma_l2_ahead = 0;
  // With imma_matvec: the plain products and groups on the integer kernel's lean form: only the
  // codes go an iteration ahead (the input's pieces, the same for every tile, are loaded where
  // they are used), 79 registers instead of 116, three blocks per SM, and the tiles split over
  // up to 8 warps until ~20 warps per SM (the 31B's down and o_proj: 8 warps per tile, one wave).
  // Why: on the H100 those products ran at ~1.6 TB/s with ~10 warps per SM, each waiting on its
  // one group in flight (bench/RESULTS.md thirty-ninth session). Where it takes more warps per
  // tile than the register form, their partial sums add in another order (last bits; CudaOps.
  // ImmaLeanMatchesTheOracle). On by default since the fortieth session: decode on the H200 31B
  // 119.2 -> 124.5 tok/s (+4.4 %), on the H100 Qwen3.5-4B +2.4 % and the 31B even (there the
  // kernels after each lean product started later). `fireline bench --imma-lean on|off`.
  bool imma_lean = true;
  // With imma_matvec: the warps per SM below which the integer matvec's launcher splits a
  // product's 16-row tiles over more warps (2, 4, then 8; never more than the row's groups).
  // 0 (default): the form's own, 10 for the register form and 20 for the lean one (the routed
  // experts' integer products, imma_experts, take it too, in the register form). Decides only
  // how many warps share a tile: the partial sums' order (last bits), not the arithmetic. For
  // A/B timing of the split apart from the form. `fireline bench --imma-warps-per-sm N`.
  int imma_warps_per_sm = 0;
  // Decode attention by KV head (query rows over a Q8_0 cache) pulls the first N MB of the next
  // product's weights (AttentionParams::next_weights: o_proj) into L2 before its wait: on the
  // H200 the 31B's attention and merge take ~15 us a layer at a fifth of the bandwidth, and
  // o_proj (24.8 MB, one wave) then reads L2. Each block prefetches its slice, one bulk prefetch
  // per 32 KB on sm_90 (at most 8 lines per thread elsewhere). 0: none. More than L2 keeps (50 MB
  // on the H100 and H200, shared with the K/V rows) evicts the first bytes before they are read.
  // A hint: identical results. Not yet timed (forty-first session: no GPU came).
  // `fireline bench --attention-prefetch-mb N`.
  int attention_prefetch_mb = 0;
  // Decode attention by KV head (query rows over a Q8_0 cache) with 4 or 8 query heads per KV head
  // on the tensor cores: both products as bf16 mma.sync (the int8 codes exact, q and the value
  // weights in three bf16 pieces), where the SIMT form spends ~6.6k instructions per warp and
  // 32-key tile of a Gemma 4 global layer and is bound by issue (batched, 64 rows of it take 542 us
  // a layer on the H200 where their K/V take ~70). Results differ in summation order only.
  // Not yet timed (forty-second session). `fireline bench --decode-attention-mma on|off`.
  bool decode_attention_mma = false;
  // The same for the one-row residual update (the register and cluster kernels) and the product
  // after it (ResidualUpdate::next_weights: the 31B's gate_proj, 65 MB, read first by gate_up's
  // grouped launch, and the next q_proj, 25-50 MB): the first N MB in address order, whole row tiles
  // of the product's first blocks. The 31B's cluster update is 7 blocks, so how much they can
  // put in flight in ~5 us is the question (bench/bandwidth_bench's fill table). 0: none.
  // Identical results. `fireline bench --update-prefetch-mb N`.
  int update_prefetch_mb = 0;
  // With imma_matvec: a one-input product whose weights take fewer bytes than this, and whose
  // input no producer cut (imma_ready_pieces), runs on the f32 rows kernels instead: such a
  // product (the 26B-A4B's router, 0.2 MB) is bound by latency either way, and the integer kernel
  // would need a pieces launch of its own before it, on the step's critical path. 0 (default):
  // every such product on the integer kernel. `fireline bench --imma-min-bytes N`.
  int64_t imma_min_bytes = 0;
  // With imma_matvec: decode's routed expert products (moe_experts on the per-pair matvec path,
  // HFQ4 G256/G128 stacks) on the integer matvec too: the input cut once, gate_up per pair, the
  // gated activation cutting its rows into the down products' pieces, down per pair. The f32
  // rows kernels ran the 26B-A4B's experts at ~30 % of the bandwidth (gate_up 18.6 us for 17.8
  // MB on the H100; bench/RESULTS.md thirty-second session). Off: on the H100 the 26B-A4B's
  // expert chain (route to combine) went 31.1 -> 29.3 us per layer, decode within the runs'
  // noise; the integer gate_up reaches ~1.2 TB/s on 8 pairs of 11-group rows, and two pieces
  // launches join the chain (thirty-third session). Results differ within the op harness's
  // budget. `fireline bench --imma-experts on|off`.
  bool imma_experts = false;
  // Decode's routed expert pairs on the f32 rows kernels (HFQ4, not gated): rows per warp and
  // warp steps of loads in flight per lane. rows 0: the plain products' choice (4 x 2 on the
  // 26B-A4B: its 8 gate_up pairs, 6 steps a row, ~1.07 waves of warps that each wait 3 DRAM round
  // trips); rows -1 (default): for one token's pairs (at most 8), where the plain shape's waves x
  // rounds of loads reach 3, the built shape with the fewest (8 x 3 for the 26B-A4B's gate_up,
  // 8 x 2 for its down; the 35B-A3B's and several tokens' launches stay plain: untimed, or
  // measured slower; cuda/expert_rows_plan.h); or a shape of 4 x 2, 2 x 4, 4 x 3, 4 x 4, 8 x 2,
  // 8 x 3 for every expert launch.
  // The same bits whatever the shape. On the H200, 26B-A4B decode +2.2 % (bench/RESULTS.md
  // thirty-eighth session). `fireline bench --expert-matvec plain|auto|RxS`.
  struct ExpertMatvecShape {
    int rows = -1;
    int steps = 0;
  } expert_matvec;
  // For the launches that take a shape of their own (expert_matvec; those it leaves plain do not
  // change): each warp's loads as a ring of its steps, a step's registers
  // refilled with the step `steps` past it as soon as its arithmetic is done, instead of a round
  // of `steps` loads, their arithmetic, then the next round (the same bits). Why: at one wave the
  // 26B-A4B's 8x3 gate_up still moved its 17.8 MB at ~1.2 TB/s (H200, ncu; thirty-eighth
  // session), 16 % occupancy, each warp's arithmetic and its next round's wait back to back.
  // `fireline bench --expert-matvec-ring on|off`.
  bool expert_matvec_ring = false;
  // Decode's routed experts (moe_experts for 1-4 tokens on the per-pair path, HFQ4 G256/G128
  // stacks) in one launch (moe_decode.cu) instead of gate_up, the activation, down and the
  // combine: the down rows are pulled into L2 while the last gate_up rows are read, and three
  // kernel boundaries leave the chain (26B-A4B on the H100: ~33 us per layer from the route's end
  // to the combine's end, for ~8 us of bytes). Same bits as the four kernels (the rows kernels'
  // per-lane order; CudaOps.FusedExpertsMatchTheFourKernels). Takes precedence over imma_experts
  // where both are on. Without --ep the router's product (f32 input, the f32 matvec's bits) and
  // the routing join the launch (Backend::moe_route_experts; CudaOps.FusedRouteMatchesTheRouter
  // RouteAndExperts). Off: slower on the H100 (decode 26B-A4B -13 %, Qwen3.5-35B-A3B -17 %; the
  // launch 55 us where the four kernels and the router took ~42; without the router in it, 50 us
  // from the route's end; bench/RESULTS.md thirty-sixth session). `fireline bench --fused-experts
  // on|off`.
  bool fused_experts = false;
  // The fused experts' grid: blocks per SM, 1 or 2 (the most that fit at 128 registers). Two hold
  // twice the weight loads in flight but take every register of the SM while they run, so the
  // side line's kernels (the 26B-A4B's dense MLP) wait for them; one leaves half of each SM free.
  // `fireline bench --fused-experts-blocks N`.
  int fused_experts_blocks = 2;
  // Decode's one-row residual update (h += the normed branch, then the next norms and their
  // pieces) spread over a cluster of up to 8 blocks on as many SMs (sm_90), each lane holding 8
  // consecutive columns and the row's sums of squares added through distributed shared memory,
  // instead of one block on one SM (whose chain ncu timed at 9.2 us on the 31B). Only the order
  // of the row's sums differs (CudaOps.ClusterResidualUpdateMatchesOneBlock). On: H100 decode
  // 31B +6.0 %, 26B-A4B +4.6 % (bench/RESULTS.md twenty-ninth session). Only updates with a
  // normed term (Gemma 4's) take it: with Qwen3.5's raw terms the 4B lost 2.0 % (together with a
  // merge change since reverted, and before the raw terms' barrier was taken out; not re-timed).
  // `fireline bench --cluster-update on|off`.
  bool cluster_residual_update = true;
  // Decode's Gated DeltaNet step (gated_delta_net_rows: gates, conv, delta rule, norm, silu gate)
  // in one launch, a thread-block cluster per key head (sm_90 with sm_90a code), instead of six
  // kernels. Only the output norm's sum goes in another order. `fireline bench --fused-delta-net
  // on|off`.
  bool fused_delta_net = true;
  // One sequence's decode attention from its projections (attention_from_projections) in one
  // launch where the decode kernel by KV head takes it (Q8_0 cache, head dims 256 / 512, up to 8
  // query heads per KV head: Gemma 4): the q/k/v head norms with RoPE and the KV write inside the
  // attention kernel, instead of a norm kernel before it and a write kernel beside it. The same
  // bits as the separate kernels (CudaOps.AttentionFromProjectionsMatchesTheThreeOps). Off:
  // slower on the H100 (26B-A4B decode -10 %, 31B -6 %): on the replayed step the attention ended
  // 18 us after the q/k/v product where the norm kernel and the attention took 9.5, 45 us on a
  // global layer (G = 8, three rows per warp) where they took 18, about 8 us per round of rows a
  // warp norms; not yet explained (bench/RESULTS.md thirty-seventh session).
  // `fireline bench --fused-decode-attention on|off`.
  bool fused_decode_attention = false;
  // The routed experts' down products on the per-pair path (decode's few tokens; HFQ4, top-k up
  // to 8) summed per token in their own launch, each output row taking its token's pairs in
  // ascending expert id as moe_combine does, instead of a [pairs, H] output and a combine launch.
  // The same bits (CudaOps.ExpertsDownSumMatchesTheCombine). Off: slower on the H100 (26B-A4B
  // decode -11 %, Qwen3.5-35B-A3B -2 %): the launch took 24 us a layer where down and the
  // combine took 12.8; a warp's 8 pairs each read their own activation row, 16 floats a lane per
  // 8 bytes of codes (the rows kernel shares one row over 4 weight rows), at 128 registers
  // (bench/RESULTS.md thirty-seventh session). `fireline bench --experts-down-sum on|off`.
  bool experts_down_sum = false;
};

// BackendOptions::expert_matvec by name: "plain", "auto" or "RxS" (one of the built shapes); throws
// fl::Error naming the choices otherwise. And back.
BackendOptions::ExpertMatvecShape parse_expert_matvec_shape(std::string_view name);
std::string expert_matvec_shape_name(BackendOptions::ExpertMatvecShape shape);

// A backend by name: "cpu", or "cuda" / "cuda:N" (GPU N) when fireline was built with CUDA.
// Throws fl::Error naming the available backends otherwise.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});
// How many GPUs make_backend("cuda:N") can open (0 in a build without a GPU backend).
int gpu_device_count();

class Communicator;
// The communicators of a split model's ranks, backends[r] being rank r's: threads of this process
// adding up in CPU memory for CPU backends, NCCL for GPU backends (one GPU each). Throws
// fl::Error for a mix, or where the transport cannot be set up (NCCL missing, ...).
std::vector<std::unique_ptr<Communicator>> make_rank_communicators(std::span<Backend* const> backends);

}  // namespace fl
