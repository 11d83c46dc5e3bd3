#pragma once
// Splits streamed model output into reasoning and answer text.
//
// Gemma 4 thinks in a channel: `<|channel>thought\n ...reasoning... <channel|>answer`. The model
// opens the channel itself when thinking is on; with thinking off the 26B/31B templates pre-fill an
// empty closed block, so output starts as answer. Stray control markers (`<|channel>` without
// "thought", `<channel|>` with nothing open, `<|turn>`, `<turn|>`) never reach either stream.
// Qwen3.5 / DeepSeek-R1 style: `...reasoning...</think>\n\nanswer`; the prompt already ends with
// `<think>\n` when thinking is on, so output starts inside reasoning (starts_in_reasoning()).
//
// Every marker is recognised in every state (a repeated opener inside reasoning or an orphan
// closer in the answer is simply removed), so the text emitted is always the input minus the
// markers, whatever the chunking; only the routing depends on state. Hold-back is MarkerScanner's:
// only a possible marker prefix is held, and finish() releases it.
//
// Thinking cap: with max_reasoning_tokens > 0, feed() counts one token per call while reasoning;
// once cap_reached(), the caller calls force_close(), injects the returned text (e.g. "<channel|>"
// or "\n</think>\n\n") into the model's context so that it continues with an answer, and does
// not feed that text back to this parser.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat/marker_scanner.h"

namespace fl::chat {

struct ChannelEvent {
  enum class Kind { reasoning, answer };
  Kind kind;
  std::string text;
  bool operator==(const ChannelEvent& o) const { return kind == o.kind && text == o.text; }
};

struct ReasoningSyntax {
  std::vector<std::string> open;   // start reasoning (removed)
  std::vector<std::string> close;  // end reasoning (removed)
  std::vector<std::string> drop;   // removed wherever they appear, state unchanged
  std::string forced_close;        // injected by the caller when the cap closes reasoning

  static ReasoningSyntax gemma4();
  static ReasoningSyntax think_tags();  // <think> ... </think> (Qwen3.5, DeepSeek-R1, ...)
};

// True when `prompt` leaves generation inside an open reasoning block (its last opener comes
// after its last closer), e.g. a Qwen3.5 prompt ending in "<think>\n".
bool starts_in_reasoning(std::string_view prompt, const ReasoningSyntax& syntax);

class ReasoningParser {
 public:
  ReasoningParser(ReasoningSyntax syntax, bool start_in_reasoning, int64_t max_reasoning_tokens = 0);

  // One decoded piece (usually one token's text). Appends events; adjacent events of one kind
  // from the same call are merged.
  void feed(std::string_view piece, std::vector<ChannelEvent>& out);
  // End of stream: releases everything held.
  void finish(std::vector<ChannelEvent>& out);

  bool in_reasoning() const { return reasoning_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  bool cap_reached() const { return max_reasoning_tokens_ > 0 && reasoning_ && reasoning_tokens_ >= max_reasoning_tokens_; }
  // Ends reasoning now (held text goes out as reasoning) and returns the text to inject.
  std::string force_close(std::vector<ChannelEvent>& out);

  // Whole-text convenience for non-streaming responses.
  struct Split {
    std::string reasoning, answer;
  };
  static Split split(std::string_view text, const ReasoningSyntax& syntax, bool start_in_reasoning);

 private:
  void emit(std::vector<ChannelEvent>& out, ChannelEvent::Kind kind, std::string_view text);
  void on_marker(size_t index);

  ReasoningSyntax syntax_;
  MarkerScanner scanner_;
  size_t n_open_, n_close_;  // marker index ranges: [0, n_open) open, [n_open, n_close) close, rest drop
  bool reasoning_;
  int64_t max_reasoning_tokens_;
  int64_t reasoning_tokens_ = 0;
};

}  // namespace fl::chat
