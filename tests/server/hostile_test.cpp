// Hostile and broken input: each case gets a JSON error with the right status (or a closed
// connection where HTTP itself is broken), and the server keeps answering afterwards.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "server_test_util.h"

namespace fl::test {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// The error object of a reply, after checking its shape.
json error_of(const TestServer::Reply& r) {
  json j = r.json();
  EXPECT_TRUE(j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param")) << r.body;
  EXPECT_TRUE(e.contains("code")) << r.body;
  return e;
}

void expect_alive(const TestServer& s) {
  auto r = s.get("/health");
  EXPECT_EQ(r.status, 200) << "the server stopped answering";
}

std::string param_of(const json& e) { return e["param"].is_string() ? e["param"].get<std::string>() : ""; }

TEST(ServeHostile, MalformedJson) {
  TestServer s;
  for (std::string body :
       {"{", "{\"messages\": [}", "not json at all", "{\"a\":1}{", "[1, 2]", "\"text\"", "null", ""}) {
    auto r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    json e = error_of(r);
    EXPECT_EQ(e["type"], "invalid_request_error") << body;
  }
  auto r = s.post("/v1/chat/completions", std::string("{\"messages\": tru}"));
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("not valid JSON"), std::string::npos) << r.body;
  expect_alive(s);
}

TEST(ServeHostile, WrongTypesNameTheField) {
  TestServer s;
  struct Case {
    json body;
    std::string param;
  };
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  std::vector<Case> cases = {
      {{{"messages", "hello"}}, "messages"},
      {{{"messages", {1, 2}}}, "messages[0]"},
      {{{"messages", {{{"role", 5}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}, {"content", 5}}}}}, "messages[0].content"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, "messages[0].content[0].type"},
      {{{"messages", {{{"role", "user"}}}}}, "messages[0].content"},
      {{{"messages", msgs}, {"max_tokens", "100"}}, "max_tokens"},
      {{{"messages", msgs}, {"max_tokens", 1.5}}, "max_tokens"},
      {{{"messages", msgs}, {"max_tokens", 0}}, "max_tokens"},
      {{{"messages", msgs}, {"temperature", "hot"}}, "temperature"},
      {{{"messages", msgs}, {"stream", "yes"}}, "stream"},
      {{{"messages", msgs}, {"stop", 5}}, "stop"},
      {{{"messages", msgs}, {"stop", {"a", 3}}}, "stop[1]"},
      {{{"messages", msgs}, {"stop", ""}}, "stop"},
      {{{"messages", msgs}, {"tools", "none"}}, "tools"},
      {{{"messages", msgs}, {"tools", {{{"type", "function"}}}}}, "tools[0].function"},
      {{{"messages", msgs}, {"tool_choice", "required"}}, "tool_choice"},
      {{{"messages", msgs}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", "yes"}}}},
       "chat_template_kwargs.enable_thinking"},
      {{{"messages", msgs}, {"reasoning_effort", "extreme"}}, "reasoning_effort"},
      {{{"messages", msgs}, {"seed", "x"}}, "seed"},
      {{{"messages", msgs}, {"model", 7}}, "model"},
  };
  for (const auto& c : cases) {
    auto r = s.post("/v1/chat/completions", c.body);
    EXPECT_EQ(r.status, 400) << c.body.dump();
    json e = error_of(r);
    EXPECT_EQ(param_of(e), c.param) << c.body.dump() << " -> " << r.body;
  }
  expect_alive(s);
}

TEST(ServeHostile, EmptyMessagesAndUnknownRoles) {
  TestServer s;
  auto empty = s.post("/v1/chat/completions", json{{"messages", json::array()}});
  EXPECT_EQ(empty.status, 400);
  EXPECT_NE(error_of(empty)["message"].get<std::string>().find("empty"), std::string::npos);
  auto missing = s.post("/v1/chat/completions", json::object());
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(param_of(error_of(missing)), "messages");
  auto role = s.post("/v1/chat/completions", json{{"messages", {{{"role", "wizard"}, {"content", "hi"}}}}});
  EXPECT_EQ(role.status, 400);
  json e = error_of(role);
  EXPECT_EQ(param_of(e), "messages[0].role");
  EXPECT_NE(e["message"].get<std::string>().find("wizard"), std::string::npos);
  expect_alive(s);
}

TEST(ServeHostile, InvalidUtf8) {
  TestServer s;
  const std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff\xfe bytes\"}]}";
  auto r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  json e = error_of(r);
  EXPECT_NE(e["message"].get<std::string>().find("UTF-8"), std::string::npos) << r.body;
  EXPECT_NE(e["message"].get<std::string>().find("byte 43"), std::string::npos) << r.body;
  // A truncated sequence at the very end, and an overlong encoding.
  EXPECT_EQ(s.post("/v1/chat/completions", std::string("{\"a\":\"\xe2\x82\"}")).status, 400);
  EXPECT_EQ(s.post("/v1/chat/completions", std::string("{\"a\":\"\xc0\xaf\"}")).status, 400);
  expect_alive(s);
}

// The JSON parser takes a NUL byte for the end of the text: a body with one used to be served from
// what came before it, the rest (here a second, conflicting max_tokens) silently dropped. JSON
// text holds no raw NUL anywhere (inside strings it is written \u0000, which still works).
TEST(ServeHostile, NulBytesAreRefusedNotTruncated) {
  TestServer s;
  const std::string head = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2";
  for (const std::string& body :
       {head + "}" + std::string(1, '\0') + "garbage", head + std::string(1, '\0') + ",\"max_tokens\":-1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a" + std::string(1, '\0') + "b\"}]}"}) {
    auto r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("NUL byte"), std::string::npos) << r.body;
  }
  auto escaped = s.post("/v1/chat/completions",
                        std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}],\"max_tokens\":2}"));
  EXPECT_EQ(escaped.status, 200) << escaped.body;
  expect_alive(s);
}

