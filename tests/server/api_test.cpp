// The OpenAI-compatible routes against the fake engine: response schemas, streaming, reasoning,
// tool calls, stop strings, limits, authentication and metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "server_test_util.h"

namespace fl::test {
namespace {

using nlohmann::json;

TEST(ServeApi, HealthAndModels) {
  TestServer s;
  auto health = s.get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json()["status"], "ok");

  auto models = s.get("/v1/models");
  ASSERT_EQ(models.status, 200);
  json m = models.json();
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "fireline-fake");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["context_length"], 4096);

  EXPECT_EQ(s.get("/v1/models/fireline-fake").status, 200);
  auto missing = s.get("/v1/models/other");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["error"]["code"], "model_not_found");

  auto unknown = s.get("/v2/nothing");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.json()["error"]["type"], "not_found_error");
}

TEST(ServeApi, ChatCompletionFollowsTheOpenAiSchema) {
  TestServer s;
  auto r = s.post("/v1/chat/completions", chat_body("hello there"));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "fireline-fake");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "You said: hello there");
  EXPECT_FALSE(choice["message"].contains("reasoning_content"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  // usage: the fake frontend counts prompt bytes; the answer is 4 words
  const std::string prompt = "<|user|>\nhello there\n<|assistant|>\n";
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + 4);
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
  for (const char* key : {"queue_ms", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                          "predicted_per_second"})
    EXPECT_TRUE(j["timings"].contains(key)) << key;
  EXPECT_EQ(j["timings"]["predicted_n"], 4);
}

TEST(ServeApi, ContentPartsAndSystemMessagesAreAccepted) {
  TestServer s;
  json body = {{"messages",
                {{{"role", "system"}, {"content", "be brief"}},
                 {{"role", "user"},
                  {"content", {{{"type", "text"}, {"text", "two "}}, {{"type", "text"}, {"text", "parts"}}}}}}}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "You said: two parts");
}

TEST(ServeApi, StreamSendsRoleDeltasFinishUsageAndDone) {
  TestServer s;
  json body = chat_body("one two three", true);
  body["stream_options"] = {{"include_usage", true}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("data: "), std::string::npos);
  auto payloads = sse_payloads(r.body);
  ASSERT_GE(payloads.size(), 4u);
  EXPECT_EQ(payloads.back(), "[DONE]");
  json first = json::parse(payloads[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  std::string content;
  std::string finish;
  json usage;
  std::string id = first["id"];
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    json c = json::parse(payloads[i]);
    EXPECT_EQ(c["id"], id);
    if (c["choices"].empty()) {
      usage = c["usage"];
      EXPECT_TRUE(c.contains("timings"));
      continue;
    }
    const json& choice = c["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(content, "You said: one two three");
  EXPECT_EQ(finish, "stop");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], 5);
}

TEST(ServeApi, StreamWithoutUsageHasNoUsageChunk) {
  TestServer s;
  auto r = s.post("/v1/chat/completions", chat_body("hi", true));
  ASSERT_EQ(r.status, 200);
  for (const auto& p : sse_payloads(r.body)) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    EXPECT_FALSE(c.contains("usage")) << p;
    EXPECT_EQ(c["choices"].size(), 1u);
  }
}

TEST(ServeApi, ReasoningGoesToReasoningContent) {
  TestServer s;
  json body = chat_body("think about this");
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "The user wrote 3 words. I will repeat them back.");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "You said: think about this");
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 10);

  body["stream"] = true;
  auto st = s.post("/v1/chat/completions", body);
  std::string reasoning;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    if (c["choices"][0]["delta"].contains("reasoning_content"))
      reasoning += c["choices"][0]["delta"]["reasoning_content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "The user wrote 3 words. I will repeat them back.");
}

