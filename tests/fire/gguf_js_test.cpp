// A standard GGUF reader, @huggingface/gguf (npm, pinned in tests/js), parses the files fireline
// writes and lists the same metadata and tensors our reader does: a .fire with every fireline
// type id, and a GGUF with arrays of every kind.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "fire/fire_test_util.h"
#include "io/fire_file.h"
#include "io/quantize_model.h"
#include "util/run_command.h"

namespace fl {
namespace {

using nlohmann::json;

json list_with_node(const std::string& path) {
  const std::string script = std::string(FIRELINE_JS_DIR) + "/gguf_list.mjs";
  auto r = test::run_command("node " + test::shell_quote(script) + " " + test::shell_quote(path));
  EXPECT_EQ(r.exit_code, 0) << "node failed (is node installed and tests/js/node_modules linked?): " << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// Our value as @huggingface/gguf presents it: numbers, strings, booleans, arrays; 64-bit integers
// as decimal strings (gguf_list.mjs turns BigInts into strings).
json as_js(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::u64: return std::to_string(static_cast<uint64_t>(v.integer));
    case GgufValueType::i64: return std::to_string(v.integer);
    case GgufValueType::f32:
    case GgufValueType::f64: return v.real;
    case GgufValueType::boolean: return v.integer != 0;
    case GgufValueType::string: return v.text;
    case GgufValueType::array: {
      json a = json::array();
      for (const GgufValue& item : v.items) a.push_back(as_js(item));
      return a;
    }
    default: return v.integer;
  }
}

void expect_same_listing(const std::string& path) {
  GgufFile ours(path);
  json js = list_with_node(path);
  ASSERT_TRUE(js.is_object());
  EXPECT_EQ(js["metadata"]["version"], ours.version());
  EXPECT_EQ(js["metadata"]["tensor_count"], std::to_string(ours.tensors().size()));
  EXPECT_EQ(js["metadata"]["kv_count"], std::to_string(ours.metadata().size()));
  for (const GgufMetadataEntry& e : ours.metadata()) {
    ASSERT_TRUE(js["metadata"].contains(e.key)) << e.key;
    EXPECT_EQ(js["metadata"][e.key], as_js(e.value)) << e.key;
  }
  EXPECT_EQ(js["metadata"].size(), ours.metadata().size() + 3);  // + version, tensor_count, kv_count
  EXPECT_EQ(js["tensor_data_offset"], std::to_string(ours.data_offset()));
  ASSERT_EQ(js["tensors"].size(), ours.tensors().size());
  for (size_t i = 0; i < ours.tensors().size(); ++i) {
    const GgufTensorInfo& t = ours.tensors()[i];
    const json& j = js["tensors"][i];
    EXPECT_EQ(j["name"], t.name);
    EXPECT_EQ(j["dtype"], t.type_id) << t.name;
    EXPECT_EQ(j["offset"], std::to_string(t.offset)) << t.name;
    ASSERT_EQ(j["n_dims"], t.shape.size()) << t.name;
    // GGUF order on disk: innermost first, the reverse of our PyTorch order.
    for (size_t d = 0; d < t.shape.size(); ++d)
      EXPECT_EQ(j["shape"][d], std::to_string(t.shape[t.shape.size() - 1 - d])) << t.name;
  }
}

TEST(GgufJs, ParsesAFireFileWithEveryFirelineType) {
  test::TempDir hf, out;
  std::vector<test::StTensor> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    tensors.push_back(test::st_f32(name, std::move(shape), test::random_floats(n, static_cast<uint32_t>(tensors.size()))));
  };
  add("model.embed_tokens.weight", {16, 256});               // q8_0
  add("model.norm.weight", {256});                            // f32
  add("model.layers.0.mlp.gate_proj.weight", {4, 512});       // hfq4_g256
  add("model.layers.0.mlp.down_proj.weight", {3, 704});       // hfq4_g128
  add("model.layers.0.mlp.up_proj.weight", {4, 256});         // hfq6_g256 by override
  add("model.layers.0.experts.gate_up_proj", {2, 3, 256});    // bf16 by override
  add("model.layers.0.self_attn.q_proj.weight", {2, 64});     // f16 by override
  test::write_hf_dir(hf, tensors);
  test::write_file(hf.file("tokenizer.json"), R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
  test::write_file(hf.file("generation_config.json"), R"({"top_k": 64})");
  test::write_file(hf.file("chat_template.jinja"), "{{ bos_token }}\n{% for m in messages %}{{ m.content }}{% endfor %}");
  QuantizeOptions options;
  options.policy.overrides = {parse_quant_override("*up_proj*=hf6"), parse_quant_override("*experts*=bf16"),
                              parse_quant_override("*q_proj*=f16")};
  quantize_model(hf.path().string(), out.file("m.fire"), options);
  expect_same_listing(out.file("m.fire"));

  json js = list_with_node(out.file("m.fire"));
  EXPECT_EQ(js["metadata"]["general.architecture"], "gemma4");
  EXPECT_EQ(js["metadata"]["general.alignment"], 64);
  EXPECT_EQ(js["metadata"]["tokenizer.chat_template"],
            "{{ bos_token }}\n{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(js["metadata"]["fireline.tensor_sha256"], FireFile(out.file("m.fire")).recorded_sha256());
  std::set<int> types;
  for (auto& t : js["tensors"]) types.insert(t["dtype"].get<int>());
  EXPECT_EQ(types, (std::set<int>{0, 1, 8, 30, 1006, 1007, 1008}));
}

TEST(GgufJs, ParsesMetadataArraysAndOtherAlignments) {
  GgufWriter w(128);
  std::vector<GgufValue> tokens, scores, flags;
  for (int i = 0; i < 5; ++i) {
    tokens.push_back(GgufValue::of_string("tok" + std::to_string(i)));
    scores.push_back(GgufValue::of_f32(-0.5f * i));
    flags.push_back(GgufValue::of_bool(i % 2 == 0));
  }
  w.add_metadata("general.architecture", GgufValue::of_string("gemma4"));
  w.add_metadata("tokenizer.ggml.tokens", GgufValue::of_array(GgufValueType::string, tokens));
  w.add_metadata("tokenizer.ggml.scores", GgufValue::of_array(GgufValueType::f32, scores));
  w.add_metadata("test.flags", GgufValue::of_array(GgufValueType::boolean, flags));
  w.add_metadata("test.i32", GgufValue::of_i32(-5));
  w.add_metadata("test.u64", GgufValue::of_u64(1ull << 40));
  w.add_metadata("test.f64", GgufValue::of_f64(0.125));
  w.add_tensor("a", 0, {3});
  w.add_tensor("b", 30, {2, 5});
  test::TempDir dir;
  {
    GgufStreamWriter out(dir.file("a.gguf"), w);
    std::string a(12, '\x01'), b(20, '\x02');
    out.write_tensor_bytes(0, a.data(), a.size());
    out.write_tensor_bytes(1, b.data(), b.size());
    out.finish(w);
  }
  expect_same_listing(dir.file("a.gguf"));
  json js = list_with_node(dir.file("a.gguf"));
  EXPECT_EQ(js["metadata"]["tokenizer.ggml.tokens"][4], "tok4");
  EXPECT_EQ(js["tensors"][1]["offset"], "128");
}

}  // namespace
}  // namespace fl