TEST(ServeHostile, DeepNestingIsRefusedBeforeAnythingWalksIt) {
  TestServer s;
  std::string deep = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":";
  deep += std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = s.post("/v1/chat/completions", deep);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("deeper than"), std::string::npos);
  expect_alive(s);
}

TEST(ServeHostile, WideObjectsAndDeepToolArgumentsAreRefused) {
  TestServer s;
  std::string wide = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":{";
  for (int i = 0; i < 10001; ++i) wide += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  wide += "}}";
  auto r = s.post("/v1/chat/completions", wide);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("more than 10000 members"), std::string::npos) << r.body;

  // JSON inside a string is checked too: tool-call arguments reach the chat template as objects.
  std::string deep_args;
  for (int i = 0; i < 100; ++i) deep_args += "{\"a\":";
  deep_args += "1" + std::string(100, '}');
  json body = {{"messages",
                {{{"role", "user"}, {"content", "x"}},
                 {{"role", "assistant"},
                  {"tool_calls",
                   {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep_args}}}}}}}}}};
  auto d = s.post("/v1/chat/completions", body);
  EXPECT_EQ(d.status, 400);
  EXPECT_EQ(param_of(error_of(d)), "messages[1].tool_calls[0].function.arguments") << d.body;
  expect_alive(s);
}

