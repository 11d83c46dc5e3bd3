#pragma once
// The prompt side of a request, done on the HTTP worker: a validated conversation (ChatPrompt)
// becomes prompt text through the model's chat template, then token ids. A PromptFrontend is
// shared by all HTTP workers, so its methods must be safe to call from several threads at once.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine.h"

namespace fl::server {

struct ChatToolCall {  // an assistant message's earlier tool call (conversation history)
  std::string id;
  std::string name;
  std::string arguments_json;  // as the client sent it (usually a JSON object in a string)
};

struct ChatMessage {
  std::string role;                    // system, developer, user, assistant, tool
  std::optional<std::string> content;  // text parts joined; nullopt: null (assistant with tool calls)
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;  // role tool
  std::string name;          // optional participant / tool name
};

struct ChatPrompt {
  std::vector<ChatMessage> messages;  // never empty
  std::vector<ToolDefinition> tools;  // empty: none (also when tool_choice is "none")
  std::optional<bool> enable_thinking;
  // Other chat_template_kwargs, passed to the template as variables (an object, maybe empty).
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

struct PreparedPrompt {
  std::string text;
  std::vector<int32_t> tokens;  // may stay empty for a frontend that does not tokenize
  int64_t token_count = 0;      // counts toward the context and usage.prompt_tokens
};

class PromptFrontend {
 public:
  virtual ~PromptFrontend() = default;
  // Throws ApiError (400) for a conversation the template cannot render, naming why.
  virtual PreparedPrompt render_chat(const ChatPrompt& chat) const = 0;
  // /v1/completions with a text prompt.
  virtual PreparedPrompt prepare_text(std::string_view text) const = 0;
  // /v1/completions with token ids; throws ApiError (400) for ids outside the vocabulary.
  virtual PreparedPrompt prepare_tokens(std::span<const int32_t> ids) const = 0;
};

}  // namespace fl::server
