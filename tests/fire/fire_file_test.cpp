// The .fire file as a ModelSource: names, shapes and bytes as in the HF checkpoint, the side files
// embedded, the metadata DESIGN §4 lists, dispatch on the magic, and clear errors for GGUF files
// that are not (valid) .fire files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/sha256.h"
#include "fire/fire_test_util.h"
#include "io/fire_file.h"
#include "io/quantize_model.h"
#include "io/safetensors.h"

namespace fl {
namespace {

// A copy of a fixture with a tokenizer, generation config and chat template beside it.
class FixtureWithSideFiles {
 public:
  explicit FixtureWithSideFiles(const std::string& name = "gemma4-moe") {
    for (const char* f : {"config.json", "model.safetensors"})
      std::filesystem::copy_file(test::fixtures_dir() + "/" + name + "/" + f, dir_.file(f));
    test::write_file(dir_.file("tokenizer.json"), R"({"version": "1.0", "model": {"type": "BPE"}})");
    test::write_file(dir_.file("generation_config.json"), R"({"do_sample": true, "top_k": 64})");
    test::write_file(dir_.file("chat_template.jinja"), "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
  }
  std::string path() const { return dir_.path().string(); }

 private:
  test::TempDir dir_;
};

std::string quantize_to(const std::string& input, const std::string& output, QuantPreset preset) {
  QuantizeOptions options;
  options.policy.preset = preset;
  quantize_model(input, output, options);
  return output;
}

TEST(FireFile, KeepsHfNamesShapesAndBytesAndEmbedsTheSideFiles) {
  FixtureWithSideFiles hf;
  test::TempDir out;
  const std::string path = quantize_to(hf.path(), out.file("m.fire"), QuantPreset::bf16);
  FireFile fire(path);
  auto source = open_hf_directory(hf.path());

  EXPECT_EQ(fire.tensor_names().size(), source->tensor_names().size());
  for (const std::string& name : source->tensor_names()) {
    Tensor want = *source->find(name);
    auto got = fire.find(name);
    ASSERT_TRUE(got.has_value()) << name;
    ASSERT_EQ(got->ndim, want.ndim) << name;
    for (int d = 0; d < want.ndim; ++d) EXPECT_EQ(got->shape[d], want.shape[d]) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data) % kFireAlignment, 0u) << name;
    if (want.ndim >= 2) {  // bf16 preset: the weights' bytes are the checkpoint's bytes
      EXPECT_EQ(got->dtype, DType::bf16);
      EXPECT_EQ(std::memcmp(got->data, want.data, want.nbytes()), 0) << name;
    } else {
      EXPECT_EQ(got->dtype, DType::f32);
    }
  }
  EXPECT_FALSE(fire.find("no.such.tensor").has_value());

  EXPECT_EQ(fire.hf_config_json(), read_text_file(hf.path() + "/config.json"));
  EXPECT_EQ(fire.config().architecture, "gemma4");
  EXPECT_EQ(fire.tokenizer_json(), source->tokenizer_json());
  EXPECT_EQ(fire.generation_config_json(), source->generation_config_json());
  EXPECT_EQ(fire.chat_template(), source->chat_template());
  EXPECT_FALSE(fire.chat_template().empty());

  const GgufFile& g = fire.gguf();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.metadata_string("general.architecture"), "gemma4");
  EXPECT_EQ(g.metadata_string("tokenizer.chat_template"), source->chat_template());
  auto quantizer = nlohmann::json::parse(fire.quantizer_json());
  EXPECT_EQ(quantizer["quantizer"], "fireline");
  EXPECT_EQ(quantizer["version"], kQuantizerVersion);
  EXPECT_EQ(quantizer["preset"], "bf16");
  EXPECT_EQ(quantizer["source_kind"], "safetensors");
  EXPECT_EQ(fire.recorded_sha256().size(), 64u);
  EXPECT_EQ(fire.compute_sha256(), fire.recorded_sha256());

  // The checksum is over the tensor bytes in file order, padding excluded.
  Sha256 h;
  for (const GgufTensorInfo& t : g.tensors()) h.update(g.tensor_data(t), t.nbytes());
  EXPECT_EQ(h.hex_digest(), fire.recorded_sha256());
}

