#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace fl {
namespace {

using nlohmann::json;

// Reads typed fields of one JSON object; errors name the field by its path in config.json.
class FieldReader {
 public:
  FieldReader(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }
  std::string where(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  // Integer in [min, max]; `fallback` when absent (nullopt: required).
  int get_int(const char* key, std::optional<int> fallback, int min, int max) const {
    if (!has(key)) {
      if (!fallback) fail("config.json: {} is required", where(key));
      return *fallback;
    }
    const json& v = object_.at(key);
    if (!v.is_number_integer()) fail("config.json: {} must be an integer (got {})", where(key), v.dump());
    auto value = v.get<int64_t>();
    if (value < min || value > max)
      fail("config.json: {} = {} is out of range [{}, {}]", where(key), value, min, max);
    return static_cast<int>(value);
  }

  double get_double(const char* key, std::optional<double> fallback, double min, double max) const {
    if (!has(key)) {
      if (!fallback) fail("config.json: {} is required", where(key));
      return *fallback;
    }
    const json& v = object_.at(key);
    if (!v.is_number()) fail("config.json: {} must be a number (got {})", where(key), v.dump());
    double value = v.get<double>();
    if (!std::isfinite(value) || value < min || value > max)
      fail("config.json: {} = {} is out of range [{}, {}]", where(key), value, min, max);
    return value;
  }

  bool get_bool(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_boolean()) fail("config.json: {} must be true or false (got {})", where(key), v.dump());
    return v.get<bool>();
  }

  std::optional<std::string> get_string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = object_.at(key);
    if (!v.is_string()) fail("config.json: {} must be a string (got {})", where(key), v.dump());
    return v.get<std::string>();
  }

  const json& object() const { return object_; }

 private:
  const json& object_;
  std::string path_;
};

constexpr int kMaxDim = 1 << 17;      // widths (hidden, intermediate, head dim)
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxLayers = 4096;
constexpr int kMaxHeads = 4096;
constexpr int kMaxPositions = 1 << 30;

std::vector<int> read_token_ids(const FieldReader& r, const char* key, int fallback) {
  if (!r.has(key)) return {fallback};
  const json& v = r.object().at(key);
  std::vector<int> ids;
  auto take = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= kMaxVocab)
      fail("config.json: {} must hold token ids (got {})", r.where(key), v.dump());
    ids.push_back(x.get<int>());
  };
  if (v.is_array()) {
    for (auto& x : v) take(x);
  } else {
    take(v);
  }
  return ids;
}

RopeConfig read_rope(const json& params, const std::string& path) {
  if (!params.is_object()) fail("config.json: {} must be an object", path);
  FieldReader r(params, path);
  RopeConfig rope;
  std::string type = r.get_string("rope_type").value_or("default");
  if (type == "default") {
    rope.type = RopeType::standard;
  } else if (type == "proportional") {
    rope.type = RopeType::proportional;
  } else {
    fail("config.json: {}.rope_type '{}' is not supported (supported: default, proportional)", path, type);
  }
  rope.theta = r.get_double("rope_theta", std::nullopt, 1.0, 1e12);
  rope.partial_rotary_factor = r.get_double("partial_rotary_factor", 1.0, 0.0, 1.0);
  rope.factor = r.get_double("factor", 1.0, 1e-6, 1e6);
  return rope;
}

// An explicit `layer_types` list of num_layers entries, each "full_attention" or `other_name`
// (the architecture's other kind of layer); empty when the config has none.
std::vector<AttentionType> listed_layer_types(const FieldReader& r, const json& text, int num_layers,
                                              const char* other_name, AttentionType other) {
  std::vector<AttentionType> types;
  if (!r.has("layer_types")) return types;
  const json& lt = text.at("layer_types");
  if (!lt.is_array()) fail("config.json: {} must be a list", r.where("layer_types"));
  if (static_cast<int>(lt.size()) != num_layers)
    fail("config.json: {} has {} entries but num_hidden_layers is {}", r.where("layer_types"), lt.size(), num_layers);
  for (size_t i = 0; i < lt.size(); ++i) {
    std::string t = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
    if (t == other_name) {
      types.push_back(other);
    } else if (t == "full_attention") {
      types.push_back(AttentionType::full);
    } else {
      fail("config.json: {}[{}] '{}' is not {} or full_attention", r.where("layer_types"), i, t, other_name);
    }
  }
  return types;
}

