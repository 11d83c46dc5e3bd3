#include "model/synthetic.h"

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "model/gemma4.h"
#include "model/qwen35.h"
#include "quant/quant_policy.h"

namespace fl {
namespace {

using nlohmann::json;

// Text configs of the published checkpoints (../shared/reference/models-gemma4-qwen35.md §2.1).
json gemma4_text_config(int hidden, int layers, int heads, int kv_heads, int global_kv_heads, bool k_eq_v,
                        int intermediate, int window, int full_every, int first_full) {
  json layer_types = json::array();
  for (int i = 0; i < layers; ++i)
    layer_types.push_back(i % full_every == first_full ? "full_attention" : "sliding_attention");
  return json{{"model_type", "gemma4_text"},
              {"vocab_size", 262144},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"num_global_key_value_heads", global_kv_heads},
              {"head_dim", 256},
              {"global_head_dim", 512},
              {"attention_k_eq_v", k_eq_v},
              {"intermediate_size", intermediate},
              {"sliding_window", window},
              {"layer_types", layer_types},
              {"final_logit_softcapping", 30.0},
              {"hidden_size_per_layer_input", 0},
              {"max_position_embeddings", 262144},
              {"dtype", "bfloat16"}};
}

// Qwen3.5 text configs (../shared/reference/models-gemma4-qwen35.md §3.1).
json qwen35_text_config(int hidden, int layers, int heads, int kv_heads, int linear_value_heads, bool tied) {
  return json{{"model_type", "qwen3_5_text"},
              {"vocab_size", 248320},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"head_dim", 256},
              {"full_attention_interval", 4},
              {"linear_conv_kernel_dim", 4},
              {"linear_key_head_dim", 128},
              {"linear_value_head_dim", 128},
              {"linear_num_key_heads", 16},
              {"linear_num_value_heads", linear_value_heads},
              {"rope_parameters",
               {{"rope_type", "default"},
                {"rope_theta", 1e7},
                {"partial_rotary_factor", 0.25},
                {"mrope_section", {11, 11, 10}},
                {"mrope_interleaved", true}}},
              {"tie_word_embeddings", tied},
              {"max_position_embeddings", 262144},
              {"eos_token_id", 248044},
              {"dtype", "bfloat16"}};
}

