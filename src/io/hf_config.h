#pragma once
// Hugging Face config.json -> typed model configs. Every field the forward pass reads is parsed
// here once, checked, and stored in a struct; model code never touches JSON. A missing field
// takes the default transformers 5.17 would use; a wrong type, an out-of-range or inconsistent
// value, or an unknown architecture is an fl::Error naming the field.
//
// Both the multimodal wrapper (model_type "gemma4", text fields under "text_config") and the
// text-only config (model_type "gemma4_text") are accepted, and both spellings of the per-layer
// attention geometry: the released checkpoints' global_head_dim / num_global_key_value_heads and
// the per_layer_config map that transformers 5.17 writes.
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fl {

enum class AttentionType { sliding, full };

enum class RopeType { standard, proportional };  // "default" and "proportional" in HF configs

struct RopeConfig {
  RopeType type = RopeType::standard;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // proportional only: share of the head dim that rotates
  double factor = 1.0;                 // divides every inverse frequency (absent -> 1)
};

struct Gemma4LayerConfig {
  AttentionType type = AttentionType::sliding;
  int head_dim = 0;
  int n_kv_heads = 0;
  int intermediate_size = 0;  // dense MLP width (doubled on E2B's KV-shared layers)
  bool value_from_key = false;  // attention_k_eq_v on a full layer: V = v_norm(raw K), no v_proj
  int kv_source_layer = -1;     // KV-shared layer: the earlier layer whose K/V it attends over
};

struct Gemma4Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  float rms_norm_eps = 1e-6f;
  int sliding_window = 0;
  int max_position_embeddings = 0;
  std::optional<float> final_logit_softcapping;
  bool tie_word_embeddings = true;
  bool attention_k_eq_v = false;
  int num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  // Mixture of experts (26B-A4B): every layer has the dense MLP *and* the expert block.
  bool enable_moe_block = false;
  int num_experts = 0;
  int top_k_experts = 0;
  int moe_intermediate_size = 0;
  // Per-layer embeddings (E2B/E4B); 0 = off.
  int hidden_size_per_layer_input = 0;
  int vocab_size_per_layer_input = 0;
  RopeConfig rope_sliding;
  RopeConfig rope_full;
  std::vector<Gemma4LayerConfig> layers;
  int pad_token_id = 0;
  int bos_token_id = 2;
  std::vector<int> eos_token_ids;
};

struct ModelConfig {
  std::string architecture;  // "gemma4"
  std::variant<Gemma4Config> arch;
};

// `json` is the whole config.json object.
ModelConfig parse_hf_config(const nlohmann::json& json);
ModelConfig parse_hf_config_text(const std::string& text, const std::string& source_name);

// The values a person wants to see about a model (`fireline show`), as an ordered JSON object:
// architecture, vocabulary, widths, layer counts by attention type, experts, context.
nlohmann::ordered_json model_config_summary(const ModelConfig& config);

}  // namespace fl
