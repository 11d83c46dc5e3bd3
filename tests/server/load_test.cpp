// A bounded loopback load test: 64 concurrent streaming clients send a fixed number of requests.
// Every request must complete with exactly its own answer (each answer echoes a per-request tag,
// so a cross-wired response shows) or be cleanly refused with 503; latency percentiles are
// printed (and recorded as test properties), never asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "server_test_util.h"

namespace fl::test {
namespace {

using nlohmann::json;

struct Outcome {
  int status = -1;
  bool answer_ok = false;
  std::string id;
  double ms = 0;
  std::string problem;
};

Outcome stream_one(int port, const std::string& tag) {
  Outcome o;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  c.set_connection_timeout(10, 0);
  json body = chat_body("tag " + tag + " end", true);
  body["stream_options"] = {{"include_usage", true}};
  const auto t0 = std::chrono::steady_clock::now();
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  o.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!res) {
    o.problem = "no response: " + httplib::to_string(res.error());
    return o;
  }
  o.status = res->status;
  if (res->status != 200) return o;
  std::string content;
  bool done = false, finished = false;
  for (const auto& p : sse_payloads(res->body)) {
    if (p == "[DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(p, nullptr, false);
    if (chunk.is_discarded()) {
      o.problem = "bad chunk: " + p;
      return o;
    }
    if (o.id.empty()) o.id = chunk.value("id", "");
    if (chunk.value("id", "") != o.id) o.problem = "chunks of two responses in one stream";
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finished = choice["finish_reason"] == "stop";
  }
  const std::string expected = "You said: tag " + tag + " end";
  o.answer_ok = done && finished && content == expected && o.problem.empty();
  if (!o.answer_ok && o.problem.empty()) o.problem = "got \"" + content + "\", expected \"" + expected + "\"";
  return o;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

TEST(ServeLoad, SixtyFourConcurrentStreamingClients) {
  constexpr int kClients = 64;
  constexpr int kRequestsPerClient = 6;
  server::ServeConfig config;
  config.max_waiting = 48;  // parallel + queue < 64 clients: some requests are refused
  server::FakeEngineConfig fake;
  fake.parallel = 8;
  fake.token_delay = std::chrono::milliseconds(2);
  TestServer s(config, fake);

  std::mutex mutex;
  std::vector<Outcome> outcomes;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kRequestsPerClient; ++i) {
        Outcome o = stream_one(s.port(), std::to_string(c) + "-" + std::to_string(i));
        std::lock_guard lock(mutex);
        outcomes.push_back(std::move(o));
      }
    });
  }
  for (auto& t : clients) t.join();

  int ok = 0, refused = 0;
  std::set<std::string> ids;
  std::vector<double> latencies;
  for (const auto& o : outcomes) {
    if (o.status == 200 && o.answer_ok) {
      ++ok;
      latencies.push_back(o.ms);
      EXPECT_TRUE(ids.insert(o.id).second) << "response id " << o.id << " used twice";
    } else if (o.status == 503) {
      ++refused;
    } else {
      ADD_FAILURE() << "status " << o.status << ": " << o.problem;
    }
  }
  EXPECT_EQ(ok + refused, kClients * kRequestsPerClient);
  EXPECT_GT(ok, kClients);  // most requests get through
  const auto stats = s.server().stats();
  EXPECT_EQ(stats.refused, static_cast<uint64_t>(refused));
  EXPECT_EQ(stats.finished, static_cast<uint64_t>(ok));
  EXPECT_LE(s.engine().max_running.load(), fake.parallel);
  EXPECT_EQ(stats.waiting + stats.running, 0);

  const double p50 = percentile(latencies, 0.50), p99 = percentile(latencies, 0.99);
  std::printf("load: %d clients x %d requests: %d completed, %d refused (503); latency p50 %.1f ms, p99 %.1f ms\n",
              kClients, kRequestsPerClient, ok, refused, p50, p99);
  RecordProperty("completed", ok);
  RecordProperty("refused", refused);
  RecordProperty("p50_ms", static_cast<int>(p50));
  RecordProperty("p99_ms", static_cast<int>(p99));
}

}  // namespace
}  // namespace fl::test
