// The quantizer: the policy of DESIGN §4 tensor by tensor, overrides, bytes equal to the
// registry's reference codecs whatever the slab size and thread count, and the imports: GGUF
// (Q4_K/Q6_K decoded, Q8_0 kept), hipfire HFQM (HFQ/Q8 kept byte for byte) and .fire itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "fire/fire_test_util.h"
#include "io/fire_file.h"
#include "io/ggml_kquants.h"
#include "io/quantize_model.h"
#include "quant/quant.h"
#include "quant/quant_policy.h"

namespace fl {
namespace {

using test::StTensor;

// ---- policy ----

DType pick(QuantPreset preset, const std::string& name, std::vector<int64_t> shape) {
  return preset_tensor_format(preset, name, shape);
}

TEST(QuantPolicy, FollowsDesignSection4) {
  using enum QuantPreset;
  const std::string embed = "model.language_model.embed_tokens.weight";
  const std::string ple = "model.language_model.embed_tokens_per_layer.weight";
  EXPECT_EQ(pick(hf4, "model.norm.weight", {2816}), DType::f32);
  EXPECT_EQ(pick(hf4, "model.layers.0.layer_scalar", {1}), DType::f32);
  EXPECT_EQ(pick(hf4, embed, {262144, 2816}), DType::q8_0);
  EXPECT_EQ(pick(hf4, ple, {262144, 8960}), DType::q8_0);
  EXPECT_EQ(pick(hf4, "q_proj.weight", {4096, 2816}), DType::hfq4_g256);  // 2816 = 11 x 256
  EXPECT_EQ(pick(hf4, "down_proj.weight", {2816, 2112}), DType::hfq4_g128);
  EXPECT_EQ(pick(hf4, "experts.down_proj", {128, 2816, 704}), DType::hfq4_g128);
  EXPECT_EQ(pick(hf4, "experts.gate_up_proj", {128, 1408, 2816}), DType::hfq4_g256);
  EXPECT_EQ(pick(hf4, "vision.patch_embedding.weight", {1, 3, 16, 16}), DType::f32);  // not a 2-D/3-D weight
  EXPECT_EQ(pick(hf6, "q_proj.weight", {4096, 2816}), DType::hfq6_g256);
  EXPECT_EQ(pick(hf6, "down_proj.weight", {2816, 2112}), DType::hfq4_g128);
  EXPECT_EQ(pick(hf6, embed, {8, 256}), DType::q8_0);
  EXPECT_EQ(pick(q8, "down_proj.weight", {2816, 2112}), DType::q8_0);
  EXPECT_EQ(pick(q8, embed, {8, 256}), DType::q8_0);
  EXPECT_EQ(pick(q8, "model.norm.weight", {256}), DType::f32);
  EXPECT_EQ(pick(bf16, embed, {8, 256}), DType::bf16);
  EXPECT_EQ(pick(bf16, "experts.down_proj", {2, 3, 704}), DType::bf16);
  EXPECT_EQ(pick(bf16, "model.norm.weight", {256}), DType::f32);
  EXPECT_EQ(pick(f16, "w", {2, 3}), DType::f16);
  EXPECT_EQ(pick(f32, "w", {2, 3}), DType::f32);
  // Qwen3.5's conv taps [C, 1, 4]: a 128-value block for 4 values would be mostly padding
  const std::string conv = "model.language_model.layers.0.linear_attn.conv1d.weight";
  for (QuantPreset preset : {hf4, hf6, q8, bf16}) EXPECT_EQ(pick(preset, conv, {8192, 1, 4}), DType::f32);
  EXPECT_EQ(pick(hf4, "model.language_model.layers.0.linear_attn.in_proj_qkv.weight", {8192, 2048}), DType::hfq4_g256);
}

TEST(QuantPolicy, OverridesMatchWholeNamesAndTheLastOneWins) {
  QuantPolicy policy;
  policy.overrides = {parse_quant_override("*.mlp.*=q8"), parse_quant_override("*down_proj*=hf6"),
                      parse_quant_override("model.norm.weight=bf16")};
  std::vector<int64_t> k704 = {4, 704}, k512 = {4, 512}, vec = {64};
  EXPECT_EQ(choose_tensor_format(policy, "model.layers.1.mlp.up_proj.weight", k512).dtype, DType::q8_0);
  FormatChoice down = choose_tensor_format(policy, "model.layers.1.mlp.down_proj.weight", k704);
  EXPECT_EQ(down.dtype, DType::hfq4_g128);  // hf6 on K = 704 falls back like the preset
  EXPECT_EQ(down.override_index, 1);
  EXPECT_EQ(choose_tensor_format(policy, "model.layers.1.mlp.down_proj.weight", k512).dtype, DType::hfq6_g256);
  EXPECT_EQ(choose_tensor_format(policy, "model.norm.weight", vec).dtype, DType::bf16);
  FormatChoice attn = choose_tensor_format(policy, "model.layers.1.self_attn.o_proj.weight", k512);
  EXPECT_EQ(attn.dtype, DType::hfq4_g256);
  EXPECT_EQ(attn.override_index, -1);
  EXPECT_FALSE(glob_match("norm.weight", "model.norm.weight"));  // whole-name match
  EXPECT_TRUE(glob_match("model.layers.?.mlp.*", "model.layers.3.mlp.gate_proj.weight"));
  EXPECT_TRUE(glob_match("*.layers.[0-2].*", "model.layers.2.x"));

  EXPECT_EQ(parse_quant_override("a=b=hfq4_g128").pattern, "a=b");  // the last '=' separates
  EXPECT_EQ(resolve_quant_format("hfq4_g256", 100), DType::hfq4_g256);  // explicit formats are taken as given
  EXPECT_THROW(parse_quant_override("nothing"), Error);
  EXPECT_THROW(parse_quant_override("=q8"), Error);
  EXPECT_THROW(parse_quant_override("x=q4"), Error);
  EXPECT_THROW(parse_quant_override("x=i32"), Error);
  EXPECT_FALSE(parse_quant_preset("q4_k_m").has_value());
  EXPECT_EQ(parse_quant_preset("hf6"), QuantPreset::hf6);
}

// ---- pipeline on a synthetic checkpoint ----

StTensor bf16_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::vector<float> v = test::random_floats(n, seed);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = f32_to_bf16(v[i]);
  return test::st_bf16(name, std::move(shape), bits);
}

StTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return test::st_f32(name, std::move(shape), test::random_floats(n, seed));
}

