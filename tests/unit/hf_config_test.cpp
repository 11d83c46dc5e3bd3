#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/hf_config.h"

namespace fl {
namespace {

using nlohmann::json;

// A tiny Gemma 4 MoE text config as transformers 5.17 writes it (per_layer_config spelling).
json tiny_517() {
  return json::parse(R"({
    "model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "sliding_window": 8, "attention_k_eq_v": true, "enable_moe_block": true, "num_experts": 4,
    "top_k_experts": 2, "moe_intermediate_size": 40, "hidden_size_per_layer_input": 0,
    "final_logit_softcapping": 30.0,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "per_layer_config": {"3": {"head_dim": 32, "num_key_value_heads": 1}},
    "rope_parameters": {
      "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}
  })");
}

// The released 26B-A4B text config shape (global_head_dim spelling), inside the multimodal wrapper.
json released_26b() {
  json text = tiny_517();
  text.erase("per_layer_config");
  text["global_head_dim"] = 32;
  text["num_global_key_value_heads"] = 1;
  return json{{"model_type", "gemma4"}, {"text_config", text}, {"vision_config", json::object()}};
}

std::string error_of(const json& j) {
  try {
    parse_hf_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HfConfig, BothSpellingsGiveTheSameLayers) {
  for (const json& j : {tiny_517(), released_26b()}) {
    ModelConfig mc = parse_hf_config(j);
    EXPECT_EQ(mc.architecture, "gemma4");
    const auto& c = std::get<Gemma4Config>(mc.arch);
    ASSERT_EQ(c.layers.size(), 4u);
    EXPECT_EQ(c.layers[0].type, AttentionType::sliding);
    EXPECT_EQ(c.layers[0].head_dim, 16);
    EXPECT_EQ(c.layers[0].n_kv_heads, 2);
    EXPECT_FALSE(c.layers[0].value_from_key);
    EXPECT_EQ(c.layers[3].type, AttentionType::full);
    EXPECT_EQ(c.layers[3].head_dim, 32);
    EXPECT_EQ(c.layers[3].n_kv_heads, 1);
    EXPECT_TRUE(c.layers[3].value_from_key);
    EXPECT_EQ(c.rope_full.type, RopeType::proportional);
    EXPECT_DOUBLE_EQ(c.rope_full.partial_rotary_factor, 0.25);
    EXPECT_DOUBLE_EQ(c.rope_sliding.theta, 10000.0);
    EXPECT_EQ(c.num_experts, 4);
    EXPECT_EQ(c.moe_intermediate_size, 40);
    EXPECT_EQ(c.hidden_size_per_layer_input, 0);
    ASSERT_TRUE(c.final_logit_softcapping.has_value());
    EXPECT_FLOAT_EQ(*c.final_logit_softcapping, 30.0f);
  }
}

TEST(HfConfig, KvSharingAndDoubleWideMlp) {
  json j = tiny_517();
  j["num_hidden_layers"] = 6;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention"};
  j["per_layer_config"] = {{"1", {{"head_dim", 32}}}, {"3", {{"head_dim", 32}}}, {"5", {{"head_dim", 32}}}};
  j["attention_k_eq_v"] = false;
  j["num_kv_shared_layers"] = 3;
  j["use_double_wide_mlp"] = true;
  j["enable_moe_block"] = false;
  const auto c = std::get<Gemma4Config>(parse_hf_config(j).arch);
  EXPECT_EQ(c.layers[2].kv_source_layer, -1);
  EXPECT_EQ(c.layers[3].kv_source_layer, 1);  // full <- last full before layer 3
  EXPECT_EQ(c.layers[4].kv_source_layer, 2);  // sliding <- layer 2
  EXPECT_EQ(c.layers[5].kv_source_layer, 1);
  EXPECT_EQ(c.layers[2].intermediate_size, 96);
  EXPECT_EQ(c.layers[3].intermediate_size, 192);
}

TEST(HfConfig, LastLayerIsForcedToFullAttention) {
  json j = tiny_517();
  j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"};
  j["per_layer_config"] = json::object();
  const auto c = std::get<Gemma4Config>(parse_hf_config(j).arch);
  EXPECT_EQ(c.layers[3].type, AttentionType::full);
}

TEST(HfConfig, ErrorsNameTheField) {
  json j = tiny_517();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type 'llama' is not supported"), std::string::npos);

  j = tiny_517();
  j.erase("model_type");
  EXPECT_NE(error_of(j).find("model_type is missing"), std::string::npos);

  j = tiny_517();
  j["hidden_size"] = "big";
  EXPECT_NE(error_of(j).find("hidden_size must be an integer"), std::string::npos);

  j = tiny_517();
  j.erase("vocab_size");
  EXPECT_NE(error_of(j).find("vocab_size is required"), std::string::npos);

  j = tiny_517();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("does not divide num_attention_heads"), std::string::npos);

  j = tiny_517();
  j["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_NE(error_of(j).find("layer_types has 2 entries but num_hidden_layers is 4"), std::string::npos);

  j = tiny_517();
  j["layer_types"][1] = "chunked_attention";
  EXPECT_NE(error_of(j).find("layer_types[1] 'chunked_attention'"), std::string::npos);

  j = tiny_517();
  j["top_k_experts"] = 9;
  EXPECT_NE(error_of(j).find("top_k_experts = 9 exceeds num_experts = 4"), std::string::npos);

  j = tiny_517();
  j["per_layer_config"]["7"] = {{"head_dim", 32}};
  EXPECT_NE(error_of(j).find("per_layer_config.7 is not a layer index"), std::string::npos);

  j = tiny_517();
  j["per_layer_config"]["3"]["sliding_window"] = 4;
  EXPECT_NE(error_of(j).find("per_layer_config.3.sliding_window is not a supported per-layer override"),
            std::string::npos);

  j = tiny_517();
  j["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  EXPECT_NE(error_of(j).find("rope_type 'yarn' is not supported"), std::string::npos);

  j = tiny_517();
  j["hidden_activation"] = "relu";
  EXPECT_NE(error_of(j).find("hidden_activation 'relu' is not supported"), std::string::npos);

  j = tiny_517();
  j["num_kv_shared_layers"] = 4;
  EXPECT_NE(error_of(j).find("leaves no layer to share from"), std::string::npos);

  j = tiny_517();
  j["per_layer_config"]["3"]["head_dim"] = 33;
  EXPECT_NE(error_of(j).find("head_dim 33 must be even"), std::string::npos);

  j = released_26b();
  j.erase("text_config");
  EXPECT_NE(error_of(j).find("needs a text_config object"), std::string::npos);

  j = tiny_517();
  j["rms_norm_eps"] = -1;
  EXPECT_NE(error_of(j).find("rms_norm_eps = -1 is out of range"), std::string::npos);

  EXPECT_NE(error_of(json::array()).find("top level must be a JSON object"), std::string::npos);
  EXPECT_THROW(parse_hf_config_text("{oops", "config.json"), Error);
}

// The released Qwen3.5-MoE wrapper shape (35B-A3B fields at toy size), text fields nested.
json qwen35_moe_wrapper() {
  json text = json::parse(R"({
    "model_type": "qwen3_5_moe_text", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "linear_num_key_heads": 1,
    "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
    "shared_expert_intermediate_size": 80, "full_attention_interval": 4, "attn_output_gate": true,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [3, 3, 2], "mrope_interleaved": true},
    "eos_token_id": 248044
  })");
  return json{{"model_type", "qwen3_5_moe"}, {"text_config", text}, {"tie_word_embeddings", false},
              {"vision_config", json::object()}};
}

TEST(HfConfig, Qwen35WrapperAndTextOnlyForms) {
  ModelConfig mc = parse_hf_config(qwen35_moe_wrapper());
  EXPECT_EQ(mc.architecture, "qwen35");
  const auto& c = std::get<Qwen35Config>(mc.arch);
  EXPECT_TRUE(c.moe);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i)  // full attention at (i + 1) % 4 == 0
    EXPECT_EQ(c.layer_types[i], i == 3 || i == 7 ? AttentionType::full : AttentionType::linear) << i;
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.conv_channels(), 2 * 32 + 4 * 16);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.shared_expert_intermediate_size, 80);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{248044});

  // text-only dense, explicit layer_types, the wrapper's tie flag only counts for wrappers
  json text = qwen35_moe_wrapper()["text_config"];
  text["model_type"] = "qwen3_5_text";
  text["intermediate_size"] = 96;
  text["tie_word_embeddings"] = true;
  text["num_hidden_layers"] = 3;
  text["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
  const auto d = std::get<Qwen35Config>(parse_hf_config(text).arch);
  EXPECT_FALSE(d.moe);
  EXPECT_EQ(d.intermediate_size, 96);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_EQ(d.layer_types[1], AttentionType::full);
  EXPECT_EQ(d.layer_types[2], AttentionType::linear);

  json tied_outside = qwen35_moe_wrapper();
  tied_outside["tie_word_embeddings"] = true;
  EXPECT_TRUE(std::get<Qwen35Config>(parse_hf_config(tied_outside).arch).tie_word_embeddings);

  const auto summary = model_config_summary(mc);
  EXPECT_EQ(summary["architecture"], "qwen35");
  EXPECT_EQ(summary["linear_attention_layers"], 6);
  EXPECT_EQ(summary["full_attention_layers"], 2);
}

