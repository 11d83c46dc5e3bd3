#include "model/parallel_plan.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/model_source.h"
#include "model/gemma4.h"
#include "model/qwen35.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The layer index of "layers.<l>.<...>", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

// `units` split over `ranks` as evenly as whole units allow (the first ranks take one more).
std::vector<std::pair<int64_t, int64_t>> deal(int64_t units, int ranks) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t n = units / ranks + (r < units % ranks ? 1 : 0);
    out.push_back({at, at + n});
    at += n;
  }
  return out;
}

int64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows * row_bytes(dtype, shape.back());
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> shard_runs(const TensorShard& shard, int rank) {
  if (!shard.runs.empty()) return shard.runs.at(rank);
  return {{shard.begin.at(rank), shard.end.at(rank)}};
}

std::vector<int64_t> shard_shape(const TensorShard& shard, int rank) {
  std::vector<int64_t> shape = shard.shape;
  int64_t n = 0;
  for (auto [b, e] : shard_runs(shard, rank)) n += e - b;
  switch (shard.split) {
    case ShardSplit::replicated: break;
    case ShardSplit::rows:  // of a matrix; an expert stack splits by whole experts
    case ShardSplit::experts: shape[0] = n; break;
    case ShardSplit::columns: shape.back() = n; break;
  }
  return shape;
}

namespace {

int check_ranks(const ParallelOptions& options) {
  if (options.tensor_parallel < 1) fail("--tp {}: the number of GPUs must be at least 1", options.tensor_parallel);
  return options.tensor_parallel;
}

// Per rank, the shared heads (attention's KV heads, a DeltaNet layer's key heads) that its
// heads read: `heads` heads (heads % N == 0) read `shared` ones in groups of heads / shared.
// Dealt out when they divide; when there are fewer than ranks, each rank holds the one its heads
// share (so a group must not straddle ranks). Empty when neither works.
std::vector<std::pair<int64_t, int64_t>> shared_head_ranges(int64_t heads, int64_t shared, int N) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t per_rank = heads / N;
  if (shared % N == 0) {
    for (int r = 0; r < N; ++r) out.push_back({r * (shared / N), (r + 1) * (shared / N)});
  } else if (N % shared == 0 && (heads / shared) % per_rank == 0) {
    const int64_t group = heads / shared;
    for (int r = 0; r < N; ++r) out.push_back({r * per_rank / group, r * per_rank / group + 1});
  }
  return out;
}

// Rank r's [r * per_rank, (r + 1) * per_rank) for each of N ranks: whole heads of `per_rank`
// elements of the split dim each.
std::vector<std::pair<int64_t, int64_t>> even_ranges(int N, int64_t per_rank) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int r = 0; r < N; ++r) out.push_back({r * per_rank, (r + 1) * per_rank});
  return out;
}

// A column split of layer l's `what` (o_proj, out_proj) into `heads` heads of `dim` per rank
// must fall on the format's block boundaries.
void check_column_cut(int N, int l, const char* what, int64_t block, int64_t heads, int64_t dim, const char* noun) {
  if (heads * dim % block)
    fail("--tp {}: layer {}'s {} would be cut inside its {}-weight blocks ({} {} of {} per GPU)", N, l, what, block,
         heads, noun, dim);
}

// Layer l's MLP intermediate of width I dealt out in units of `block` (the down projection's
// block, so its column split falls on block boundaries); the last rank takes the padded tail.
std::vector<std::pair<int64_t, int64_t>> split_mlp_in_blocks(int64_t I, int64_t block, int N, int64_t l) {
  const int64_t units = (I + block - 1) / block;
  if (units < N)
    fail("--tp {}: layer {}'s MLP width {} is {} blocks of {} weights, fewer than one per GPU", N, l, I, units, block);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto [u0, u1] : deal(units, N)) out.push_back({u0 * block, std::min(u1 * block, I)});
  return out;
}

// A weight spec's entry, in the format it will have, not split yet.
TensorShard unsplit(const WeightSpec& spec, const WeightFormatOf& format_of) {
  TensorShard t;
  t.name = spec.name;
  t.shape = spec.shape;
  t.dtype = format_of(spec.name, spec.shape);
  return t;
}

// Appends `t` with its per-rank ranges (none: replicated) and counts its bytes on each rank.
void add_shard(ParallelPlan& plan, TensorShard t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  for (int r = 0; r < plan.ranks; ++r) {
    t.begin.push_back(t.split == ShardSplit::replicated ? 0 : ranges.at(r).first);
    t.end.push_back(t.split == ShardSplit::replicated ? 0 : ranges.at(r).second);
  }
  for (int r = 0; r < plan.ranks; ++r) plan.rank_bytes[r] += tensor_bytes(t.dtype, shard_shape(t, r));
  plan.tensors.push_back(std::move(t));
}

}  // namespace