std::vector<StTensor> synthetic_tensors() {
  StTensor ids{"model.position_ids", "I32", {4}, std::vector<uint8_t>(16, 7)};
  return {
      f32_tensor("model.embed_tokens.weight", {8, 256}, 1),
      f32_tensor("model.layers.0.input_layernorm.weight", {256}, 2),
      bf16_tensor("model.layers.0.mlp.gate_proj.weight", {4, 512}, 3),
      bf16_tensor("model.layers.0.mlp.down_proj.weight", {3, 704}, 4),
      f32_tensor("model.layers.0.experts.gate_up_proj", {2, 6, 2816}, 5),
      bf16_tensor("model.layers.0.experts.down_proj", {2, 5, 704}, 6),
      bf16_tensor("model.layers.0.layer_scalar", {1}, 7),
      ids,
  };
}

// The input tensor decoded to f32, row-major.
std::vector<float> decode_input(const StTensor& t) {
  std::vector<float> out;
  if (t.dtype == "F32") {
    out.resize(t.bytes.size() / 4);
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  } else {
    for (size_t i = 0; i < t.bytes.size(); i += 2) out.push_back(bf16_to_f32(static_cast<uint16_t>(t.bytes[i] | t.bytes[i + 1] << 8)));
  }
  return out;
}

// What the quantizer must have written for `t` in `dtype`: each row through the reference codec.
std::string expected_bytes(const StTensor& t, DType dtype) {
  const int64_t k = t.shape.back();
  std::vector<float> values = decode_input(t);
  const int64_t rows = static_cast<int64_t>(values.size()) / k;
  std::string out(static_cast<size_t>(rows * row_bytes(dtype, k)), '\0');
  for (int64_t r = 0; r < rows; ++r)
    quant_format(dtype).quantize_row(values.data() + r * k, out.data() + r * row_bytes(dtype, k), k);
  return out;
}

std::string tensor_bytes(const FireFile& f, const std::string& name) {
  const GgufTensorInfo* info = f.gguf().find_tensor(name);
  EXPECT_NE(info, nullptr) << name;
  return info ? std::string(reinterpret_cast<const char*>(f.gguf().tensor_data(*info)), info->nbytes()) : "";
}

class SyntheticCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { test::write_hf_dir(hf_, tensors_); }
  QuantizeReport run(QuantizeOptions options, const std::string& name = "out.fire") {
    return quantize_model(hf_.path().string(), out_.file(name), options);
  }
  const StTensor& input(const std::string& name) const {
    for (const StTensor& t : tensors_)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  test::TempDir hf_, out_;
  std::vector<StTensor> tensors_ = synthetic_tensors();
};

TEST_F(SyntheticCheckpoint, EachPresetWritesTheRegistryCodecsBytes) {
  const std::map<QuantPreset, std::map<std::string, DType>> want = {
      {QuantPreset::hf4,
       {{"model.embed_tokens.weight", DType::q8_0},
        {"model.layers.0.input_layernorm.weight", DType::f32},
        {"model.layers.0.mlp.gate_proj.weight", DType::hfq4_g256},
        {"model.layers.0.mlp.down_proj.weight", DType::hfq4_g128},
        {"model.layers.0.experts.gate_up_proj", DType::hfq4_g256},
        {"model.layers.0.experts.down_proj", DType::hfq4_g128},
        {"model.layers.0.layer_scalar", DType::f32}}},
      {QuantPreset::hf6,
       {{"model.embed_tokens.weight", DType::q8_0},
        {"model.layers.0.mlp.gate_proj.weight", DType::hfq6_g256},
        {"model.layers.0.mlp.down_proj.weight", DType::hfq4_g128},
        {"model.layers.0.experts.gate_up_proj", DType::hfq6_g256}}},
      {QuantPreset::q8,
       {{"model.embed_tokens.weight", DType::q8_0},
        {"model.layers.0.experts.down_proj", DType::q8_0},
        {"model.layers.0.input_layernorm.weight", DType::f32}}},
      {QuantPreset::bf16,
       {{"model.embed_tokens.weight", DType::bf16},
        {"model.layers.0.mlp.gate_proj.weight", DType::bf16},
        {"model.layers.0.layer_scalar", DType::f32}}},
  };
  for (auto& [preset, formats] : want) {
    QuantizeOptions options;
    options.policy.preset = preset;
    const std::string name = std::string(quant_preset_name(preset)) + ".fire";
    QuantizeReport report = run(options, name);
    EXPECT_EQ(report.tensor_count, tensors_.size());
    FireFile f(out_.file(name));
    for (auto& [tensor, dtype] : formats) {
      const GgufTensorInfo* info = f.gguf().find_tensor(tensor);
      ASSERT_NE(info, nullptr) << tensor;
      EXPECT_EQ(f.tensor_dtype(*info), dtype) << quant_preset_name(preset) << " " << tensor;
      EXPECT_EQ(tensor_bytes(f, tensor), expected_bytes(input(tensor), dtype)) << quant_preset_name(preset) << " " << tensor;
    }
    // Integer tensors are copied as they are.
    EXPECT_EQ(f.tensor_dtype(*f.gguf().find_tensor("model.position_ids")), DType::i32);
    EXPECT_EQ(tensor_bytes(f, "model.position_ids"), std::string(16, '\x07'));
    // The summary adds up.
    uint64_t bytes = 0;
    size_t count = 0;
    for (const FormatTotals& t : report.formats) {
      bytes += t.bytes;
      count += t.tensors;
    }
    uint64_t in_file = 0;
    for (const GgufTensorInfo& t : f.gguf().tensors()) in_file += t.nbytes();
    EXPECT_EQ(bytes, in_file);
    EXPECT_EQ(count, tensors_.size());
    EXPECT_EQ(report.tensor_sha256, f.recorded_sha256());
    EXPECT_EQ(report.file_bytes, f.gguf().file_size());
  }
}

TEST_F(SyntheticCheckpoint, OutputDoesNotDependOnSlabSizeOrThreads) {
  QuantizeOptions options;
  const std::string reference = run(options, "a.fire").tensor_sha256;
  ThreadPool one(1), three(3);
  options.pool = &one;
  options.slab_bytes = 100;  // many slabs per tensor, slabs smaller than a row
  EXPECT_EQ(run(options, "b.fire").tensor_sha256, reference);
  options.pool = &three;
  options.slab_bytes = 5000;
  EXPECT_EQ(run(options, "c.fire").tensor_sha256, reference);
  // Progress reports every input byte exactly once, ending at the total.
  uint64_t last = 0, total = 0;
  int calls = 0;
  options.progress = [&](const QuantizeProgress& p) {
    EXPECT_GE(p.bytes_done, last);
    last = p.bytes_done;
    total = p.bytes_total;
    ++calls;
  };
  run(options, "d.fire");
  EXPECT_EQ(last, total);
  EXPECT_GT(calls, static_cast<int>(tensors_.size()));
}

