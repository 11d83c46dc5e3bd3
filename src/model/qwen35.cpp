// Qwen3.5 text decoder: three of every four layers are Gated DeltaNet linear attention (a causal
// conv over the fused q/k/v projection, L2-normalised q/k, the gated delta rule, a gated output
// norm), the rest gated full attention (per-head interleaved query/gate rows, (1+w) q/k norms,
// partial RoPE, a sigmoid output gate); the feed-forward is a SwiGLU MLP or routed experts with
// a sigmoid-gated shared expert. Follows ../shared/reference/models-gemma4-qwen35.md §3 and
// transformers 5.17 modeling_qwen3_5(_moe).py. Model code only: every computation is a Backend
// op, every weight a Tensor of whatever format the source holds.
//
// State per sequence: full-attention layers keep K/V rows (one row per position); linear layers
// keep a recurrent state of fixed size (the last kernel-1 conv inputs and a [dk, dv] delta-rule
// matrix per value head). Prompts run the delta rule in its chunked form (64 tokens per chunk),
// decode steps in its recurrent form; both leave the same state.
#include "model/qwen35.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/batched_decode.h"
#include "model/decode_graph.h"
#include "model/scratch_arena.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

constexpr int kDeltaRuleChunk = 64;  // transformers' and FLA's chunk length

struct Qwen35Layer {
  Tensor input_norm, post_attention_norm;
  // Gated DeltaNet
  Tensor in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv_taps, a_log, dt_bias, mixer_norm, out_proj;
  // gated full attention
  Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  // feed-forward: dense, or mixture of experts with a shared expert
  Tensor gate_proj, up_proj, down_proj;
  Tensor router, experts_gate_up, experts_down;
  Tensor shared_gate_proj, shared_up_proj, shared_down_proj, shared_expert_gate;
};

std::string layer_prefix(int64_t l) { return "layers." + std::to_string(l) + "."; }

class Qwen35Model final : public Model {
 public:
  Qwen35Model(const ModelSource& source, Backend& backend)
      : source_config_(source.config()),
        c_(std::get<Qwen35Config>(source_config_.arch)),
        backend_(backend),
        scratch_(backend) {
    WeightLoader w(source, backend, "embed_tokens.weight");
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    embed_tokens_ = w.get("embed_tokens.weight", {V, H});
    final_norm_ = w.get("norm.weight", {H});
    lm_head_ = c_.tie_word_embeddings ? embed_tokens_ : w.get_unprefixed_optional("lm_head.weight", {V, H});
    if (!lm_head_.data) fail("{}: tie_word_embeddings is false but lm_head.weight is missing", source.path());

    const int64_t nH = c_.num_heads, nKV = c_.num_kv_heads, D = c_.head_dim;
    const int64_t nV = c_.linear_num_value_heads, dv = c_.linear_value_head_dim, C = c_.conv_channels(),
                  Kc = c_.linear_conv_kernel_dim;
    layers_.resize(c_.num_layers);
    for (int64_t l = 0; l < c_.num_layers; ++l) {
      Qwen35Layer& layer = layers_[l];
      const std::string p = layer_prefix(l);
      layer.input_norm = w.get(p + "input_layernorm.weight", {H});
      layer.post_attention_norm = w.get(p + "post_attention_layernorm.weight", {H});
      if (c_.layer_types[l] == AttentionType::linear) {
        const std::string a = p + "linear_attn.";
        layer.in_proj_qkv = w.get(a + "in_proj_qkv.weight", {C, H});
        layer.in_proj_z = w.get(a + "in_proj_z.weight", {nV * dv, H});
        layer.in_proj_b = w.get(a + "in_proj_b.weight", {nV, H});
        layer.in_proj_a = w.get(a + "in_proj_a.weight", {nV, H});
        layer.conv_taps = w.get(a + "conv1d.weight", {C, 1, Kc}).reshape({C, Kc});
        layer.a_log = w.get(a + "A_log", {nV});
        layer.dt_bias = w.get(a + "dt_bias", {nV});
        layer.mixer_norm = w.get(a + "norm.weight", {dv});
        layer.out_proj = w.get(a + "out_proj.weight", {H, nV * dv});
      } else {
        const std::string a = p + "self_attn.";
        layer.q_proj = w.get(a + "q_proj.weight", {nH * 2 * D, H});
        layer.k_proj = w.get(a + "k_proj.weight", {nKV * D, H});
        layer.v_proj = w.get(a + "v_proj.weight", {nKV * D, H});
        layer.o_proj = w.get(a + "o_proj.weight", {H, nH * D});
        layer.q_norm = w.get(a + "q_norm.weight", {D});
        layer.k_norm = w.get(a + "k_norm.weight", {D});
      }
      if (c_.moe) {
        load_experts(source, w, l, layer);
      } else {
        const int64_t I = c_.intermediate_size;
        layer.gate_proj = w.get(p + "mlp.gate_proj.weight", {I, H});
        layer.up_proj = w.get(p + "mlp.up_proj.weight", {I, H});
        layer.down_proj = w.get(p + "mlp.down_proj.weight", {H, I});
      }
    }
    inv_freq_ = make_inv_freq();
  }

