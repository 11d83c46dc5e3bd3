// `fireline synth`: a random-weight .fire with the shapes and default formats of a published
// model (the tiny MoE stand-in keeps the test fast), deterministic per seed, and runnable.
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "util/run_command.h"
#include "util/test_util.h"

namespace fl {
namespace {

using nlohmann::json;

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }

TEST(CliSynth, WritesARunnableDeterministicFireWithThePolicyFormats) {
  test::TempDir dir;
  const std::string a = dir.file("a.fire"), b = dir.file("b.fire"), c = dir.file("c.fire");
  auto r = fireline("synth --like tiny-gemma4-moe -o " + a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(fireline("synth --like tiny-gemma4-moe -o " + b).exit_code, 0);
  ASSERT_EQ(fireline("synth --like tiny-gemma4-moe --seed 2 -o " + c).exit_code, 0);
  auto show = [&](const std::string& path) {
    auto shown = fireline("show " + path + " --json");
    EXPECT_EQ(shown.exit_code, 0) << shown.err;
    return json::parse(shown.out);
  };
  json ja = show(a);
  EXPECT_EQ(ja.dump().find("hfq4_g256") != std::string::npos, true);  // K = 256 projections
  EXPECT_EQ(ja.dump().find("hfq4_g128") != std::string::npos, true);  // K = 352 / 176 down projections
  EXPECT_EQ(ja.dump().find("q8_0") != std::string::npos, true);       // the embedding / tied head
  EXPECT_EQ(fireline("verify " + a).exit_code, 0);
  // same seed, same bytes; another seed, other bytes
  const std::string sum_a = fireline("verify " + a).out, sum_b = fireline("verify " + b).out;
  EXPECT_EQ(sum_a.substr(sum_a.find("sha256")), sum_b.substr(sum_b.find("sha256")));
  const std::string sum_c = fireline("verify " + c).out;
  EXPECT_NE(sum_a.substr(sum_a.find("sha256")), sum_c.substr(sum_c.find("sha256")));

  auto run = fireline("logits " + a + " --ids 2,17,300,5 --generate 3 --top 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json out = json::parse(run.out);
  EXPECT_EQ(out["generated"].size(), 3u);
  EXPECT_TRUE(std::isfinite(out["top"][0][0]["logit"].get<double>()));

  auto bad = fireline("synth --like gemma-9 -o " + dir.file("x.fire"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown model"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.fire")));
}

TEST(CliSynth, QwenHybridRunsFromAFireFileInHf4) {
  test::TempDir dir;
  const std::string path = dir.file("qwen.fire");
  auto r = fireline("synth --like tiny-qwen35-moe -o " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto shown = fireline("show " + path + " --json");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  const std::string text = shown.out;
  EXPECT_NE(text.find("qwen35"), std::string::npos) << text;
  EXPECT_NE(text.find("linear_attention_layers"), std::string::npos) << text;
  EXPECT_NE(text.find("hfq4_g256"), std::string::npos);  // quantized projections and experts
  auto run = fireline("logits " + path + " --ids 2,17,300,5,9,11 --generate 3 --top 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json out = json::parse(run.out);
  EXPECT_EQ(out["generated"].size(), 3u);
  EXPECT_TRUE(std::isfinite(out["top"][0][0]["logit"].get<double>()));
}

}  // namespace
}  // namespace fl
