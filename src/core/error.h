#pragma once
// Errors: every failure a user can cause (bad files, bad flags, bad input) is an fl::Error whose
// message says what was wrong and where, in one line. Modules throw it; the CLI and the server
// catch it at their boundary and print or return the message. Internal invariants use
// FL_ASSERT, which also throws (never aborts) so that a bug in one request cannot take the
// server down.
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace fl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// fail("tensor {} has {} dims", name, n): throws fl::Error with the formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void assert_failed(const char* condition, const char* file, int line);

}  // namespace fl

// Invariant that only a bug can break; names the condition and the source line.
#define FL_ASSERT(cond) \
  do {                  \
    if (!(cond)) ::fl::assert_failed(#cond, __FILE__, __LINE__); \
  } while (0)
