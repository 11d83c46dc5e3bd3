#include "text/chat/reasoning_parser.h"

namespace fl::chat {
namespace {

std::vector<std::string> all_markers(const ReasoningSyntax& s) {
  std::vector<std::string> m = s.open;
  m.insert(m.end(), s.close.begin(), s.close.end());
  m.insert(m.end(), s.drop.begin(), s.drop.end());
  return m;
}

}  // namespace

ReasoningSyntax ReasoningSyntax::gemma4() {
  ReasoningSyntax s;
  // The header's newline belongs to the marker, so reasoning text starts with the thought itself.
  s.open = {"<|channel>thought\n", "<|channel>thought"};
  s.close = {"<channel|>"};
  s.drop = {"<|channel>", "<|channel|>", "<|turn>", "<turn|>"};
  s.forced_close = "<channel|>";
  return s;
}

ReasoningSyntax ReasoningSyntax::think_tags() {
  ReasoningSyntax s;
  s.open = {"<think>\n", "<think>"};
  // Qwen writes "</think>\n\n" before the answer; the newlines are part of the separator.
  s.close = {"</think>\n\n", "</think>\n", "</think>"};
  s.forced_close = "\n</think>\n\n";
  return s;
}

bool starts_in_reasoning(std::string_view prompt, const ReasoningSyntax& syntax) {
  size_t last_open = std::string_view::npos, last_close = std::string_view::npos;
  for (const auto& m : syntax.open) {
    size_t p = prompt.rfind(m);
    if (p != std::string_view::npos && (last_open == std::string_view::npos || p > last_open)) last_open = p;
  }
  for (const auto& m : syntax.close) {
    size_t p = prompt.rfind(m);
    if (p != std::string_view::npos && (last_close == std::string_view::npos || p > last_close)) last_close = p;
  }
  if (last_open == std::string_view::npos) return false;
  return last_close == std::string_view::npos || last_open > last_close;
}

ReasoningParser::ReasoningParser(ReasoningSyntax syntax, bool start_in_reasoning, int64_t max_reasoning_tokens)
    : syntax_(std::move(syntax)),
      scanner_(all_markers(syntax_)),
      n_open_(syntax_.open.size()),
      n_close_(syntax_.open.size() + syntax_.close.size()),
      reasoning_(start_in_reasoning),
      max_reasoning_tokens_(max_reasoning_tokens) {}

void ReasoningParser::emit(std::vector<ChannelEvent>& out, ChannelEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text.append(text);
  } else {
    out.push_back({kind, std::string(text)});
  }
}

void ReasoningParser::on_marker(size_t index) {
  if (index < n_open_) {
    reasoning_ = true;
  } else if (index < n_close_) {
    reasoning_ = false;
  }
}

void ReasoningParser::feed(std::string_view piece, std::vector<ChannelEvent>& out) {
  bool counted = reasoning_;
  scanner_.feed(
      piece,
      [&](std::string_view text) {
        if (reasoning_) counted = true;
        emit(out, reasoning_ ? ChannelEvent::Kind::reasoning : ChannelEvent::Kind::answer, text);
      },
      [&](size_t index) {
        on_marker(index);
        if (reasoning_) counted = true;
      });
  if (counted) ++reasoning_tokens_;
}

void ReasoningParser::finish(std::vector<ChannelEvent>& out) {
  scanner_.finish(
      [&](std::string_view text) {
        emit(out, reasoning_ ? ChannelEvent::Kind::reasoning : ChannelEvent::Kind::answer, text);
      },
      [&](size_t index) { on_marker(index); });
}

std::string ReasoningParser::force_close(std::vector<ChannelEvent>& out) {
  if (!reasoning_) return {};
  scanner_.release_held([&](std::string_view text) { emit(out, ChannelEvent::Kind::reasoning, text); });
  reasoning_ = false;
  return syntax_.forced_close;
}

ReasoningParser::Split ReasoningParser::split(std::string_view text, const ReasoningSyntax& syntax,
                                              bool start_in_reasoning) {
  ReasoningParser parser(syntax, start_in_reasoning);
  std::vector<ChannelEvent> events;
  parser.feed(text, events);
  parser.finish(events);
  Split s;
  for (const auto& e : events) (e.kind == ChannelEvent::Kind::reasoning ? s.reasoning : s.answer) += e.text;
  return s;
}

}  // namespace fl::chat
