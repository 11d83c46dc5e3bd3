#include "runtime/text_stream.h"

#include <algorithm>
#include <span>

#include "core/error.h"

namespace fl {

std::vector<std::string> token_bytes_table(const Tokenizer& tokenizer, int32_t vocab_size) {
  std::vector<std::string> texts(static_cast<size_t>(std::max(vocab_size, 0)));
  for (int32_t t = 0; t < vocab_size && t < tokenizer.vocab_size(); ++t)
    if (!tokenizer.is_special(t)) texts[static_cast<size_t>(t)] = tokenizer.token_bytes(t);
  return texts;
}
namespace {

std::vector<std::string> tool_markers(chat::ToolCallFormat format) {
  if (format == chat::ToolCallFormat::gemma4)
    return {"<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|\"|>"};
  return {"<tool_call>", "</tool_call>"};
}

}  // namespace

TextStream::TextStream(Tokenizer tokenizer, TextStreamOptions options)
    : tokenizer_(std::move(tokenizer)), detok_(tokenizer_, /*skip_special_tokens=*/false), stop_(std::move(options.stop)) {
  std::vector<std::string> markers;
  if (options.reasoning) {
    const chat::ReasoningSyntax& s = *options.reasoning;
    for (const auto* list : {&s.open, &s.close, &s.drop}) markers.insert(markers.end(), list->begin(), list->end());
    reasoning_.emplace(*options.reasoning, options.start_in_reasoning, options.max_reasoning_tokens);
  }
  if (options.tool_calls) {
    for (auto& m : tool_markers(*options.tool_calls)) markers.push_back(std::move(m));
    tools_.emplace(*options.tool_calls, std::move(options.tools));
  }
  for (const auto& m : markers)
    for (int32_t id : tokenizer_.encode(m, /*add_special_tokens=*/false))
      if (tokenizer_.is_special(id)) marker_ids_.insert(id);
}

void TextStream::append(std::vector<TextEvent>& out, TextEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != TextEvent::Kind::tool_call) {
    out.back().text.append(text);
  } else {
    out.push_back({kind, std::string(text), {}});
  }
}

void TextStream::content(std::string_view text, std::vector<TextEvent>& out) {
  if (!tools_) {
    append(out, TextEvent::Kind::content, text);
    return;
  }
  std::vector<chat::ToolCallEvent> events;
  tools_->feed(text, events);
  for (auto& e : events) {
    if (e.kind == chat::ToolCallEvent::Kind::text) {
      append(out, TextEvent::Kind::content, e.text);
    } else {
      out.push_back({TextEvent::Kind::tool_call, {}, std::move(e.call)});
    }
  }
}

void TextStream::route(const std::vector<chat::ChannelEvent>& events, std::vector<TextEvent>& out) {
  for (const auto& e : events) {
    if (e.kind == chat::ChannelEvent::Kind::reasoning) {
      append(out, TextEvent::Kind::reasoning, e.text);
    } else {
      content(e.text, out);
    }
  }
}

void TextStream::push(int32_t id, std::vector<TextEvent>& out) {
  if (finished_ || stop_.matched()) return;
  std::string piece;
  // Other special tokens (<bos>, <pad>, image placeholders, ...) are not text a person reads.
  if (!tokenizer_.is_special(id) || marker_ids_.count(id)) piece = detok_.push(id);
  std::string released = stop_.feed(piece);
  if (reasoning_) {
    scratch_.clear();
    reasoning_->feed(released, scratch_);  // once per token, even when empty: it counts thought tokens
    reasoning_tokens_ = reasoning_->reasoning_tokens();
    route(scratch_, out);
  } else {
    content(released, out);
  }
}

std::string TextStream::close_reasoning(std::vector<TextEvent>& out) {
  if (!reasoning_ || !reasoning_->in_reasoning()) return {};
  scratch_.clear();
  // Text still held for a possible stop string belongs to the thought being closed.
  std::string held = stop_.flush();
  if (!held.empty()) reasoning_->feed(held, scratch_);
  std::string inject = reasoning_->force_close(scratch_);
  route(scratch_, out);
  return inject;
}

void TextStream::finish(std::vector<TextEvent>& out) {
  if (finished_) return;
  finished_ = true;
  // After a stop string nothing more is text: what the detokenizer still holds came after it.
  std::string tail = stop_.matched() ? std::string() : stop_.feed(detok_.finish());
  if (!stop_.matched()) tail += stop_.flush();
  if (reasoning_) {
    scratch_.clear();
    if (!tail.empty()) reasoning_->feed(tail, scratch_);
    reasoning_->finish(scratch_);
    route(scratch_, out);
  } else {
    content(tail, out);
  }
  if (tools_) {
    std::vector<chat::ToolCallEvent> events;
    tools_->finish(events);
    for (auto& e : events) {
      if (e.kind == chat::ToolCallEvent::Kind::text) {
        append(out, TextEvent::Kind::content, e.text);
      } else {
        out.push_back({TextEvent::Kind::tool_call, {}, std::move(e.call)});
      }
    }
  }
}

std::vector<std::string> TextStream::tool_call_errors() const { return tools_ ? tools_->errors() : std::vector<std::string>{}; }

}  // namespace fl
