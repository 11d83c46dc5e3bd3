#pragma once
// Counters for GET /metrics, written in the Prometheus text exposition format (version 0.0.4).
// HTTP workers count requests and errors here; the InferenceLoop reports queue depth, tokens and
// throughput through LoopStats; render() puts both on one page.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fl::server {

struct LoopStats;

// Events per second over the last `seconds` whole seconds (one bucket per second).
class RateWindow {
 public:
  explicit RateWindow(int seconds = 10);
  void add(int64_t n);
  double per_second() const;

 private:
  void advance(int64_t now_s) const;  // clears buckets that fell out of the window
  static int64_t now_seconds();

  const int seconds_;
  mutable std::mutex mutex_;
  mutable std::vector<int64_t> buckets_;
  mutable int64_t head_s_ = 0;  // the second buckets_[head_s_ % seconds_] counts
};

class ServerMetrics {
 public:
  // One finished HTTP request: `route` is the matched route ("/v1/chat/completions") or "other".
  void count_request(const std::string& route, int status);
  // A request that failed with an OpenAI error type ("invalid_request_error", ...).
  void count_error(const std::string& type);
  void connection_opened() {
    connections_open_.fetch_add(1);
    connections_total_.fetch_add(1);
  }
  void connection_closed() { connections_open_.fetch_sub(1); }
  int64_t connections_open() const { return connections_open_.load(); }

  std::string render(const LoopStats& loop) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> errors_;
  std::atomic<int64_t> connections_open_{0};
  std::atomic<uint64_t> connections_total_{0};
};

}  // namespace fl::server
