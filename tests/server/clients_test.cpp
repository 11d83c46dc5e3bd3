// Real clients against the fake-engine server: the `openai` npm client (v6, the one users' tools
// embed) for chat, streaming, tools and reasoning, and curl for the raw SSE bytes.
#include <gtest/gtest.h>

#include <filesystem>

#include "server_test_util.h"
#include "util/run_command.h"

namespace fl::test {
namespace {

using nlohmann::json;

bool have(const std::string& program) { return run_command("command -v " + program + " >/dev/null").exit_code == 0; }

TEST(ServeClients, OpenAiNpmClient) {
  const std::string js_dir = FIRELINE_JS_DIR;
  if (!std::filesystem::exists(js_dir + "/node_modules/openai/package.json"))
    GTEST_FAIL() << "the openai npm package is not installed in " << js_dir
                 << "/node_modules (scripts/setup --test installs the oracles)";
  if (!have("node")) GTEST_FAIL() << "node is not on PATH";

  server::ServeConfig config;
  config.api_key = "test-key";
  TestServer s(config);
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port()) + "/v1";
  auto result =
      run_command("cd " + shell_quote(js_dir) + " && node openai_client.mjs " + shell_quote(url) + " test-key");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  json out = json::parse(result.out, nullptr, false);
  ASSERT_FALSE(out.is_discarded()) << result.out << result.err;

  EXPECT_EQ(out["models"]["ids"], json::array({"fireline-fake"})) << out["models"];

  EXPECT_EQ(out["chat"]["object"], "chat.completion") << out["chat"];
  EXPECT_EQ(out["chat"]["content"], "You said: hello from openai");
  EXPECT_EQ(out["chat"]["finish_reason"], "stop");
  EXPECT_EQ(out["chat"]["usage"]["completion_tokens"], 5);

  EXPECT_EQ(out["stream"]["content"], "You said: stream these words") << out["stream"];
  EXPECT_EQ(out["stream"]["finish_reason"], "stop");
  EXPECT_EQ(out["stream"]["usage"]["completion_tokens"], 5);

  EXPECT_EQ(out["tools"]["finish_reason"], "tool_calls") << out["tools"];
  EXPECT_EQ(out["tools"]["name"], "get_weather");
  EXPECT_EQ(out["tools"]["arguments"]["text"], "weather in Paris [[tool]]");

  EXPECT_EQ(out["tools_stream"]["finish_reason"], "tool_calls") << out["tools_stream"];
  EXPECT_EQ(out["tools_stream"]["name"], "get_weather");
  EXPECT_EQ(out["tools_stream"]["arguments"]["text"], "weather in Oslo [[tool]]");

  const json& r = out["reasoning"];
  EXPECT_EQ(r["reasoning_content"], "The user wrote 2 words. I will repeat them back.") << r;
  EXPECT_EQ(r["content"], "You said: think first");
  EXPECT_EQ(r["reasoning_tokens"], 10);
  EXPECT_EQ(r["streamed_reasoning"], "The user wrote 2 words. I will repeat them back.");
  EXPECT_EQ(r["streamed_content"], "You said: think first");

  // The fake engine's log-probabilities (its 4 answer tokens at 0, -0.25, -0.5, -0.75), whole and
  // as the client's stream helper puts the chunks' entries together.
  const json& lp = out["logprobs"];
  ASSERT_EQ(lp["entries"].size(), 4u) << lp;
  EXPECT_EQ(lp["streamed"], lp["entries"]) << lp;
  EXPECT_EQ(lp["entries"][0]["token"], "You");
  EXPECT_EQ(lp["entries"][3]["token"], " these");
  EXPECT_EQ(lp["entries"][3]["logprob"], -0.75);
  EXPECT_EQ(lp["entries"][3]["top"], 2);

  // n = 3 streamed, as the client's stream helper assembles it
  const json& sn = out["stream_n"];
  ASSERT_EQ(sn["choices"].size(), 3u) << sn;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sn["choices"][i]["index"], i) << sn;
    EXPECT_EQ(sn["choices"][i]["content"], "You said: three at once") << sn;
    EXPECT_EQ(sn["choices"][i]["finish_reason"], "stop");
  }
  EXPECT_EQ(sn["usage"]["completion_tokens"], 3 * 5) << sn;  // "You", " said:", " three", " at", " once"

  EXPECT_EQ(out["completion"]["object"], "text_completion") << out["completion"];
  EXPECT_EQ(out["completion"]["text"], "You said: complete me");

  EXPECT_EQ(out["bad_request"]["thrown"], true) << out["bad_request"];
  EXPECT_EQ(out["bad_request"]["status"], 400);
  EXPECT_EQ(out["bad_request"]["param"], "messages");
  EXPECT_EQ(out["bad_request"]["type"], "invalid_request_error");

  EXPECT_EQ(out["bad_key"]["thrown"], true) << out["bad_key"];
  EXPECT_EQ(out["bad_key"]["status"], 401);
  EXPECT_EQ(out["bad_key"]["name"], "AuthenticationError");
}

TEST(ServeClients, CurlSeesWellFormedSse) {
  if (!have("curl")) GTEST_SKIP() << "curl is not installed";
  TestServer s;
  json body = chat_body("raw bytes please", true);
  body["stream_options"] = {{"include_usage", true}};
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port()) + "/v1/chat/completions";
  auto result = run_command("curl -sS -N -i --max-time 20 -H 'Content-Type: application/json' -d " +
                            shell_quote(body.dump()) + " " + shell_quote(url));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string& raw = result.out;
  const size_t head_end = raw.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << raw;
  const std::string head = raw.substr(0, head_end);
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Type: text/event-stream"), std::string::npos) << head;
  EXPECT_NE(head.find("Cache-Control: no-cache"), std::string::npos) << head;
  const std::string events = raw.substr(head_end + 4);

  // Every event is exactly one `data: ` line followed by a blank line; the last is [DONE].
  size_t pos = 0;
  int n = 0;
  std::string content;
  bool usage = false;
  while (pos < events.size()) {
    const size_t end = events.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << "unterminated event at byte " << pos;
    const std::string event = events.substr(pos, end - pos);
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << event;
    ASSERT_EQ(event.find('\n'), std::string::npos) << "multi-line event: " << event;
    const std::string data = event.substr(6);
    pos = end + 2;
    ++n;
    if (pos == events.size()) {
      EXPECT_EQ(data, "[DONE]");
      break;
    }
    json chunk = json::parse(data);
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content"))
      content += chunk["choices"][0]["delta"]["content"].get<std::string>();
    if (chunk["usage"].is_object()) usage = true;
  }
  EXPECT_GE(n, 5);
  EXPECT_EQ(content, "You said: raw bytes please");
  EXPECT_TRUE(usage);
}

}  // namespace
}  // namespace fl::test
