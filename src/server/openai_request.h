#pragma once
// OpenAI request bodies -> typed requests. Every rule a client can break is checked here and
// answered with a 400 ApiError that names the field (`param`) and says what was expected, so
// nothing past this point sees raw or unchecked JSON.
//
// Unknown fields are ignored (clients send `user`, `store`, `metadata`, ...); known fields with
// values fireline cannot honour (n > 1, unsupported JSON Schema keywords, image parts, ...) are refused
// rather than silently ignored.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine.h"
#include "server/prompt_frontend.h"

namespace fl::server {

// Limits on what one request may ask for (ServeConfig sets them).
struct RequestLimits {
  int max_json_depth = 64;         // nesting of arrays/objects in a body
  int max_object_members = 10000;  // members of one JSON object
  int max_stop_strings = 16;
  size_t max_stop_bytes = 256;  // per stop string
};

// Checks JSON text (a body, or JSON inside a string such as tool-call arguments) against the
// depth and object-size limits, and for NUL bytes (where the parser would stop reading), without
// parsing it; throws ApiError (400) naming `what`.
void check_json_shape(std::string_view text, const RequestLimits& limits, const std::string& what);

// Parses a request body: valid UTF-8, JSON, an object, nested at most `limits.max_json_depth`.
nlohmann::json parse_json_body(std::string_view body, const RequestLimits& limits);

// Fields /v1/chat/completions and /v1/completions share.
struct GenerationRequest {
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // unset: the rest of the context
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int logprobs = -1;           // GenerationTask::logprobs (-1: not asked for)
  int n = 1;                   // choices per prompt
};

// At most this many choices (n) per prompt.
inline constexpr size_t kMaxChoices = 16;

struct ChatRequest {
  ChatPrompt prompt;
  GenerationRequest generation;
  ToolChoice tool_choice;
  ResponseFormat response_format = ResponseFormat::text;
  std::shared_ptr<const JsonSchema> json_schema;  // ResponseFormat::json_schema: the compiled schema
  std::optional<int64_t> thinking_budget;  // explicit budget (fireline extension `thinking_budget`)
  std::optional<std::string> reasoning_effort;
};

struct CompletionPrompt {
  std::string text;                            // a text prompt, or
  std::optional<std::vector<int32_t>> tokens;  // token ids
};

// At most this many prompts in one /v1/completions request (each is a task of its own).
inline constexpr size_t kMaxCompletionPrompts = 64;

struct CompletionRequest {
  std::vector<CompletionPrompt> prompts;  // one, or up to kMaxCompletionPrompts
  GenerationRequest generation;
  bool echo = false;  // the prompt's text (and with logprobs its tokens' entries) first
};

// Sampling fields the request leaves out keep their value in `defaults` (the model's
// generation_config.json, when a real model is served); the seed is random unless given.
ChatRequest parse_chat_request(const nlohmann::json& body, const RequestLimits& limits,
                               const SamplingParams& defaults = {});
CompletionRequest parse_completion_request(const nlohmann::json& body, const RequestLimits& limits,
                                           const SamplingParams& defaults = {});

// The token budget of a request once its prompt is known. Throws ApiError (400, code
// context_length_exceeded where it applies) saying which limit is broken and by how much.
int64_t resolve_max_tokens(std::optional<int64_t> requested, int64_t prompt_tokens, int64_t context_length,
                           const std::string& prompt_param = "messages");

// Thinking options from enable_thinking, reasoning_effort and thinking_budget, checked against
// max_tokens (a budget must leave room for the answer). Throws ApiError for contradictions.
ThinkingOptions resolve_thinking(const ChatRequest& request, int64_t max_tokens);

}  // namespace fl::server
