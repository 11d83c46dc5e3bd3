#include "model/rank_source.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

// "<stem><e><rest>" for a per-expert tensor "...mlp.experts.<e>.<part>.weight".
struct PerExpertName {
  std::string stem;  // up to and including "experts."
  int expert = 0;
  std::string rest;  // from the dot after the index
};

std::optional<PerExpertName> parse_per_expert_name(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + 9, end = name.find('.', digits);
  if (end == std::string::npos || end == digits || end - digits > 6) return std::nullopt;
  for (size_t i = digits; i < end; ++i)
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  return PerExpertName{name.substr(0, digits), std::stoi(name.substr(digits, end - digits)), name.substr(end)};
}

class RankSource final : public ModelSource {
 public:
  RankSource(const ModelSource& whole, const ParallelPlan& plan, int rank) : whole_(whole) {
    if (rank < 0 || rank >= plan.ranks) fail("rank {} of a plan over {} ranks", rank, plan.ranks);
    const std::optional<std::string> prefix = find_weight_prefix(whole, "embed_tokens.weight");
    if (!prefix) fail("{}: no embed_tokens.weight under any known prefix", whole.path());
    std::map<std::string, const TensorShard*> shard_of;
    for (const TensorShard& t : plan.tensors) shard_of[*prefix + t.name] = &t;

    // --ep: the rank's experts (every layer's stacks are dealt alike).
    int expert_first = 0, expert_count = 0;
    for (const TensorShard& t : plan.tensors)
      if (t.split == ShardSplit::experts) {
        expert_first = static_cast<int>(t.begin[rank]);
        expert_count = static_cast<int>(t.end[rank] - t.begin[rank]);
      }

    // Every tensor resolved now: replicated ones and parts that are one contiguous run of their
    // tensor (whole rows, whole experts) as views of `whole`; column splits and several runs cut
    // into bytes this source owns.
    for (const std::string& name : whole.tensor_names()) {
      const std::optional<Tensor> t = whole.find(name);
      if (!t) continue;
      if (const std::optional<PerExpertName> e = parse_per_expert_name(name); e && expert_count > 0) {
        // Experts stored one tensor per expert (Qwen3.5's text-only checkpoints): the rank keeps
        // its own, numbered from 0 as in its stacks.
        if (e->expert >= expert_first && e->expert < expert_first + expert_count)
          tensors_[e->stem + std::to_string(e->expert - expert_first) + e->rest] = *t;
        continue;
      }
      const auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second->split == ShardSplit::replicated) {
        tensors_[name] = *t;
        continue;
      }
      const TensorShard& shard = *it->second;
      if (t->dtype != shard.dtype)
        fail("{}: tensor '{}' is {} but the split was planned for {}", whole.path(), name, dtype_name(t->dtype),
             dtype_name(shard.dtype));
      const std::vector<int64_t> shape = shard_shape(shard, rank);
      if (const std::optional<int64_t> offset = shard_byte_offset(shard, rank)) {
        // one contiguous run (rows, experts): a view, no copy (--ep on CPU ranks would otherwise
        // hold every expert twice)
        tensors_[name] = make_tensor(static_cast<uint8_t*>(t->data) + *offset, t->dtype, shape.data(),
                                     static_cast<int>(shape.size()));
        continue;
      }
      std::vector<uint8_t>& bytes = owned_[name];
      bytes = extract_shard(shard, rank, static_cast<const uint8_t*>(t->data));
      tensors_[name] = make_tensor(bytes.data(), t->dtype, shape.data(), static_cast<int>(shape.size()));
    }

    // The rank's own counts, as its shards hold them: the length of `name`'s split dim on this
    // rank over `per`, or nothing when `name` is not split.
    config_ = whole.config();
    auto rank_count = [&](const std::string& name, int64_t per) -> std::optional<int> {
      const auto it = shard_of.find(*prefix + name);
      if (it == shard_of.end() || it->second->split == ShardSplit::replicated) return std::nullopt;
      const std::vector<int64_t> shape = shard_shape(*it->second, rank);
      return static_cast<int>((it->second->split == ShardSplit::columns ? shape.back() : shape[0]) / per);
    };
    if (auto* gemma = std::get_if<Gemma4Config>(&config_.arch)) {
      Gemma4Config& c = *gemma;
      c.num_heads /= plan.ranks;  // query heads dealt evenly
      c.expert_first = expert_first;
      c.expert_count = expert_count;
      for (size_t l = 0; l < c.layers.size(); ++l) {
        Gemma4LayerConfig& lc = c.layers[l];
        const int kv_layer = lc.kv_source_layer >= 0 ? lc.kv_source_layer : static_cast<int>(l);
        if (auto n = rank_count("layers." + std::to_string(kv_layer) + ".self_attn.k_proj.weight", lc.head_dim))
          lc.n_kv_heads = *n;
        if (auto n = rank_count("layers." + std::to_string(l) + ".mlp.down_proj.weight", 1)) lc.intermediate_size = *n;
      }
    } else {
      Qwen35Config& c = std::get<Qwen35Config>(config_.arch);
      c.num_heads /= plan.ranks;
      c.linear_num_value_heads /= plan.ranks;
      c.expert_first = expert_first;
      c.expert_count = expert_count;
      // The config is the whole model's, not per layer: every layer of a kind splits alike.
      for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        if (auto n = rank_count(p + "linear_attn.in_proj_qkv.weight", 1))  // its Q, K and V channels
          c.linear_num_key_heads =
              (*n - c.linear_num_value_heads * c.linear_value_head_dim) / (2 * c.linear_key_head_dim);
        if (auto n = rank_count(p + "self_attn.k_proj.weight", c.head_dim)) c.num_kv_heads = *n;
        if (auto n = rank_count(p + "mlp.down_proj.weight", 1)) c.intermediate_size = *n;
      }
    }
    path_ = whole.path() + " (rank " + std::to_string(rank) + " of " + std::to_string(plan.ranks) + ")";
  }

  const std::string& path() const override { return path_; }
  const ModelConfig& config() const override { return config_; }
  const std::string& hf_config_json() const override { return whole_.hf_config_json(); }
  std::optional<Tensor> find(std::string_view name) const override {
    const auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors_) names.push_back(name);
    return names;
  }
  std::string tokenizer_json() const override { return whole_.tokenizer_json(); }
  std::string generation_config_json() const override { return whole_.generation_config_json(); }
  std::string chat_template() const override { return whole_.chat_template(); }
  std::string tokenizer_config_json() const override { return whole_.tokenizer_config_json(); }

 private:
  const ModelSource& whole_;
  ModelConfig config_;
  std::string path_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::vector<uint8_t>> owned_;
};

}  // namespace

std::unique_ptr<ModelSource> make_rank_source(const ModelSource& whole, const ParallelPlan& plan, int rank) {
  return std::make_unique<RankSource>(whole, plan, rank);
}

}  // namespace fl
