// `fireline tokenize` end to end: the binary is run through the shell on the committed fixtures.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct CliResult {
  std::string out;  // stdout and stderr together
  int status;
};

CliResult run(const std::string& args, const std::string& stdin_text = "") {
  const std::string cmd = "printf '%s' '" + stdin_text + "' | '" FIRELINE_BIN "' tokenize " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{{}, -1};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

const std::string kSpm = std::string("'") + FIRELINE_TOKENIZER_FIXTURES + "/tiny_spm'";

TEST(TokenizeCli, EncodesToJsonIds) {
  EXPECT_EQ(run(kSpm + " 'hello world'").out, "[2, 277, 282]\n");
  EXPECT_EQ(run(kSpm + " --ids 'hello world'").out, "[2, 277, 282]\n");
  EXPECT_EQ(run(kSpm + " --no-add-special-tokens 'hello world'").out, "[277, 282]\n");
  EXPECT_EQ(run(std::string("'") + FIRELINE_TOKENIZER_FIXTURES + "/tiny_spm/tokenizer.json' ''").out, "[2]\n");
  // Text from stdin, byte for byte.
  EXPECT_EQ(run(kSpm + " --no-add-special-tokens -", "hello world").out, "[277, 282]\n");
  const CliResult tokens = run(kSpm + " --tokens 'hello world'");
  ASSERT_EQ(tokens.status, 0) << tokens.out;
  const auto j = nlohmann::json::parse(tokens.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["id"], 2);
  EXPECT_EQ(j[0]["token"], "<bos>");
  EXPECT_EQ(j[2]["token"], "\xE2\x96\x81world");
}

TEST(TokenizeCli, DecodesExactly) {
  EXPECT_EQ(run(kSpm + " --decode 2,277,282").out, "<bos>hello world");
  EXPECT_EQ(run(kSpm + " --decode 2,277,282 --skip-special-tokens").out, "hello world");
  EXPECT_EQ(run(kSpm + " --decode '[2, 277, 282]'").out, "<bos>hello world");
  EXPECT_EQ(run(kSpm + " --decode ''").out, "");
}

TEST(TokenizeCli, ErrorsAreOneLine) {
  CliResult r = run("/nonexistent/tokenizer.json hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out.rfind("fireline: error: /nonexistent/tokenizer.json: no such file", 0), 0u) << r.out;
  r = run(kSpm + " hi --decode 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("either TEXT or --decode"), std::string::npos) << r.out;
  r = run(kSpm);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("give the TEXT"), std::string::npos) << r.out;
  r = run(kSpm + " --decode 1,x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("\"x\" is not a token id"), std::string::npos) << r.out;
}

}  // namespace