ParallelPlan plan_gemma4_parallel(const Gemma4Config& c, const ParallelOptions& options, const WeightFormatOf& format_of) {
  const int N = check_ranks(options);
  if (c.num_heads % N) fail("--tp {}: the model's {} query heads do not divide into {} equal parts", N, c.num_heads, N);
  if (options.expert_parallel && c.enable_moe_block && c.num_experts < N)
    fail("--ep over {} GPUs: the model has only {} experts", N, c.num_experts);

  ParallelPlan plan;
  plan.ranks = N;
  plan.rank_bytes.assign(N, 0);
  plan.all_reduces_per_layer = N == 1 ? 0 : 2 + (c.enable_moe_block && options.expert_parallel ? 1 : 0);
  const int heads_per_rank = c.num_heads / N;

  // The MLP intermediate of each layer, in units of its down projection's block.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> mlp_split(c.layers.size());
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const int64_t I = c.layers[l].intermediate_size;
    const std::string down = "layers." + std::to_string(l) + ".mlp.down_proj.weight";
    const int64_t block = dtype_traits(format_of(down, {c.hidden_size, I})).block_elems;
    mlp_split[l] = split_mlp_in_blocks(I, block, N, static_cast<int64_t>(l));
  }

  for (const WeightSpec& spec : gemma4_weight_specs(c)) {
    TensorShard t = unsplit(spec, format_of);
    const int l = layer_of(spec.name);
    const Gemma4LayerConfig* lc = l >= 0 ? &c.layers.at(l) : nullptr;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    if (N == 1) {
      // nothing splits
    } else if (ends_with(spec.name, "self_attn.q_proj.weight") || ends_with(spec.name, "self_attn.o_proj.weight")) {
      t.split = ends_with(spec.name, "q_proj.weight") ? ShardSplit::rows : ShardSplit::columns;
      const int64_t D = lc->head_dim, block = dtype_traits(t.dtype).block_elems;
      if (t.split == ShardSplit::columns) check_column_cut(N, l, "o_proj", block, heads_per_rank, D, "heads");
      ranges = even_ranges(N, heads_per_rank * D);
    } else if (ends_with(spec.name, "self_attn.k_proj.weight") || ends_with(spec.name, "self_attn.v_proj.weight")) {
      t.split = ShardSplit::rows;
      const int64_t D = lc->head_dim, nKV = lc->n_kv_heads;
      for (auto [h0, h1] : shared_head_ranges(c.num_heads, nKV, N)) ranges.push_back({h0 * D, h1 * D});
      if (ranges.empty())
        fail("--tp {}: layer {} has {} KV heads, which neither divide into {} parts nor repeat evenly over {} GPUs", N,
             l, nKV, N, N);
    } else if (ends_with(spec.name, "mlp.gate_proj.weight") || ends_with(spec.name, "mlp.up_proj.weight") ||
               ends_with(spec.name, "mlp.down_proj.weight")) {
      t.split = ends_with(spec.name, "down_proj.weight") ? ShardSplit::columns : ShardSplit::rows;
      ranges = mlp_split[l];
    } else if (options.expert_parallel && (ends_with(spec.name, "experts.gate_up_proj") || ends_with(spec.name, "experts.down_proj"))) {
      t.split = ShardSplit::experts;
      ranges = deal(c.num_experts, N);
    }
    add_shard(plan, std::move(t), ranges);
  }
  return plan;
}

