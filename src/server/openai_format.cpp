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

ordered_json byte_values(const std::string& bytes) {
  ordered_json out = ordered_json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

ordered_json chat_logprob_entry(const LogprobEntry& e) {
  return {{"token", e.token}, {"logprob", e.logprob}, {"bytes", byte_values(e.bytes)}};
}

// {"content": [...], "refusal": null}: chat's log-probabilities of `entries`.
ordered_json chat_logprobs(const std::vector<TokenLogprobOutput>& entries) {
  ordered_json content = ordered_json::array();
  for (const TokenLogprobOutput& t : entries) {
    ordered_json entry = chat_logprob_entry(t.chosen);
    ordered_json top = ordered_json::array();
    for (const LogprobEntry& alt : t.top) top.push_back(chat_logprob_entry(alt));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// The legacy completions object; text_offset counts the bytes the tokens before each one add to
// the text (special tokens none), from `offset` (advanced past these entries).
ordered_json completion_logprobs(const std::vector<TokenLogprobOutput>& entries, int64_t& offset) {
  ordered_json tokens = ordered_json::array(), values = ordered_json::array(), top = ordered_json::array(),
               offsets = ordered_json::array();
  for (const TokenLogprobOutput& t : entries) {
    tokens.push_back(t.chosen.token);
    if (!t.has_logprob) {  // an echoed prompt's first token
      values.push_back(nullptr);
      top.push_back(nullptr);
    } else {
      values.push_back(t.chosen.logprob);
      ordered_json alternatives = ordered_json::object();
      for (const LogprobEntry& alt : t.top)
        if (!alternatives.contains(alt.token))
          alternatives[alt.token] = alt.logprob;  // (the likelier of two spellings)
      top.push_back(std::move(alternatives));
    }
    offsets.push_back(offset);
    if (!t.chosen.special) offset += static_cast<int64_t>(t.chosen.bytes.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

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
    case EngineEvent::Kind::logprob: logprobs.push_back(event.logprob); break;
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

std::pair<Usage, Timings> summed_usage(std::span<const CollectedOutput> outs, size_t per_prompt) {
  Usage usage;
  Timings timings;
  for (size_t i = 0; i < outs.size(); ++i) {
    const CollectedOutput& out = outs[i];
    if (i % per_prompt == 0) {
      usage.prompt_tokens += out.usage.prompt_tokens;
      usage.cached_prompt_tokens += out.usage.cached_prompt_tokens;
    }
    usage.completion_tokens += out.usage.completion_tokens;
    usage.reasoning_tokens += out.usage.reasoning_tokens;
    timings.queue_ms += out.timings.queue_ms;
    timings.prompt_ms += out.timings.prompt_ms;
    timings.generation_ms += out.timings.generation_ms;
  }
  return {usage, timings};
}

namespace {

ordered_json response(const ResponseMeta& meta, const char* object, ordered_json choices,
                      std::span<const CollectedOutput> outs, size_t per_prompt) {
  const auto [usage, timings] = summed_usage(outs, per_prompt);
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(usage)},
          {"timings", timings_json(timings, usage)}};
}

}  // namespace

std::string chat_completion_body(const ResponseMeta& meta, std::span<const CollectedOutput> outs, size_t per_prompt) {
  ordered_json choices = ordered_json::array();
  for (size_t i = 0; i < outs.size(); ++i) {
    const CollectedOutput& out = outs[i];
    ordered_json message = {{"role", "assistant"}};
    message["content"] =
        out.content.empty() && !out.tool_calls.empty() ? ordered_json(nullptr) : ordered_json(out.content);
    if (!out.reasoning.empty()) message["reasoning_content"] = out.reasoning;
    if (!out.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& c : out.tool_calls) calls.push_back(tool_call_json(c));
      message["tool_calls"] = std::move(calls);
    }
    choices.push_back({{"index", i},
                       {"message", std::move(message)},
                       {"logprobs", meta.logprobs ? chat_logprobs(out.logprobs) : ordered_json(nullptr)},
                       {"finish_reason", finish_reason_name(out.finish_reason)}});
  }
  return dump(response(meta, "chat.completion", std::move(choices), outs, per_prompt));
}

std::string text_completion_body(const ResponseMeta& meta, std::span<const CollectedOutput> outs, size_t per_prompt) {
  ordered_json choices = ordered_json::array();
  for (size_t i = 0; i < outs.size(); ++i) {
    const CollectedOutput& out = outs[i];
    int64_t offset = 0;
    choices.push_back({{"index", i},
                       {"text", out.content},
                       {"logprobs", meta.logprobs ? completion_logprobs(out.logprobs, offset) : ordered_json(nullptr)},
                       {"finish_reason", finish_reason_name(out.finish_reason)}});
  }
  return dump(response(meta, "text_completion", std::move(choices), outs, per_prompt));
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
  return sse_data(chunk({{"index", index_},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}}));
}

ordered_json StreamFormatter::take_logprobs() {
  if (!meta_.logprobs) return nullptr;
  ordered_json out = chat_ ? chat_logprobs(pending_logprobs_) : completion_logprobs(pending_logprobs_, text_offset_);
  pending_logprobs_.clear();
  return out;
}

std::string StreamFormatter::event(const EngineEvent& e) {
  if (e.kind == EngineEvent::Kind::logprob) {  // sent with the next chunk that carries text
    pending_logprobs_.push_back(e.logprob);
    return {};
  }
  if (!chat_) {
    if (e.kind != EngineEvent::Kind::content || e.text.empty()) return {};
    return sse_data(
        chunk({{"index", index_}, {"text", e.text}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
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
    case EngineEvent::Kind::logprob:
    case EngineEvent::Kind::finish:
      return {};
  }
  return sse_data(chunk(
      {{"index", index_}, {"delta", std::move(delta)}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
}

std::string StreamFormatter::finish_choice(const EngineEvent& e) {
  ordered_json choice = {{"index", index_}};
  if (chat_)
    choice["delta"] = ordered_json::object();
  else
    choice["text"] = "";
  // the entries of tokens whose text never came (held back by a stop string, or all whitespace)
  choice["logprobs"] = pending_logprobs_.empty() ? ordered_json(nullptr) : take_logprobs();
  choice["finish_reason"] = finish_reason_name(e.finish_reason);
  ordered_json last = chunk(std::move(choice));
  if (!include_usage_) last["timings"] = timings_json(e.timings, e.usage);
  return sse_data(last);
}

std::string StreamFormatter::end(const Usage& usage, const Timings& timings) const {
  std::string out;
  if (include_usage_) {
    ordered_json j = {{"id", meta_.id},
                      {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                      {"created", meta_.created},
                      {"model", meta_.model},
                      {"choices", ordered_json::array()},
                      {"usage", usage_json(usage)},
                      {"timings", timings_json(timings, usage)}};
    out += sse_data(j);
  }
  out += kSseDone;
  return out;
}

}  // namespace fl::server