TEST_F(SyntheticCheckpoint, OverridesPickFormatsAndMustMatchSomething) {
  QuantizeOptions options;
  options.policy.overrides = {parse_quant_override("*.mlp.*=q8"), parse_quant_override("*down_proj*=f16"),
                              parse_quant_override("*layernorm*=bf16")};
  run(options);
  FireFile f(out_.file("out.fire"));
  auto dtype_of = [&](const std::string& n) { return f.tensor_dtype(*f.gguf().find_tensor(n)); };
  EXPECT_EQ(dtype_of("model.layers.0.mlp.gate_proj.weight"), DType::q8_0);
  EXPECT_EQ(dtype_of("model.layers.0.mlp.down_proj.weight"), DType::f16);
  EXPECT_EQ(dtype_of("model.layers.0.experts.down_proj"), DType::f16);
  EXPECT_EQ(dtype_of("model.layers.0.input_layernorm.weight"), DType::bf16);
  EXPECT_EQ(dtype_of("model.layers.0.experts.gate_up_proj"), DType::hfq4_g256);
  auto quantizer = nlohmann::json::parse(f.quantizer_json());
  ASSERT_EQ(quantizer["overrides"].size(), 3u);
  EXPECT_EQ(quantizer["overrides"][1]["pattern"], "*down_proj*");
  EXPECT_EQ(quantizer["overrides"][1]["format"], "f16");

  options.policy.overrides = {parse_quant_override("*.mpl.*=q8")};
  try {
    run(options, "typo.fire");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--override '*.mpl.*=q8' matches no tensor"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out_.file("typo.fire")));
  for (const auto& entry : std::filesystem::directory_iterator(out_.path()))
    EXPECT_EQ(entry.path().filename().string().rfind("typo.fire.partial", 0), std::string::npos) << entry.path();
  options.policy.overrides = {parse_quant_override("*position_ids=q8")};
  EXPECT_THROW(run(options, "int.fire"), Error);
}

TEST_F(SyntheticCheckpoint, RequantizingAFireKeepsQuantizedTensorsAndConvertsFloats) {
  QuantizeOptions options;
  QuantizeReport hf4 = run(options, "hf4.fire");
  // Re-quantizing an hf4 .fire with the default policy changes nothing: every tensor is already in
  // its format (f32 stays f32, quantized tensors keep their bytes).
  QuantizeReport again = quantize_model(out_.file("hf4.fire"), out_.file("again.fire"), options);
  EXPECT_EQ(again.source_kind, "fire");
  EXPECT_EQ(again.tensor_sha256, hf4.tensor_sha256);
  EXPECT_TRUE(again.warnings.empty());
  // An override re-quantizes (and says it compounds error).
  options.policy.overrides = {parse_quant_override("*gate_proj*=q8")};
  QuantizeReport forced = quantize_model(out_.file("hf4.fire"), out_.file("forced.fire"), options);
  ASSERT_EQ(forced.warnings.size(), 1u);
  EXPECT_NE(forced.warnings[0].find("re-quantized from HFQ4_G256 to q8_0"), std::string::npos) << forced.warnings[0];

  // bf16 .fire -> f32 widens every value exactly; -> bf16 again changes nothing.
  QuantizeOptions plain;
  plain.policy.preset = QuantPreset::bf16;
  QuantizeReport bf16 = run(plain, "bf16.fire");
  EXPECT_EQ(quantize_model(out_.file("bf16.fire"), out_.file("bf16b.fire"), plain).tensor_sha256, bf16.tensor_sha256);
  plain.policy.preset = QuantPreset::f32;
  quantize_model(out_.file("bf16.fire"), out_.file("f32.fire"), plain);
  FireFile narrow(out_.file("bf16.fire")), wide(out_.file("f32.fire"));
  for (const std::string& name : narrow.tensor_names()) {
    Tensor a = *narrow.find(name), b = *wide.find(name);
    if (a.dtype == DType::i32) continue;
    ASSERT_EQ(b.dtype, DType::f32) << name;
    std::vector<float> values(static_cast<size_t>(a.numel()));
    quant_format(a.dtype).dequantize_row(a.data, values.data(), a.numel());
    EXPECT_EQ(std::memcmp(values.data(), b.data, b.nbytes()), 0) << name;
  }

  EXPECT_THROW(quantize_model(out_.file("hf4.fire"), out_.file("hf4.fire"), options), Error);  // in place
}

TEST_F(SyntheticCheckpoint, ShardedCheckpointsGiveTheSameFile) {
  test::TempDir sharded;
  std::filesystem::copy_file(hf_.file("config.json"), sharded.file("config.json"));
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  std::vector<StTensor> first, second;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const std::string shard = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (i % 2 ? second : first).push_back(tensors_[i]);
    index["weight_map"][tensors_[i].name] = shard;
  }
  test::write_file(sharded.file("model-00001-of-00002.safetensors"), test::safetensors_bytes(first));
  test::write_file(sharded.file("model-00002-of-00002.safetensors"), test::safetensors_bytes(second));
  test::write_file(sharded.file("model.safetensors.index.json"), index.dump());
  QuantizeReport one = run({}, "one.fire");
  QuantizeReport two = quantize_model(sharded.path().string(), out_.file("two.fire"), {});
  EXPECT_EQ(two.tensor_sha256, one.tensor_sha256);
  EXPECT_EQ(FireFile(out_.file("two.fire")).tensor_names(), FireFile(out_.file("one.fire")).tensor_names());
}