Gemma4Config parse_gemma4_text(const json& text, const std::string& path) {
  FieldReader r(text, path);
  Gemma4Config c;
  c.vocab_size = r.get_int("vocab_size", std::nullopt, 1, kMaxVocab);
  c.hidden_size = r.get_int("hidden_size", std::nullopt, 1, kMaxDim);
  c.num_layers = r.get_int("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  c.num_heads = r.get_int("num_attention_heads", std::nullopt, 1, kMaxHeads);
  const int n_kv_heads = r.get_int("num_key_value_heads", std::nullopt, 1, kMaxHeads);
  const int head_dim = r.get_int("head_dim", 256, 2, kMaxDim);
  const int intermediate_size = r.get_int("intermediate_size", std::nullopt, 1, kMaxDim);
  c.rms_norm_eps = static_cast<float>(r.get_double("rms_norm_eps", 1e-6, 0.0, 1.0));
  if (!(c.rms_norm_eps > 0)) fail("config.json: {} must be positive", r.where("rms_norm_eps"));
  c.sliding_window = r.get_int("sliding_window", 512, 1, kMaxPositions);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 131072, 1, kMaxPositions);
  if (r.has("final_logit_softcapping"))
    c.final_logit_softcapping = static_cast<float>(r.get_double("final_logit_softcapping", std::nullopt, 1e-3, 1e6));
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", true);
  c.attention_k_eq_v = r.get_bool("attention_k_eq_v", false);
  c.num_kv_shared_layers = r.get_int("num_kv_shared_layers", 0, 0, kMaxLayers);
  c.use_double_wide_mlp = r.get_bool("use_double_wide_mlp", false);
  c.enable_moe_block = r.get_bool("enable_moe_block", false);
  c.hidden_size_per_layer_input = r.get_int("hidden_size_per_layer_input", 256, 0, kMaxDim);
  c.vocab_size_per_layer_input = r.get_int("vocab_size_per_layer_input", 262144, 0, kMaxVocab);
  c.pad_token_id = r.get_int("pad_token_id", 0, 0, kMaxVocab - 1);
  c.bos_token_id = r.get_int("bos_token_id", 2, 0, kMaxVocab - 1);
  c.eos_token_ids = read_token_ids(r, "eos_token_id", 1);

  if (auto act = r.get_string("hidden_activation").value_or("gelu_pytorch_tanh"); act != "gelu_pytorch_tanh")
    fail("config.json: {} '{}' is not supported (Gemma 4 uses gelu_pytorch_tanh)", r.where("hidden_activation"), act);
  if (r.get_bool("attention_bias", false)) fail("config.json: {} = true is not supported", r.where("attention_bias"));
  if (auto bidi = r.get_string("use_bidirectional_attention"); bidi && *bidi != "vision")
    fail("config.json: {} '{}' is not supported for text generation (expected null or \"vision\")",
         r.where("use_bidirectional_attention"), *bidi);

  if (c.enable_moe_block) {
    c.num_experts = r.get_int("num_experts", std::nullopt, 1, 1 << 16);
    c.top_k_experts = r.get_int("top_k_experts", std::nullopt, 1, 1 << 16);
    c.moe_intermediate_size = r.get_int("moe_intermediate_size", std::nullopt, 1, kMaxDim);
    if (c.top_k_experts > c.num_experts)
      fail("config.json: {} = {} exceeds num_experts = {}", r.where("top_k_experts"), c.top_k_experts, c.num_experts);
  }
  if (c.hidden_size_per_layer_input > 0 && c.vocab_size_per_layer_input == 0)
    fail("config.json: {} must be positive when hidden_size_per_layer_input is set",
         r.where("vocab_size_per_layer_input"));

  // Layer types. transformers forces the last layer to full attention; so do we.
  std::vector<AttentionType> types =
      listed_layer_types(r, text, c.num_layers, "sliding_attention", AttentionType::sliding);
  if (types.empty()) {
    for (int i = 0; i < c.num_layers; ++i)
      types.push_back((i + 1) % 6 ? AttentionType::sliding : AttentionType::full);
  }
  if (types.back() != AttentionType::full) {
    log_warn("config.json: the last layer must be full attention; treating it as full (as transformers does)");
    types.back() = AttentionType::full;
  }

  // RoPE per layer type.
  if (r.has("rope_parameters")) {
    const json& rp = text.at("rope_parameters");
    if (!rp.is_object()) fail("config.json: {} must be an object", r.where("rope_parameters"));
    if (!rp.contains("sliding_attention") || !rp.contains("full_attention"))
      fail("config.json: {} needs sliding_attention and full_attention entries", r.where("rope_parameters"));
    c.rope_sliding = read_rope(rp.at("sliding_attention"), r.where("rope_parameters") + ".sliding_attention");
    c.rope_full = read_rope(rp.at("full_attention"), r.where("rope_parameters") + ".full_attention");
  } else {
    c.rope_sliding = RopeConfig{RopeType::standard, 10000.0, 1.0, 1.0};
    c.rope_full = RopeConfig{RopeType::proportional, 1e6, 0.25, 1.0};
  }

  // Per-layer attention geometry: the sliding defaults, overridden for some layers either by
  // per_layer_config (transformers >= 5.6) or by global_head_dim / num_global_key_value_heads.
  c.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    c.layers[i].type = types[i];
    c.layers[i].head_dim = head_dim;
    c.layers[i].n_kv_heads = n_kv_heads;
    c.layers[i].intermediate_size = intermediate_size;
  }
  if (r.has("per_layer_config")) {
    const json& plc = text.at("per_layer_config");
    if (!plc.is_object()) fail("config.json: {} must be an object", r.where("per_layer_config"));
    for (auto& [key, overrides] : plc.items()) {
      std::string where = r.where("per_layer_config") + "." + key;
      int layer = -1;
      try {
        size_t used = 0;
        layer = std::stoi(key, &used);
        if (used != key.size()) layer = -1;
      } catch (...) {
      }
      if (layer < 0 || layer >= c.num_layers)
        fail("config.json: {} is not a layer index below {}", where, c.num_layers);
      if (!overrides.is_object()) fail("config.json: {} must be an object", where);
      FieldReader o(overrides, where);
      for (auto& [field, _] : overrides.items())
        if (field != "head_dim" && field != "num_key_value_heads" && field != "intermediate_size")
          fail("config.json: {}.{} is not a supported per-layer override", where, field);
      c.layers[layer].head_dim = o.get_int("head_dim", c.layers[layer].head_dim, 2, kMaxDim);
      c.layers[layer].n_kv_heads = o.get_int("num_key_value_heads", c.layers[layer].n_kv_heads, 1, kMaxHeads);
      c.layers[layer].intermediate_size =
          o.get_int("intermediate_size", c.layers[layer].intermediate_size, 1, kMaxDim);
    }
  } else {
    const int global_head_dim = r.get_int("global_head_dim", 512, 2, kMaxDim);
    std::optional<int> global_kv;
    if (r.has("num_global_key_value_heads"))
      global_kv = r.get_int("num_global_key_value_heads", std::nullopt, 1, kMaxHeads);
    for (auto& layer : c.layers) {
      if (layer.type != AttentionType::full) continue;
      layer.head_dim = global_head_dim;
      // As in transformers: the global KV-head count applies only with attention_k_eq_v.
      if (global_kv && c.attention_k_eq_v) layer.n_kv_heads = *global_kv;
    }
  }

  // KV sharing: the last num_kv_shared_layers layers attend over the K/V of the last earlier
  // layer of the same type, and (with use_double_wide_mlp) have a twice-as-wide MLP.
  if (c.num_kv_shared_layers >= c.num_layers)
    fail("config.json: {} = {} leaves no layer to share from (num_hidden_layers = {})",
         r.where("num_kv_shared_layers"), c.num_kv_shared_layers, c.num_layers);
  const int first_shared = c.num_layers - c.num_kv_shared_layers;
  for (int i = 0; i < c.num_layers; ++i) {
    Gemma4LayerConfig& layer = c.layers[i];
    if (layer.head_dim % 2) fail("config.json: layer {} head_dim {} must be even", i, layer.head_dim);
    if (c.num_heads % layer.n_kv_heads)
      fail("config.json: layer {} has {} KV heads, which does not divide num_attention_heads = {}", i,
           layer.n_kv_heads, c.num_heads);
    layer.value_from_key = c.attention_k_eq_v && layer.type == AttentionType::full;
    if (i >= first_shared && c.num_kv_shared_layers > 0) {
      for (int j = first_shared - 1; j >= 0; --j)
        if (c.layers[j].type == layer.type) {
          layer.kv_source_layer = j;
          break;
        }
      if (layer.kv_source_layer < 0)
        fail("config.json: KV-shared layer {} has no earlier non-shared layer of the same type to share from", i);
      const Gemma4LayerConfig& source = c.layers[layer.kv_source_layer];
      if (source.head_dim != layer.head_dim || source.n_kv_heads != layer.n_kv_heads)
        fail("config.json: KV-shared layer {} and its source layer {} disagree on head_dim or KV heads", i,
             layer.kv_source_layer);
      if (c.use_double_wide_mlp) layer.intermediate_size *= 2;
    }
  }
  return c;
}

