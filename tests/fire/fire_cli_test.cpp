// fireline quantize / show / verify / logits with .fire files, as a user runs them: a .fire gives
// the same logits as the HF directory it came from, bit for bit; show and verify report what the
// docs say; every broken file or bad flag is one clear error line and a non-zero exit.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "fire/fire_test_util.h"
#include "io/fire_file.h"
#include "io/safetensors.h"
#include "util/run_command.h"

namespace fl {
namespace {

using nlohmann::json;

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/" + name; }

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }

// The whitespace-separated fields of the table line that starts with `first`.
std::vector<std::string> table_row(const std::string& out, const std::string& first) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    if (!row.empty() && row[0] == first) return row;
  }
  return {};
}

void expect_clean_failure(const test::CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << "stdout: " << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("fireline: error: ", 0), 0u) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err << "\nexpected to mention: " << needle;
}

std::string golden_ids(const std::string& name) {
  SafetensorsFile g(fixture(name) + "/golden.safetensors");
  Tensor t = g.tensor(*g.find("input_ids"));
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? "," : "") + std::to_string(t.ptr<int32_t>()[i]);
  return s;
}

std::string quantize(const std::string& input, const std::string& output, const std::string& flags) {
  auto r = fireline("quantize " + input + " -o " + output + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

// The acceptance test of issue 4 item 6: a lossless .fire runs exactly as its HF directory.
void expect_same_logits(const std::string& fixture_name, const std::string& format) {
  test::TempDir dir;
  const std::string fire = dir.file(fixture_name + ".fire");
  quantize(fixture(fixture_name), fire, "--format " + format);
  const std::string args = " --ids " + golden_ids(fixture_name) + " --all-positions --generate 4";
  auto want = fireline("logits " + fixture(fixture_name) + args);
  auto got = fireline("logits " + fire + args);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_GT(want.out.size(), 1000u);
  EXPECT_TRUE(want.out == got.out) << fixture_name << " " << format << ": logits differ";
}

TEST(FireCli, Bf16FireOfTheMoeFixtureGivesBitIdenticalLogits) { expect_same_logits("gemma4-moe", "bf16"); }
TEST(FireCli, Bf16FireOfTheE2bFixtureGivesBitIdenticalLogits) { expect_same_logits("gemma4-e2b", "bf16"); }
TEST(FireCli, F32FireOfTheDenseFixtureGivesBitIdenticalLogits) { expect_same_logits("gemma4-dense", "f32"); }

TEST(FireCli, QuantizedFireRunsAndPrintsTheSummaryTable) {
  test::TempDir dir;
  const std::string fire = dir.file("m.fire");
  const std::string out = quantize(fixture("gemma4-moe"), fire, "--threads 2");
  // The fixture's K = 64 / 176 / 96 are not multiples of 256: HFQ4-G128 everywhere but the embedding.
  EXPECT_EQ(table_row(out, "format"),
            (std::vector<std::string>{"format", "tensors", "weights", "bytes", "size", "bits/weight"})) << out;
  std::vector<std::string> q8 = table_row(out, "q8_0"), hf4 = table_row(out, "hfq4_g128"), f32 = table_row(out, "f32");
  std::vector<std::string> total = table_row(out, "total");
  ASSERT_EQ(q8.size(), 7u) << out;  // format, tensors, weights, bytes, size (2 fields), bits/weight
  EXPECT_EQ(q8[1], "1");            // the embedding (tied LM head)
  EXPECT_EQ(q8[2], "32768");
  EXPECT_EQ(q8[3], std::to_string(512 * 2 * 34));
  EXPECT_EQ(q8[6], "8.50");
  ASSERT_EQ(hf4.size(), 7u) << out;
  EXPECT_EQ(hf4[1], "38");
  ASSERT_EQ(f32.size(), 7u) << out;
  EXPECT_EQ(f32[6], "32.00");
  ASSERT_EQ(total.size(), 7u) << out;
  EXPECT_EQ(total[1], "88");
  EXPECT_NE(out.find("wrote " + fire), std::string::npos) << out;
  FireFile f(fire);
  EXPECT_NE(out.find("tensor sha256 " + f.recorded_sha256()), std::string::npos) << out;
  auto r = fireline("logits " + fire + " --ids " + golden_ids("gemma4-moe") + " --top 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NO_THROW(json::parse(r.out));
}

TEST(FireCli, ShowDescribesFireFilesAndHfDirectories) {
  test::TempDir dir;
  const std::string fire = dir.file("m.fire");
  quantize(fixture("gemma4-moe"), fire, "--format q8");
  auto r = fireline("show " + fire);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("architecture  gemma4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kind          .fire (GGUF v3)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("num_experts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"preset\":\"q8\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chat template: none"), std::string::npos) << r.out;
  std::vector<std::string> q8 = table_row(r.out, "q8_0");
  ASSERT_GE(q8.size(), 2u) << r.out;
  EXPECT_EQ(q8[1], "39");

  r = fireline("show " + fire + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["kind"], "fire");
  EXPECT_EQ(j["architecture"], "gemma4");
  EXPECT_EQ(j["config"]["hidden_size"], 64);
  EXPECT_EQ(j["config"]["num_experts"], 4);
  EXPECT_EQ(j["tensor_count"], 88);
  EXPECT_TRUE(j["chat_template"].is_null());
  EXPECT_EQ(j["quantizer"]["preset"], "q8");
  EXPECT_EQ(j["tensor_sha256"], FireFile(fire).recorded_sha256());
  uint64_t bytes = 0;
  for (auto& f : j["formats"]) {
    bytes += f["bytes"].get<uint64_t>();
    if (f["format"] == "q8_0") {
      EXPECT_EQ(f["tensors"], 39);
      EXPECT_NEAR(f["bits_per_weight"].get<double>(), 8.5, 0.3);
    }
  }
  EXPECT_EQ(j["tensor_bytes"], bytes);

  // A HF directory with a chat template: the same command, the template printed in full.
  test::TempDir hf;
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(fixture("gemma4-dense") + "/" + f, hf.file(f));
  test::write_file(hf.file("chat_template.jinja"), "{{ bos_token }}{{ messages[0].content }}");
  r = fireline("show " + hf.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kind          Hugging Face directory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chat template:\n{{ bos_token }}{{ messages[0].content }}\n"), std::string::npos) << r.out;
  EXPECT_EQ(table_row(r.out, "f32").at(1), "84") << r.out;
  r = fireline("show " + hf.path().string() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_EQ(j["kind"], "hf_directory");
  EXPECT_EQ(j["chat_template"], "{{ bos_token }}{{ messages[0].content }}");
  EXPECT_TRUE(j["quantizer"].is_null());

  // The template survives quantization.
  quantize(hf.path().string(), dir.file("t.fire"), "--format f32");
  r = fireline("show " + dir.file("t.fire") + " --json");
  EXPECT_EQ(json::parse(r.out)["chat_template"], "{{ bos_token }}{{ messages[0].content }}");
}

TEST(FireCli, VerifyReportsMatchAndMismatch) {
  test::TempDir dir;
  const std::string fire = dir.file("m.fire");
  quantize(fixture("gemma4-dense"), fire, "");
  auto r = fireline("verify " + fire);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("OK, tensor sha256 " + FireFile(fire).recorded_sha256() + " matches"), std::string::npos) << r.out;

  // Flip one bit in the last tensor's data: the layout is still valid, only the checksum notices.
  std::string bytes = read_text_file(fire);
  const uint64_t last_byte = FireFile(fire).gguf().tensors().back().data_end - 1;
  bytes[last_byte] = static_cast<char>(bytes[last_byte] ^ 1);
  test::write_file(fire, bytes);
  expect_clean_failure(fireline("verify " + fire), "tensor data sha256 mismatch: recorded");

  expect_clean_failure(fireline("verify " + fixture("gemma4-dense")), "verify checks .fire files");
  expect_clean_failure(fireline("verify /nonexistent.fire"), "no such file or directory");
}

// A copy of a valid .fire that tests break in one way each.
class BrokenFire {
 public:
  BrokenFire() {
    path_ = dir_.file("m.fire");
    quantize(fixture("gemma4-dense"), path_, "--format f32");
    bytes_ = read_text_file(path_);
    FireFile f(path_);
    data_offset_ = f.gguf().data_offset();
    for (const GgufTensorInfo& t : f.gguf().tensors()) infos_.push_back(t);
  }
  const std::string& path() const { return path_; }
  std::string& bytes() { return bytes_; }
  void save() { test::write_file(path_, bytes_); }
  // The byte offset, inside the header, of the tensor info of `name` (its name string's length field).
  size_t info_at(const std::string& name) const {
    test::Bytes needle;
    needle.str(name);
    size_t at = bytes_.find(needle.data);
    EXPECT_NE(at, std::string::npos);
    return at;
  }
  size_t type_field(const std::string& name) const {
    const GgufTensorInfo& t = info(name);
    return info_at(name) + 8 + name.size() + 4 + 8 * t.shape.size();
  }
  const GgufTensorInfo& info(const std::string& name) const {
    return *std::find_if(infos_.begin(), infos_.end(), [&](auto& t) { return t.name == name; });
  }
  template <typename T>
  void poke(size_t at, T value) {
    std::memcpy(bytes_.data() + at, &value, sizeof value);
  }

 private:
  test::TempDir dir_;
  std::string path_;
  std::string bytes_;
  uint64_t data_offset_ = 0;
  std::vector<GgufTensorInfo> infos_;
};

const std::string kNorm = "model.norm.weight";
const std::string kDown = "model.layers.0.mlp.down_proj.weight";

TEST(FireCli, BrokenFireFilesGiveOneClearErrorLine) {
  const std::string ids = " --ids 2,5,7";
  {
    BrokenFire f;  // truncated
    f.bytes().resize(f.bytes().size() / 2);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "lies past the end of the");
    f.bytes().resize(100);
    f.save();
    expect_clean_failure(fireline("show " + f.path()), "truncated");
  }
  {
    BrokenFire f;  // wrong magic
    f.bytes()[0] = 'X';
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "not a model");
    test::TempDir d;
    test::write_file(d.file("a.gguf"), "GGUF\x07");
    expect_clean_failure(fireline("show " + d.file("a.gguf")), "truncated: version at byte 4");
  }
  {
    BrokenFire f;  // unknown type id
    f.poke<uint32_t>(f.type_field(kNorm), 1234);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "tensor '" + kNorm + "' has unknown type id 1234");
  }
  {
    BrokenFire f;  // tensor past the end of the file
    f.poke<uint64_t>(f.type_field(kNorm) + 4, f.bytes().size() / 64 * 64);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "tensor '" + kNorm + "' data [");
  }
  {
    BrokenFire f;  // shape and size disagreeing: the shape claims more bytes than its slot holds
    const GgufTensorInfo& down = f.info(kDown);  // [64, 160] f32
    f.poke<uint64_t>(f.info_at(kDown) + 8 + kDown.size() + 4 + 8, down.shape[0] + 8);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "overlap");
  }
  {
    BrokenFire f;  // same bytes, shape transposed: the file is valid, the model's shape check fails
    f.poke<uint64_t>(f.info_at(kDown) + 8 + kDown.size() + 4, 64);
    f.poke<uint64_t>(f.info_at(kDown) + 8 + kDown.size() + 4 + 8, 160);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "'" + kDown + "' is f32[160, 64]");
  }
  {
    BrokenFire f;  // duplicate names: rename one tensor to its neighbour's name (same length)
    const std::string a = "model.layers.0.mlp.up_proj.weight";
    const std::string b = "model.layers.1.mlp.up_proj.weight";
    size_t at = f.info_at(b);
    f.bytes().replace(at + 8, b.size(), a);
    f.save();
    expect_clean_failure(fireline("logits " + f.path() + ids), "tensor '" + a + "' appears twice");
  }
  {
    BrokenFire f;  // sha256 mismatch: loads (the layout is fine), verify catches it
    const GgufTensorInfo& norm = f.info(kNorm);
    f.bytes()[norm.data_begin] = static_cast<char>(f.bytes()[norm.data_begin] ^ 0x40);
    f.save();
    EXPECT_EQ(fireline("logits " + f.path() + ids).exit_code, 0);
    expect_clean_failure(fireline("verify " + f.path()), "sha256 mismatch");
  }
}