// ---- GGUF input with Hugging Face names ----

TEST(QuantizeImport, GgufTensorsAreDecodedOrKept) {
  test::TempDir dir;
  // Q4_K: every weight d * scale * q - dmin * min with one scale/min for the whole block keeps the
  // expectation simple; the kquants tests cover the packing in depth.
  std::vector<uint8_t> q4k(2 * kQ4KBlockBytes, 0);
  for (int b = 0; b < 2; ++b) {
    uint8_t* blk = q4k.data() + b * kQ4KBlockBytes;
    const uint16_t d = f32_to_f16(0.5f), dmin = f32_to_f16(0.25f);
    std::memcpy(blk, &d, 2);
    std::memcpy(blk + 2, &dmin, 2);
    for (int j = 0; j < 4; ++j) {
      blk[4 + j] = 3;      // scale 3 for sub-blocks 0-3
      blk[8 + j] = 2;      // min 2 for sub-blocks 0-3
      blk[12 + j] = 0x23;  // sub-blocks 4-7: scale 3, min 2 (no high bits)
    }
    for (int i = 0; i < 128; ++i) blk[16 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  }
  std::vector<uint8_t> q6k(2 * kQ6KBlockBytes, 0);  // all codes 33 (= +1), scale 2, d = 0.75
  for (int b = 0; b < 2; ++b) {
    uint8_t* blk = q6k.data() + b * kQ6KBlockBytes;
    for (int i = 0; i < 128; ++i) blk[i] = 0x11;
    for (int i = 0; i < 64; ++i) blk[128 + i] = 0xaa;  // high bits 2 -> code 0x21 = 33
    for (int i = 0; i < 16; ++i) blk[192 + i] = 2;
    const uint16_t d = f32_to_f16(0.75f);
    std::memcpy(blk + 208, &d, 2);
  }
  std::vector<float> q8_values = test::random_floats(128, 9);
  std::string q8(2 * row_bytes(DType::q8_0, 64), '\0');
  for (int r = 0; r < 2; ++r) quant_format(DType::q8_0).quantize_row(q8_values.data() + 64 * r, q8.data() + r * 68, 64);
  std::vector<uint16_t> f16(64);
  for (int i = 0; i < 64; ++i) f16[i] = f32_to_f16(0.5f + i);

  GgufWriter w;
  w.add_metadata("general.architecture", GgufValue::of_string("gemma4"));
  w.add_metadata("tokenizer.chat_template", GgufValue::of_string("{{ gguf template }}"));
  w.add_tensor("model.layers.0.mlp.gate_proj.weight", 12, {1, 512});
  w.add_tensor("model.layers.0.mlp.up_proj.weight", 14, {2, 256});
  w.add_tensor("model.layers.0.self_attn.q_proj.weight", 8, {2, 64});
  w.add_tensor("model.layers.0.input_layernorm.weight", 1, {64});
  {
    GgufStreamWriter out(dir.file("in.gguf"), w);
    out.write_tensor_bytes(0, q4k.data(), q4k.size());
    out.write_tensor_bytes(1, q6k.data(), q6k.size());
    out.write_tensor_bytes(2, q8.data(), q8.size());
    out.write_tensor_bytes(3, f16.data(), 128);
    out.finish(w);
  }
  QuantizeOptions options;
  try {
    quantize_model(dir.file("in.gguf"), dir.file("out.fire"), options);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass --hf-config DIR"), std::string::npos) << e.what();
  }
  test::TempDir config_dir;
  std::filesystem::copy_file(test::fixtures_dir() + "/gemma4-moe/config.json", config_dir.file("config.json"));
  options.hf_config_dir = config_dir.path().string();
  options.policy.overrides = {parse_quant_override("*_proj.weight=f32")};
  options.policy.overrides.push_back(parse_quant_override("*q_proj*=hf4"));
  QuantizeReport report = quantize_model(dir.file("in.gguf"), dir.file("out.fire"), options);
  EXPECT_EQ(report.source_kind, "gguf");

  FireFile f(dir.file("out.fire"));
  EXPECT_EQ(f.chat_template(), "{{ gguf template }}");  // the GGUF's own, as the config dir has none
  auto values = [&](const std::string& name) {
    Tensor t = *f.find(name);
    EXPECT_EQ(t.dtype, DType::f32) << name;
    return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
  };
  std::vector<float> gate = values("model.layers.0.mlp.gate_proj.weight");
  ASSERT_EQ(gate.size(), 512u);
  for (int i = 0; i < 512; ++i) {
    const int in_chunk = i % 64;
    const int byte = in_chunk % 32;  // byte i of the chunk: low nibble first half, high second
    const int q = in_chunk < 32 ? byte % 16 : 15 - byte % 16;
    EXPECT_EQ(gate[i], 0.5f * 3 * q - 0.25f * 2) << i;
  }
  for (float v : values("model.layers.0.mlp.up_proj.weight")) EXPECT_EQ(v, 0.75f * 2 * 1);
  std::vector<float> norm = values("model.layers.0.input_layernorm.weight");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(norm[i], 0.5f + i);
  // Q8_0 is a fireline format, but the override (hf4 -> HFQ4-G128 at K = 64) re-quantizes it.
  EXPECT_EQ(f.tensor_dtype(*f.gguf().find_tensor("model.layers.0.self_attn.q_proj.weight")), DType::hfq4_g128);
  ASSERT_EQ(report.warnings.size(), 1u);

  // Without overrides Q8_0 is kept byte for byte.
  options.policy.overrides.clear();
  quantize_model(dir.file("in.gguf"), dir.file("kept.fire"), options);
  FireFile kept(dir.file("kept.fire"));
  EXPECT_EQ(tensor_bytes(kept, "model.layers.0.self_attn.q_proj.weight"), q8);
  EXPECT_EQ(kept.tensor_dtype(*kept.gguf().find_tensor("model.layers.0.mlp.up_proj.weight")), DType::hfq4_g256);
}

TEST(QuantizeImport, KQuantInputsQuantizedAgainAreWarnedAbout) {
  test::TempDir dir, config_dir;
  std::filesystem::copy_file(test::fixtures_dir() + "/gemma4-moe/config.json", config_dir.file("config.json"));
  GgufWriter w;
  w.add_tensor("model.layers.0.mlp.up_proj.weight", 14, {2, 256});
  {
    GgufStreamWriter out(dir.file("in.gguf"), w);
    std::string zeros(w.tensor(0).nbytes(), '\0');
    out.write_tensor_bytes(0, zeros.data(), zeros.size());
    out.finish(w);
  }
  QuantizeOptions options;
  options.hf_config_dir = config_dir.path().string();
  QuantizeReport report = quantize_model(dir.file("in.gguf"), dir.file("out.fire"), options);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("re-quantized from Q6_K to hfq4_g256"), std::string::npos) << report.warnings[0];
  options.policy.preset = QuantPreset::f32;  // decoding to a float format loses nothing more
  EXPECT_TRUE(quantize_model(dir.file("in.gguf"), dir.file("f32.fire"), options).warnings.empty());
}

