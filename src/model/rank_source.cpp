#include "model/rank_source.h"

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

class RankSource final : public ModelSource {
 public:
  RankSource(const ModelSource& whole, const ParallelPlan& plan, int rank) : whole_(whole) {
    if (rank < 0 || rank >= plan.ranks) fail("rank {} of a plan over {} ranks", rank, plan.ranks);
    if (!std::holds_alternative<Gemma4Config>(whole.config().arch))
      fail("{}: only Gemma 4 models split over several devices so far", whole.path());
    const std::optional<std::string> prefix = find_weight_prefix(whole, "embed_tokens.weight");
    if (!prefix) fail("{}: no embed_tokens.weight under any known prefix", whole.path());
    std::map<std::string, const TensorShard*> shard_of;
    for (const TensorShard& t : plan.tensors) shard_of[*prefix + t.name] = &t;

    // Every tensor resolved now: replicated ones as views of `whole`, split ones cut into bytes
    // this source owns.
    for (const std::string& name : whole.tensor_names()) {
      const std::optional<Tensor> t = whole.find(name);
      if (!t) continue;
      const auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second->split == ShardSplit::replicated) {
        tensors_[name] = *t;
        continue;
      }
      const TensorShard& shard = *it->second;
      if (t->dtype != shard.dtype)
        fail("{}: tensor '{}' is {} but the split was planned for {}", whole.path(), name, dtype_name(t->dtype),
             dtype_name(shard.dtype));
      std::vector<uint8_t>& bytes = owned_[name];
      bytes = extract_shard(shard, rank, static_cast<const uint8_t*>(t->data));
      const std::vector<int64_t> shape = shard_shape(shard, rank);
      tensors_[name] = make_tensor(bytes.data(), t->dtype, shape.data(), static_cast<int>(shape.size()));
    }

    // The rank's own counts: query heads dealt evenly, KV heads and MLP width as its shards hold.
    config_ = whole.config();
    Gemma4Config& c = std::get<Gemma4Config>(config_.arch);
    c.num_heads /= plan.ranks;
    for (const TensorShard& t : plan.tensors)
      if (t.split == ShardSplit::experts) {  // --ep: every layer's stacks are dealt alike
        c.expert_first = static_cast<int>(t.begin[rank]);
        c.expert_count = static_cast<int>(t.end[rank] - t.begin[rank]);
      }
    for (size_t l = 0; l < c.layers.size(); ++l) {
      Gemma4LayerConfig& lc = c.layers[l];
      const std::string p = *prefix + "layers." + std::to_string(l) + ".";
      const int kv_layer = lc.kv_source_layer >= 0 ? lc.kv_source_layer : static_cast<int>(l);
      const std::string k_proj = *prefix + "layers." + std::to_string(kv_layer) + ".self_attn.k_proj.weight";
      if (const auto k = shard_of.find(k_proj); k != shard_of.end() && k->second->split == ShardSplit::rows)
        lc.n_kv_heads = static_cast<int>((k->second->end[rank] - k->second->begin[rank]) / lc.head_dim);
      if (const auto d = shard_of.find(p + "mlp.down_proj.weight");
          d != shard_of.end() && d->second->split == ShardSplit::columns)
        lc.intermediate_size = static_cast<int>(d->second->end[rank] - d->second->begin[rank]);
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