TEST(ServeApi, ThinkingBudgetAndReasoningEffort) {
  TestServer s;
  json body = chat_body("think about this");
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  body["thinking_budget"] = 3;
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["message"]["reasoning_content"], "The user wrote");

  json effort = chat_body("think");
  effort["reasoning_effort"] = "low";
  effort["max_tokens"] = 8;  // low effort caps reasoning at half of max_tokens
  auto e = s.post("/v1/chat/completions", effort);
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["usage"]["completion_tokens_details"]["reasoning_tokens"], 4);

  json off = chat_body("think");
  off["reasoning_effort"] = "none";
  auto o = s.post("/v1/chat/completions", off);
  ASSERT_EQ(o.status, 200);
  EXPECT_FALSE(o.json()["choices"][0]["message"].contains("reasoning_content"));
}

json weather_tools() {
  json parameters = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}};
  json function = {{"name", "get_weather"}, {"description", "Weather in a city"}, {"parameters", parameters}};
  json tool = {{"type", "function"}, {"function", function}};
  return json::array({tool});
}

TEST(ServeApi, ToolCallsComeBackAsOpenAiToolCalls) {
  TestServer s;
  json body = chat_body("weather please [[tool]]");
  body["tools"] = weather_tools();
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  const json& msg = j["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  json args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_EQ(args["text"], "weather please [[tool]]");
  EXPECT_FALSE(msg["tool_calls"][0]["id"].get<std::string>().empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

  // streamed: one tool_calls delta with index 0
  body["stream"] = true;
  auto st = s.post("/v1/chat/completions", body);
  int calls = 0;
  std::string finish;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    const json& choice = c["choices"][0];
    if (choice["delta"].contains("tool_calls")) {
      ++calls;
      EXPECT_EQ(choice["delta"]["tool_calls"][0]["index"], 0);
      EXPECT_EQ(choice["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(finish, "tool_calls");

  // tool_choice: none never calls; a named function always does
  body["stream"] = false;
  body["tool_choice"] = "none";
  EXPECT_FALSE(s.post("/v1/chat/completions", body).json()["choices"][0]["message"].contains("tool_calls"));
  json named = chat_body("no directive here");
  named["tools"] = weather_tools();
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  EXPECT_EQ(s.post("/v1/chat/completions", named).json()["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ServeApi, ToolHistoryRoundTrip) {
  TestServer s;
  json body = {{"tools", weather_tools()},
               {"messages",
                {{{"role", "user"}, {"content", "weather?"}},
                 {{"role", "assistant"},
                  {"content", nullptr},
                  {"tool_calls",
                   {{{"id", "call_1"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
                 {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}},
                 {{"role", "user"}, {"content", "thanks"}}}}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "You said: thanks");
}

TEST(ServeApi, StopStringsAndMaxTokens) {
  TestServer s;
  json body = chat_body("alpha beta gamma delta");
  body["stop"] = "gamma";
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "You said: alpha beta ");
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop");

  body["stop"] = json::array({"zzz", "beta"});
  EXPECT_EQ(s.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"], "You said: alpha ");

  json limited = chat_body("alpha beta gamma delta");
  limited["max_tokens"] = 3;
  auto l = s.post("/v1/chat/completions", limited);
  EXPECT_EQ(l.json()["choices"][0]["message"]["content"], "You said: alpha");
  EXPECT_EQ(l.json()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(l.json()["usage"]["completion_tokens"], 3);

  json newer = chat_body("alpha beta gamma delta");
  newer["max_completion_tokens"] = 2;
  EXPECT_EQ(s.post("/v1/chat/completions", newer).json()["usage"]["completion_tokens"], 2);

  json endless = chat_body("[[long]]");
  endless["max_tokens"] = 50;
  auto e = s.post("/v1/chat/completions", endless);
  EXPECT_EQ(e.json()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(e.json()["usage"]["completion_tokens"], 50);
}

TEST(ServeApi, ResponseFormatJsonObject) {
  TestServer s;
  json body = chat_body("give me json");
  body["response_format"] = {{"type", "json_object"}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  json content = json::parse(r.json()["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(content["echo"], "give me json");

  body["response_format"] = {{"type", "xml"}};
  auto refused = s.post("/v1/chat/completions", body);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.json()["error"]["param"], "response_format.type");
}

// json_schema: a schema in the supported subset is accepted (the fake engine's answer ignores it;
// tests/server/model_engine_test.cpp holds a model to one); what cannot be enforced is a 400 that
// names the keyword.
TEST(ServeApi, ResponseFormatJsonSchemaCompilesOrSaysWhy) {
  TestServer s;
  json body = chat_body("give me json");
  const json schema = {{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}}}, {"age", {{"type", "integer"}}}}},
                       {"required", {"name", "age"}},
                       {"additionalProperties", false}};
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}};
  auto ok = s.post("/v1/chat/completions", body);
  EXPECT_EQ(ok.status, 200) << ok.body;

  json unsupported = schema;
  unsupported["properties"]["age"]["minimum"] = 0;
  body["response_format"]["json_schema"]["schema"] = unsupported;
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 400);
  const json error = r.json()["error"];
  EXPECT_EQ(error["param"], "response_format.json_schema.schema");
  EXPECT_NE(error["message"].get<std::string>().find("schema.properties.age.minimum"), std::string::npos) << error;

  body["response_format"] = {{"type", "json_schema"}};
  EXPECT_EQ(s.post("/v1/chat/completions", body).json()["error"]["param"], "response_format.json_schema");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}};
  EXPECT_EQ(s.post("/v1/chat/completions", body).json()["error"]["param"], "response_format.json_schema.schema");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}}}}}};
  auto root = s.post("/v1/chat/completions", body);
  EXPECT_EQ(root.status, 400);
  EXPECT_NE(root.body.find("the root must allow an object"), std::string::npos) << root.body;
}

