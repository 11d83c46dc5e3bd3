// Google Gemma 4 text decoder (dense 31B-style, 26B-A4B mixture of experts, E2B/E4B with
// per-layer embeddings and KV sharing), following ../shared/reference/models-gemma4-qwen35.md §2
// and transformers 5.17 modeling_gemma4.py. Model code only: every computation is a Backend op,
// every weight a Tensor of whatever format the source holds.
#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/communicator.h"
#include "core/error.h"
#include "core/half.h"
#include "model/batched_decode.h"
#include "model/decode_graph.h"
#include "model/gemma4.h"
#include "model/scratch_arena.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

// Rows [first_row, first_row + n_rows) of a forward's stacked tokens belong to `seq`.
struct Gemma4Layer {
  Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  Tensor layer_scalar;  // [1]
  Tensor q_proj, q_norm, k_proj, k_norm, v_proj, o_proj;  // k/v absent on KV-shared layers, v absent with k_eq_v
  Tensor gate_proj, up_proj, down_proj;
  // mixture of experts
  Tensor router_proj, router_scale, per_expert_scale, experts_gate_up, experts_down;
  Tensor pre_feedforward_norm_2, post_feedforward_norm_1, post_feedforward_norm_2;
  // per-layer embeddings
  Tensor per_layer_input_gate, per_layer_projection, post_per_layer_input_norm;
  Tensor inv_freq;  // [head_dim / 2] f32 on the device
};

// Rounds `value` the way torch's .to(dtype) would for the checkpoint's activation dtype.
float round_to_dtype(float value, const std::string& dtype) {
  if (dtype == "bfloat16") return bf16_to_f32(f32_to_bf16(value));
  if (dtype == "float16") return f16_to_f32(f32_to_f16(value));
  return value;
}

