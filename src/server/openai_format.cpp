#include "server/openai_format.h"

namespace fl::server {
namespace {

using nlohmann::ordered_json;

// Engine text is valid UTF-8 by contract; replacing rather than throwing keeps one bad piece from
// failing a response.
std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

ordered_json null_or(const std::string& s) { return s.empty() ? ordered_json(nullptr) : ordered_json(s); }

ordered_json tool_call_json(const ToolCallOutput& call) {
  return {
      {"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments_json}}}};
}

double per_second(int64_t n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; }

}  // namespace

void CollectedOutput::add(const EngineEvent& event) {
  switch (event.kind) {
    case EngineEvent::Kind::reasoning:
      reasoning += event.text;
      break;
    case EngineEvent::Kind::content:
      content += event.text;
      break;
    case EngineEvent::Kind::tool_call:
      tool_calls.push_back(event.tool_call);
      break;
    case EngineEvent::Kind::finish:
      finished = true;
      finish_reason = event.finish_reason;
      usage = event.usage;
      timings = event.timings;
      error = event.error;
      break;
  }
}

std::string error_body(const ApiError& error) {
  ordered_json j = {{"error",
                     {{"message", error.message()},
                      {"type", error.type()},
                      {"param", null_or(error.param())},
                      {"code", null_or(error.code())}}}};
  return dump(j);
}

ordered_json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}}};
}

ordered_json timings_json(const Timings& t, const Usage& usage) {
  const int64_t prompt_n = usage.prompt_tokens - usage.cached_prompt_tokens;
  return {{"queue_ms", t.queue_ms},
          {"cache_n", usage.cached_prompt_tokens},
          {"prompt_n", prompt_n},
          {"prompt_ms", t.prompt_ms},
          {"prompt_per_second", per_second(prompt_n, t.prompt_ms)},
          {"predicted_n", usage.completion_tokens},
          {"predicted_ms", t.generation_ms},
          {"predicted_per_second", per_second(usage.completion_tokens, t.generation_ms)}};
}

std::string chat_completion_body(const ResponseMeta& meta, const CollectedOutput& out) {
  ordered_json message = {{"role", "assistant"}};
  message["content"] =
      out.content.empty() && !out.tool_calls.empty() ? ordered_json(nullptr) : ordered_json(out.content);
  if (!out.reasoning.empty()) message["reasoning_content"] = out.reasoning;
  if (!out.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& c : out.tool_calls) calls.push_back(tool_call_json(c));
    message["tool_calls"] = std::move(calls);
  }
  ordered_json j = {{"id", meta.id},
                    {"object", "chat.completion"},
                    {"created", meta.created},
                    {"model", meta.model},
                    {"choices", ordered_json::array({{{"index", 0},
                                                      {"message", std::move(message)},
                                                      {"logprobs", nullptr},
                                                      {"finish_reason", finish_reason_name(out.finish_reason)}}})},
                    {"usage", usage_json(out.usage)},
                    {"timings", timings_json(out.timings, out.usage)}};
  return dump(j);
}

std::string text_completion_body(const ResponseMeta& meta, const CollectedOutput& out) {
  ordered_json j = {{"id", meta.id},
                    {"object", "text_completion"},
                    {"created", meta.created},
                    {"model", meta.model},
                    {"choices", ordered_json::array({{{"index", 0},
                                                      {"text", out.content},
                                                      {"logprobs", nullptr},
                                                      {"finish_reason", finish_reason_name(out.finish_reason)}}})},
                    {"usage", usage_json(out.usage)},
                    {"timings", timings_json(out.timings, out.usage)}};
  return dump(j);
}

std::string sse_data(const ordered_json& payload) { return "data: " + dump(payload) + "\n\n"; }

ordered_json StreamFormatter::chunk(ordered_json choice) const {
  ordered_json j = {{"id", meta_.id},
                    {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                    {"created", meta_.created},
                    {"model", meta_.model},
                    {"choices", ordered_json::array({std::move(choice)})}};
  if (include_usage_) j["usage"] = nullptr;  // OpenAI: null on every chunk but the last
  return j;
}

std::string StreamFormatter::begin() {
  if (!chat_) return {};
  return sse_data(chunk({{"index", 0},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}}));
}

std::string StreamFormatter::event(const EngineEvent& e) {
  if (!chat_) {
    if (e.kind != EngineEvent::Kind::content || e.text.empty()) return {};
    return sse_data(chunk({{"index", 0}, {"text", e.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  }
  ordered_json delta;
  switch (e.kind) {
    case EngineEvent::Kind::reasoning:
      if (e.text.empty()) return {};
      delta = {{"reasoning_content", e.text}};
      break;
    case EngineEvent::Kind::content:
      if (e.text.empty()) return {};
      delta = {{"content", e.text}};
      break;
    case EngineEvent::Kind::tool_call: {
      ordered_json call = {{"index", tool_calls_++}};
      const ordered_json fields = tool_call_json(e.tool_call);
      for (const auto& [key, value] : fields.items()) call[key] = value;
      delta = {{"tool_calls", ordered_json::array({std::move(call)})}};
      break;
    }
    case EngineEvent::Kind::finish:
      return {};
  }
  return sse_data(
      chunk({{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
}

std::string StreamFormatter::finish(const EngineEvent& e) {
  std::string out;
  ordered_json choice = {{"index", 0}};
  if (chat_)
    choice["delta"] = ordered_json::object();
  else
    choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason_name(e.finish_reason);
  ordered_json last = chunk(std::move(choice));
  if (!include_usage_) last["timings"] = timings_json(e.timings, e.usage);
  out += sse_data(last);
  if (include_usage_) {
    ordered_json usage = {{"id", meta_.id},
                          {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                          {"created", meta_.created},
                          {"model", meta_.model},
                          {"choices", ordered_json::array()},
                          {"usage", usage_json(e.usage)},
                          {"timings", timings_json(e.timings, e.usage)}};
    out += sse_data(usage);
  }
  out += kSseDone;
  return out;
}

}  // namespace fl::server
