#pragma once
// Hugging Face config.json -> typed model configs. Every field the forward pass reads is parsed
// here once, checked, and stored in a struct; model code never touches JSON. A missing field
// takes the default transformers 5.17 would use; a wrong type, an out-of-range or inconsistent
// value, or an unknown architecture is an fl::Error naming the field.
//
// Gemma 4: both the multimodal wrapper (model_type "gemma4", text fields under "text_config") and
// the text-only config (model_type "gemma4_text") are accepted, and both spellings of the per-layer
// attention geometry: the released checkpoints' global_head_dim / num_global_key_value_heads and
// the per_layer_config map that transformers 5.17 writes.
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fl {

// linear: Gated DeltaNet linear attention (Qwen3.5), a recurrent state instead of a KV cache.
enum class AttentionType { sliding, full, linear };

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
  // Not from config.json: a rank of an expert-parallel split (model/rank_source.h) holds experts
  // [expert_first, expert_first + expert_count) of every layer's stacks; 0 = all of them.
  int expert_first = 0, expert_count = 0;
  int experts_held() const { return expert_count > 0 ? expert_count : num_experts; }
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

// Qwen3.5, dense and mixture of experts: Gated DeltaNet layers with gated full attention every
// full_attention_interval-th layer (../shared/reference/models-gemma4-qwen35.md §3). Accepted as
// the multimodal wrapper (model_type qwen3_5 / qwen3_5_moe, text fields under "text_config") or
// text-only (qwen3_5_text / qwen3_5_moe_text).
struct Qwen35Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<AttentionType> layer_types;  // linear or full, one per layer
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // gated full attention: q_proj rows per head are [query (head_dim) | gate (head_dim)]
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 1e7;
  int rope_dim = 0;  // rotated span: the first int(head_dim * partial_rotary_factor) dims of each head
  // Gated DeltaNet
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;
  // feed-forward: the dense SwiGLU MLP, or routed experts plus a sigmoid-gated shared expert
  bool moe = false;
  int intermediate_size = 0;  // dense only
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  // One rank of a model split with --ep (model/rank_source.h): its experts are [expert_first,
  // expert_first + expert_count) of every layer's; 0 = all of them.
  int expert_first = 0, expert_count = 0;
  int experts_held() const { return expert_count > 0 ? expert_count : num_experts; }
  std::vector<int> eos_token_ids;

  int conv_channels() const { return 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim; }
};

struct ModelConfig {
  std::string architecture;  // "gemma4" or "qwen35"
  std::variant<Gemma4Config, Qwen35Config> arch;
};

// `json` is the whole config.json object.
ModelConfig parse_hf_config(const nlohmann::json& json);
ModelConfig parse_hf_config_text(const std::string& text, const std::string& source_name);

// The values a person wants to see about a model (`fireline show`), as an ordered JSON object:
// architecture, vocabulary, widths, layer counts by attention type, experts, context.
nlohmann::ordered_json model_config_summary(const ModelConfig& config);

}  // namespace fl