  // One rank of a model split with --tp (model/rank_source.h): the rank's shards come from
  // `rank_source`, which the model keeps, and `comm` adds up the partial sums of out_proj /
  // o_proj, the dense MLP's down_proj and (with --ep) the routed experts.
  Qwen35Model(std::unique_ptr<ModelSource> rank_source, Backend& backend, Communicator& comm)
      : Qwen35Model(*rank_source, backend) {
    rank_source_ = std::move(rank_source);
    comm_ = &comm;
  }

  const ModelConfig& config() const override { return source_config_; }
  int vocab_size() const override { return c_.vocab_size; }

  std::unique_ptr<Sequence> new_sequence(const SequenceOptions& options) override {
    check_sequence_options(options);
    auto seq = std::make_unique<Sequence>();
    seq->max_seq = options.max_seq;
    seq->kv.resize(c_.num_layers);
    seq->recurrent.resize(c_.num_layers);
    auto allocate = [&](DType dtype, std::initializer_list<int64_t> shape, size_t& counter) {
      Tensor probe = make_tensor(nullptr, dtype, shape, backend_.device());
      seq->storage.push_back(backend_.allocate(static_cast<size_t>(probe.nbytes())));  // zero-filled
      counter += static_cast<size_t>(probe.nbytes());
      return make_tensor(seq->storage.back()->data(), dtype, shape, backend_.device());
    };
    const int64_t Kc = c_.linear_conv_kernel_dim;
    for (int l = 0; l < c_.num_layers; ++l) {
      if (c_.layer_types[l] == AttentionType::linear) {
        seq->recurrent[l].conv = allocate(DType::f32, {Kc - 1, c_.conv_channels()}, seq->recurrent_bytes);
        seq->recurrent[l].delta = allocate(
            DType::f32, {c_.linear_num_value_heads, c_.linear_key_head_dim, c_.linear_value_head_dim},
            seq->recurrent_bytes);
      } else {
        seq->kv[l].k = allocate(options.kv_dtype, {options.max_seq, c_.num_kv_heads, c_.head_dim}, seq->kv_bytes);
        seq->kv[l].v = allocate(options.kv_dtype, {options.max_seq, c_.num_kv_heads, c_.head_dim}, seq->kv_bytes);
      }
    }
    return seq;
  }

  void copy_sequence(const Sequence& src, Sequence& dst) override { copy_sequence_storage(backend_, src, dst); }

  void reset_sequence(Sequence& seq) override {
    seq.n_past = 0;
    std::vector<uint8_t> zeros;
    for (RecurrentView& r : seq.recurrent)
      for (Tensor* t : {&r.conv, &r.delta}) {
        if (!t->data) continue;  // an attention layer
        zeros.assign(static_cast<size_t>(t->nbytes()), 0);
        backend_.copy_to_device(*t, zeros.data());
      }
  }

  std::vector<float> forward(Sequence& seq, std::span<const int32_t> ids, LogitsMode mode) override {
    const int64_t T = static_cast<int64_t>(ids.size());
    check_step(seq, ids);
    scratch_.reset();
    Tensor ids_t = scratch_.alloc(DType::i32, {T});
    backend_.copy_to_device(ids_t, ids.data());
    std::vector<int32_t> pos_host(T);
    for (int64_t t = 0; t < T; ++t) pos_host[t] = static_cast<int32_t>(seq.n_past + t);
    Tensor positions = scratch_.alloc(DType::i32, {T});
    backend_.copy_to_device(positions, pos_host.data());
    Tensor logits = run(scratch_, seq, ids_t, positions, mode);
    std::vector<float> out(static_cast<size_t>(logits.numel()));
    backend_.copy_to_host(out.data(), logits);
    seq.n_past += T;
    return out;
  }

  std::vector<float> forward_batch(std::span<Sequence* const> seqs, std::span<const int32_t> ids) override {
    return batched_decode().logits(seqs, ids);
  }

  std::vector<int32_t> forward_batch_sample(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                                            std::span<const SampleSpec> specs) override {
    return batched_decode().sampled(seqs, ids, specs);
  }

  BatchedDecode batched_decode() {
    return BatchedDecode(
        backend_, scratch_, [this](const Sequence& s, std::span<const int32_t> ids) { check_step(s, ids); },
        [this](ScratchArena& arena, std::span<const SequenceRows> parts, const Tensor& ids, const Tensor& positions) {
          return run(arena, parts, ids, positions, LogitsMode::last);
        });
  }

  void bind_to_this_thread() override { backend_.bind_to_this_thread(); }