TEST(QuantizeImport, GgufFilesFirelineCannotImportAreRejectedByName) {
  test::TempDir dir, config_dir;
  std::filesystem::copy_file(test::fixtures_dir() + "/gemma4-moe/config.json", config_dir.file("config.json"));
  auto write = [&](const std::string& name, uint32_t type, std::vector<int64_t> shape) {
    GgufWriter w;
    size_t i = w.add_tensor(name, type, shape);
    GgufStreamWriter out(dir.file("in.gguf"), w);
    std::string zeros(w.tensor(i).nbytes(), '\0');
    out.write_tensor_bytes(i, zeros.data(), zeros.size());
    out.finish(w);
  };
  QuantizeOptions options;
  options.hf_config_dir = config_dir.path().string();
  auto expect_error = [&](const std::string& needle) {
    try {
      quantize_model(dir.file("in.gguf"), dir.file("out.fire"), options);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  write("model.layers.0.mlp.up_proj.weight", 13, {1, 256});
  expect_error("has GGUF type Q5_K, which fireline cannot import");
  write("blk.0.attn_q.weight", 0, {2, 2});
  expect_error("tensor 'blk.0.attn_q.weight' has a llama.cpp name");
}

// ---- hipfire HFQM input ----

struct HfqmEntry {
  std::string name;
  uint8_t qt;
  std::vector<uint32_t> shape;
  uint32_t group;
  std::string bytes;
};

std::string hfqm_bytes(const nlohmann::json& metadata, const std::vector<HfqmEntry>& tensors, uint32_t version = 1) {
  test::Bytes index;
  index.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  std::string data;
  for (const HfqmEntry& t : tensors) {
    index.put<uint16_t>(static_cast<uint16_t>(t.name.size()));
    index.data += t.name;
    index.put<uint8_t>(t.qt).put<uint8_t>(static_cast<uint8_t>(t.shape.size()));
    for (uint32_t d : t.shape) index.put<uint32_t>(d);
    index.put<uint32_t>(t.group).put<uint64_t>(t.bytes.size());
    data += t.bytes;
  }
  const std::string json = metadata.dump();
  const uint64_t data_offset = (32 + json.size() + index.data.size() + 4095) / 4096 * 4096;
  test::Bytes header;
  header.data = "HFQM";
  header.put<uint32_t>(version).put<uint32_t>(7).put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  header.put<uint64_t>(32).put<uint64_t>(data_offset);
  std::string out = header.data + json + index.data;
  out.resize(data_offset, '\0');
  return out + data;
}

std::string encode(DType dtype, int64_t rows, int64_t k, uint32_t seed) {
  std::vector<float> v = test::random_floats(static_cast<size_t>(rows * k), seed);
  std::string out(static_cast<size_t>(rows * row_bytes(dtype, k)), '\0');
  for (int64_t r = 0; r < rows; ++r)
    quant_format(dtype).quantize_row(v.data() + r * k, out.data() + r * row_bytes(dtype, k), k);
  return out;
}

class HfqmImport : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = {
        {"architecture", "gemma4"},
        {"config", nlohmann::json::parse(read_text_file(test::fixtures_dir() + "/gemma4-moe/config.json"))},
        {"tokenizer", "{\"model\": {\"vocab\": {\"}{\": 1, \"\\\"\": 2}}}"},  // braces and quotes inside a string
        {"tokenizer_config",
         {{"chat_template", "{% for m in messages %}{{ m }}{% endfor %}"}, {"bos_token", "<bos>"}, {"pad_token", "<pad>"}}},
        {"generation_config", {{"top_k", 64}}},
    };
    std::vector<uint16_t> f16(64), bf16(4 * 256);
    for (int i = 0; i < 64; ++i) f16[i] = f32_to_f16(0.25f * i);
    std::vector<float> w = test::random_floats(bf16.size(), 11);
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(w[i]);
    tensors_ = {
        {"model.embed_tokens.weight", 3, {8, 64}, 32, encode(DType::q8_0, 8, 64, 1)},
        {"model.layers.0.mlp.gate_proj.weight", 6, {2, 512}, 256, encode(DType::hfq4_g256, 2, 512, 2)},
        {"model.layers.0.mlp.down_proj.weight", 7, {2, 704}, 128, encode(DType::hfq4_g128, 2, 704, 3)},
        {"model.layers.0.mlp.up_proj.weight", 8, {3, 256}, 256, encode(DType::hfq6_g256, 3, 256, 4)},
        {"model.layers.0.input_layernorm.weight", 1, {64}, 0,
         std::string(reinterpret_cast<const char*>(f16.data()), 128)},
        {"model.layers.0.self_attn.q_proj.weight", 16, {4, 256}, 0,
         std::string(reinterpret_cast<const char*>(bf16.data()), bf16.size() * 2)},
    };
  }
  std::string write(const std::string& bytes) {
    test::write_file(dir_.file("m.hf4"), bytes);
    return dir_.file("m.hf4");
  }
  void expect_error(const std::string& bytes, const std::string& needle) {
    try {
      quantize_model(write(bytes), dir_.file("out.fire"), QuantizeOptions{});
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\nexpected: " << needle;
    }
  }
  test::TempDir dir_;
  nlohmann::json metadata_;
  std::vector<HfqmEntry> tensors_;
};

