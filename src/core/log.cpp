#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace fl {
namespace {
std::atomic<LogLevel> g_level{LogLevel::info};
std::mutex g_write_mutex;  // keeps lines from different threads whole
}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

void log_write(LogLevel level, std::string_view message) {
  static constexpr const char* kPrefix[] = {"debug", "info", "warning", "error", ""};
  std::lock_guard lock(g_write_mutex);
  std::fprintf(stderr, "fireline %s: %.*s\n", kPrefix[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace fl