TEST(ServeApi, SamplingParametersAreAcceptedAndChecked) {
  TestServer s;
  json body = chat_body("sample");
  body.update({{"temperature", 0.7},
               {"top_p", 0.9},
               {"top_k", 40},
               {"min_p", 0.05},
               {"presence_penalty", 0.5},
               {"frequency_penalty", 0.5},
               {"repetition_penalty", 1.1},
               {"seed", 42},
               {"logit_bias", {{"15", -100}}},
               {"n", 1},
               {"user", "someone"}});
  EXPECT_EQ(s.post("/v1/chat/completions", body).status, 200);

  for (auto [key, value] : std::vector<std::pair<std::string, json>>{{"temperature", 3.0},
                                                                     {"top_p", 0.0},
                                                                     {"top_k", -1},
                                                                     {"min_p", 1.5},
                                                                     {"presence_penalty", 2.5},
                                                                     {"n", 17},
                                                                     {"logprobs", "yes"},
                                                                     {"top_logprobs", 3},  // without logprobs
                                                                     {"logit_bias", {{"x", 1}}}}) {
    json bad = chat_body("sample");
    bad[key] = value;
    auto r = s.post("/v1/chat/completions", bad);
    EXPECT_EQ(r.status, 400) << key;
    const std::string param =
        r.json()["error"]["param"].is_string() ? r.json()["error"]["param"].get<std::string>() : "";
    EXPECT_EQ(param.rfind(key, 0), 0u) << key << ": " << r.body;
  }
}