class Gemma4Model final : public Model {
 public:
  Gemma4Model(const ModelSource& source, Backend& backend)
      : source_config_(source.config()),
        c_(std::get<Gemma4Config>(source_config_.arch)),
        backend_(backend),
        scratch_(backend) {
    WeightLoader w(source, backend, "embed_tokens.weight");
    const int64_t H = c_.hidden_size, L = c_.num_layers, V = c_.vocab_size, P = c_.hidden_size_per_layer_input;
    embed_tokens_ = w.get("embed_tokens.weight", {V, H});
    final_norm_ = w.get("norm.weight", {H});
    lm_head_ = c_.tie_word_embeddings ? embed_tokens_ : w.get_unprefixed_optional("lm_head.weight", {V, H});
    if (!lm_head_.data) fail("{}: tie_word_embeddings is false but lm_head.weight is missing", source.path());
    if (P > 0) {
      embed_tokens_per_layer_ = w.get("embed_tokens_per_layer.weight", {c_.vocab_size_per_layer_input, L * P});
      per_layer_model_projection_ = w.get("per_layer_model_projection.weight", {L * P, H});
      per_layer_projection_norm_ = w.get("per_layer_projection_norm.weight", {P});
    }

    // The embedding scale sqrt(H) is cast to the checkpoint's dtype before use, as transformers
    // does (bf16 checkpoints multiply by 53.0, not 53.07, on the 26B).
    const std::string dtype = source_dtype(source);
    embed_scale_ = round_to_dtype(static_cast<float>(std::sqrt(static_cast<double>(H))), dtype);
    ple_embed_scale_ = round_to_dtype(static_cast<float>(std::sqrt(static_cast<double>(P))), dtype);

    layers_.resize(L);
    for (int64_t l = 0; l < L; ++l) {
      const Gemma4LayerConfig& lc = c_.layers[l];
      Gemma4Layer& layer = layers_[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      const int64_t D = lc.head_dim, nH = c_.num_heads, nKV = lc.n_kv_heads, I = lc.intermediate_size;
      layer.input_norm = w.get(p + "input_layernorm.weight", {H});
      layer.post_attention_norm = w.get(p + "post_attention_layernorm.weight", {H});
      layer.pre_feedforward_norm = w.get(p + "pre_feedforward_layernorm.weight", {H});
      layer.post_feedforward_norm = w.get(p + "post_feedforward_layernorm.weight", {H});
      layer.layer_scalar = w.get(p + "layer_scalar", {1});
      layer.q_proj = w.get(p + "self_attn.q_proj.weight", {nH * D, H});
      layer.q_norm = w.get(p + "self_attn.q_norm.weight", {D});
      layer.o_proj = w.get(p + "self_attn.o_proj.weight", {H, nH * D});
      if (lc.kv_source_layer < 0) {
        layer.k_proj = w.get(p + "self_attn.k_proj.weight", {nKV * D, H});
        layer.k_norm = w.get(p + "self_attn.k_norm.weight", {D});
        if (!lc.value_from_key) layer.v_proj = w.get(p + "self_attn.v_proj.weight", {nKV * D, H});
      }
      layer.gate_proj = w.get(p + "mlp.gate_proj.weight", {I, H});
      layer.up_proj = w.get(p + "mlp.up_proj.weight", {I, H});
      layer.down_proj = w.get(p + "mlp.down_proj.weight", {H, I});
      if (c_.enable_moe_block) {
        const int64_t E = c_.num_experts, Ie = c_.moe_intermediate_size;
        const int64_t held = c_.experts_held();  // an expert-parallel rank's experts
        layer.router_proj = w.get(p + "router.proj.weight", {E, H});
        layer.router_scale = w.get(p + "router.scale", {H});
        layer.per_expert_scale = w.get(p + "router.per_expert_scale", {E});
        layer.experts_gate_up = w.get(p + "experts.gate_up_proj", {held, 2 * Ie, H});
        layer.experts_down = w.get(p + "experts.down_proj", {held, H, Ie});
        layer.pre_feedforward_norm_2 = w.get(p + "pre_feedforward_layernorm_2.weight", {H});
        layer.post_feedforward_norm_1 = w.get(p + "post_feedforward_layernorm_1.weight", {H});
        layer.post_feedforward_norm_2 = w.get(p + "post_feedforward_layernorm_2.weight", {H});
      }
      if (P > 0) {
        layer.per_layer_input_gate = w.get(p + "per_layer_input_gate.weight", {P, H});
        layer.per_layer_projection = w.get(p + "per_layer_projection.weight", {H, P});
        layer.post_per_layer_input_norm = w.get(p + "post_per_layer_input_norm.weight", {H});
      }
      layer.inv_freq = make_inv_freq(lc);
    }

    // A layer whose K/V a later (KV-shared) layer reads writes its cache only at the end of the
    // forward, so that the sharer still sees the cache as it was before this call.
    writes_deferred_.assign(L, false);
    for (const auto& lc : c_.layers)
      if (lc.kv_source_layer >= 0) writes_deferred_[lc.kv_source_layer] = true;
  }

  // One rank of a model split with --tp (model/rank_source.h): the rank's shards come from
  // `rank_source`, which the model keeps, and `comm` adds up the partial sums of o_proj and the MLP.
  Gemma4Model(std::unique_ptr<ModelSource> rank_source, Backend& backend, Communicator& comm)
      : Gemma4Model(*rank_source, backend) {
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
    for (int l = 0; l < c_.num_layers; ++l) {
      const Gemma4LayerConfig& lc = c_.layers[l];
      if (lc.kv_source_layer >= 0) continue;
      int64_t rows = options.max_seq;
      if (lc.type == AttentionType::sliding && options.sliding_ring)
        rows = std::min<int64_t>(c_.sliding_window, options.max_seq);
      Tensor probe = make_tensor(nullptr, options.kv_dtype, {rows, lc.n_kv_heads, lc.head_dim}, backend_.device());
      for (Tensor* t : {&seq->kv[l].k, &seq->kv[l].v}) {
        seq->storage.push_back(backend_.allocate(static_cast<size_t>(probe.nbytes())));
        *t = make_tensor(seq->storage.back()->data(), options.kv_dtype, {rows, lc.n_kv_heads, lc.head_dim},
                         backend_.device());
        seq->kv_bytes += static_cast<size_t>(probe.nbytes());
      }
    }
    for (int l = 0; l < c_.num_layers; ++l)
      if (c_.layers[l].kv_source_layer >= 0) seq->kv[l] = seq->kv[c_.layers[l].kv_source_layer];
    return seq;
  }

  void copy_sequence(const Sequence& src, Sequence& dst) override { copy_sequence_storage(backend_, src, dst); }

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
    const SequenceRows part{&seq, 0, T};
    Tensor logits = run(scratch_, std::span<const SequenceRows>(&part, 1), ids_t, positions, mode);
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

  std::unique_ptr<DecodeGraph> make_decode_graph(Sequence& seq) override;
  void bind_to_this_thread() override { backend_.bind_to_this_thread(); }

  BatchedDecode batched_decode() {
    return BatchedDecode(
        backend_, scratch_, [this](const Sequence& s, std::span<const int32_t> ids) { check_step(s, ids); },
        [this](ScratchArena& arena, std::span<const SequenceRows> parts, const Tensor& ids, const Tensor& positions) {
          return run(arena, parts, ids, positions, LogitsMode::last);
        });
  }

  void check_step(const Sequence& seq, std::span<const int32_t> ids) const { check_step_ids(seq, ids, c_.vocab_size); }

  // The whole forward as device ops only: no host copies, no synchronisation, scratch from
  // `arena` (not reset here), so that a decode step can be captured and replayed. ids and
  // positions are device tensors [T]: the rows of one or more sequences (`parts`, in row order),
  // stacked for every weight op; attention and KV writes run per part on its own cache. Returns
  // the logits in `arena`: LogitsMode::all gives every row [T, vocab]; LogitsMode::last the last
  // row of a single part [1, vocab], or, for several parts of one row each, [parts, vocab].
  Tensor run(ScratchArena& arena, std::span<const SequenceRows> parts, const Tensor& ids_t, const Tensor& positions,
             LogitsMode mode) {
    const int64_t T = ids_t.numel();
    FL_ASSERT(!parts.empty() && parts.back().first_row + parts.back().n_rows == T);
    if (parts.size() > 1 && mode == LogitsMode::last)
      for (const SequenceRows& part : parts)
        if (part.n_rows != 1) fail("a batched forward of several tokens per sequence needs LogitsMode::all");
    const int64_t H = c_.hidden_size, L = c_.num_layers, P = c_.hidden_size_per_layer_input, nH = c_.num_heads;
    Backend& b = backend_;
    // Several sequences of one row each (batched decode): the deferred KV writes at the end take
    // all rows in one op, each row into its own cache (attend_and_write_kv does the same per layer).
    bool one_row_parts = parts.size() > 1;
    for (const SequenceRows& part : parts) one_row_parts = one_row_parts && part.n_rows == 1;
    std::vector<KvView> row_caches(one_row_parts ? parts.size() : 0);
    auto caches_of_layer = [&](int64_t layer) -> std::span<const KvView> {  // row i: sequence i's cache
      for (size_t i = 0; i < parts.size(); ++i) row_caches[i] = parts[i].seq->kv[layer];
      return row_caches;
    };
    Tensor h = arena.alloc(DType::f32, {T, H});  // the residual stream
    b.embed(h, embed_tokens_, ids_t, embed_scale_);

    // Per-layer embeddings: P_tok = E_ple[ids] * sqrt(P); P_ctx = norm((W h) / sqrt(H));
    // ple = (P_ctx + P_tok) / sqrt(2).                                     [T, L * P]
    Tensor ple;
    if (P > 0) {
      Tensor ple_tok = arena.alloc(DType::f32, {T, L * P});
      b.embed(ple_tok, embed_tokens_per_layer_, ids_t, ple_embed_scale_);
      ple = arena.alloc(DType::f32, {T, L * P});
      b.matmul(ple, h, per_layer_model_projection_);
      b.scale(ple, static_cast<float>(1.0 / std::sqrt(static_cast<double>(H))));
      Tensor ple_rows = ple.reshape({T * L, P});
      b.rms_norm(ple_rows, ple_rows, &per_layer_projection_norm_, NormGain::weight, c_.rms_norm_eps);
      b.add(ple, ple, ple_tok);
      b.scale(ple, static_cast<float>(1.0 / std::sqrt(2.0)));
    }

    Tensor x = arena.alloc(DType::f32, {T, H});
    Tensor tmp = arena.alloc(DType::f32, {T, H});
    // K/V that a later layer reads (KV sharing) outlive their layer: allocate them up front.
    std::vector<Tensor> fresh_k(L), fresh_v(L);
    for (int64_t l = 0; l < L; ++l)
      if (writes_deferred_[l]) {
        fresh_k[l] = arena.alloc(DType::f32, {T, c_.layers[l].n_kv_heads, c_.layers[l].head_dim});
        fresh_v[l] = arena.alloc(DType::f32, {T, c_.layers[l].n_kv_heads, c_.layers[l].head_dim});
      }
    const size_t layer_mark = arena.mark();
    const float eps = c_.rms_norm_eps;
    // x holds a layer's input norm: the first layer's from here, every later one's from the
    // residual update that ends the layer before it.
    b.rms_norm(x, h, &layers_[0].input_norm, NormGain::weight, eps);
    for (int64_t l = 0; l < L; ++l) {
      const Gemma4LayerConfig& lc = c_.layers[l];
      const Gemma4Layer& layer = layers_[l];
      const int64_t D = lc.head_dim, nKV = lc.n_kv_heads;
      arena.rewind(layer_mark);  // this layer's temporaries reuse the previous layer's bytes

      // ---- attention ----
      AttentionParams params;
      params.n_heads = static_cast<int>(nH);
      params.n_kv_heads = static_cast<int>(nKV);
      params.head_dim = static_cast<int>(D);
      params.scale = 1.0f;  // Gemma 4: q/k norms replace 1/sqrt(D)
      params.window = lc.type == AttentionType::sliding ? c_.sliding_window : 0;
      params.next_weights = &layer.o_proj;
      Tensor q = arena.alloc(DType::f32, {T, nH, D});
      Tensor attn = arena.alloc(DType::f32, {T, nH, D});
      if (lc.kv_source_layer >= 0) {
        // attend over the source layer's keys and values (its fresh rows, normed; written later)
        const int64_t source = lc.kv_source_layer;
        b.matmul(q.reshape({T, nH * D}), x, layer.q_proj);
        b.rms_norm_rope(q, &layer.q_norm, NormGain::weight, c_.rms_norm_eps, positions, layer.inv_freq);
        attend_and_write_kv(b, attn, q, fresh_k[source], fresh_v[source], parts, positions, params, source, false);
      } else {
        Tensor k = writes_deferred_[l] ? fresh_k[l] : arena.alloc(DType::f32, {T, nKV, D});
        Tensor v = writes_deferred_[l] ? fresh_v[l] : arena.alloc(DType::f32, {T, nKV, D});
        // With attention_k_eq_v, V is the raw K projection (before k_norm and RoPE).
        const Tensor outs[] = {q.reshape({T, nH * D}), k.reshape({T, nKV * D}), v.reshape({T, nKV * D})};
        const Tensor* weights[] = {&layer.q_proj, &layer.k_proj, lc.value_from_key ? &layer.k_proj : &layer.v_proj};
        b.matmul_group(outs, x, weights);
        const HeadNorm head_norms[] = {{q, &layer.q_norm, NormGain::weight, true},
                                       {k, &layer.k_norm, NormGain::weight, true},
                                       {v, nullptr, NormGain::none, false}};  // v_norm has no gain
        if (writes_deferred_[l]) {  // (k and v are fresh_k[l], fresh_v[l]: sharers read them, then the write)
          b.rms_norm_rope_group(head_norms, eps, positions, layer.inv_freq);
          attend_and_write_kv(b, attn, q, k, v, parts, positions, params, l, false);
        } else {  // (a decode step: one launch on a GPU)
          attend_from_projections(b, attn, head_norms, eps, layer.inv_freq, parts, positions, params, l);
        }
      }
      b.matmul(tmp, attn.reshape({T, nH * D}), layer.o_proj);
      if (comm_) comm_->all_reduce_sum(tmp);  // a rank's heads' share of o_proj: the sum over ranks

      // h += post_attention_norm(attention), then the feed-forward's input norms of the new h:
      // the dense MLP's; on MoE models also the router's (rms(h) * scale / sqrt(H): the residual,
      // not the MLP's input) and the expert block's.
      Tensor x_router, x_experts;
      {
        const ResidualTerm attention_out[] = {{tmp, &layer.post_attention_norm, NormGain::weight}};
        StreamNorm ffn_inputs[3] = {{x, &layer.pre_feedforward_norm, NormGain::weight}};
        size_t n_inputs = 1;
        if (c_.enable_moe_block) {
          x_router = arena.alloc(DType::f32, {T, H});
          x_experts = arena.alloc(DType::f32, {T, H});
          ffn_inputs[n_inputs++] = {x_router, &layer.router_scale, NormGain::weight,
                                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)))};
          ffn_inputs[n_inputs++] = {x_experts, &layer.pre_feedforward_norm_2, NormGain::weight};
        }
        ResidualUpdate update;
        update.terms = attention_out;
        update.norms = std::span<const StreamNorm>(ffn_inputs, n_inputs);
        update.eps = eps;
        update.next_weights = &layer.gate_proj;
        b.residual_update(h, update);
      }