  std::unique_ptr<DecodeGraph> make_decode_graph(Sequence& seq) override {
    return std::make_unique<ReplayedDecode>(
        backend_, seq, [this](const Sequence& s, std::span<const int32_t> ids) { check_step(s, ids); },
        [this](ScratchArena& arena, Sequence& s, const Tensor& ids, const Tensor& positions) {
          return run(arena, s, ids, positions, LogitsMode::last);
        });
  }

  void check_step(const Sequence& seq, std::span<const int32_t> ids) const {
    if (!ids.empty() && seq.recurrent.size() != static_cast<size_t>(c_.num_layers))
      fail("forward: the sequence was not made by this Qwen3.5 model");
    check_step_ids(seq, ids, c_.vocab_size);
  }

  // The whole forward as device ops only (no host copies, no synchronisation; scratch from
  // `arena`, not reset here), so that a decode step can be captured and replayed. ids and
  // positions are device tensors [T]; returns the logits [1 or T, vocab] in `arena`.
  Tensor run(ScratchArena& arena, Sequence& seq, const Tensor& ids_t, const Tensor& positions, LogitsMode mode) {
    const SequenceRows part{&seq, 0, ids_t.numel()};
    return run(arena, std::span<const SequenceRows>(&part, 1), ids_t, positions, mode);
  }

  // The same over the rows of one or more sequences (`parts`, in row order), stacked for every
  // weight op; convolution and delta-rule states, attention and KV writes go per sequence.
  // LogitsMode::last gives the last row of a single part [1, vocab], or, for several parts of one
  // row each (batched decode), [parts, vocab].
  Tensor run(ScratchArena& arena, std::span<const SequenceRows> parts, const Tensor& ids_t, const Tensor& positions,
             LogitsMode mode) {
    const int64_t T = ids_t.numel(), H = c_.hidden_size;
    FL_ASSERT(!parts.empty() && parts.back().first_row + parts.back().n_rows == T);
    if (parts.size() > 1 && mode == LogitsMode::last)
      for (const SequenceRows& part : parts)
        if (part.n_rows != 1) fail("a batched forward of several tokens per sequence needs LogitsMode::all");
    Backend& b = backend_;
    Tensor h = arena.alloc(DType::f32, {T, H});  // the residual stream
    b.embed(h, embed_tokens_, ids_t, 1.0f);      // no embedding scale
    Tensor x = arena.alloc(DType::f32, {T, H});
    Tensor mixed = arena.alloc(DType::f32, {T, H});
    const size_t layer_mark = arena.mark();
    const int64_t L = c_.num_layers;
    // h += mixer or MLP output (added as it is), then the norm the next block reads, in one op.
    const ResidualTerm block_out[] = {{mixed, nullptr, NormGain::none, false}};
    // next_weights: the product after the update (a hint: a GPU may pull its first bytes into L2).
    auto residual_add_then_norm = [&](const Tensor* next_norm, const Tensor* next_weights) {
      const StreamNorm norm[] = {{x, next_norm, NormGain::one_plus_weight}};
      ResidualUpdate update;
      update.terms = block_out;
      update.norms = std::span<const StreamNorm>(norm, next_norm ? 1 : 0);
      update.eps = c_.rms_norm_eps;
      update.next_weights = next_weights;
      b.residual_update(h, update);
    };
    // The first product of layer l's mixer and of its feed-forward (the MoE's shared expert: the
    // routed experts are not known before the router runs).
    auto mixer_input = [&](int64_t l) {
      return c_.layer_types[l] == AttentionType::linear ? &layers_[l].in_proj_qkv : &layers_[l].q_proj;
    };
    auto mlp_input = [&](int64_t l) { return c_.moe ? &layers_[l].shared_gate_proj : &layers_[l].gate_proj; };
    b.rms_norm(x, h, &layers_[0].input_norm, NormGain::one_plus_weight, c_.rms_norm_eps);
    for (int64_t l = 0; l < L; ++l) {
      const Qwen35Layer& layer = layers_[l];
      arena.rewind(layer_mark);  // this layer's temporaries reuse the previous layer's bytes
      if (c_.layer_types[l] == AttentionType::linear)
        gated_delta_net(arena, layer, l, parts, x, mixed);
      else
        gated_attention(arena, layer, l, parts, x, positions, mixed);
      arena.rewind(layer_mark);  // the mixer's temporaries are dead
      residual_add_then_norm(&layer.post_attention_norm, mlp_input(l));
      feed_forward(arena, layer, x, mixed);
      const bool last = l + 1 == L;
      residual_add_then_norm(last ? nullptr : &layers_[l + 1].input_norm, last ? nullptr : mixer_input(l + 1));
    }
    const int64_t n_out = mode == LogitsMode::all ? T : static_cast<int64_t>(parts.size());
    Tensor normed = arena.alloc(DType::f32, {n_out, H});
    b.rms_norm(normed, h.slice(T - n_out, T), &final_norm_, NormGain::one_plus_weight, c_.rms_norm_eps);
    Tensor logits = arena.alloc(DType::f32, {n_out, c_.vocab_size});
    b.matmul(logits, normed, lm_head_);
    return logits;
  }