ParallelPlan plan_qwen35_parallel(const Qwen35Config& c, const ParallelOptions& options,
                                  const WeightFormatOf& format_of) {
  const int N = check_ranks(options);
  if (c.num_heads % N) fail("--tp {}: the model's {} query heads do not divide into {} equal parts", N, c.num_heads, N);
  const int64_t nV = c.linear_num_value_heads, nK = c.linear_num_key_heads, dk = c.linear_key_head_dim,
                dv = c.linear_value_head_dim, D = c.head_dim;
  if (nV % N) fail("--tp {}: the model's {} linear-attention value heads do not divide into {} equal parts", N, nV, N);
  if (options.expert_parallel && c.moe && c.num_experts < N)
    fail("--ep over {} GPUs: the model has only {} experts", N, c.num_experts);

  ParallelPlan plan;
  plan.ranks = N;
  plan.rank_bytes.assign(N, 0);
  // After each mixer; after the feed-forward when it is split (a dense MLP, or experts with --ep).
  plan.all_reduces_per_layer = N == 1 ? 0 : 1 + (!c.moe || options.expert_parallel ? 1 : 0);
  const int64_t heads_per_rank = c.num_heads / N, values_per_rank = nV / N;
  const auto kv_heads = shared_head_ranges(c.num_heads, c.num_kv_heads, N);
  const auto key_heads = shared_head_ranges(nV, nK, N);
  const auto n_linear = std::count(c.layer_types.begin(), c.layer_types.end(), AttentionType::linear);
  const bool has_linear = n_linear > 0, has_full = n_linear < c.num_layers;
  if (N > 1 && has_full && kv_heads.empty())
    fail("--tp {}: the model's {} KV heads neither divide into {} parts nor repeat evenly over {} GPUs", N,
         c.num_kv_heads, N, N);
  if (N > 1 && has_linear && key_heads.empty())
    fail(
        "--tp {}: the model's {} linear-attention key heads neither divide into {} parts nor repeat evenly over {} "
        "GPUs",
        N, nK, N, N);

  // The dense MLP's split, the same in every layer (the config has one width for all of them): in
  // units of the largest down-projection block of any layer (block sizes 1, 32, 128, 256 divide
  // one another, so the cuts fall on every layer's block boundaries, whatever its format).
  std::vector<std::pair<int64_t, int64_t>> mlp_split;
  if (N > 1 && !c.moe) {
    int64_t block = 1, widest = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string down = "layers." + std::to_string(l) + ".mlp.down_proj.weight";
      const int64_t b = dtype_traits(format_of(down, {c.hidden_size, c.intermediate_size})).block_elems;
      if (b > block) block = b, widest = l;
    }
    mlp_split = split_mlp_in_blocks(c.intermediate_size, block, N, widest);
  }

  for (const WeightSpec& spec : qwen35_weight_specs(c)) {
    TensorShard t = unsplit(spec, format_of);
    const int l = layer_of(spec.name);
    const int64_t block = dtype_traits(t.dtype).block_elems;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    if (N == 1) {
      // nothing splits
    } else if (ends_with(spec.name, "linear_attn.in_proj_qkv.weight") ||
               ends_with(spec.name, "linear_attn.conv1d.weight")) {
      // Channels [Q of every key head | K of every key head | V of every value head]: the rank's
      // three runs.
      t.split = ShardSplit::rows;
      for (int r = 0; r < N; ++r) {
        const auto [k0, k1] = key_heads[r];
        const int64_t v0 = r * values_per_rank, v1 = v0 + values_per_rank;
        t.runs.push_back({{k0 * dk, k1 * dk},
                          {nK * dk + k0 * dk, nK * dk + k1 * dk},
                          {2 * nK * dk + v0 * dv, 2 * nK * dk + v1 * dv}});
        ranges.push_back({k0 * dk, 2 * nK * dk + v1 * dv});
      }
    } else if (ends_with(spec.name, "linear_attn.in_proj_z.weight")) {
      t.split = ShardSplit::rows;
      ranges = even_ranges(N, values_per_rank * dv);
    } else if (ends_with(spec.name, "linear_attn.in_proj_b.weight") ||
               ends_with(spec.name, "linear_attn.in_proj_a.weight") || ends_with(spec.name, "linear_attn.A_log") ||
               ends_with(spec.name, "linear_attn.dt_bias")) {
      t.split = ShardSplit::rows;
      ranges = even_ranges(N, values_per_rank);
    } else if (ends_with(spec.name, "linear_attn.out_proj.weight")) {
      t.split = ShardSplit::columns;
      check_column_cut(N, l, "out_proj", block, values_per_rank, dv, "value heads");
      ranges = even_ranges(N, values_per_rank * dv);
    } else if (ends_with(spec.name, "self_attn.q_proj.weight")) {
      t.split = ShardSplit::rows;  // per head: D query rows, then D gate rows
      ranges = even_ranges(N, heads_per_rank * 2 * D);
    } else if (ends_with(spec.name, "self_attn.o_proj.weight")) {
      t.split = ShardSplit::columns;
      check_column_cut(N, l, "o_proj", block, heads_per_rank, D, "heads");
      ranges = even_ranges(N, heads_per_rank * D);
    } else if (ends_with(spec.name, "self_attn.k_proj.weight") || ends_with(spec.name, "self_attn.v_proj.weight")) {
      t.split = ShardSplit::rows;
      for (auto [h0, h1] : kv_heads) ranges.push_back({h0 * D, h1 * D});
    } else if (ends_with(spec.name, "mlp.gate_proj.weight") || ends_with(spec.name, "mlp.up_proj.weight") ||
               ends_with(spec.name, "mlp.down_proj.weight")) {
      t.split = ends_with(spec.name, "down_proj.weight") ? ShardSplit::columns : ShardSplit::rows;
      ranges = mlp_split;
    } else if (options.expert_parallel &&
               (ends_with(spec.name, "mlp.experts.gate_up_proj") || ends_with(spec.name, "mlp.experts.down_proj"))) {
      t.split = ShardSplit::experts;
      ranges = deal(c.num_experts, N);
    }
    add_shard(plan, std::move(t), ranges);
  }
  return plan;
}