// The fake engine's log-probabilities: piece i at -0.25 (i % 4), alternatives "<altK>" 0.5 apart.
TEST(ServeApi, ChatLogprobsListEverySampledToken) {
  TestServer s;
  json body = chat_body("one two three");
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json response = r.json();
  const json& lp = response["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  EXPECT_TRUE(lp["refusal"].is_null());
  const json& content = lp["content"];
  ASSERT_EQ(content.size(), 5u);  // "You" " said:" " one" " two" " three"
  std::string joined;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& e = content[i];
    joined += e["token"].get<std::string>();
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), -0.25f * static_cast<float>(i % 4));
    std::string bytes;
    for (const json& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, e["token"].get<std::string>());
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_EQ(e["top_logprobs"][1]["token"], "<alt1>");
    EXPECT_FLOAT_EQ(e["top_logprobs"][1]["logprob"].get<float>(), e["logprob"].get<float>() - 0.5f);
    EXPECT_TRUE(e["top_logprobs"][1]["bytes"].is_array());
  }
  EXPECT_EQ(joined, "You said: one two three");
  // logprobs: true alone gives entries with no alternatives; not asking gives null.
  body.erase("top_logprobs");
  auto plain = s.post("/v1/chat/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_TRUE(plain.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());
  body["logprobs"] = false;
  EXPECT_TRUE(s.post("/v1/chat/completions", body).json()["choices"][0]["logprobs"].is_null());
  for (int bad : {-1, 21}) {
    body["logprobs"] = true;
    body["top_logprobs"] = bad;
    auto r2 = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r2.status, 400) << bad;
    EXPECT_EQ(r2.json()["error"]["param"], "top_logprobs");
  }

  // Streamed: each entry rides with a chunk that carries text (the thought's tokens with the
  // reasoning chunks), none is lost, and the order is the tokens'.
  body = chat_body("four five", true);
  body["logprobs"] = true;
  body["top_logprobs"] = 1;
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  auto st = s.post("/v1/chat/completions", body);
  ASSERT_EQ(st.status, 200) << st.body;
  std::string streamed_tokens, text;
  size_t entries = 0;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    const json c = json::parse(p);
    const json& choice = c["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (delta.contains("reasoning_content")) text += delta["reasoning_content"].get<std::string>();
    if (choice["logprobs"].is_null()) continue;
    for (const json& e : choice["logprobs"]["content"]) {
      streamed_tokens += e["token"].get<std::string>();
      EXPECT_EQ(e["top_logprobs"].size(), 1u);
      ++entries;
    }
  }
  EXPECT_EQ(streamed_tokens, text);
  EXPECT_EQ(entries, 10u + 4u);  // the thought's 10 words, then the answer's 4
}

TEST(ServeApi, CompletionLogprobsUseTheLegacyLists) {
  TestServer s;
  json body = {{"prompt", "alpha beta"}, {"logprobs", 2}};
  auto r = s.post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json response = r.json();
  const json& lp = response["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  const std::vector<std::string> tokens = {"You", " said:", " alpha", " beta"};
  ASSERT_EQ(lp["tokens"].size(), tokens.size());
  int64_t offset = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], tokens[i]);
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), -0.25f * static_cast<float>(i % 4));
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += static_cast<int64_t>(tokens[i].size());
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 2u);
    EXPECT_FLOAT_EQ(top[tokens[i]].get<float>(), -0.25f * static_cast<float>(i % 4));
    EXPECT_TRUE(top.contains("<alt1>"));
  }
  // Streamed, the offsets continue from chunk to chunk.
  body["stream"] = true;
  auto st = s.post("/v1/completions", body);
  std::vector<int64_t> offsets;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    const json c = json::parse(p);
    const json& choice = c["choices"][0];
    if (choice["logprobs"].is_null()) continue;
    for (const json& o : choice["logprobs"]["text_offset"]) offsets.push_back(o.get<int64_t>());
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3, 9, 15}));
  for (const json& bad : {json(6), json(-1), json("two")}) {
    json b = {{"prompt", "x"}, {"logprobs", bad}};
    auto r2 = s.post("/v1/completions", b);
    EXPECT_EQ(r2.status, 400) << bad.dump();
    EXPECT_EQ(r2.json()["error"]["param"], "logprobs") << bad.dump();
  }
  EXPECT_TRUE(s.post("/v1/completions", json{{"prompt", "x"}}).json()["choices"][0]["logprobs"].is_null());
  // chat's boolean spelling: true is the sampled tokens' without alternatives, false none.
  const json as_true = s.post("/v1/completions", json{{"prompt", "x"}, {"logprobs", true}}).json();
  EXPECT_TRUE(as_true["choices"][0]["logprobs"]["top_logprobs"][0].empty()) << as_true;
  EXPECT_TRUE(
      s.post("/v1/completions", json{{"prompt", "x"}, {"logprobs", false}}).json()["choices"][0]["logprobs"].is_null());
}

