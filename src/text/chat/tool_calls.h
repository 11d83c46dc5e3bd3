#pragma once
// Tool calls in model output -> OpenAI `tool_calls`.
//
// Gemma 4 writes `<|tool_call>call:NAME{key:value,...}<tool_call|>`: the exact inverse of what its
// chat template writes for history (format_argument with escape_keys=False): bare keys, strings
// quoted with `<|"|>` and not escaped, nested {...} and [...], numbers as Python prints them,
// true/false, null (older templates print None). Keys inside may also be `<|"|>`-quoted.
// Qwen writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (JSON), and Qwen3.5 /
// Qwen3-Coder `<tool_call><function=NAME><parameter=KEY>\nVALUE\n</parameter></function></tool_call>`;
// both are accepted inside <tool_call>. XML parameter values are typed by the tool's JSON schema
// when the tools are known (a "string" parameter stays a string), else parsed as JSON when they
// are valid JSON.
//
// Malformed calls are left in the content as the text the model wrote (nothing is lost, nothing
// half-parsed is executed) and reported in `errors`; an unterminated call at the end of the stream
// is treated the same way.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat/marker_scanner.h"

namespace fl::chat {

enum class ToolCallFormat { gemma4, qwen };

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

// Parse the text between the markers; throw fl::Error naming what is wrong.
ToolCall parse_gemma4_tool_call(std::string_view body);
ToolCall parse_qwen_tool_call(std::string_view body, const nlohmann::ordered_json& tools = nullptr);

struct ToolCallEvent {
  enum class Kind { text, call };
  Kind kind;
  std::string text;  // kind == text
  ToolCall call;     // kind == call
};

// Streaming: passes text through and withholds tool-call blocks until they are complete.
class ToolCallExtractor {
 public:
  explicit ToolCallExtractor(ToolCallFormat format, nlohmann::ordered_json tools = nullptr);
  void feed(std::string_view text, std::vector<ToolCallEvent>& out);
  void finish(std::vector<ToolCallEvent>& out);
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  void text(std::vector<ToolCallEvent>& out, std::string_view t);
  void marker(std::vector<ToolCallEvent>& out, size_t index);

  ToolCallFormat format_;
  nlohmann::ordered_json tools_;
  MarkerScanner scanner_;
  bool inside_ = false;
  std::string body_;
  std::vector<std::string> errors_;
};

// A fresh id for a tool call: 9 random ASCII letters and digits (the form Mistral's templates
// require; OpenAI accepts any string).
std::string make_tool_call_id();

struct ParsedToolCalls {
  std::string content;                 // the text outside tool calls (malformed calls stay here)
  nlohmann::ordered_json tool_calls;   // [{"id","type":"function","function":{"name","arguments"}}]
  std::vector<std::string> errors;
};

// Whole-text convenience. `make_id` defaults to make_tool_call_id.
ParsedToolCalls extract_tool_calls(std::string_view text, ToolCallFormat format,
                                   const nlohmann::ordered_json& tools = nullptr,
                                   const std::function<std::string()>& make_id = {});

// One OpenAI tool_calls entry; arguments become a compact JSON string.
nlohmann::ordered_json to_openai_tool_call(const ToolCall& call, const std::string& id);

}  // namespace fl::chat