TEST(ServeHostile, HugeBodiesGet413) {
  server::ServeConfig config;
  config.max_body_bytes = 64 * 1024;
  TestServer s(config);
  json body = chat_body(std::string(100 * 1024, 'x'));
  auto r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 413);
  json e = error_of(r);
  EXPECT_EQ(e["code"], "request_too_large");
  EXPECT_NE(e["message"].get<std::string>().find("65536"), std::string::npos);

  // A Content-Length far past the limit is refused without reading the body.
  int fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  send_all(fd,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: 99999999999\r\n\r\n{");
  const std::string reply = read_until_closed(fd, milliseconds(5000));
  ::close(fd);
  EXPECT_NE(reply.find(" 413 "), std::string::npos) << reply;

  // A chunked body has no Content-Length to refuse: it is cut off once it passes the limit.
  fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk(8192, 'x');
  for (int i = 0; i < 64; ++i)
    if (!send_all(fd, "2000\r\n" + chunk + "\r\n")) break;  // the server may close before the end
  const std::string chunked_reply = read_until_closed(fd, milliseconds(5000));
  ::close(fd);
  EXPECT_NE(chunked_reply.find(" 413 "), std::string::npos) << chunked_reply.substr(0, 200);
  EXPECT_NE(chunked_reply.find("request_too_large"), std::string::npos);
  expect_alive(s);
}

// Expect: 100-continue asks before the body is sent: a body over the limit, or a request without
// the API key, is refused at once (no "100 Continue" inviting a body that would then be refused
// and dropped); an acceptable one is invited and served.
TEST(ServeHostile, ExpectContinueIsRefusedBeforeTheBodyWhenItWouldBe) {
  server::ServeConfig config;
  config.max_body_bytes = 64 * 1024;
  config.api_key = "sesame";
  TestServer s(config);
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::string body = chat_body("hi").dump();
  auto exchange = [&](const std::string& request) {  // everything the server sends until it closes
    int fd = connect_local(s.port());
    EXPECT_GE(fd, 0);
    send_all(fd, request);
    const std::string reply = read_until_closed(fd, milliseconds(3000));
    ::close(fd);
    return reply;
  };
  // No body sent: the server must answer the head alone.
  const std::string too_big =
      exchange(head + "Expect: 100-continue\r\nAuthorization: Bearer sesame\r\nContent-Length: 99999999\r\n\r\n");
  EXPECT_EQ(too_big.rfind("HTTP/1.1 413", 0), 0u) << too_big;
  EXPECT_NE(too_big.find("request_too_large"), std::string::npos) << too_big;
  const std::string no_key = exchange(head + "Expect: 100-continue\r\nContent-Length: 10\r\n\r\n");
  EXPECT_EQ(no_key.rfind("HTTP/1.1 401", 0), 0u) << no_key;
  EXPECT_NE(no_key.find("missing API key"), std::string::npos) << no_key;

  // Without Expect, a refused request's body is not read: the connection closes after the 401,
  // so the body is never parsed as a next request (a keep-alive client's next request got "400
  // malformed HTTP request" for it).
  const std::string refused = exchange(head + "Authorization: Bearer wrong\r\nContent-Length: " +
                                       std::to_string(body.size()) + "\r\n\r\n" + body +
                                       "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 401", 0), 0u) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("HTTP/1.1 400"), std::string::npos) << refused;

  // Within the limit and with the key: "100 Continue", then the body, then the answer.
  int fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  send_all(fd, head + "Authorization: Bearer sesame\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n");
  std::string interim;
  char c;
  while (interim.find("\r\n\r\n") == std::string::npos && ::recv(fd, &c, 1, 0) == 1) interim += c;
  EXPECT_EQ(interim.rfind("HTTP/1.1 100", 0), 0u) << interim;
  send_all(fd, body);
  const std::string reply = read_until_closed(fd, milliseconds(5000));
  ::close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 300);
  expect_alive(s);
}

TEST(ServeHostile, MaxTokensAndContextLimitsSayWhichAndWhy) {
  server::FakeEngineConfig fake;
  fake.context_length = 256;
  TestServer s({}, fake);
  json huge = chat_body("hi");
  huge["max_tokens"] = 1000000000000LL;
  auto r = s.post("/v1/chat/completions", huge);
  EXPECT_EQ(r.status, 400);
  json e = error_of(r);
  EXPECT_EQ(param_of(e), "max_tokens");
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_NE(e["message"].get<std::string>().find("larger than the context of 256"), std::string::npos) << r.body;

  huge["max_tokens"] = 18446744073709551615ull;
  EXPECT_EQ(s.post("/v1/chat/completions", huge).status, 400);
  huge["max_tokens"] = 1e300;
  EXPECT_EQ(s.post("/v1/chat/completions", huge).status, 400);

  json past = chat_body("hi");  // the prompt is 26 bytes = 26 tokens
  past["max_tokens"] = 250;
  auto p = s.post("/v1/chat/completions", past);
  EXPECT_EQ(p.status, 400);
  json pe = error_of(p);
  EXPECT_EQ(param_of(pe), "max_tokens");
  EXPECT_NE(pe["message"].get<std::string>().find("at most 230"), std::string::npos) << p.body;

  auto long_prompt = s.post("/v1/chat/completions", chat_body(std::string(300, 'y')));
  EXPECT_EQ(long_prompt.status, 400);
  json le = error_of(long_prompt);
  EXPECT_EQ(param_of(le), "messages");
  EXPECT_EQ(le["code"], "context_length_exceeded");

  // Without max_tokens the answer may use the rest of the context.
  auto fits = s.post("/v1/chat/completions", chat_body("[[long]]"));
  ASSERT_EQ(fits.status, 200);
  EXPECT_EQ(fits.json()["usage"]["total_tokens"], 256);
  EXPECT_EQ(fits.json()["choices"][0]["finish_reason"], "length");
  expect_alive(s);
}