// The text part of a Qwen3.5 config. `wrapper` is the enclosing multimodal config, if any (it may
// carry tie_word_embeddings instead of the text config).
Qwen35Config parse_qwen35_text(const json& text, const std::string& path, bool moe, const json* wrapper) {
  FieldReader r(text, path);
  Qwen35Config c;
  c.moe = moe;
  c.vocab_size = r.get_int("vocab_size", std::nullopt, 1, kMaxVocab);
  c.hidden_size = r.get_int("hidden_size", std::nullopt, 1, kMaxDim);
  c.num_layers = r.get_int("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  c.num_heads = r.get_int("num_attention_heads", std::nullopt, 1, kMaxHeads);
  c.num_kv_heads = r.get_int("num_key_value_heads", std::nullopt, 1, kMaxHeads);
  c.head_dim = r.get_int("head_dim", 256, 2, kMaxDim);
  c.rms_norm_eps = static_cast<float>(r.get_double("rms_norm_eps", 1e-6, 0.0, 1.0));
  if (!(c.rms_norm_eps > 0)) fail("config.json: {} must be positive", r.where("rms_norm_eps"));
  c.max_position_embeddings = r.get_int("max_position_embeddings", 32768, 1, kMaxPositions);
  c.linear_num_key_heads = r.get_int("linear_num_key_heads", 16, 1, kMaxHeads);
  c.linear_num_value_heads = r.get_int("linear_num_value_heads", 32, 1, kMaxHeads);
  c.linear_key_head_dim = r.get_int("linear_key_head_dim", 128, 1, kMaxDim);
  c.linear_value_head_dim = r.get_int("linear_value_head_dim", 128, 1, kMaxDim);
  c.linear_conv_kernel_dim = r.get_int("linear_conv_kernel_dim", 4, 1, 64);
  c.eos_token_ids = read_token_ids(r, "eos_token_id", 248044);

  // Tied when the text config says so, or (wrappers) when the outer config does.
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  if (wrapper) c.tie_word_embeddings = c.tie_word_embeddings || FieldReader(*wrapper, "").get_bool("tie_word_embeddings", false);

  if (auto act = r.get_string("hidden_act").value_or("silu"); act != "silu")
    fail("config.json: {} '{}' is not supported (Qwen3.5 uses silu)", r.where("hidden_act"), act);
  if (r.get_bool("attention_bias", false)) fail("config.json: {} = true is not supported", r.where("attention_bias"));
  if (!r.get_bool("attn_output_gate", true))
    fail("config.json: {} = false is not supported (Qwen3.5 gates every attention output)", r.where("attn_output_gate"));
  if (c.num_heads % c.num_kv_heads)
    fail("config.json: {} = {} does not divide num_attention_heads = {}", r.where("num_key_value_heads"),
         c.num_kv_heads, c.num_heads);
  if (c.linear_num_value_heads % c.linear_num_key_heads)
    fail("config.json: {} = {} is not a multiple of linear_num_key_heads = {}", r.where("linear_num_value_heads"),
         c.linear_num_value_heads, c.linear_num_key_heads);

  if (moe) {
    c.num_experts = r.get_int("num_experts", std::nullopt, 1, 1 << 16);
    c.num_experts_per_tok = r.get_int("num_experts_per_tok", std::nullopt, 1, 1 << 16);
    c.moe_intermediate_size = r.get_int("moe_intermediate_size", std::nullopt, 1, kMaxDim);
    c.shared_expert_intermediate_size = r.get_int("shared_expert_intermediate_size", std::nullopt, 1, kMaxDim);
    if (c.num_experts_per_tok > c.num_experts)
      fail("config.json: {} = {} exceeds num_experts = {}", r.where("num_experts_per_tok"), c.num_experts_per_tok,
           c.num_experts);
  } else {
    c.intermediate_size = r.get_int("intermediate_size", std::nullopt, 1, kMaxDim);
  }

  // Layer types: listed, or every full_attention_interval-th layer is full attention.
  c.layer_types = listed_layer_types(r, text, c.num_layers, "linear_attention", AttentionType::linear);
  if (c.layer_types.empty()) {
    const int interval = r.get_int("full_attention_interval", 4, 1, kMaxLayers);
    for (int i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval ? AttentionType::linear : AttentionType::full);
  }

  // RoPE: rope_parameters (transformers 5), or the older top-level rope_theta/partial_rotary_factor.
  // Text positions make the M-RoPE sections all equal, so mrope_section does not matter here.
  double partial = 0.25;
  if (r.has("rope_parameters")) {
    const json& rp = text.at("rope_parameters");
    if (!rp.is_object()) fail("config.json: {} must be an object", r.where("rope_parameters"));
    FieldReader rr(rp, r.where("rope_parameters"));
    if (auto type = rr.get_string("rope_type").value_or("default"); type != "default")
      fail("config.json: {} '{}' is not supported (Qwen3.5 uses default)", rr.where("rope_type"), type);
    c.rope_theta = rr.get_double("rope_theta", 1e7, 1.0, 1e12);
    partial = rr.get_double("partial_rotary_factor", r.get_double("partial_rotary_factor", 0.25, 0.0, 1.0), 0.0, 1.0);
  } else {
    c.rope_theta = r.get_double("rope_theta", 1e7, 1.0, 1e12);
    partial = r.get_double("partial_rotary_factor", 0.25, 0.0, 1.0);
  }
  c.rope_dim = static_cast<int>(c.head_dim * partial);  // transformers: int(head_dim * partial_rotary_factor)
  if (c.rope_dim < 2 || c.rope_dim % 2)
    fail("config.json: head_dim {} x partial_rotary_factor {} gives a rotated span of {} dims; it must be even "
         "and at least 2",
         c.head_dim, partial, c.rope_dim);
  return c;
}

}  // namespace

