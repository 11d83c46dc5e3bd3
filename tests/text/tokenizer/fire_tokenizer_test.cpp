// A model's tokenizer and chat template from a .fire file (text/tokenizer/model_tokenizer.h,
// `fireline tokenize` / `template` / `show` on a .fire):
//   - a .fire made from a Hugging Face directory embeds tokenizer.json and keeps bos/eos of
//     tokenizer_config.json (fireline.tokenizer_config);
//   - a .fire made from a GGUF file without tokenizer.json carries that file's tokenizer.ggml.*
//     metadata, and everything falls back to it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/fire_file.h"
#include "io/gguf.h"
#include "io/quantize_model.h"
#include "text/tokenizer/model_tokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_gguf.h"
#include "util/run_command.h"
#include "util/test_util.h"
#include "gguf_tokenizer_convert.h"

namespace fl {
namespace {

namespace fs = std::filesystem;
using test::shell_quote;

const std::string kTinySpm = std::string(FIRELINE_TOKENIZER_FIXTURES) + "/tiny_spm";
const char* const kTexts[] = {"hello world", "  two  spaces\n\nand <start_of_turn> a turn", "", "<bos>x"};

// A copy of the dense Gemma 4 fixture (config.json + model.safetensors, no tokenizer files).
std::string copy_fixture(const test::TempDir& dir, const std::string& name) {
  const fs::path out = dir.path() / name;
  fs::create_directories(out);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(test::fixtures_dir()) / "gemma4-dense" / f, out / f);
  return out.string();
}

std::string quantize(const std::string& input, const std::string& output, const std::string& hf_config_dir = {}) {
  QuantizeOptions q;
  q.policy.preset = QuantPreset::f32;
  q.hf_config_dir = hf_config_dir;
  quantize_model(input, output, q);
  return output;
}

// tiny_spm's vocabulary as tokenizer.ggml.* keys, as llama.cpp's converter lays them out, and a
// chat template.
std::vector<GgufMetadataEntry> tiny_spm_gguf_metadata() {
  std::vector<GgufMetadataEntry> md = test::convert_tokenizer(kTinySpm, {true, ""});
  md.push_back({"tokenizer.chat_template",
                GgufValue::of_string("{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}")});
  return md;
}

// A GGUF file as another converter would write it: the tensors of `fire` (Hugging Face names) and
// the given metadata, without any fireline.* key.
void write_foreign_gguf(const std::string& fire_path, const std::string& out, const std::vector<GgufMetadataEntry>& md) {
  const FireFile fire(fire_path);
  GgufWriter layout;
  layout.add_metadata("general.architecture", GgufValue::of_string("gemma4"));
  for (const GgufMetadataEntry& e : md) layout.add_metadata(e.key, e.value);
  for (const GgufTensorInfo& t : fire.gguf().tensors()) layout.add_tensor(t.name, t.type_id, t.shape);
  GgufStreamWriter writer(out, layout);
  for (size_t i = 0; i < fire.gguf().tensors().size(); ++i) {
    const GgufTensorInfo& t = fire.gguf().tensors()[i];
    writer.write_tensor_bytes(i, fire.gguf().tensor_data(t), t.nbytes());
  }
  writer.finish(layout);
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]\n";
}

test::CommandResult fireline(const std::string& args) {
  return test::run_command(shell_quote(test::fireline_binary()) + " " + args);
}