TEST(FireFile, OpenModelSourceDispatchesOnTheMagicNotTheName) {
  test::TempDir out;
  const std::string path = quantize_to(test::fixtures_dir() + "/gemma4-dense", out.file("model.bin"), QuantPreset::f32);
  auto source = open_model_source(path);
  EXPECT_NE(dynamic_cast<FireFile*>(source.get()), nullptr);
  EXPECT_EQ(detect_model_file(path), ModelFileKind::gguf);
  EXPECT_EQ(detect_model_file(test::fixtures_dir() + "/gemma4-dense"), ModelFileKind::hf_directory);
  auto hf = open_model_source(test::fixtures_dir() + "/gemma4-dense");
  EXPECT_EQ(dynamic_cast<FireFile*>(hf.get()), nullptr);

  test::write_file(out.file("junk"), "not a model at all");
  EXPECT_THROW(
      {
        try {
          open_model_source(out.file("junk"));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not a model"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  test::write_file(out.file("x.hf4"), std::string("HFQM\x01\0\0\0", 8));
  try {
    open_model_source(out.file("x.hf4"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hipfire HFQM file; convert it with `fireline quantize"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(open_model_source(out.file("missing")), Error);
}

void expect_fire_error(const std::string& bytes, const std::string& needle) {
  test::TempDir dir;
  test::write_file(dir.file("x.fire"), bytes);
  try {
    FireFile f(dir.file("x.fire"));
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\nexpected: " << needle;
  }
}

test::RawGguf minimal_fire(const std::string& config_json) {
  test::RawGguf g;
  g.u32_kv("general.alignment", 64);
  g.alignment = 64;
  g.string_kv("general.architecture", "gemma4");
  g.string_kv("fireline.hf_config", config_json);
  g.tensors = {{"w", {4}, 0, 0}};
  g.data = std::string(16, '\0');
  return g;
}

TEST(FireFile, RejectsGgufFilesThatAreNotValidFireFiles) {
  const std::string config = read_text_file(test::fixtures_dir() + "/gemma4-moe/config.json");
  {
    test::TempDir dir;
    test::write_file(dir.file("ok.fire"), minimal_fire(config).bytes());
    EXPECT_NO_THROW(FireFile(dir.file("ok.fire")));
  }
  test::RawGguf g;
  g.string_kv("general.architecture", "llama");
  expect_fire_error(g.bytes(), "GGUF file without fireline.hf_config (not a .fire file");

  g = minimal_fire(config);
  g.metadata.clear();
  g.n_metadata = 0;
  g.string_kv("fireline.hf_config", config);
  expect_fire_error(g.bytes(), "no general.architecture in the metadata");

  g = minimal_fire(config);
  g.metadata.clear();
  g.n_metadata = 0;
  g.string_kv("general.architecture", "qwen35");
  g.string_kv("fireline.hf_config", config);
  expect_fire_error(g.bytes(), "general.architecture is 'qwen35' but the embedded config.json describes 'gemma4'");

  g = minimal_fire("{\"model_type\": ");
  expect_fire_error(g.bytes(), "not valid JSON");

  g = minimal_fire(config);
  g.u32_kv("fireline.tensor_sha256", 5);
  expect_fire_error(g.bytes(), "metadata 'fireline.tensor_sha256' is a u32, expected a string");
  g = minimal_fire(config);
  g.string_kv("fireline.tensor_sha256", "abc");
  expect_fire_error(g.bytes(), "fireline.tensor_sha256 is not 64 lowercase hex digits");

  g = minimal_fire(config);
  g.tensors[0] = {"q", {256}, 12, 0};  // a valid GGUF Q4_K tensor, but not something fireline runs
  g.data = std::string(144, '\0');
  expect_fire_error(g.bytes(), "tensor 'q' has type Q4_K, which fireline cannot run");

  g = minimal_fire(config);
  g.tensors[0].type = 1234;
  expect_fire_error(g.bytes(), "tensor 'w' has unknown type id 1234");
}

TEST(Sha256, MatchesKnownDigestsAndIsIncremental) {
  EXPECT_EQ(sha256_hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  Sha256 h;
  for (size_t at = 0; at < big.size(); at += 777) h.update(big.data() + at, std::min<size_t>(777, big.size() - at));
  EXPECT_EQ(h.hex_digest(), sha256_hex(big));
}

}  // namespace
}  // namespace fl