ParallelPlan plan_model_parallel(const ModelConfig& config, const ParallelOptions& options,
                                 const WeightFormatOf& format_of) {
  if (const auto* gemma = std::get_if<Gemma4Config>(&config.arch))
    return plan_gemma4_parallel(*gemma, options, format_of);
  return plan_qwen35_parallel(std::get<Qwen35Config>(config.arch), options, format_of);
}

bool has_routed_experts(const ModelConfig& config) {
  if (const auto* gemma = std::get_if<Gemma4Config>(&config.arch)) return gemma->enable_moe_block;
  return std::get<Qwen35Config>(config.arch).moe;
}

WeightFormatOf source_weight_formats(const ModelSource& source) {
  const std::string prefix = find_weight_prefix(source, "embed_tokens.weight").value_or("");
  return [&source, prefix](const std::string& name, const std::vector<int64_t>&) {
    std::optional<Tensor> t = source.find(prefix + name);
    if (!t) t = source.find(name);  // lm_head.weight sits outside the model prefix
    if (!t && (ends_with(name, "experts.gate_up_proj") || ends_with(name, "experts.down_proj"))) {
      // stored per expert: expert 0's part (the loader refuses experts of mixed formats)
      const std::string base = prefix + name.substr(0, name.rfind('.') + 1) + "0.";
      t = source.find(base + (ends_with(name, "gate_up_proj") ? "gate_proj.weight" : "down_proj.weight"));
    }
    if (!t) fail("{}: missing tensor '{}{}'", source.path(), prefix, name);
    return t->dtype;
  };
}

namespace {

// The bytes of one slice along dim 0 of a packed tensor: a row of a matrix (or of [C, 1, k] conv
// taps), an element of a vector, a whole expert of a stack [E, out, in].
int64_t dim0_slice_bytes(const TensorShard& shard) {
  const DTypeTraits& traits = dtype_traits(shard.dtype);
  int64_t unit = row_bytes(shard.dtype, shard.shape.back());
  if (shard.shape.size() == 1) {
    if (traits.block_elems != 1)
      fail("{}: a {} vector cannot be split by element", shard.name, dtype_name(shard.dtype));
    unit = traits.block_bytes;
  }
  for (size_t i = 1; i + 1 < shard.shape.size(); ++i) unit *= shard.shape[i];
  return unit;
}

}  // namespace

std::optional<int64_t> shard_byte_offset(const TensorShard& shard, int rank) {
  if (shard.split == ShardSplit::replicated) return 0;
  if (shard.split == ShardSplit::columns || shard_runs(shard, rank).size() != 1) return std::nullopt;
  return shard.begin.at(rank) * dim0_slice_bytes(shard);
}

std::vector<uint8_t> extract_shard(const TensorShard& shard, int rank, const uint8_t* data) {
  const std::vector<int64_t> shape = shard_shape(shard, rank);
  std::vector<uint8_t> out(static_cast<size_t>(tensor_bytes(shard.dtype, shape)));
  const DTypeTraits& traits = dtype_traits(shard.dtype);
  const int64_t K = shard.shape.back(), row = row_bytes(shard.dtype, K);
  switch (shard.split) {
    case ShardSplit::replicated:
      std::memcpy(out.data(), data, out.size());
      break;
    case ShardSplit::rows:
    case ShardSplit::experts: {
      const int64_t unit = dim0_slice_bytes(shard);
      uint8_t* at = out.data();
      for (auto [b, e] : shard_runs(shard, rank)) {
        std::memcpy(at, data + b * unit, static_cast<size_t>((e - b) * unit));
        at += (e - b) * unit;
      }
      break;
    }
    case ShardSplit::columns: {
      if (!shard.runs.empty()) fail("{}: a column split of several runs", shard.name);
      const int64_t b = shard.begin.at(rank), e = shard.end.at(rank);
      if (b % traits.block_elems) fail("{}: column split at {} is inside a block of {}", shard.name, b, traits.block_elems);
      const int64_t first = b / traits.block_elems * traits.block_bytes, piece = row_bytes(shard.dtype, e - b);
      int64_t rows = 1;
      for (size_t i = 0; i + 1 < shard.shape.size(); ++i) rows *= shard.shape[i];
      for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * piece, data + r * row + first, static_cast<size_t>(piece));
      break;
    }
  }
  return out;
}

}  // namespace fl