TEST(ServeHostile, InconsistentThinkingParameters) {
  TestServer s;
  json body = chat_body("hi");
  body["max_tokens"] = 100;
  body["thinking_budget"] = 500;
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  auto r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  json e = error_of(r);
  EXPECT_EQ(param_of(e), "thinking_budget");
  EXPECT_NE(e["message"].get<std::string>().find("smaller than max_tokens (100)"), std::string::npos) << r.body;

  json off = chat_body("hi");
  off["thinking_budget"] = 10;
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_EQ(s.post("/v1/chat/completions", off).status, 400);

  json contradiction = chat_body("hi");
  contradiction["reasoning_effort"] = "high";
  contradiction["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto c = s.post("/v1/chat/completions", contradiction);
  EXPECT_EQ(c.status, 400);
  EXPECT_NE(error_of(c)["message"].get<std::string>().find("contradicts"), std::string::npos);
  expect_alive(s);
}

TEST(ServeHostile, BrokenHttpIsAnsweredOrClosed) {
  TestServer s;
  for (std::string raw : {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/9.9\r\n\r\n"),
                          std::string("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
                          "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
                          "GET /health HTTP/1.1\r\nX: " + std::string(20000, 'h') + "\r\n\r\n",
                          std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)}) {
    int fd = connect_local(s.port());
    ASSERT_GE(fd, 0);
    send_all(fd, raw);
    ::shutdown(fd, SHUT_WR);
    const std::string reply = read_until_closed(fd, milliseconds(5000));
    ::close(fd);
    if (!reply.empty()) {
      EXPECT_EQ(reply.rfind("HTTP/1.1 ", 0), 0u) << reply.substr(0, 80);
    }
  }
  expect_alive(s);
}

TEST(ServeHostile, SlowlorisConnectionsAreClosedAtTheRequestDeadline) {
  server::ServeConfig config;
  config.http.request_timeout = milliseconds(1000);
  config.http.read_timeout = milliseconds(500);
  config.http.keep_alive_timeout = milliseconds(1000);
  config.http.max_threads = 8;  // fewer threads than attackers: the deadline is what saves it
  TestServer s(config);

  // 16 clients that trickle header bytes faster than the read timeout, forever.
  std::atomic<bool> stop{false};
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {
    int fd = connect_local(s.port());
    ASSERT_GE(fd, 0);
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    fds.push_back(fd);
  }
  std::atomic<int> closed{0};
  std::vector<std::thread> tricklers;
  for (int fd : fds) {
    tricklers.emplace_back([fd, &stop, &closed] {
      while (!stop.load()) {
        if (!send_all(fd, "X")) break;
        if (closed_within(fd, milliseconds(200))) {
          closed.fetch_add(1);
          return;
        }
      }
    });
  }
  // Requests from a real client still get through (they may wait for a deadline to free a thread).
  const auto t0 = std::chrono::steady_clock::now();
  auto r = s.post("/v1/chat/completions", chat_body("still here"));
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(TestServer::eventually([&] { return closed.load() == 16; }, milliseconds(6000)))
      << closed.load() << " of 16 slow connections closed";
  stop = true;
  for (auto& t : tricklers) t.join();
  for (int fd : fds) ::close(fd);

  // A body that stops half way is also cut off at the deadline.
  int fd = connect_local(s.port());
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"messages\":");
  const auto t1 = std::chrono::steady_clock::now();
  read_until_closed(fd, milliseconds(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(3000));
  ::close(fd);
  expect_alive(s);
}

TEST(ServeHostile, ThousandsOfConnectionsOpenedAndDropped) {
  TestServer s;
  int opened = 0;
  for (int round = 0; round < 10; ++round) {
    std::vector<int> fds;
    for (int i = 0; i < 250; ++i) {
      int fd = connect_local(s.port());
      if (fd < 0) continue;
      ++opened;
      if (i % 3 == 1) send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"mess");
      if (i % 3 == 2) send_all(fd, "GET /health HTTP/1.1\r\n");
      fds.push_back(fd);
    }
    for (int fd : fds) ::close(fd);
  }
  EXPECT_GE(opened, 2000);
  expect_alive(s);
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body("after the storm")).json()["choices"][0]["message"]["content"],
            "You said: after the storm");
  // Every dropped connection is noticed and closed on the server side too.
  EXPECT_TRUE(TestServer::eventually([&] { return s.server().metrics().connections_open() <= 1; }, milliseconds(15000)))
      << s.server().metrics().connections_open() << " connections still open";
}

