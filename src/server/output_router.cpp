#include "server/output_router.h"

namespace fl::server {
namespace {

void append(std::vector<EngineEvent>& out, EngineEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != EngineEvent::Kind::tool_call) {
    out.back().text.append(text);
    return;
  }
  out.push_back(kind == EngineEvent::Kind::reasoning ? EngineEvent::reasoning(std::string(text))
                                                     : EngineEvent::content(std::string(text)));
}

}  // namespace

OutputRouter::OutputRouter(const GenerationTask& task, OutputSyntax syntax) : raw_(task.kind == TaskKind::completion) {
  if (raw_) return;
  const bool start_inside = chat::starts_in_reasoning(task.prompt_text, syntax.reasoning);
  reasoning_.emplace(std::move(syntax.reasoning), start_inside, task.thinking.budget_tokens);
  if (syntax.tool_calls && !task.tools.empty() && task.tool_choice.mode != ToolChoice::Mode::none) {
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
    for (const auto& t : task.tools) {
      auto params = nlohmann::ordered_json::parse(t.parameters_json, nullptr, false);
      tools.push_back(
          {{"type", "function"},
           {"function",
            {{"name", t.name}, {"parameters", params.is_discarded() ? nlohmann::ordered_json::object() : params}}}});
    }
    tools_.emplace(*syntax.tool_calls, std::move(tools));
  }
}

void OutputRouter::feed(std::string_view piece, std::vector<EngineEvent>& out) {
  if (raw_) {
    append(out, EngineEvent::Kind::content, piece);
    return;
  }
  std::vector<chat::ChannelEvent> channel;
  reasoning_->feed(piece, channel);
  route(channel, out);
}

void OutputRouter::finish(std::vector<EngineEvent>& out) {
  if (raw_) return;
  std::vector<chat::ChannelEvent> channel;
  reasoning_->finish(channel);
  route(channel, out);
  if (tools_) {
    std::vector<chat::ToolCallEvent> events;
    tools_->finish(events);
    tool_events(events, out);
  }
}

bool OutputRouter::reasoning_cap_reached() const { return !raw_ && reasoning_->cap_reached(); }

std::string OutputRouter::close_reasoning(std::vector<EngineEvent>& out) {
  if (raw_) return {};
  std::vector<chat::ChannelEvent> channel;
  std::string inject = reasoning_->force_close(channel);
  route(channel, out);
  return inject;
}

int64_t OutputRouter::reasoning_tokens() const { return raw_ ? 0 : reasoning_->reasoning_tokens(); }

std::vector<std::string> OutputRouter::tool_call_errors() const {
  return tools_ ? tools_->errors() : std::vector<std::string>{};
}

void OutputRouter::route(const std::vector<chat::ChannelEvent>& channel, std::vector<EngineEvent>& out) {
  for (const auto& e : channel) {
    if (e.kind == chat::ChannelEvent::Kind::reasoning)
      append(out, EngineEvent::Kind::reasoning, e.text);
    else
      answer(e.text, out);
  }
}

void OutputRouter::answer(std::string_view text, std::vector<EngineEvent>& out) {
  if (!tools_) {
    append(out, EngineEvent::Kind::content, text);
    return;
  }
  std::vector<chat::ToolCallEvent> events;
  tools_->feed(text, events);
  tool_events(events, out);
}

void OutputRouter::tool_events(const std::vector<chat::ToolCallEvent>& events, std::vector<EngineEvent>& out) {
  for (const auto& e : events) {
    if (e.kind == chat::ToolCallEvent::Kind::text) {
      append(out, EngineEvent::Kind::content, e.text);
      continue;
    }
    called_tools_ = true;
    const std::string args = e.call.arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    out.push_back(EngineEvent::tool({"call_" + chat::make_tool_call_id(), e.call.name, args}));
  }
}

}  // namespace fl::server
