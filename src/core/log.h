#pragma once
// Logging to stderr: one line per message, a level prefix, nothing when below the threshold.
// The threshold is set once at start-up (CLI --verbose / --quiet), not read from the environment.
#include <string_view>

#include <fmt/format.h>

namespace fl {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::debug) log_write(LogLevel::debug, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::info) log_write(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::warn) log_write(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() <= LogLevel::error) log_write(LogLevel::error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace fl