TEST(ServeHostile, QueueFullGets503WithRetryAfter) {
  server::ServeConfig config;
  config.max_waiting = 1;
  server::FakeEngineConfig fake;
  fake.parallel = 1;
  TestServer s(config, fake);
  // One request runs and one waits, both slow; a third finds the queue full.
  std::vector<std::thread> slow;
  std::vector<int> statuses(2, 0);
  for (int i = 0; i < 2; ++i) {
    slow.emplace_back(
        [&, i] { statuses[i] = s.post("/v1/chat/completions", chat_body("a b c d [[delay=150]]")).status; });
    ASSERT_TRUE(TestServer::eventually([&] { return s.server().stats().submitted == static_cast<uint64_t>(i + 1); }));
  }
  auto r = s.post("/v1/chat/completions", chat_body("one too many"));
  EXPECT_EQ(r.status, 503);
  json e = error_of(r);
  EXPECT_EQ(e["code"], "queue_full");
  ASSERT_TRUE(r.headers.count("Retry-After"));
  EXPECT_EQ(r.headers.find("Retry-After")->second, "1");
  for (auto& t : slow) t.join();
  EXPECT_EQ(statuses[0], 200);
  EXPECT_EQ(statuses[1], 200);
  EXPECT_EQ(s.server().stats().refused, 1u);
}

TEST(ServeHostile, DisconnectedStreamingClientCancelsItsTask) {
  server::FakeEngineConfig fake;
  fake.token_delay = milliseconds(20);
  TestServer s({}, fake);
  int fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  const std::string body = chat_body("[[long]]", true).dump();
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  // Read until some content has streamed, then hang up.
  std::string got;
  char buf[4096];
  while (got.find("more") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_TRUE(TestServer::eventually([&] { return s.engine().cancelled.load() == 1; }))
      << "the engine was not told to cancel";
  EXPECT_TRUE(TestServer::eventually([&] { return s.server().stats().running == 0; }));
  EXPECT_EQ(s.server().stats().cancelled, 1u);
  expect_alive(s);
}

TEST(ServeHostile, DisconnectedNonStreamingClientCancelsItsTask) {
  server::FakeEngineConfig fake;
  fake.token_delay = milliseconds(20);
  TestServer s({}, fake);
  int fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  const std::string body = chat_body("[[long]]").dump();
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(TestServer::eventually([&] { return s.engine().started.load() == 1; }));
  ::close(fd);
  EXPECT_TRUE(TestServer::eventually([&] { return s.engine().cancelled.load() == 1; }))
      << "the engine was not told to cancel";
  EXPECT_TRUE(TestServer::eventually([&] { return s.server().stats().running == 0; }));
  expect_alive(s);
}

TEST(ServeHostile, ClientThatLeavesTheQueueIsDroppedBeforeItStarts) {
  server::FakeEngineConfig fake;
  fake.parallel = 1;
  TestServer s({}, fake);
  // One slow request holds the only slot.
  std::thread slow(
      [&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body("a b c d e [[delay=100]]")).status, 200); });
  ASSERT_TRUE(TestServer::eventually([&] { return s.engine().started.load() == 1; }));
  // A streaming request waits behind it, and its client gives up.
  int fd = connect_local(s.port());
  ASSERT_GE(fd, 0);
  const std::string body = chat_body("never started", true).dump();
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(TestServer::eventually([&] { return s.server().stats().waiting == 1; }));
  ::close(fd);
  EXPECT_TRUE(TestServer::eventually([&] { return s.server().stats().cancelled == 1; }));
  EXPECT_EQ(s.server().stats().waiting, 0);
  slow.join();
  EXPECT_EQ(s.engine().started.load(), 1) << "the abandoned request was started anyway";
  EXPECT_EQ(s.engine().cancelled.load(), 0);
}

TEST(ServeHostile, EngineFailuresAreErrorsNotCrashes) {
  TestServer s;
  auto r = s.post("/v1/chat/completions", chat_body("please [[fail]]"));
  EXPECT_EQ(r.status, 500);
  json e = error_of(r);
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_NE(e["message"].get<std::string>().find("asked it to fail"), std::string::npos);

  auto st = s.post("/v1/chat/completions", chat_body("please [[fail]]", true));
  EXPECT_EQ(st.status, 200);  // the stream had started; the error arrives as an event
  auto payloads = sse_payloads(st.body);
  ASSERT_FALSE(payloads.empty());
  EXPECT_TRUE(json::parse(payloads.back()).contains("error")) << st.body;
  expect_alive(s);
}