TEST_F(HfqmImport, KeepsHfqAndQ8BytesAndConvertsFloats) {
  QuantizeReport report = quantize_model(write(hfqm_bytes(metadata_, tensors_)), dir_.file("out.fire"), {});
  EXPECT_EQ(report.source_kind, "hfqm");
  FireFile f(dir_.file("out.fire"));
  const std::map<std::string, DType> kept = {{"model.embed_tokens.weight", DType::q8_0},
                                             {"model.layers.0.mlp.gate_proj.weight", DType::hfq4_g256},
                                             {"model.layers.0.mlp.down_proj.weight", DType::hfq4_g128},
                                             {"model.layers.0.mlp.up_proj.weight", DType::hfq6_g256}};
  for (const HfqmEntry& e : tensors_) {
    const GgufTensorInfo* info = f.gguf().find_tensor(e.name);
    ASSERT_NE(info, nullptr) << e.name;
    std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
    EXPECT_EQ(info->shape, shape) << e.name;
    if (kept.count(e.name)) {
      EXPECT_EQ(f.tensor_dtype(*info), kept.at(e.name)) << e.name;
      EXPECT_EQ(tensor_bytes(f, e.name), e.bytes) << e.name;
    }
  }
  Tensor norm = *f.find("model.layers.0.input_layernorm.weight");
  ASSERT_EQ(norm.dtype, DType::f32);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(norm.ptr<float>()[i], 0.25f * i);
  EXPECT_EQ(f.find("model.layers.0.self_attn.q_proj.weight")->dtype, DType::hfq4_g256);  // bf16 -> policy
  EXPECT_EQ(nlohmann::json::parse(f.hf_config_json()), metadata_["config"]);
  EXPECT_EQ(f.tokenizer_json(), metadata_["tokenizer"].get<std::string>());
  EXPECT_EQ(f.chat_template(), "{% for m in messages %}{{ m }}{% endfor %}");
  EXPECT_EQ(f.tokenizer_config_json(), R"({"bos_token":"<bos>"})");  // only what fireline reads of it
  EXPECT_EQ(nlohmann::json::parse(f.generation_config_json()), metadata_["generation_config"]);
}

