#pragma once
// An error answered to an HTTP client, in the OpenAI shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Request parsing and validation throw it; the route handlers turn it into the response. The
// message says what was wrong and, where it helps, how to fix it.
#include <fmt/format.h>

#include <exception>
#include <string>
#include <utility>

namespace fl::server {

class ApiError : public std::exception {
 public:
  ApiError(int status, std::string type, std::string message, std::string param = {}, std::string code = {})
      : status_(status),
        type_(std::move(type)),
        message_(std::move(message)),
        param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& message() const { return message_; }
  const std::string& param() const { return param_; }  // empty: null
  const std::string& code() const { return code_; }    // empty: null
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int status_;
  std::string type_, message_, param_, code_;
};

// 400 invalid_request_error naming `param`: invalid_param("temperature", "... {} ...", value).
template <typename... Args>
[[noreturn]] void invalid_param(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, "invalid_request_error", fmt::format(format, std::forward<Args>(args)...), std::move(param));
}

}  // namespace fl::server