// A request whose end cannot be known (a request line the library cannot parse, Content-Length
// headers that disagree, a Transfer-Encoding it does not decode) is refused and the connection
// closed: the bytes after it must never be served as a next request (request smuggling).
TEST(ServeHostile, UnframableRequestsCloseTheConnection) {
  TestServer s;
  const std::string body = chat_body("hi").dump();
  const std::string inner = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  auto exchange = [&](const std::string& raw) {
    int fd = connect_local(s.port());
    EXPECT_GE(fd, 0);
    send_all(fd, raw);
    std::string reply = read_until_closed(fd, milliseconds(5000));
    ::close(fd);
    return reply;
  };
  auto responses = [](const std::string& reply) {
    size_t n = 0;
    for (size_t at = reply.find("HTTP/1.1 "); at != std::string::npos; at = reply.find("HTTP/1.1 ", at + 1)) ++n;
    return n;
  };
  const std::string cases[] = {
      // A method the library does not know, with a request in its body.
      "FOO / HTTP/1.1\r\nContent-Length: " + std::to_string(inner.size()) + "\r\n\r\n" + inner,
      // Two lengths: the first covers the chat body, the second the request behind it too.
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nContent-Length: " + std::to_string(body.size() + inner.size()) + "\r\n\r\n" + body + inner,
      // A transfer coding that is not decoded, and chunked alongside a length.
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body + inner,
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" +
          fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", body.size(), body) + inner,
  };
  for (const std::string& raw : cases) {
    const std::string reply = exchange(raw);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 200);
    EXPECT_EQ(responses(reply), 1u) << reply;
    EXPECT_EQ(reply.find("\"object\":\"list\""), std::string::npos) << "the smuggled request was served:\n" << reply;
  }
  // A Range header is ignored: answers (and errors) stay whole JSON.
  for (const std::string& raw :
       {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRange: bytes=0-10\r\n" +
            fmt::format("Content-Length: {}\r\n\r\n", body.size()) + body,
        std::string("GET /v1/models/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRange: bytes=0-10\r\n\r\n")}) {
    const std::string reply = exchange(raw);
    EXPECT_EQ(reply.find("206 Partial"), std::string::npos) << reply.substr(0, 200);
    const size_t at = reply.find("\r\n\r\n");
    ASSERT_NE(at, std::string::npos) << reply;
    EXPECT_TRUE(json::accept(reply.substr(at + 4))) << reply;
  }
  // A POST with no length at all is answered at once (411), not after the read timeout.
  const auto start = std::chrono::steady_clock::now();
  const std::string unsized = exchange("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n" + body);
  EXPECT_EQ(unsized.rfind("HTTP/1.1 411", 0), 0u) << unsized.substr(0, 200);
  EXPECT_EQ(responses(unsized), 1u) << unsized;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  // The same length twice is one length.
  const std::string twice = exchange("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                                     fmt::format("Content-Length: {0}\r\nContent-Length: {0}\r\n\r\n", body.size()) +
                                     body);
  EXPECT_EQ(twice.rfind("HTTP/1.1 200", 0), 0u) << twice.substr(0, 200);
  expect_alive(s);
}

// Token ids the model does not have are the client's mistake (400 naming the field), found before
// the task is queued, not an engine failure (500, or a 200 stream ending in an error event).
TEST(ServeHostile, TokensTheModelLacksAreRequestErrorsNamingTheField) {
  TestServer s;  // the fake engine's vocabulary is the 256 byte values
  for (bool stream : {false, true}) {
    json body = chat_body("hi", stream);
    body["logit_bias"] = {{"256", 1}};
    auto r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    json e = error_of(r);
    EXPECT_EQ(param_of(e), "logit_bias.256") << r.body;
  }
  auto c = s.post("/v1/completions", json{{"prompt", "hi"}, {"logit_bias", {{"2000000000", -5}}}});
  EXPECT_EQ(c.status, 400) << c.body;
  EXPECT_EQ(param_of(error_of(c)), "logit_bias.2000000000");
  // A completion prompt that fills the context names `prompt` (it has no `messages`).
  auto full = s.post("/v1/completions", json{{"prompt", std::string(100000, 'x')}});
  EXPECT_EQ(full.status, 400) << full.body;
  EXPECT_EQ(param_of(error_of(full)), "prompt") << full.body;
  json ok = chat_body("hi");
  ok["logit_bias"] = {{"255", 1}};
  EXPECT_EQ(s.post("/v1/chat/completions", ok).status, 200);
  EXPECT_EQ(s.engine().started.load(), 1) << "a refused request reached the engine";
  expect_alive(s);
}

}  // namespace
}  // namespace fl::test
