// `fireline logits` as a user runs it: JSON that matches transformers' goldens, and one clear
// error line with a non-zero exit status for every kind of broken model or argument.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "util/run_command.h"
#include "util/test_util.h"

namespace fl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixture = "gemma4-dense";

std::string fixture(const std::string& name = kFixture) { return test::fixtures_dir() + "/" + name; }

std::vector<int32_t> golden_ids(const std::string& name = kFixture) {
  SafetensorsFile g(fixture(name) + "/golden.safetensors");
  Tensor t = g.tensor(*g.find("input_ids"));
  return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel());
}

std::string ids_arg(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }

// A failed command: non-zero status, exactly one line on stderr, naming the problem.
void expect_clean_failure(const test::CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << "stdout: " << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("fireline: error: ", 0), 0u) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err << "\nexpected to mention: " << needle;
}

TEST(CliLogits, AllPositionsMatchTransformers) {
  std::vector<int32_t> ids = golden_ids();
  auto r = fireline("logits " + fixture() + " --ids " + ids_arg(ids) + " --all-positions");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  SafetensorsFile g(fixture() + "/golden.safetensors");
  Tensor want = g.tensor(*g.find("logits_prefill"));
  const int64_t V = want.dim(1);
  ASSERT_EQ(out["logits"].size(), ids.size());
  float worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    ASSERT_EQ(out["logits"][t].size(), static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::fabs(out["logits"][t][v].get<float>() - want.ptr<float>()[t * V + v]));
  }
  EXPECT_LE(worst, 1e-4f);
  EXPECT_TRUE(out["generated"].empty());
}

TEST(CliLogits, GenerateAndTop) {
  std::vector<int32_t> ids = golden_ids();
  auto r = fireline("logits " + fixture() + " --ids " + ids_arg(ids) + " --generate 8 --top 3 --kv bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  SafetensorsFile g(fixture() + "/golden.safetensors");
  Tensor gen = g.tensor(*g.find("generated_ids"));
  ASSERT_EQ(out["generated"].size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out["generated"][i].get<int32_t>(), gen.ptr<int32_t>()[i]);
  ASSERT_EQ(out["top"].size(), 1u);
  ASSERT_EQ(out["top"][0].size(), 3u);
  EXPECT_EQ(out["top"][0][0]["id"].get<int32_t>(), gen.ptr<int32_t>()[0]);  // the argmax is generated first
  EXPECT_GE(out["top"][0][0]["logit"].get<float>(), out["top"][0][1]["logit"].get<float>());
  EXPECT_GE(out["top"][0][1]["logit"].get<float>(), out["top"][0][2]["logit"].get<float>());
}

// Copies a fixture, optionally rewriting its safetensors through `edit` or its config.
class BrokenModel {
 public:
  explicit BrokenModel(const std::string& name = kFixture) {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fixture(name) + "/" + f, dir_.file(f));
  }
  std::string path() const { return dir_.path().string(); }
  std::string file(const char* f) const { return dir_.file(f); }

  // Rewrites model.safetensors with the header edited by `edit` (data bytes unchanged).
  template <typename Edit>
  void edit_header(Edit edit) {
    std::string bytes = read_text_file(file("model.safetensors"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
    json header = json::parse(bytes.substr(8, n));
    edit(header);
    test::write_file(file("model.safetensors"), test::safetensors_from_header(header, bytes.substr(8 + n)));
  }

 private:
  test::TempDir dir_;
};

TEST(CliLogits, BrokenInputsGiveOneClearErrorLine) {
  const std::string ids = " --ids 2,5,7";
  expect_clean_failure(fireline("logits /nonexistent/model" + ids), "no such file or directory");

  {
    test::TempDir empty;
    expect_clean_failure(fireline("logits " + empty.path().string() + ids), "no config.json");
  }
  {
    BrokenModel m;
    std::string bytes = read_text_file(m.file("model.safetensors"));
    test::write_file(m.file("model.safetensors"), bytes.substr(0, bytes.size() / 2));
    expect_clean_failure(fireline("logits " + m.path() + ids), "outside the");
  }
  {
    BrokenModel m;
    test::write_file(m.file("model.safetensors"), test::safetensors_from_header(json{{"a", {1, 2, 3}}}, ""));
    expect_clean_failure(fireline("logits " + m.path() + ids), "is not an object");
  }
  {
    BrokenModel m;
    m.edit_header([](json& h) { h.erase("model.layers.2.mlp.up_proj.weight"); });
    expect_clean_failure(fireline("logits " + m.path() + ids), "missing tensor 'model.layers.2.mlp.up_proj.weight'");
  }
  {
    BrokenModel m;  // same bytes, claimed transposed: the shape check must catch it
    m.edit_header([](json& h) { h["model.layers.0.mlp.down_proj.weight"]["shape"] = {160, 64}; });
    expect_clean_failure(fireline("logits " + m.path() + ids), "'model.layers.0.mlp.down_proj.weight' is f32[160, 64]");
  }
  {
    BrokenModel m;
    m.edit_header([](json& h) { h["model.norm.weight"]["dtype"] = "F64"; });
    expect_clean_failure(fireline("logits " + m.path() + ids), "unsupported dtype F64");
  }
  {
    BrokenModel m;
    m.edit_header([](json& h) {
      h["model.norm.weight"]["dtype"] = "I32";  // same size as F32: loads, but is no weight
    });
    expect_clean_failure(fireline("logits " + m.path() + ids), "type i32, which cannot be used as a weight");
  }
  {
    BrokenModel m;
    json config = json::parse(read_text_file(m.file("config.json")));
    config["model_type"] = "llama";
    test::write_file(m.file("config.json"), config.dump());
    expect_clean_failure(fireline("logits " + m.path() + ids), "model_type 'llama' is not supported");
    config["model_type"] = "gemma4_text";
    config["num_attention_heads"] = 5;
    test::write_file(m.file("config.json"), config.dump());
    expect_clean_failure(fireline("logits " + m.path() + ids), "does not divide num_attention_heads = 5");
    test::write_file(m.file("config.json"), "{\"model_type\": ");
    expect_clean_failure(fireline("logits " + m.path() + ids), "not valid JSON");
  }
  expect_clean_failure(fireline("logits " + fixture() + " --ids 2,99999"), "token id 99999 is outside the vocabulary");
  expect_clean_failure(fireline("logits " + fixture() + ids + " --kv q4"), "--kv q4 is not a KV cache type");
  expect_clean_failure(fireline("logits " + fixture() + ids + " --max-seq 2"), "its context holds 2");

  auto r = fireline("logits " + fixture() + " --ids 2,x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--ids"), std::string::npos) << r.err;
  // An empty list, an empty id, a number past int32 and a negative one are errors, not token 0
  // or the largest id (CLI11 read them so).
  expect_clean_failure(fireline("logits " + fixture() + " --ids ''"), "needs at least one token id");
  for (const char* bad : {"2,,5", "2,", "99999999999999999999", "-1", "2,0x10"})
    expect_clean_failure(fireline("logits " + fixture() + " --ids " + bad), "is not a token id");
  // Spaces around an id are fine.
  EXPECT_EQ(fireline("logits " + fixture() + " --ids '2, 5,7'").exit_code, 0);
}

}  // namespace
}  // namespace fl