TEST(ServeApi, CompletionEchoScoresThePrompt) {
  TestServer s;
  // echo: the prompt's text, then the answer; max_tokens 0 (only with echo) scores the prompt alone.
  auto r = s.post("/v1/completions", json{{"prompt", "once upon"}, {"echo", true}, {"max_tokens", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["text"], "once uponYou said: once upon");
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 4);
  auto scored =
      s.post("/v1/completions", json{{"prompt", "once upon"}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 1}});
  ASSERT_EQ(scored.status, 200) << scored.body;
  const json j = scored.json();
  EXPECT_EQ(j["choices"][0]["text"], "once upon");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 1u) << lp;        // the fake engine's echo is one piece
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing precedes a prompt's first token
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  auto zero = s.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 0}});
  EXPECT_EQ(zero.status, 400);
  EXPECT_EQ(zero.json()["error"]["param"], "max_tokens");
  auto chat_zero = s.post("/v1/chat/completions", [] {
    json b = chat_body("x");
    b["max_tokens"] = 0;
    return b;
  }());
  EXPECT_EQ(chat_zero.status, 400);
  // Streamed: the same text.
  auto st = s.post("/v1/completions", json{{"prompt", "a b"}, {"echo", true}, {"stream", true}});
  std::string text;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    text += json::parse(p)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "a bYou said: a b");
}

// Several prompts in one request (as evaluation harnesses batch them): one choice each, in order,
// usage summed; all are checked before any runs; at most 64 (streaming: StreamedChoicesInterleave).
TEST(ServeApi, CompletionsTakeSeveralPrompts) {
  TestServer s;
  auto r = s.post("/v1/completions", json{{"prompt", {"alpha", "beta gamma", {104, 105}}}, {"logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["choices"].size(), 3u) << j;
  const std::vector<std::string> texts = {"You said: alpha", "You said: beta gamma", "You said: hi"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], texts[i]);
    EXPECT_EQ(j["choices"][i]["logprobs"]["text_offset"][0], 0);
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5 + 10 + 2);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 + 4 + 3);
  // A bad prompt fails the request whole, naming which.
  auto bad = s.post("/v1/completions", json{{"prompt", {"fine", {104, 300}}}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json()["error"]["param"], "prompt[1]") << bad.body;
  auto empty = s.post("/v1/completions", json{{"prompt", {"fine", ""}}});
  EXPECT_EQ(empty.json()["error"]["param"], "prompt[1]") << empty.body;
  EXPECT_EQ(s.post("/v1/completions", json{{"prompt", json::array({"x"})}}).status, 200);
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back("x");
  EXPECT_EQ(s.post("/v1/completions", json{{"prompt", many}}).status, 400);
  // More prompts than may wait: 503. (The engine is slowed so that the first prompts are still
  // there when the last are queued: else they may finish in between, and all five fit.)
  server::ServeConfig small;
  small.max_waiting = 2;
  server::FakeEngineConfig one;
  one.parallel = 1;
  one.token_delay = std::chrono::milliseconds(50);
  TestServer tight(small, one);
  auto busy = tight.post("/v1/completions", json{{"prompt", {"a", "b", "c", "d", "e"}}});
  EXPECT_EQ(busy.status, 503) << busy.body;
  // The refused request's queued prompts were cancelled (the loop drops them between steps):
  // two prompts then fit again.
  int status = 0;
  for (int tries = 0; tries < 100 && status != 200; ++tries) {
    status = tight.post("/v1/completions", json{{"prompt", {"a", "b"}}}).status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status, 200);
}

// n choices: one task each with its own seed (seed + i), answered in one response; usage counts
// the prompt once; at most 16 (streaming: StreamedChoicesInterleave).
TEST(ServeApi, SeveralChoicesPerPrompt) {
  TestServer s;
  json body = chat_body("one two");
  body["n"] = 3;
  body["seed"] = 5;
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["choices"].size(), 3u) << j;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "You said: one two");
  }
  const std::string prompt = "<|user|>\none two\n<|assistant|>\n";
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * 4);
  // Completions: n per prompt, choice index = prompt * n + j.
  auto c = s.post("/v1/completions", json{{"prompt", {"a", "b c"}}, {"n", 2}});
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.json();
  ASSERT_EQ(cj["choices"].size(), 4u);
  EXPECT_EQ(cj["choices"][1]["text"], "You said: a");
  EXPECT_EQ(cj["choices"][2]["text"], "You said: b c");
  EXPECT_EQ(cj["usage"]["prompt_tokens"], 1 + 3);
  body["n"] = 0;
  EXPECT_EQ(s.post("/v1/chat/completions", body).status, 400);
}

