#include "server/metrics.h"

#include <fmt/format.h>

#include "server/inference_loop.h"

namespace fl::server {

RateWindow::RateWindow(int seconds) : seconds_(seconds), buckets_(seconds, 0), head_s_(now_seconds()) {}

int64_t RateWindow::now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void RateWindow::advance(int64_t now_s) const {
  if (now_s <= head_s_) return;
  const int64_t gap = std::min<int64_t>(now_s - head_s_, seconds_);
  for (int64_t s = 1; s <= gap; ++s) buckets_[(head_s_ + s) % seconds_] = 0;
  head_s_ = now_s;
}

void RateWindow::add(int64_t n) {
  std::lock_guard lock(mutex_);
  advance(now_seconds());
  buckets_[head_s_ % seconds_] += n;
}

double RateWindow::per_second() const {
  std::lock_guard lock(mutex_);
  advance(now_seconds());
  int64_t total = 0;
  for (int64_t b : buckets_) total += b;
  return static_cast<double>(total) / seconds_;
}

void ServerMetrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
}

void ServerMetrics::count_error(const std::string& type) {
  std::lock_guard lock(mutex_);
  ++errors_[type];
}

std::string ServerMetrics::render(const LoopStats& loop) const {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  {
    std::lock_guard lock(mutex_);
    metric("fireline_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
    for (const auto& [key, n] : requests_)
      out += fmt::format("fireline_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    metric("fireline_errors_total", "counter", "Requests answered with an error, by OpenAI error type.");
    for (const auto& [type, n] : errors_) out += fmt::format("fireline_errors_total{{type=\"{}\"}} {}\n", type, n);
  }
  metric("fireline_connections_open", "gauge", "HTTP connections open now.");
  out += fmt::format("fireline_connections_open {}\n", connections_open_.load());
  metric("fireline_connections_total", "counter", "HTTP connections accepted.");
  out += fmt::format("fireline_connections_total {}\n", connections_total_.load());
  metric("fireline_queue_depth", "gauge", "Generation tasks waiting for a slot.");
  out += fmt::format("fireline_queue_depth {}\n", loop.waiting);
  metric("fireline_running_tasks", "gauge", "Generation tasks inside the engine.");
  out += fmt::format("fireline_running_tasks {}\n", loop.running);
  metric("fireline_tasks_total", "counter", "Generation tasks by outcome.");
  out += fmt::format("fireline_tasks_total{{outcome=\"submitted\"}} {}\n", loop.submitted);
  out += fmt::format("fireline_tasks_total{{outcome=\"refused\"}} {}\n", loop.refused);
  out += fmt::format("fireline_tasks_total{{outcome=\"finished\"}} {}\n", loop.finished);
  out += fmt::format("fireline_tasks_total{{outcome=\"cancelled\"}} {}\n", loop.cancelled);
  out += fmt::format("fireline_tasks_total{{outcome=\"failed\"}} {}\n", loop.failed);
  metric("fireline_prompt_tokens_total", "counter", "Prompt tokens of finished tasks.");
  out += fmt::format("fireline_prompt_tokens_total {}\n", loop.prompt_tokens);
  metric("fireline_generated_tokens_total", "counter", "Tokens generated.");
  out += fmt::format("fireline_generated_tokens_total {}\n", loop.generated_tokens);
  metric("fireline_generated_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.");
  out += fmt::format("fireline_generated_tokens_per_second {:.3f}\n", loop.tokens_per_second);
  return out;
}

}  // namespace fl::server