json synthetic_config(const std::string& like) {
  if (like == "qwen3.5-4b") {
    json c = qwen35_text_config(2560, 32, 16, 4, 32, true);
    c["intermediate_size"] = 9216;
    return c;
  }
  if (like == "qwen3.5-35b-a3b") {
    json c = qwen35_text_config(2048, 40, 16, 2, 32, false);
    c["model_type"] = "qwen3_5_moe_text";
    c["num_experts"] = 256;
    c["num_experts_per_tok"] = 8;
    c["moe_intermediate_size"] = 512;
    c["shared_expert_intermediate_size"] = 512;
    return c;
  }
  if (like == "tiny-qwen35-moe") {  // for tests: every code path of the 35B-A3B at toy size
    json c = qwen35_text_config(256, 8, 4, 2, 4, false);
    c["model_type"] = "qwen3_5_moe_text";
    c["vocab_size"] = 1024;
    c["head_dim"] = 64;
    c["linear_num_key_heads"] = 2;
    c["linear_key_head_dim"] = 64;
    c["linear_value_head_dim"] = 64;
    c["num_experts"] = 8;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 128;
    c["shared_expert_intermediate_size"] = 128;
    return c;
  }
  if (like == "gemma-4-26b-a4b") {
    json c = gemma4_text_config(2816, 30, 16, 8, 2, true, 2112, 1024, 6, 5);
    c["enable_moe_block"] = true;
    c["num_experts"] = 128;
    c["top_k_experts"] = 8;
    c["moe_intermediate_size"] = 704;
    return c;
  }
  if (like == "tiny-gemma4-moe") {  // for tests: every code path of the 26B-A4B at toy size
    json c = gemma4_text_config(256, 6, 4, 2, 1, true, 352, 16, 6, 5);
    c["vocab_size"] = 1024;
    c["head_dim"] = 64;
    c["global_head_dim"] = 128;
    c["enable_moe_block"] = true;
    c["num_experts"] = 8;
    c["top_k_experts"] = 2;
    c["moe_intermediate_size"] = 176;
    return c;
  }
  if (like == "gemma-4-31b") return gemma4_text_config(5376, 60, 32, 16, 4, true, 21504, 1024, 6, 5);
  if (like == "gemma-4-e4b") {
    json c = gemma4_text_config(2560, 42, 8, 2, 2, false, 10240, 512, 6, 5);
    c["hidden_size_per_layer_input"] = 256;
    c["vocab_size_per_layer_input"] = 262144;
    c["num_kv_shared_layers"] = 18;
    return c;
  }
  if (like == "gemma-4-e2b") {
    json c = gemma4_text_config(1536, 35, 8, 1, 1, false, 6144, 512, 5, 4);
    c["hidden_size_per_layer_input"] = 256;
    c["vocab_size_per_layer_input"] = 262144;
    c["num_kv_shared_layers"] = 20;
    c["use_double_wide_mlp"] = true;
    return c;
  }
  std::string known;
  for (const auto& n : synthetic_model_names()) known += (known.empty() ? "" : ", ") + n;
  fail("--like {}: unknown model (known: {})", like, known);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// uniform in [-1, 1)
float uniform(uint64_t& state) { return static_cast<float>(splitmix64(state) >> 40) / 8388608.0f - 1.0f; }

void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

// One row of random weights in `type`, with magnitudes ~ 1/sqrt(k) so activations stay O(1);
// vectors (norm gains, f32) are gain * (1 + 0.25 u).
void fill_row(uint8_t* row, DType type, int64_t k, WeightKind kind, uint64_t state, float gain = 1.0f) {
  const float amplitude = kind == WeightKind::vector ? 0.25f : 1.0f / std::sqrt(static_cast<float>(k));
  const int64_t bytes = row_bytes(type, k);
  switch (type) {
    case DType::f32:
      for (int64_t i = 0; i < k; ++i)
        store_f32(row + 4 * i,
                  kind == WeightKind::vector ? gain * (1.0f + amplitude * uniform(state)) : amplitude * uniform(state));
      return;
    case DType::bf16:
    case DType::f16:
      for (int64_t i = 0; i < k; ++i) {
        const float v = amplitude * uniform(state);
        uint16_t h = type == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(row + 2 * i, &h, 2);
      }
      return;
    default:
      break;
  }
  // Quantized formats: random codes with a sane scale/min per block, padding code 0.
  for (int64_t i = 0; i < bytes; i += 8) {
    uint64_t r = splitmix64(state);
    std::memcpy(row + i, &r, std::min<int64_t>(8, bytes - i));
  }
  const DTypeTraits& t = dtype_traits(type);
  const int64_t blocks = bytes / t.block_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = row + b * t.block_bytes;
    if (type == DType::q8_0) {
      uint16_t scale = f32_to_f16(amplitude * 1.7f / 127.0f);
      std::memcpy(block, &scale, 2);
    } else {
      const float levels = type == DType::hfq6_g256 ? 63.0f : 15.0f;
      store_f32(block, 2.0f * 1.7f * amplitude / levels);
      store_f32(block + 4, -1.7f * amplitude);
    }
  }
}