ModelConfig parse_hf_config(const json& config) {
  if (!config.is_object()) fail("config.json: the top level must be a JSON object");
  auto model_type_it = config.find("model_type");
  if (model_type_it == config.end() || !model_type_it->is_string())
    fail("config.json: model_type is missing; cannot tell the architecture");
  const std::string model_type = model_type_it->get<std::string>();
  ModelConfig out;
  if (model_type == "gemma4") {
    auto text = config.find("text_config");
    if (text == config.end() || !text->is_object())
      fail("config.json: model_type gemma4 needs a text_config object");
    out.architecture = "gemma4";
    out.arch = parse_gemma4_text(*text, "text_config");
  } else if (model_type == "gemma4_text") {
    out.architecture = "gemma4";
    out.arch = parse_gemma4_text(config, "");
  } else if (model_type == "qwen3_5" || model_type == "qwen3_5_moe") {
    auto text = config.find("text_config");
    if (text == config.end() || !text->is_object())
      fail("config.json: model_type {} needs a text_config object", model_type);
    out.architecture = "qwen35";
    out.arch = parse_qwen35_text(*text, "text_config", model_type == "qwen3_5_moe", &config);
  } else if (model_type == "qwen3_5_text" || model_type == "qwen3_5_moe_text") {
    out.architecture = "qwen35";
    out.arch = parse_qwen35_text(config, "", model_type == "qwen3_5_moe_text", nullptr);
  } else {
    fail("config.json: model_type '{}' is not supported (supported: gemma4, gemma4_text, qwen3_5, qwen3_5_text, "
         "qwen3_5_moe, qwen3_5_moe_text)",
         model_type);
  }
  return out;
}