  DecodeTraffic decode_traffic(int64_t context, DType kv_dtype) const override {
    DecodeTraffic traffic;
    auto bytes = [](const Tensor& t) { return t.data ? static_cast<double>(t.nbytes()) : 0.0; };
    traffic.weight_bytes += bytes(final_norm_) + static_cast<double>(embed_tokens_.row_bytes()) + bytes(lm_head_);
    const double expert_share = c_.moe ? static_cast<double>(c_.num_experts_per_tok) / c_.num_experts : 0.0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Qwen35Layer& w = layers_[l];
      for (const Tensor* t :
           {&w.input_norm, &w.post_attention_norm, &w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a,
            &w.conv_taps, &w.a_log, &w.dt_bias, &w.mixer_norm, &w.out_proj, &w.q_proj, &w.k_proj, &w.v_proj,
            &w.o_proj, &w.q_norm, &w.k_norm, &w.gate_proj, &w.up_proj, &w.down_proj, &w.router,
            &w.shared_gate_proj, &w.shared_up_proj, &w.shared_down_proj, &w.shared_expert_gate})
        traffic.weight_bytes += bytes(*t);
      traffic.weight_bytes += expert_share * (bytes(w.experts_gate_up) + bytes(w.experts_down));
      if (c_.layer_types[l] == AttentionType::linear)
        traffic.state_bytes += 2.0 * static_cast<double>(recurrent_state_bytes(c_));  // read, then written back
      else
        traffic.kv_bytes += 2.0 * static_cast<double>(context) * c_.num_kv_heads *
                            static_cast<double>(row_bytes(kv_dtype, c_.head_dim));
    }
    return traffic;
  }

  static int64_t recurrent_state_bytes(const Qwen35Config& c) {
    return 4 * ((c.linear_conv_kernel_dim - 1) * static_cast<int64_t>(c.conv_channels()) +
                static_cast<int64_t>(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim);
  }

 private:
  // ---- Gated DeltaNet mixer: x [T, H] (normed) -> out [T, H]; updates each sequence's state ----
  void gated_delta_net(ScratchArena& arena, const Qwen35Layer& layer, int64_t l, std::span<const SequenceRows> parts,
                       const Tensor& x, Tensor out) {
    Backend& b = backend_;
    const int64_t T = x.dim(0), C = c_.conv_channels();
    const int64_t nK = c_.linear_num_key_heads, nV = c_.linear_num_value_heads, dk = c_.linear_key_head_dim,
                  dv = c_.linear_value_head_dim;
    Tensor qkv = arena.alloc(DType::f32, {T, C});  // pre-convolution [Q all heads | K all heads | V all heads]
    Tensor z = arena.alloc(DType::f32, {T, nV * dv});
    Tensor beta = arena.alloc(DType::f32, {T, nV});  // b, then sigmoid(b)
    Tensor g = arena.alloc(DType::f32, {T, nV});     // a, then the log-decay g
    const Tensor projections[] = {qkv, z, beta, g};
    const Tensor* projection_weights[] = {&layer.in_proj_qkv, &layer.in_proj_z, &layer.in_proj_b, &layer.in_proj_a};
    b.matmul_group(projections, x, projection_weights);
    Tensor conv = arena.alloc(DType::f32, {T, C});
    Tensor core = arena.alloc(DType::f32, {T, nV, dv});
    DeltaRuleParams params;
    params.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
    params.chunk = kDeltaRuleChunk;
    bool one_row_parts = true;
    for (const SequenceRows& part : parts) one_row_parts = one_row_parts && part.n_rows == 1;
    if (one_row_parts) {  // decode: every sequence's one row through the whole step (one launch on a GPU)
      std::vector<Tensor> conv_states, delta_states;
      for (const SequenceRows& part : parts) {
        conv_states.push_back(part.seq->recurrent[l].conv);
        delta_states.push_back(part.seq->recurrent[l].delta);
      }
      DeltaNetStep step;
      step.conv_taps = &layer.conv_taps;
      step.a_log = &layer.a_log;
      step.dt_bias = &layer.dt_bias;
      step.norm = &layer.mixer_norm;  // (a plain gain here, unlike the model's 1 + w norms)
      step.norm_eps = c_.rms_norm_eps;
      step.rule = params;
      b.gated_delta_net_rows(core, conv, qkv, z, g, beta, conv_states, delta_states, step);
    } else {
      // The decay and beta gates (from a and b) beside the convolution (of q, k, v): independent
      // until the delta rule reads both.
      run_side_by_side(
          b, [&] { b.delta_rule_gates(g, beta, g, beta, layer.a_log, layer.dt_bias); },
          [&] {
            for (const SequenceRows& part : parts) {  // each sequence's rows continue its own states
              const int64_t r0 = part.first_row, r1 = part.first_row + part.n_rows;
              b.causal_conv1d(conv.slice(r0, r1), qkv.slice(r0, r1), layer.conv_taps, part.seq->recurrent[l].conv,
                              Activation::silu);  // z, a, b skip it
            }
          });
      for (const SequenceRows& part : parts) {
        const int64_t r0 = part.first_row, r1 = part.first_row + part.n_rows;
        const Tensor part_conv = conv.slice(r0, r1);
        const Tensor q = head_columns(part_conv, 0, nK, dk), k = head_columns(part_conv, nK * dk, nK, dk),
                     v = head_columns(part_conv, 2 * nK * dk, nV, dv);
        Tensor& delta = part.seq->recurrent[l].delta;
        if (part.n_rows == 1)
          b.gated_delta_rule(core.slice(r0, r1), q, k, v, g.slice(r0, r1), beta.slice(r0, r1), delta, params);
        else
          b.gated_delta_rule_chunked(core.slice(r0, r1), q, k, v, g.slice(r0, r1), beta.slice(r0, r1), delta, params);
      }
      // y = RMSNorm_w(o) * silu(z) per value head (plain gain here, unlike the model's 1+w norms)
      Tensor heads = core.reshape({T * nV, dv});
      b.rms_norm(heads, heads, &layer.mixer_norm, NormGain::weight, c_.rms_norm_eps);
      b.gated_activation(heads, z.reshape({T * nV, dv}), heads, Activation::silu);
    }
    b.matmul(out, core.reshape({T, nV * dv}), layer.out_proj);
    if (comm_) comm_->all_reduce_sum(out);  // a rank's value heads' share of out_proj: the sum over ranks
  }

  // ---- gated full attention: x [T, H] (normed) -> out [T, H]; appends K/V to each cache ----
  void gated_attention(ScratchArena& arena, const Qwen35Layer& layer, int64_t l, std::span<const SequenceRows> parts,
                       const Tensor& x, const Tensor& positions, Tensor out) {
    Backend& b = backend_;
    const int64_t T = x.dim(0), nH = c_.num_heads, nKV = c_.num_kv_heads, D = c_.head_dim;
    // q_proj rows per head: D query rows, then D gate rows.
    Tensor query_gate = arena.alloc(DType::f32, {T, nH, 2 * D});
    Tensor k = arena.alloc(DType::f32, {T, nKV, D});
    Tensor v = arena.alloc(DType::f32, {T, nKV, D});
    const Tensor outs[] = {query_gate.reshape({T, nH * 2 * D}), k.reshape({T, nKV * D}), v.reshape({T, nKV * D})};
    const Tensor* weights[] = {&layer.q_proj, &layer.k_proj, &layer.v_proj};
    b.matmul_group(outs, x, weights);
    // q from the projection's query halves, k in place; RoPE on the first rope_dim dims of each head
    Tensor q = arena.alloc(DType::f32, {T, nH, D});
    const Tensor query = query_gate.narrow(2, 0, D);
    const HeadNorm head_norms[] = {{q, &layer.q_norm, NormGain::one_plus_weight, true, &query},
                                   {k, &layer.k_norm, NormGain::one_plus_weight, true}};
    b.rms_norm_rope_group(head_norms, c_.rms_norm_eps, positions, inv_freq_);
    AttentionParams params;
    params.n_heads = static_cast<int>(nH);
    params.n_kv_heads = static_cast<int>(nKV);
    params.head_dim = static_cast<int>(D);
    params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    params.next_weights = &layer.o_proj;
    Tensor attn = arena.alloc(DType::f32, {T, nH, D});
    attend_and_write_kv(b, attn, q, k, v, parts, positions, params, l, true);
    b.sigmoid_gate(attn, query_gate.narrow(2, D, D));
    b.matmul(out, attn.reshape({T, nH * D}), layer.o_proj);
    if (comm_) comm_->all_reduce_sum(out);  // likewise for a rank's heads
  }

  // ---- feed-forward: x [T, H] (normed) -> out [T, H] ----
  void feed_forward(ScratchArena& arena, const Qwen35Layer& layer, const Tensor& x, Tensor out) {
    Backend& b = backend_;
    const int64_t T = x.dim(0), H = c_.hidden_size;
    // gate and up [T, I] are allocated by the caller (outside any concurrent branch's lines)
    auto swiglu = [&](Tensor y, const Tensor& gate_w, const Tensor& up_w, const Tensor& down_w, Tensor gate,
                      Tensor up) {
      b.matmul_gated(gate, up, x, gate_w, up_w, Activation::silu);
      b.matmul(y, gate, down_w);
    };
    if (!c_.moe) {
      swiglu(out, layer.gate_proj, layer.up_proj, layer.down_proj, arena.alloc(DType::f32, {T, c_.intermediate_size}),
             arena.alloc(DType::f32, {T, c_.intermediate_size}));
      if (comm_) comm_->all_reduce_sum(out);  // a rank's slice of the intermediate
      return;
    }
    // Routed experts: softmax over all experts, top-k, renormalised (no per-expert scale).
    const int64_t E = c_.num_experts, K = c_.num_experts_per_tok;
    Tensor router_logits = arena.alloc(DType::f32, {T, E});
    Tensor expert_weights = arena.alloc(DType::f32, {T, K});
    Tensor expert_ids = arena.alloc(DType::i32, {T, K});
    auto routed = [&] {
      if (c_.expert_count == 0) {  // (one op: a backend may run the router with the experts)
        b.moe_route_experts(out, x, x, layer.router, nullptr, router_logits, expert_weights, expert_ids,
                            layer.experts_gate_up, layer.experts_down, Activation::silu);
        return;
      }
      // Expert parallel: every rank routes over all experts, runs its own and adds up the rest.
      // The shared expert is whole on every rank (model/parallel_plan.h), so it is added after the
      // sum.
      b.matmul(router_logits, x, layer.router);
      b.moe_route(expert_weights, expert_ids, router_logits, nullptr);
      b.moe_keep_experts(expert_ids, expert_weights, c_.expert_first, c_.expert_count);
      b.moe_experts(out, x, layer.experts_gate_up, layer.experts_down, expert_ids, expert_weights, Activation::silu);
      if (comm_) comm_->all_reduce_sum(out);
    };
    // Shared expert, always on, scaled by sigmoid(w_gate . x).
    Tensor shared = arena.alloc(DType::f32, {T, H});
    Tensor shared_gate = arena.alloc(DType::f32, {T, 1});
    Tensor shared_hidden[2];  // gate and up
    for (Tensor& t : shared_hidden) t = arena.alloc(DType::f32, {T, c_.shared_expert_intermediate_size});
    auto shared_expert = [&] {
      swiglu(shared, layer.shared_gate_proj, layer.shared_up_proj, layer.shared_down_proj, shared_hidden[0],
             shared_hidden[1]);
      b.matmul(shared_gate, x, layer.shared_expert_gate);
      b.sigmoid_gate(shared, shared_gate);
    };
    // The shared expert (5 kernels) beside the router and routed experts (3-4): two short chains
    // at once. Split models keep one line (their all-reduces run on the backend's one stream).
    if (comm_) {
      routed();
      shared_expert();
    } else {
      run_side_by_side(b, shared_expert, routed);
    }
    b.add(out, out, shared);
  }

  // Experts as fused stacks, from either checkpoint layout: mlp.experts.gate_up_proj [E, 2 I, H]
  // and mlp.experts.down_proj [E, H, I], or per expert mlp.experts.{e}.{gate,up,down}_proj.weight
  // ([I, H], [I, H], [H, I]), which are packed here into the fused form (whole rows are copied,
  // so this works for every weight format: rows are packed independently). An expert-parallel
  // rank's stacks hold its own experts only (the router still scores all E).
  void load_experts(const ModelSource& source, WeightLoader& w, int64_t l, Qwen35Layer& layer) {
    const int64_t H = c_.hidden_size, E = c_.num_experts, I = c_.moe_intermediate_size,
                  Is = c_.shared_expert_intermediate_size, held = c_.experts_held();
    const std::string p = layer_prefix(l) + "mlp.";
    layer.router = w.get(p + "gate.weight", {E, H});
    layer.shared_gate_proj = w.get(p + "shared_expert.gate_proj.weight", {Is, H});
    layer.shared_up_proj = w.get(p + "shared_expert.up_proj.weight", {Is, H});
    layer.shared_down_proj = w.get(p + "shared_expert.down_proj.weight", {H, Is});
    layer.shared_expert_gate = w.get(p + "shared_expert_gate.weight", {1, H});
    layer.experts_gate_up = w.get_optional(p + "experts.gate_up_proj", {held, 2 * I, H});
    layer.experts_down = w.get_optional(p + "experts.down_proj", {held, H, I});
    if (layer.experts_gate_up.data && layer.experts_down.data) return;
    if (layer.experts_gate_up.data || layer.experts_down.data)
      fail("{}: layer {} has only one of the fused expert tensors gate_up_proj and down_proj", source.path(), l);
    layer.experts_gate_up = stack_experts(source, w, p, {"gate_proj", "up_proj"}, I, H);
    layer.experts_down = stack_experts(source, w, p, {"down_proj"}, H, I);
  }

  // [E, parts * rows, cols] from mlp.experts.{e}.{part}.weight [rows, cols], parts in order (E:
  // the experts this model holds).
  Tensor stack_experts(const ModelSource& source, const WeightLoader& w, const std::string& p,
                       std::initializer_list<const char*> parts, int64_t rows, int64_t cols) {
    const int64_t E = c_.experts_held(), n_parts = static_cast<int64_t>(parts.size());
    std::optional<DType> dtype;
    std::vector<Tensor> pieces;
    for (int64_t e = 0; e < E; ++e)
      for (const char* part : parts) {
        const std::string name = w.prefix() + p + "experts." + std::to_string(e) + "." + part + ".weight";
        auto t = source.find(name);
        if (!t) fail("{}: missing tensor '{}' (and no fused {}experts tensors)", source.path(), name, w.prefix() + p);
        if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols || !t->is_contiguous())
          fail("{}: tensor '{}' is {} but the config implies [{}, {}]", source.path(), name, t->describe(), rows, cols);
        if (dtype && *dtype != t->dtype)
          fail("{}: tensor '{}' is {} but the other experts are {}", source.path(), name, dtype_name(t->dtype),
               dtype_name(*dtype));
        dtype = t->dtype;
        pieces.push_back(*t);
      }
    const int64_t piece_bytes = pieces.front().nbytes();
    HostBuffer stacked(static_cast<size_t>(piece_bytes * static_cast<int64_t>(pieces.size())));
    for (size_t i = 0; i < pieces.size(); ++i)
      std::memcpy(static_cast<char*>(stacked.data()) + i * piece_bytes, pieces[i].data, static_cast<size_t>(piece_bytes));
    Tensor host = make_tensor(stacked.data(), *dtype, {E, n_parts * rows, cols});
    Tensor uploaded = backend_.upload_weight(host);
    if (uploaded.data == host.data) stacked_experts_.push_back(std::move(stacked));  // the backend reads it in place
    return uploaded;
  }

  // Inverse RoPE frequencies over the rotated span R = rope_dim, in f32 as transformers computes
  // them: f_i = 1 / theta^(2i / R), i < R / 2. Pairs (i, i + R/2) rotate; dims >= R pass through.
  Tensor make_inv_freq() {
    const int64_t R = c_.rope_dim, half = R / 2;
    std::vector<float> freq(half);
    for (int64_t i = 0; i < half; ++i)
      freq[i] = 1.0f / std::pow(static_cast<float>(c_.rope_theta), static_cast<float>(2 * i) / static_cast<float>(R));
    inv_freq_storage_ = backend_.allocate(half * sizeof(float));
    Tensor t = make_tensor(inv_freq_storage_->data(), DType::f32, {half}, backend_.device());
    backend_.copy_to_device(t, freq.data());
    return t;
  }

  ModelConfig source_config_;
  const Qwen35Config& c_;
  Backend& backend_;
  ScratchArena scratch_;
  Tensor embed_tokens_, final_norm_, lm_head_, inv_freq_;
  std::vector<Qwen35Layer> layers_;
  std::unique_ptr<DeviceBuffer> inv_freq_storage_;
  std::vector<HostBuffer> stacked_experts_;
  std::unique_ptr<ModelSource> rank_source_;  // one rank of a split model: its shards (CPU weights are views of them)
  Communicator* comm_ = nullptr;              // one rank of a split model: the all-reduce
};

}  // namespace