      // ---- feed-forward: dense MLP, plus the expert block on MoE models ----
      const int64_t I = lc.intermediate_size;
      Tensor mlp = arena.alloc(DType::f32, {T, H});
      Tensor gate = arena.alloc(DType::f32, {T, I});  // (allocated here: a branch's lines only issue ops)
      Tensor up = arena.alloc(DType::f32, {T, I});
      auto dense_mlp = [&] {
        b.matmul_gated(gate, up, x, layer.gate_proj, layer.up_proj, Activation::gelu_tanh);
        b.matmul(mlp, gate, layer.down_proj);
        if (comm_) comm_->all_reduce_sum(mlp);  // a rank's slice of the intermediate: likewise
      };
      // The block's output: the MLP's post norm; on MoE models the MLP and expert outputs each
      // normed, summed and normed again (post_feedforward_norm).
      ResidualTerm ffn_out[2] = {{mlp, &layer.post_feedforward_norm, NormGain::weight}};
      ResidualUpdate update;
      update.terms = std::span<const ResidualTerm>(ffn_out, 1);
      update.eps = eps;
      if (c_.enable_moe_block) {
        const int64_t E = c_.num_experts, K = c_.top_k_experts;
        Tensor router_logits = arena.alloc(DType::f32, {T, E});
        Tensor expert_weights = arena.alloc(DType::f32, {T, K});
        Tensor expert_ids = arena.alloc(DType::i32, {T, K});
        auto experts = [&] {
          if (c_.expert_count == 0) {  // (one op: a backend may run the router with the experts)
            b.moe_route_experts(tmp, x_experts, x_router, layer.router_proj, &layer.per_expert_scale, router_logits,
                                expert_weights, expert_ids, layer.experts_gate_up, layer.experts_down,
                                Activation::gelu_tanh);
            return;
          }
          // Expert parallel: every rank routes over all experts, runs its own and adds up the rest.
          b.matmul(router_logits, x_router, layer.router_proj);
          b.moe_route(expert_weights, expert_ids, router_logits, &layer.per_expert_scale);
          b.moe_keep_experts(expert_ids, expert_weights, c_.expert_first, c_.expert_count);
          b.moe_experts(tmp, x_experts, layer.experts_gate_up, layer.experts_down, expert_ids, expert_weights,
                        Activation::gelu_tanh);
          if (comm_) comm_->all_reduce_sum(tmp);
        };
        // The dense MLP (3 kernels, ~10 MB of weights on the 26B-A4B) beside the router and experts
        // (4 kernels): two short chains at once rather than one long one. Split models keep one
        // line (their all-reduces run on the backend's one stream).
        if (comm_) {
          dense_mlp();
          experts();
        } else {
          run_side_by_side(b, dense_mlp, experts);
        }
        ffn_out[0].weight = &layer.post_feedforward_norm_1;
        ffn_out[1] = {tmp, &layer.post_feedforward_norm_2, NormGain::weight};
        update.terms = ffn_out;
        update.merge_weight = &layer.post_feedforward_norm;
        update.merge_gain = NormGain::weight;
      } else {
        dense_mlp();
      }
      // Then h *= layer_scalar and the next layer's input norm, after the per-layer embedding
      // block where the model has one (E2B/E4B).
      const StreamNorm next_input[] = {{x, l + 1 < L ? &layers_[l + 1].input_norm : nullptr, NormGain::weight}};
      const std::span<const StreamNorm> next_norms(next_input, l + 1 < L ? 1 : 0);
      ResidualTerm ple_out[1];
      if (P > 0) {
        b.residual_update(h, update);
        Tensor g = arena.alloc(DType::f32, {T, P});
        b.matmul(g, h, layer.per_layer_input_gate);
        b.gated_activation(g, g, ple.narrow(1, l * P, P), Activation::gelu_tanh);
        b.matmul(tmp, g, layer.per_layer_projection);
        ple_out[0] = {tmp, &layer.post_per_layer_input_norm, NormGain::weight};
        update = ResidualUpdate{};
        update.terms = ple_out;
        update.eps = eps;
      }
      update.layer_scalar = &layer.layer_scalar;
      update.norms = next_norms;
      update.next_weights = l + 1 < L ? &layers_[l + 1].q_proj : nullptr;
      b.residual_update(h, update);
    }
    for (int64_t l = 0; l < L; ++l) {
      if (!writes_deferred_[l]) continue;
      if (one_row_parts) {
        b.kv_write_rows(caches_of_layer(l), fresh_k[l], fresh_v[l], positions);
        continue;
      }
      for (const SequenceRows& part : parts) {
        const int64_t r0 = part.first_row, r1 = part.first_row + part.n_rows;
        b.kv_write(part.seq->kv[l], fresh_k[l].slice(r0, r1), fresh_v[l].slice(r0, r1), positions.slice(r0, r1));
      }
    }

    // ---- output: final norm, tied head, soft-cap ----
    const int64_t n_out = mode == LogitsMode::all ? T : parts.size() > 1 ? static_cast<int64_t>(parts.size()) : 1;
    Tensor last = h.slice(T - n_out, T);
    Tensor normed = arena.alloc(DType::f32, {n_out, H});
    b.rms_norm(normed, last, &final_norm_, NormGain::weight, c_.rms_norm_eps);
    Tensor logits = arena.alloc(DType::f32, {n_out, c_.vocab_size});
    b.matmul(logits, normed, lm_head_);
    if (c_.final_logit_softcapping) b.softcap(logits, *c_.final_logit_softcapping);
    return logits;
  }

  DecodeTraffic decode_traffic(int64_t context, DType kv_dtype) const override {
    DecodeTraffic traffic;
    auto bytes = [](const Tensor& t) { return t.data ? static_cast<double>(t.nbytes()) : 0.0; };
    traffic.weight_bytes += bytes(final_norm_) + bytes(lm_head_) + static_cast<double>(embed_tokens_.row_bytes());
    if (embed_tokens_per_layer_.data)
      traffic.weight_bytes += static_cast<double>(embed_tokens_per_layer_.row_bytes()) + bytes(per_layer_model_projection_) +
                              bytes(per_layer_projection_norm_);
    const double expert_share = c_.enable_moe_block ? static_cast<double>(c_.top_k_experts) / c_.num_experts : 0.0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Gemma4Layer& w = layers_[l];
      for (const Tensor* t : {&w.input_norm, &w.post_attention_norm, &w.pre_feedforward_norm, &w.post_feedforward_norm,
                              &w.layer_scalar, &w.q_proj, &w.q_norm, &w.k_proj, &w.k_norm, &w.v_proj, &w.o_proj,
                              &w.gate_proj, &w.up_proj, &w.down_proj, &w.router_proj, &w.router_scale,
                              &w.per_expert_scale, &w.pre_feedforward_norm_2, &w.post_feedforward_norm_1,
                              &w.post_feedforward_norm_2, &w.per_layer_input_gate, &w.per_layer_projection,
                              &w.post_per_layer_input_norm})
        traffic.weight_bytes += bytes(*t);
      traffic.weight_bytes += expert_share * (bytes(w.experts_gate_up) + bytes(w.experts_down));
      const Gemma4LayerConfig& lc = c_.layers[l];
      const int64_t visible = lc.type == AttentionType::sliding ? std::min<int64_t>(context, c_.sliding_window) : context;
      traffic.kv_bytes += 2.0 * static_cast<double>(visible) * lc.n_kv_heads * static_cast<double>(row_bytes(kv_dtype, lc.head_dim));
    }
    return traffic;
  }

 private:
  // The checkpoint's declared activation dtype (config "dtype", or "torch_dtype" in older files).
  static std::string source_dtype(const ModelSource& source) {
    auto json = nlohmann::json::parse(source.hf_config_json(), nullptr, false);
    for (const nlohmann::json* obj : {&json, json.contains("text_config") ? &json["text_config"] : nullptr}) {
      if (!obj || !obj->is_object()) continue;
      for (const char* key : {"dtype", "torch_dtype"})
        if (obj->contains(key) && (*obj)[key].is_string()) return (*obj)[key].get<std::string>();
    }
    return "float32";
  }

  // Inverse RoPE frequencies for one layer type, computed in f32 exactly as transformers does:
  // standard  f_i = 1 / theta^(2i / D), i < D/2;
  // proportional: the first floor(partial * D / 2) frequencies as above (exponent over the full
  // D), the rest 0, so that pairs (i, i + D/2) with i beyond them pass through unrotated.
  Tensor make_inv_freq(const Gemma4LayerConfig& lc) {
    const RopeConfig& rope = lc.type == AttentionType::sliding ? c_.rope_sliding : c_.rope_full;
    const int64_t D = lc.head_dim, half = D / 2;
    int64_t rotated = half;
    if (rope.type == RopeType::proportional)
      rotated = static_cast<int64_t>(rope.partial_rotary_factor * static_cast<double>(D) / 2.0);
    std::vector<float> freq(half, 0.0f);
    for (int64_t i = 0; i < rotated; ++i) {
      float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
      freq[i] = 1.0f / std::pow(static_cast<float>(rope.theta), exponent);
      freq[i] /= static_cast<float>(rope.factor);
    }
    inv_freq_storage_.push_back(backend_.allocate(half * sizeof(float)));
    Tensor t = make_tensor(inv_freq_storage_.back()->data(), DType::f32, {half}, backend_.device());
    backend_.copy_to_device(t, freq.data());
    return t;
  }

  ModelConfig source_config_;
  const Gemma4Config& c_;
  Backend& backend_;
  ScratchArena scratch_;
  Tensor embed_tokens_, final_norm_, lm_head_;
  Tensor embed_tokens_per_layer_, per_layer_model_projection_, per_layer_projection_norm_;
  float embed_scale_ = 1.0f, ple_embed_scale_ = 1.0f;
  std::vector<Gemma4Layer> layers_;
  std::vector<bool> writes_deferred_;
  std::vector<std::unique_ptr<DeviceBuffer>> inv_freq_storage_;
  std::unique_ptr<ModelSource> rank_source_;  // one rank of a split model: its shards (CPU weights are views of them)
  Communicator* comm_ = nullptr;              // one rank of a split model: the all-reduce
};