TEST(HfConfig, Qwen35ErrorsNameTheField) {
  json j = qwen35_moe_wrapper();
  j["text_config"]["linear_num_value_heads"] = 3;
  j["text_config"]["linear_num_key_heads"] = 2;
  EXPECT_NE(error_of(j).find("text_config.linear_num_value_heads = 3 is not a multiple"), std::string::npos);

  j = qwen35_moe_wrapper();
  j["text_config"]["layer_types"] = {"linear_attention", "sliding_attention"};
  j["text_config"]["num_hidden_layers"] = 2;
  EXPECT_NE(error_of(j).find("'sliding_attention' is not linear_attention or full_attention"), std::string::npos);

  j = qwen35_moe_wrapper();
  j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.01;
  EXPECT_NE(error_of(j).find("rotated span of 0 dims"), std::string::npos);

  j = qwen35_moe_wrapper();
  j["text_config"].erase("num_experts");
  EXPECT_NE(error_of(j).find("text_config.num_experts is required"), std::string::npos);

  j = qwen35_moe_wrapper();
  j["text_config"]["attn_output_gate"] = false;
  EXPECT_NE(error_of(j).find("attn_output_gate = false is not supported"), std::string::npos);

  j = qwen35_moe_wrapper();
  j["model_type"] = "qwen3_5";  // dense wrapper: intermediate_size is required
  EXPECT_NE(error_of(j).find("text_config.intermediate_size is required"), std::string::npos);
}

}  // namespace
}  // namespace fl