// Streamed n > 1 and several prompts: every choice streams at once, each chunk naming its index;
// each choice has its own role (chat) and finish chunks; the usage chunk (prompt counted once per
// prompt) and [DONE] come once, last. One failing choice ends the stream with an error event and
// cancels the rest.
TEST(ServeApi, StreamedChoicesInterleave) {
  server::FakeEngineConfig slow;
  // so that the choices' chunks interleave unless this thread stalls for the whole answer (~150 ms)
  slow.token_delay = std::chrono::milliseconds(30);
  TestServer s({}, slow);
  json body = chat_body("one two three", /*stream=*/true);
  body["n"] = 3;
  body["stream_options"] = {{"include_usage", true}};
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<std::string> payloads = sse_payloads(r.body);
  ASSERT_GE(payloads.size(), 3u);
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::vector<std::string> content(3);
  std::vector<int> roles(3, 0), finishes(3, 0);
  std::vector<int> order;  // the index of every content chunk, in arrival order
  json usage;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    const json j = json::parse(payloads[i]);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j["choices"].empty()) {  // the usage chunk: once, after every finish
      EXPECT_TRUE(usage.is_null()) << "a second usage chunk";
      usage = j["usage"];
      for (int f : finishes) EXPECT_EQ(f, 1);
      continue;
    }
    ASSERT_EQ(j["choices"].size(), 1u);
    const json& c = j["choices"][0];
    const int index = c["index"].get<int>();
    ASSERT_GE(index, 0);
    ASSERT_LT(index, 3);
    EXPECT_EQ(finishes[index], 0) << "a chunk after choice " << index << " finished";
    if (c["delta"].contains("role")) ++roles[index];
    if (c["delta"].contains("content") && !c["delta"]["content"].get<std::string>().empty()) {
      content[index] += c["delta"]["content"].get<std::string>();
      order.push_back(index);
    }
    if (!c["finish_reason"].is_null()) {
      ++finishes[index];
      EXPECT_EQ(c["finish_reason"], "stop");
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(content[i], "You said: one two three") << "choice " << i;
    EXPECT_EQ(roles[i], 1);
    EXPECT_EQ(finishes[i], 1);
  }
  // interleaved: some choice's chunk comes before another choice has finished its answer
  ASSERT_EQ(order.size(), 15u);
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end())) << "the choices came one after another";
  const std::string prompt = "<|user|>\none two three\n<|assistant|>\n";
  EXPECT_EQ(usage["prompt_tokens"], prompt.size());
  EXPECT_EQ(usage["completion_tokens"], 3 * 5);

  // Completions, two prompts x n = 2: indices prompt * n + j, texts per prompt.
  auto c = s.post("/v1/completions", json{{"prompt", {"a", "b c"}}, {"n", 2}, {"stream", true}, {"logprobs", 0}});
  ASSERT_EQ(c.status, 200) << c.body;
  std::vector<std::string> texts(4);
  int done = 0;
  for (const auto& p : sse_payloads(c.body)) {
    if (p == "[DONE]") {
      ++done;
      continue;
    }
    const json j = json::parse(p);
    ASSERT_EQ(j["choices"].size(), 1u) << j;
    const json& choice = j["choices"][0];
    texts.at(choice["index"].get<size_t>()) += choice["text"].get<std::string>();
    if (!choice["text"].get<std::string>().empty()) EXPECT_TRUE(choice["logprobs"].is_object()) << j;
  }
  EXPECT_EQ(done, 1);
  EXPECT_EQ(texts, (std::vector<std::string>{"You said: a", "You said: a", "You said: b c", "You said: b c"}));

  // One choice fails as it starts; the other (endless) is cancelled and the stream ends in an error.
  const int cancelled_before = s.engine().cancelled.load();
  auto f = s.post("/v1/completions",
                  json{{"prompt", {"[[long]] [[delay=20]]", "[[fail]]"}}, {"stream", true}, {"max_tokens", 1000}});
  ASSERT_EQ(f.status, 200) << f.body;
  const std::vector<std::string> failed = sse_payloads(f.body);
  ASSERT_FALSE(failed.empty());
  EXPECT_NE(failed.back(), "[DONE]");
  EXPECT_TRUE(json::parse(failed.back()).contains("error")) << failed.back();
  EXPECT_TRUE(TestServer::eventually([&] { return s.server().stats().running == 0; }));
  EXPECT_GE(s.engine().cancelled.load(), cancelled_before + 1);
}