std::unique_ptr<DecodeGraph> Gemma4Model::make_decode_graph(Sequence& seq) {
  return std::make_unique<ReplayedDecode>(
      backend_, seq, [this](const Sequence& s, std::span<const int32_t> ids) { check_step(s, ids); },
      [this](ScratchArena& arena, Sequence& s, const Tensor& ids, const Tensor& positions) {
        const SequenceRows part{&s, 0, 1};
        return run(arena, std::span<const SequenceRows>(&part, 1), ids, positions, LogitsMode::last);
      });
}

}  // namespace

std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& c) {
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape, WeightKind kind) {
    specs.push_back({std::move(name), std::move(shape), kind});
  };
  const int64_t H = c.hidden_size, L = c.num_layers, V = c.vocab_size, P = c.hidden_size_per_layer_input;
  add("embed_tokens.weight", {V, H}, WeightKind::embedding);
  add("norm.weight", {H}, WeightKind::vector);
  if (P > 0) {
    add("embed_tokens_per_layer.weight", {c.vocab_size_per_layer_input, L * P}, WeightKind::embedding);
    add("per_layer_model_projection.weight", {L * P, H}, WeightKind::matrix);
    add("per_layer_projection_norm.weight", {P}, WeightKind::vector);
  }
  for (int64_t l = 0; l < L; ++l) {
    const Gemma4LayerConfig& lc = c.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    const int64_t D = lc.head_dim, nH = c.num_heads, nKV = lc.n_kv_heads, I = lc.intermediate_size;
    for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm"})
      add(p + norm + ".weight", {H}, WeightKind::vector);
    add(p + "layer_scalar", {1}, WeightKind::vector);
    add(p + "self_attn.q_proj.weight", {nH * D, H}, WeightKind::matrix);
    add(p + "self_attn.q_norm.weight", {D}, WeightKind::vector);
    add(p + "self_attn.o_proj.weight", {H, nH * D}, WeightKind::matrix);
    if (lc.kv_source_layer < 0) {
      add(p + "self_attn.k_proj.weight", {nKV * D, H}, WeightKind::matrix);
      add(p + "self_attn.k_norm.weight", {D}, WeightKind::vector);
      if (!lc.value_from_key) add(p + "self_attn.v_proj.weight", {nKV * D, H}, WeightKind::matrix);
    }
    add(p + "mlp.gate_proj.weight", {I, H}, WeightKind::matrix);
    add(p + "mlp.up_proj.weight", {I, H}, WeightKind::matrix);
    add(p + "mlp.down_proj.weight", {H, I}, WeightKind::matrix);
    if (c.enable_moe_block) {
      const int64_t E = c.num_experts, Ie = c.moe_intermediate_size, held = c.experts_held();
      add(p + "router.proj.weight", {E, H}, WeightKind::matrix);
      add(p + "router.scale", {H}, WeightKind::vector);
      add(p + "router.per_expert_scale", {E}, WeightKind::vector);
      add(p + "experts.gate_up_proj", {held, 2 * Ie, H}, WeightKind::experts);
      add(p + "experts.down_proj", {held, H, Ie}, WeightKind::experts);
      for (const char* norm : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                               "post_feedforward_layernorm_2"})
        add(p + norm + ".weight", {H}, WeightKind::vector);
    }
    if (P > 0) {
      add(p + "per_layer_input_gate.weight", {P, H}, WeightKind::matrix);
      add(p + "per_layer_projection.weight", {H, P}, WeightKind::matrix);
      add(p + "post_per_layer_input_norm.weight", {H}, WeightKind::vector);
    }
  }
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, WeightKind::embedding);
  return specs;
}