std::vector<WeightSpec> qwen35_weight_specs(const Qwen35Config& c) {
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape, WeightKind kind) {
    specs.push_back({std::move(name), std::move(shape), kind});
  };
  const int64_t H = c.hidden_size, V = c.vocab_size, nH = c.num_heads, nKV = c.num_kv_heads, D = c.head_dim;
  const int64_t nV = c.linear_num_value_heads, dv = c.linear_value_head_dim, C = c.conv_channels();
  add("embed_tokens.weight", {V, H}, WeightKind::embedding);
  add("norm.weight", {H}, WeightKind::vector);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    add(p + "input_layernorm.weight", {H}, WeightKind::vector);
    add(p + "post_attention_layernorm.weight", {H}, WeightKind::vector);
    if (c.layer_types[l] == AttentionType::linear) {
      const std::string a = p + "linear_attn.";
      add(a + "in_proj_qkv.weight", {C, H}, WeightKind::matrix);
      add(a + "in_proj_z.weight", {nV * dv, H}, WeightKind::matrix);
      add(a + "in_proj_b.weight", {nV, H}, WeightKind::matrix);
      add(a + "in_proj_a.weight", {nV, H}, WeightKind::matrix);
      add(a + "conv1d.weight", {C, 1, c.linear_conv_kernel_dim}, WeightKind::matrix);
      add(a + "A_log", {nV}, WeightKind::vector);
      add(a + "dt_bias", {nV}, WeightKind::vector);
      add(a + "norm.weight", {dv}, WeightKind::vector);
      add(a + "out_proj.weight", {H, nV * dv}, WeightKind::matrix);
    } else {
      const std::string a = p + "self_attn.";
      add(a + "q_proj.weight", {nH * 2 * D, H}, WeightKind::matrix);
      add(a + "k_proj.weight", {nKV * D, H}, WeightKind::matrix);
      add(a + "v_proj.weight", {nKV * D, H}, WeightKind::matrix);
      add(a + "o_proj.weight", {H, nH * D}, WeightKind::matrix);
      add(a + "q_norm.weight", {D}, WeightKind::vector);
      add(a + "k_norm.weight", {D}, WeightKind::vector);
    }
    if (c.moe) {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
      add(p + "mlp.gate.weight", {E, H}, WeightKind::matrix);
      add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, WeightKind::experts);
      add(p + "mlp.experts.down_proj", {E, H, I}, WeightKind::experts);
      add(p + "mlp.shared_expert.gate_proj.weight", {Is, H}, WeightKind::matrix);
      add(p + "mlp.shared_expert.up_proj.weight", {Is, H}, WeightKind::matrix);
      add(p + "mlp.shared_expert.down_proj.weight", {H, Is}, WeightKind::matrix);
      add(p + "mlp.shared_expert_gate.weight", {1, H}, WeightKind::matrix);
    } else {
      const int64_t I = c.intermediate_size;
      add(p + "mlp.gate_proj.weight", {I, H}, WeightKind::matrix);
      add(p + "mlp.up_proj.weight", {I, H}, WeightKind::matrix);
      add(p + "mlp.down_proj.weight", {H, I}, WeightKind::matrix);
    }
  }
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, WeightKind::embedding);
  return specs;
}