class SyntheticSource final : public ModelSource {
 public:
  explicit SyntheticSource(const SyntheticOptions& options) : options_(options) {
    auto preset = parse_quant_preset(options.format);
    if (!preset) fail("--format {} is not a weight format (hf4, hf6, q8, bf16, f16, f32)", options.format);
    preset_ = *preset;
    json config = synthetic_config(options.like);
    config_json_ = config.dump(2);
    config_ = parse_hf_config(config);
    path_ = "synthetic:" + options.like + ":" + options.format;
    std::vector<WeightSpec> specs = std::holds_alternative<Qwen35Config>(config_.arch)
                                        ? qwen35_weight_specs(std::get<Qwen35Config>(config_.arch))
                                        : gemma4_weight_specs(std::get<Gemma4Config>(config_.arch));
    for (WeightSpec& spec : specs) {
      // lm_head sits outside the model prefix, everything else under model.language_model.
      std::string name = spec.name == "lm_head.weight" ? spec.name : "model.language_model." + spec.name;
      specs_.emplace(name, std::move(spec));
    }
  }

  const std::string& path() const override { return path_; }
  const ModelConfig& config() const override { return config_; }
  const std::string& hf_config_json() const override { return config_json_; }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const auto& [name, _] : specs_) names.push_back(name);
    return names;
  }
  std::string tokenizer_json() const override { return options_.tokenizer.tokenizer_json; }
  std::string tokenizer_config_json() const override { return options_.tokenizer.tokenizer_config_json; }
  std::string generation_config_json() const override { return options_.tokenizer.generation_config_json; }
  std::string chat_template() const override { return options_.tokenizer.chat_template; }

  std::optional<Tensor> find(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    auto spec_it = specs_.find(std::string(name));
    if (spec_it == specs_.end()) return std::nullopt;
    auto made = made_.find(spec_it->first);
    if (made != made_.end()) return made->second.view;
    const WeightSpec& spec = spec_it->second;
    const int64_t k = spec.shape.back();
    const DType type = preset_tensor_format(preset_, spec_it->first, spec.shape);
    HostTensor t;
    Tensor probe = make_tensor(nullptr, type, spec.shape.data(), static_cast<int>(spec.shape.size()));
    t.buffer = HostBuffer(static_cast<size_t>(probe.nbytes()));
    t.view = make_tensor(t.buffer.data(), type, spec.shape.data(), static_cast<int>(spec.shape.size()));
    const uint64_t tensor_seed = options_.seed * 0x100000001b3ull + std::hash<std::string>{}(spec_it->first);
    const int64_t rows = t.view.rows(), stride = t.view.row_bytes();
    uint8_t* base = static_cast<uint8_t*>(t.buffer.data());
    // Gemma 4 scores attention at scale 1 after its q/k norms (trained gains keep q.k moderate):
    // gains near 1 would make a 256-wide head's scores ~N(0, 16^2), a near one-hot softmax that
    // amplifies any rounding difference ~1.7x per layer (a 60-layer model's logits then depend
    // on the summation order at O(1)). Gains of D^-1/4 give scores of O(1), as in a trained model.
    float gain = 1.0f;
    if (std::holds_alternative<Gemma4Config>(config_.arch) &&
        (spec_it->first.ends_with("self_attn.q_norm.weight") || spec_it->first.ends_with("self_attn.k_norm.weight")))
      gain = 1.0f / std::sqrt(std::sqrt(static_cast<float>(k)));
    ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        fill_row(base + r * stride, type, k, spec.kind, tensor_seed + 7919 * r, gain);
    });
    return made_.emplace(spec_it->first, std::move(t)).first->second.view;
  }

 private:
  SyntheticOptions options_;
  QuantPreset preset_ = QuantPreset::hf4;
  std::string path_, config_json_;
  ModelConfig config_;
  std::map<std::string, WeightSpec, std::less<>> specs_;
  mutable std::map<std::string, HostTensor, std::less<>> made_;
  mutable std::mutex mutex_;
};

}  // namespace

std::vector<std::string> synthetic_model_names() {
  return {"gemma-4-26b-a4b", "gemma-4-31b", "gemma-4-e4b", "gemma-4-e2b", "tiny-gemma4-moe",
          "qwen3.5-4b",      "qwen3.5-35b-a3b", "tiny-qwen35-moe"};
}

std::unique_ptr<ModelSource> make_synthetic_source(const SyntheticOptions& options) {
  return std::make_unique<SyntheticSource>(options);
}

}  // namespace fl