TEST(FireTokenizer, FallsBackToGgufTokenizerMetadata) {
  test::TempDir dir;
  const std::string hf = copy_fixture(dir, "hf");
  const std::string plain = quantize(hf, dir.file("plain.fire"));
  // No tokenizer at all: a clear error.
  try {
    load_model_tokenizer(*open_model_source(plain));
    FAIL() << "a model without a tokenizer gave one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tokenizer (no tokenizer.json and no tokenizer.ggml.* metadata)"),
              std::string::npos)
        << e.what();
  }

  // A GGUF with tokenizer metadata and no tokenizer.json, converted with --hf-config (config.json only).
  write_foreign_gguf(plain, dir.file("foreign.gguf"), tiny_spm_gguf_metadata());
  const std::string fire = quantize(dir.file("foreign.gguf"), dir.file("fallback.fire"), hf);
  auto source = open_model_source(fire);
  EXPECT_TRUE(source->tokenizer_json().empty());
  ASSERT_NE(source->gguf_file(), nullptr);
  EXPECT_TRUE(has_gguf_tokenizer(*source->gguf_file()));

  const Tokenizer want = Tokenizer::load(kTinySpm);
  const Tokenizer got = load_model_tokenizer(*source);
  const Tokenizer loaded = Tokenizer::load(fire);  // what `fireline tokenize` does
  EXPECT_EQ(got.bos_id(), want.bos_id());
  EXPECT_EQ(got.eos_id(), want.eos_id());
  for (const char* text : kTexts) {
    SCOPED_TRACE(text);
    EXPECT_EQ(got.encode(text), want.encode(text));
    EXPECT_EQ(loaded.encode(text), want.encode(text));
    EXPECT_EQ(got.decode(want.encode(text)), want.decode(want.encode(text)));
  }

  // The commands on the .fire.
  auto r = fireline("tokenize " + shell_quote(fire) + " 'hello world'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_json(want.encode("hello world")));
  test::write_file(dir.file("messages.json"), R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");
  r = fireline("template " + shell_quote(fire) + " --messages " + shell_quote(dir.file("messages.json")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<bos>[Hi][Yo]<eos>");  // bos/eos: the tokens tokenizer.ggml.bos/eos_token_id name
  r = fireline("show " + shell_quote(fire));
  EXPECT_NE(r.out.find("tokenizer     GGUF tokenizer metadata (tokenizer.ggml.model llama)"), std::string::npos) << r.out;
}

TEST(FireTokenizer, EmbeddedTokenizerJsonKeepsBosAndEos) {
  test::TempDir dir;
  const std::string hf = copy_fixture(dir, "hf");
  fs::copy_file(kTinySpm + "/tokenizer.json", hf + "/tokenizer.json");
  // A config with the usual bulk, of which the .fire keeps only bos/eos.
  test::write_file(hf + "/tokenizer_config.json", R"({
    "added_tokens_decoder": {"2": {"content": "<bos>", "special": true}},
    "bos_token": {"content": "<bos>", "__type": "AddedToken"}, "eos_token": "<eos>", "model_max_length": 8192,
    "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.content }}>{% endfor %}{{ eos_token }}"})");
  const std::string fire = quantize(hf, dir.file("model.fire"));
  const FireFile f(fire);
  EXPECT_EQ(f.gguf().metadata_string(fire_key::kTokenizerConfig), R"({"bos_token":"<bos>","eos_token":"<eos>"})");
  EXPECT_FALSE(has_gguf_tokenizer(f.gguf()));

  const Tokenizer tok = load_model_tokenizer(f);
  const Tokenizer want = Tokenizer::load(hf);
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 1);
  for (const char* text : kTexts) EXPECT_EQ(tok.encode(text), want.encode(text)) << text;
  EXPECT_EQ(Tokenizer::load(fire).bos_id(), 2);

  test::write_file(dir.file("messages.json"), R"([{"role": "user", "content": "Hi"}])");
  auto r = fireline("template " + shell_quote(fire) + " --messages " + shell_quote(dir.file("messages.json")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<bos><Hi><eos>");
  r = fireline("template " + shell_quote(fire) + " --messages " + shell_quote(dir.file("messages.json")) +
               " --bos-token '[B]'");
  EXPECT_EQ(r.out, "[B]<Hi><eos>");
  // A GGUF without a chat template: a clear error.
  quantize(copy_fixture(dir, "bare"), dir.file("bare.fire"));
  r = fireline("template " + shell_quote(dir.file("bare.fire")) + " --messages " + shell_quote(dir.file("messages.json")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no tokenizer.chat_template in this GGUF file"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fl