MemoryPlan qwen35_memory_plan(const ModelSource& source, const LoadOptions& o) {
  const Qwen35Config& c = std::get<Qwen35Config>(source.config().arch);
  MemoryPlan plan;
  const std::string prefix = find_weight_prefix(source, "embed_tokens.weight").value_or("");
  for (const WeightSpec& spec : qwen35_weight_specs(c)) {
    if (auto t = source.find(spec.name == "lm_head.weight" ? spec.name : prefix + spec.name)) {
      plan.weights += static_cast<double>(t->nbytes());
    } else if (spec.kind == WeightKind::experts) {
      // per-expert checkpoint: the same bytes, stacked at load
      const std::string base = prefix + spec.name.substr(0, spec.name.rfind('.') + 1);
      const std::vector<std::string> parts = spec.name.ends_with("gate_up_proj")
                                                 ? std::vector<std::string>{"gate_proj", "up_proj"}
                                                 : std::vector<std::string>{"down_proj"};
      for (int64_t e = 0; e < c.num_experts; ++e)
        for (const std::string& part : parts)
          if (auto t = source.find(base + std::to_string(e) + "." + part + ".weight"))
            plan.weights += static_cast<double>(t->nbytes());
    }
  }
  const double T = static_cast<double>(o.max_tokens), H = c.hidden_size, nH = c.num_heads, nKV = c.num_kv_heads,
               D = c.head_dim, C = c.conv_channels(), nV = c.linear_num_value_heads,
               dv = c.linear_value_head_dim;
  double per_layer_max = 0, workspace = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    double mixer;
    if (c.layer_types[l] == AttentionType::linear) {
      plan.recurrent += static_cast<double>(Qwen35Model::recurrent_state_bytes(c));
      mixer = T * (2 * C + 2 * nV * dv + 2 * nV) * 4;
    } else {
      plan.kv += 2.0 * static_cast<double>(o.max_seq) * nKV * static_cast<double>(row_bytes(o.kv_dtype, c.head_dim));
      mixer = T * (4 * nH * D + 2 * nKV * D) * 4;
      // attention partials; the bf16 prompt attention's gathered K and V (bf16)
      workspace = std::max({workspace, attention_partials_workspace(T, o.sequences, nH, D),
                            2.0 * nKV * (o.max_seq + T) * D * 2});
    }
    double ffn = c.moe ? T * (c.num_experts + 2.0 * c.num_experts_per_tok + 2.0 * c.shared_expert_intermediate_size + H + 1) * 4
                       : T * 2.0 * c.intermediate_size * 4;
    per_layer_max = std::max(per_layer_max, std::max(mixer, ffn));
    if (c.moe)
      workspace = std::max(workspace,
                           moe_experts_workspace(T, c.num_experts_per_tok, c.num_experts, H, c.moe_intermediate_size));
  }
  // the shared expert's, on the side line of a concurrent branch
  const double side_workspace = c.moe ? concurrent_branch_workspace(T, H, c.shared_expert_intermediate_size) : 0.0;
  const double n_out = o.logits == LogitsMode::all ? T : 1;
  plan.scratch = 3 * T * H * 4 + per_layer_max + n_out * (H + c.vocab_size) * 4 + workspace + side_workspace;
  plan.scratch *= 1.05;  // allocation alignment and small buffers
  return plan;
}

std::unique_ptr<Model> make_qwen35_model(const ModelSource& source, Backend& backend) {
  return std::make_unique<Qwen35Model>(source, backend);
}

std::unique_ptr<Model> make_qwen35_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend,
                                              Communicator& comm) {
  if (!rank_source) fail("make_qwen35_rank_model: no rank source");
  return std::make_unique<Qwen35Model>(std::move(rank_source), backend, comm);
}

}  // namespace fl
