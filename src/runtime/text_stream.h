#pragma once
// The text side of one generation: generated token ids in, typed text events out.
//
//   id -> streaming detokenizer -> stop strings -> reasoning parser -> tool-call extractor
//
// - Special tokens are dropped, except those that spell a reasoning or tool-call marker (Gemma 4's
//   <|channel>, <channel|>, <|tool_call>, ...), which the parsers consume.
// - Stop strings are matched in the model's whole output text (markers and reasoning included),
//   across token boundaries; a stop string and everything after it is never emitted.
// - Reasoning tokens are counted one per push while the model is inside a thought; once the cap
//   is reached, the token engine asks close_reasoning() for the text to inject (Gemma 4:
//   "<channel|>") and feeds its tokens to the model without pushing them here.
//
// It knows nothing about the model or timing, so a server can run it on a worker thread per
// stream while one thread drives the token engine.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/stop_conditions.h"
#include "text/chat/reasoning_parser.h"
#include "text/chat/tool_calls.h"
#include "text/tokenizer/tokenizer.h"

namespace fl {
// Each id below vocab_size as the raw bytes it adds to the text (Tokenizer::token_bytes: a byte
// token that is part of a UTF-8 character gives that byte); "" for special tokens and ids past
// the tokenizer's. What JSON mode (json_prefix.h) feeds its checker, token by token.
std::vector<std::string> token_bytes_table(const Tokenizer& tokenizer, int32_t vocab_size);

struct TextEvent {
  enum class Kind { reasoning, content, tool_call };
  Kind kind;
  std::string text;    // reasoning / content
  chat::ToolCall call;  // tool_call
};

struct TextStreamOptions {
  std::vector<std::string> stop;                   // stop strings
  std::optional<chat::ReasoningSyntax> reasoning;  // nullopt: all text is content
  bool start_in_reasoning = false;                 // the prompt opened a thought
  int64_t max_reasoning_tokens = 0;                // 0: no cap
  std::optional<chat::ToolCallFormat> tool_calls;  // nullopt: tool-call markup stays content
  nlohmann::ordered_json tools;                    // the request's tools (types XML parameters)
};

class TextStream {
 public:
  TextStream(Tokenizer tokenizer, TextStreamOptions options);

  // One generated token (never an EOS: the engine stops before). Appends the events it completes.
  void push(int32_t id, std::vector<TextEvent>& out);
  // End of generation: releases everything held (a partial stop string that never completed, a
  // partial marker, an unfinished UTF-8 sequence) and ends any open tool call.
  void finish(std::vector<TextEvent>& out);

  bool stop_matched() const { return stop_.matched(); }
  const std::string& matched_stop() const { return stop_.matched_string(); }

  // Thinking cap: true once the thought has used its tokens. close_reasoning() ends it (held
  // reasoning text goes out) and returns the text whose tokens the engine must feed the model.
  bool reasoning_cap_reached() const { return reasoning_ && reasoning_->cap_reached(); }
  std::string close_reasoning(std::vector<TextEvent>& out);
  bool in_reasoning() const { return reasoning_ && reasoning_->in_reasoning(); }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }  // pushes made inside a thought

  // Tool-call blocks that could not be parsed (left in the content as written).
  std::vector<std::string> tool_call_errors() const;

 private:
  void route(const std::vector<chat::ChannelEvent>& events, std::vector<TextEvent>& out);
  void content(std::string_view text, std::vector<TextEvent>& out);
  static void append(std::vector<TextEvent>& out, TextEvent::Kind kind, std::string_view text);

  Tokenizer tokenizer_;
  StreamingDetokenizer detok_;
  StopStringMatcher stop_;
  std::optional<chat::ReasoningParser> reasoning_;
  std::optional<chat::ToolCallExtractor> tools_;
  std::unordered_set<int32_t> marker_ids_;  // special tokens that are kept for the parsers
  std::vector<chat::ChannelEvent> scratch_;
  int64_t reasoning_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace fl
