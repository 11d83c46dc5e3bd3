#include "model/parallel_plan.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/gemma4.h"

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

std::vector<int64_t> shard_shape(const TensorShard& shard, int rank) {
  std::vector<int64_t> shape = shard.shape;
  const int64_t n = shard.end.at(rank) - shard.begin.at(rank);
  switch (shard.split) {
    case ShardSplit::replicated: break;
    case ShardSplit::rows:  // of a matrix; an expert stack splits by whole experts
    case ShardSplit::experts: shape[0] = n; break;
    case ShardSplit::columns: shape.back() = n; break;
  }
  return shape;
}

ParallelPlan plan_gemma4_parallel(const Gemma4Config& c, const ParallelOptions& options, const WeightFormatOf& format_of) {
  const int N = options.tensor_parallel;
  if (N < 1) fail("--tp {}: the number of GPUs must be at least 1", N);
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
    const int64_t units = (I + block - 1) / block;
    if (units < N)
      fail("--tp {}: layer {}'s MLP width {} is {} blocks of {} weights, fewer than one per GPU", N, l, I, units, block);
    for (auto [u0, u1] : deal(units, N)) mlp_split[l].push_back({u0 * block, std::min(u1 * block, I)});
  }

  for (const WeightSpec& spec : gemma4_weight_specs(c)) {
    TensorShard t;
    t.name = spec.name;
    t.shape = spec.shape;
    t.dtype = format_of(spec.name, spec.shape);
    const int l = layer_of(spec.name);
    const Gemma4LayerConfig* lc = l >= 0 ? &c.layers.at(l) : nullptr;
    auto each_rank = [&](auto range_of) {
      for (int r = 0; r < N; ++r) {
        auto [b, e] = range_of(r);
        t.begin.push_back(b);
        t.end.push_back(e);
      }
    };
    if (N == 1) {
      // nothing splits
    } else if (ends_with(spec.name, "self_attn.q_proj.weight") || ends_with(spec.name, "self_attn.o_proj.weight")) {
      t.split = ends_with(spec.name, "q_proj.weight") ? ShardSplit::rows : ShardSplit::columns;
      const int64_t D = lc->head_dim, block = dtype_traits(t.dtype).block_elems;
      if (t.split == ShardSplit::columns && heads_per_rank * D % block)
        fail("--tp {}: layer {}'s o_proj would be cut inside its {}-weight blocks ({} heads of {} per GPU)", N, l, block,
             heads_per_rank, D);
      each_rank([&](int r) { return std::pair<int64_t, int64_t>{r * heads_per_rank * D, (r + 1) * heads_per_rank * D}; });
    } else if (ends_with(spec.name, "self_attn.k_proj.weight") || ends_with(spec.name, "self_attn.v_proj.weight")) {
      t.split = ShardSplit::rows;
      const int64_t D = lc->head_dim, nKV = lc->n_kv_heads;
      if (nKV % N == 0) {
        each_rank([&](int r) { return std::pair<int64_t, int64_t>{r * (nKV / N) * D, (r + 1) * (nKV / N) * D}; });
      } else if (N % nKV == 0 && (c.num_heads / nKV) % heads_per_rank == 0) {
        // Fewer KV heads than GPUs: each rank's query heads share one KV head, which it holds.
        const int group = c.num_heads / static_cast<int>(nKV);
        each_rank([&](int r) {
          const int64_t kv = r * heads_per_rank / group;
          return std::pair<int64_t, int64_t>{kv * D, (kv + 1) * D};
        });
      } else {
        fail("--tp {}: layer {} has {} KV heads, which neither divide into {} parts nor repeat evenly over {} GPUs", N,
             l, nKV, N, N);
      }
    } else if (ends_with(spec.name, "mlp.gate_proj.weight") || ends_with(spec.name, "mlp.up_proj.weight") ||
               ends_with(spec.name, "mlp.down_proj.weight")) {
      t.split = ends_with(spec.name, "down_proj.weight") ? ShardSplit::columns : ShardSplit::rows;
      each_rank([&](int r) { return mlp_split[l][r]; });
    } else if (options.expert_parallel && (ends_with(spec.name, "experts.gate_up_proj") || ends_with(spec.name, "experts.down_proj"))) {
      t.split = ShardSplit::experts;
      const auto experts = deal(c.num_experts, N);
      each_rank([&](int r) { return experts[r]; });
    }
    if (t.split == ShardSplit::replicated) {
      t.begin.assign(N, 0);
      t.end.assign(N, 0);
    }
    for (int r = 0; r < N; ++r) plan.rank_bytes[r] += tensor_bytes(t.dtype, shard_shape(t, r));
    plan.tensors.push_back(std::move(t));
  }
  return plan;
}

std::vector<uint8_t> extract_shard(const TensorShard& shard, int rank, const uint8_t* data) {
  const std::vector<int64_t> shape = shard_shape(shard, rank);
  std::vector<uint8_t> out(static_cast<size_t>(tensor_bytes(shard.dtype, shape)));
  const int64_t K = shard.shape.back(), row = row_bytes(shard.dtype, K);
  const int64_t b = shard.begin.at(rank), e = shard.end.at(rank);
  switch (shard.split) {
    case ShardSplit::replicated:
      std::memcpy(out.data(), data, out.size());
      break;
    case ShardSplit::rows:
    case ShardSplit::experts: {
      // Rows of a matrix, or whole experts of a stack [E, out, in]: a contiguous run of units.
      const int64_t unit = shard.split == ShardSplit::experts ? shard.shape[1] * row : row;
      std::memcpy(out.data(), data + b * unit, static_cast<size_t>((e - b) * unit));
      break;
    }
    case ShardSplit::columns: {
      const DTypeTraits& traits = dtype_traits(shard.dtype);
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