ModelConfig parse_hf_config_text(const std::string& text, const std::string& source_name) {
  json parsed;
  try {
    parsed = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", source_name, e.what());
  }
  return parse_hf_config(parsed);
}

namespace {

nlohmann::ordered_json qwen35_summary(const Qwen35Config& c) {
  nlohmann::ordered_json out;
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["num_layers"] = c.num_layers;
  out["linear_attention_layers"] = std::count(c.layer_types.begin(), c.layer_types.end(), AttentionType::linear);
  out["full_attention_layers"] = std::count(c.layer_types.begin(), c.layer_types.end(), AttentionType::full);
  out["num_attention_heads"] = c.num_heads;
  out["num_key_value_heads"] = c.num_kv_heads;
  out["head_dim"] = c.head_dim;
  out["linear_key_heads"] = c.linear_num_key_heads;
  out["linear_value_heads"] = c.linear_num_value_heads;
  out["linear_head_dims"] = {c.linear_key_head_dim, c.linear_value_head_dim};
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["moe"] = c.moe;
  if (c.moe) {
    out["num_experts"] = c.num_experts;
    out["num_experts_per_tok"] = c.num_experts_per_tok;
    out["moe_intermediate_size"] = c.moe_intermediate_size;
    out["shared_expert_size"] = c.shared_expert_intermediate_size;
  } else {
    out["intermediate_size"] = c.intermediate_size;
  }
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  return out;
}

}  // namespace

