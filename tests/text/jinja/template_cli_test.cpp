// `fireline template` end to end: the prompt is printed byte for byte (no newline added), the
// three kinds of TEMPLATE_OR_MODEL are found, special tokens come from tokenizer_config.json,
// flags reach the template, and template errors exit non-zero with the template's message.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "util/run_command.h"
#include "util/test_util.h"

namespace {

const std::string kTemplates = std::string(FIRELINE_SHARED_DIR) + "/data/templates/";

struct Result {
  int status;
  std::string out;  // stdout, then stderr
};

Result run(const std::string& args) {
  auto r = fl::test::run_command(fl::test::shell_quote(fl::test::fireline_binary()) + " template " + args);
  return {r.exit_code, r.out + r.err};
}

class TemplateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    fl::test::write_file(dir.file("msgs.json"), R"([{"role": "user", "content": "Hi!"}])");
  }
  std::string q(const std::string& name) { return "'" + dir.file(name) + "'"; }
  fl::test::TempDir dir;
};

TEST_F(TemplateCli, ModelDirectoryWithSpecialTokensFromTheConfig) {
  std::filesystem::create_directories(dir.path() / "model");
  std::filesystem::copy_file(kTemplates + "gemma4-31b-jul2026.jinja", dir.path() / "model" / "chat_template.jinja");
  fl::test::write_file(dir.file("model/tokenizer_config.json"),
                       R"({"bos_token": {"content": "<bos>", "__type": "AddedToken"}, "eos_token": "<eos>"})");
  Result r = run(q("model") + " --messages " + q("msgs.json") + " --add-generation-prompt");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "<bos><|turn>user\nHi!<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  r = run(q("model") + " --messages " + q("msgs.json") + " --add-generation-prompt --enable-thinking --bos-token '[B]'");
  EXPECT_EQ(r.out, "[B]<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi!<turn|>\n<|turn>model\n");
}

TEST_F(TemplateCli, TokenizerConfigAndThinkingFlags) {
  fl::test::write_file(dir.file("tokenizer_config.json"),
                       R"({"eos_token": "<|im_end|>", "bos_token": null, "chat_template": "{{ bos_token is defined }}|{{ enable_thinking }}|{{ eos_token }}"})");
  EXPECT_EQ(run(q("tokenizer_config.json") + " --messages " + q("msgs.json")).out, "False||<|im_end|>");
  EXPECT_EQ(run(q("tokenizer_config.json") + " --messages " + q("msgs.json") + " --enable-thinking").out,
            "False|True|<|im_end|>");
  EXPECT_EQ(run(q("tokenizer_config.json") + " --messages " + q("msgs.json") + " --disable-thinking").out,
            "False|False|<|im_end|>");
}

TEST_F(TemplateCli, ToolsVarsRequestBodiesAndStringArguments) {
  fl::test::write_file(dir.file("t.jinja"),
                       "{{ tools | length if tools else 'no tools' }}|{{ reasoning_effort }}|"
                       "{{ messages[-1].tool_calls[0].function.arguments is mapping }}\n");
  fl::test::write_file(dir.file("tools.json"), R"([{"type": "function", "function": {"name": "f"}}])");
  fl::test::write_file(dir.file("vars.json"), R"({"reasoning_effort": "low"})");
  fl::test::write_file(dir.file("request.json"), R"({"model": "x", "tools": [1, 2],
      "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]})");
  Result r = run(q("t.jinja") + " --messages " + q("request.json") + " --vars " + q("vars.json"));
  EXPECT_EQ(r.out, "2|low|False");  // the trailing newline of the file is dropped, none is added
  r = run(q("t.jinja") + " --messages " + q("request.json") + " --tools " + q("tools.json") + " --parse-arguments");
  EXPECT_EQ(r.out, "1||True");
}

TEST_F(TemplateCli, TemplateErrorsExitNonZeroWithTheMessage) {
  fl::test::write_file(dir.file("bad.json"), R"([{"role": "assistant", "content": "x"}])");
  Result r = run("'" + kTemplates + "gemma3-it.jinja' --messages " + q("bad.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("Conversation roles must alternate"), std::string::npos) << r.out;
  fl::test::write_file(dir.file("syntax.jinja"), "ok\n{% if %}");
  r = run(q("syntax.jinja") + " --messages " + q("msgs.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("syntax.jinja:2:7:"), std::string::npos) << r.out;
  r = run(q("nope") + " --messages " + q("msgs.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  fl::test::write_file(dir.file("notjson.json"), "[{");
  r = run(q("syntax.jinja") + " --messages " + q("notjson.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;
}

}  // namespace