TEST(ServeApi, CompletionsEndpoint) {
  TestServer s;
  auto r = s.post("/v1/completions", json{{"prompt", "once upon"}, {"max_tokens", 10}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  EXPECT_EQ(j["choices"][0]["text"], "You said: once upon");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 9);

  // token ids (the fake vocabulary is bytes)
  auto ids = s.post("/v1/completions", json{{"prompt", {104, 105}}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  EXPECT_EQ(ids.json()["choices"][0]["text"], "You said: hi");
  EXPECT_EQ(s.post("/v1/completions", json{{"prompt", {104, 300}}}).status, 400);

  auto st = s.post("/v1/completions", json{{"prompt", "a b"}, {"stream", true}});
  std::string text;
  for (const auto& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "You said: a b");
}

TEST(ServeApi, ApiKeyIsRequiredWhenSet) {
  server::ServeConfig config;
  config.api_key = "sekret";
  TestServer s(config);
  auto none = s.post("/v1/chat/completions", chat_body("hi"));
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.json()["error"]["type"], "authentication_error");
  EXPECT_EQ(none.json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body("hi"), {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body("hi"), {{"Authorization", "Bearer sekret2"}}).status, 401);
  EXPECT_EQ(s.get("/v1/models").status, 401);
  EXPECT_EQ(s.get("/metrics").status, 401);
  EXPECT_EQ(s.get("/health").status, 200);  // liveness checks need no key
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body("hi"), {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(s.get("/v1/models", {{"Authorization", "Bearer sekret"}}).status, 200);
}

TEST(ServeApi, MetricsCountRequestsTokensAndErrors) {
  TestServer s;
  ASSERT_EQ(s.post("/v1/chat/completions", chat_body("a b c")).status, 200);
  ASSERT_EQ(s.post("/v1/chat/completions", std::string("{")).status, 400);
  // A request is counted just after its response is written, so the client can be faster.
  TestServer::Reply m;
  TestServer::eventually([&] {
    m = s.get("/metrics");
    return m.body.find("status=\"400\"") != std::string::npos;
  });
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("fireline_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("fireline_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1"),
            std::string::npos);
  EXPECT_NE(m.body.find("fireline_errors_total{type=\"invalid_request_error\"} 1"), std::string::npos);
  EXPECT_NE(m.body.find("fireline_queue_depth 0"), std::string::npos);
  EXPECT_NE(m.body.find("fireline_generated_tokens_total 5"), std::string::npos);
  EXPECT_NE(m.body.find("# TYPE fireline_generated_tokens_per_second gauge"), std::string::npos);
  EXPECT_NE(m.body.find("fireline_tasks_total{outcome=\"finished\"} 1"), std::string::npos);
}

}  // namespace
}  // namespace fl::test