TEST(FireCli, BadQuantizeArgumentsGiveOneClearErrorLine) {
  test::TempDir dir;
  const std::string out = " -o " + dir.file("x.fire");
  const std::string src = fixture("gemma4-moe");
  expect_clean_failure(fireline("quantize " + src + out + " --format q4"), "--format q4 is not a preset");
  expect_clean_failure(fireline("quantize " + src + out + " --override foo"), "--override 'foo' is not PATTERN=FORMAT");
  expect_clean_failure(fireline("quantize " + src + out + " --override '*=q3'"), "'q3' is not a weight format");
  expect_clean_failure(fireline("quantize " + src + out + " --override 'nothing.*=q8'"),
                       "--override 'nothing.*=q8' matches no tensor");
  expect_clean_failure(fireline("quantize /nonexistent" + out), "no such file or directory");
  expect_clean_failure(fireline("quantize " + src + " -o " + dir.file("no/such/dir/x.fire")), "cannot create");
  expect_clean_failure(fireline("quantize " + src + out + " --hf-config " + src), "--hf-config is only for GGUF inputs");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a failed run leaves no file behind";

  // --override is repeatable.
  auto r = fireline("quantize " + src + out + " --override '*.mlp.*=q8' --override '*experts*=bf16'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  FireFile f(dir.file("x.fire"));
  EXPECT_EQ(f.find("model.language_model.layers.0.mlp.up_proj.weight")->dtype, DType::q8_0);
  EXPECT_EQ(f.find("model.language_model.layers.0.experts.down_proj")->dtype, DType::bf16);
}

}  // namespace
}  // namespace fl