MemoryPlan gemma4_memory_plan(const ModelSource& source, const LoadOptions& o) {
  const Gemma4Config& c = std::get<Gemma4Config>(source.config().arch);
  MemoryPlan plan;
  const std::string prefix = find_weight_prefix(source, "embed_tokens.weight").value_or("");
  for (const WeightSpec& spec : gemma4_weight_specs(c)) {
    auto t = source.find(spec.name == "lm_head.weight" ? spec.name : prefix + spec.name);
    if (t) plan.weights += static_cast<double>(t->nbytes());
  }
  const double T = static_cast<double>(o.max_tokens), H = c.hidden_size, L = c.num_layers,
               P = c.hidden_size_per_layer_input, nH = c.num_heads;
  double per_layer_max = 0, deferred = 0, workspace = 0, side_workspace = 0;
  std::vector<bool> is_source(c.num_layers, false);
  for (const auto& lc : c.layers)
    if (lc.kv_source_layer >= 0) is_source[lc.kv_source_layer] = true;
  for (int l = 0; l < c.num_layers; ++l) {
    const Gemma4LayerConfig& lc = c.layers[l];
    const double D = lc.head_dim, nKV = lc.n_kv_heads, I = lc.intermediate_size;
    const double cache_rows =
        lc.type == AttentionType::sliding ? std::min<double>(c.sliding_window, o.max_seq) : o.max_seq;
    if (lc.kv_source_layer < 0)
      plan.kv += 2.0 * cache_rows * nKV * static_cast<double>(row_bytes(o.kv_dtype, lc.head_dim));
    const double kv_fresh = 2.0 * T * nKV * D * 4;
    if (is_source[l]) deferred += kv_fresh;
    double layer = 2.0 * T * nH * D * 4 + kv_fresh + 2.0 * T * I * 4 + T * H * 4 + T * P * 4;
    // MoE: router logits, routes, and the router's and experts' own input norms of h
    if (c.enable_moe_block) layer += T * c.num_experts * 4 + T * c.top_k_experts * 8 + 2.0 * T * H * 4;
    per_layer_max = std::max(per_layer_max, layer);
    // backend workspace: attention partials, the bf16 prompt attention's gathered keys (K and V of
    // every cache row plus the step's, bf16), and the expert block's intermediates and GEMM inputs
    workspace = std::max({workspace, attention_partials_workspace(T, o.sequences, nH, D),
                          2.0 * nKV * (cache_rows + T) * D * 2});
    if (c.enable_moe_block) {
      workspace =
          std::max(workspace, moe_experts_workspace(T, c.top_k_experts, c.num_experts, H, c.moe_intermediate_size));
      side_workspace = std::max(side_workspace, concurrent_branch_workspace(T, H, I));  // the dense MLP's
    }
  }
  const double n_out = o.logits == LogitsMode::all ? T : 1;
  plan.scratch = 3 * T * H * 4 + 2 * T * L * P * 4 + deferred + per_layer_max + n_out * (H + c.vocab_size) * 4 +
                 workspace + side_workspace;
  plan.scratch *= 1.05;  // allocation alignment and small buffers
  return plan;
}

std::unique_ptr<Model> make_gemma4_model(const ModelSource& source, Backend& backend) {
  return std::make_unique<Gemma4Model>(source, backend);
}

std::unique_ptr<Model> make_gemma4_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend,
                                              Communicator& comm) {
  if (!rank_source) fail("make_gemma4_rank_model: no rank source");
  return std::make_unique<Gemma4Model>(std::move(rank_source), backend, comm);
}

}  // namespace fl