TEST_F(HfqmImport, RejectsWhatItCannotImportWithTheReason) {
  auto with = [&](auto edit) {
    std::vector<HfqmEntry> t = tensors_;
    edit(t);
    return hfqm_bytes(metadata_, t);
  };
  expect_error(with([](auto& t) { t[1].qt = 13; }),
               "tensor 'model.layers.0.mlp.gate_proj.weight' has hipfire quant type MQ4G256 (13), which fireline "
               "cannot import");
  // K = 704 packed flat (the tensor as one stream of 128-groups): 2 x 704 = 1408 -> 11 groups.
  expect_error(with([](auto& t) { t[2].bytes = std::string(11 * 72, '\0'); }), "was packed before row-safe packing");
  expect_error(with([](auto& t) { t[2].bytes.pop_back(); }), "has 863 bytes but its shape needs 864");
  expect_error(with([](auto& t) { t[1].group = 128; }), "with group size 128 (expected 256)");
  expect_error(with([](auto& t) { t[3].name = t[2].name; }), "appears twice");
  expect_error(with([](auto& t) { t[0].shape = {}; }), "has 0 dimensions");
  const std::string good = hfqm_bytes(metadata_, tensors_);
  expect_error(good.substr(0, good.size() - 10), "lies past the end");
  expect_error(hfqm_bytes(metadata_, tensors_, 2), "HFQM version 2 is not supported");
  expect_error(good.substr(0, 40), "lies outside the");
  nlohmann::json no_config = metadata_;
  no_config.erase("config");
  expect_error(hfqm_bytes(no_config, tensors_), "HFQM metadata has no 'config'");
  std::string unclosed = good;
  unclosed[32 + metadata_.dump().size() - 1] = ' ';  // the closing brace
  expect_error(unclosed, "metadata JSON does not end before the data section");
}

}  // namespace
}  // namespace fl