nlohmann::ordered_json model_config_summary(const ModelConfig& config) {
  nlohmann::ordered_json out;
  out["architecture"] = config.architecture;
  if (const auto* qwen = std::get_if<Qwen35Config>(&config.arch)) {
    const nlohmann::ordered_json fields = qwen35_summary(*qwen);
    for (auto& [key, value] : fields.items()) out[key] = value;
    return out;
  }
  const auto& c = std::get<Gemma4Config>(config.arch);
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["num_layers"] = c.num_layers;
  int sliding = 0, full = 0;
  std::vector<int> head_dims;
  for (const auto& layer : c.layers) {
    (layer.type == AttentionType::sliding ? sliding : full) += 1;
    if (std::find(head_dims.begin(), head_dims.end(), layer.head_dim) == head_dims.end())
      head_dims.push_back(layer.head_dim);
  }
  out["sliding_layers"] = sliding;
  out["full_attention_layers"] = full;
  out["num_attention_heads"] = c.num_heads;
  out["head_dims"] = head_dims;
  out["sliding_window"] = c.sliding_window;
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["intermediate_size"] = c.layers.empty() ? 0 : c.layers.front().intermediate_size;
  out["moe"] = c.enable_moe_block;
  if (c.enable_moe_block) {
    out["num_experts"] = c.num_experts;
    out["top_k_experts"] = c.top_k_experts;
    out["moe_intermediate_size"] = c.moe_intermediate_size;
  }
  if (c.hidden_size_per_layer_input > 0) out["hidden_size_per_layer_input"] = c.hidden_size_per_layer_input;
  if (c.num_kv_shared_layers > 0) out["num_kv_shared_layers"] = c.num_kv_shared_layers;
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.final_logit_softcapping) out["final_logit_softcapping"] = *c.final_logit_softcapping;
  return out;
}

}  // namespace fl
