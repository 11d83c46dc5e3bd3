// Fuzzes request validation, the part of the server that reads untrusted bytes: a body goes
// through parse_json_body and then the chat and the completions parsers. Every input must end in
// a typed request or an ApiError with a 4xx status; anything else (a crash, another exception, a
// 5xx) is a bug. Accepted chat requests are also rendered by the fake frontend and checked
// against a context, as the route does.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"
#include "server/fake_engine.h"
#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const fl::server::RequestLimits limits;
  auto expect_client_error = [](const fl::server::ApiError& e) {
    if (e.status() < 400 || e.status() >= 500 || e.message().empty()) std::abort();
  };
  nlohmann::json j;
  try {
    j = fl::server::parse_json_body(body, limits);
  } catch (const fl::server::ApiError& e) {
    expect_client_error(e);
    return 0;
  }
  try {
    auto chat = fl::server::parse_chat_request(j, limits);
    const auto prompt = fl::server::FakePromptFrontend().render_chat(chat.prompt);
    const int64_t max_tokens = fl::server::resolve_max_tokens(chat.generation.max_tokens, prompt.token_count, 4096);
    fl::server::resolve_thinking(chat, max_tokens);
  } catch (const fl::server::ApiError& e) {
    expect_client_error(e);
  }
  try {
    fl::server::parse_completion_request(j, limits);
  } catch (const fl::server::ApiError& e) {
    expect_client_error(e);
  }
  return 0;
}
