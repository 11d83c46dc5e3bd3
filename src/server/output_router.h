#pragma once
// For an Engine implementation: turns one task's generated text into EngineEvents. Decoded pieces
// go through the reasoning-channel parser (text/chat/reasoning_parser.h), then, for the answer
// channel of a chat with tools, through the tool-call extractor (text/chat/tool_calls.h). A
// completion task's text is all answer. The router does not see tokens: the engine feeds it the
// streaming detokenizer's output, and handles stop strings and max_tokens itself.
//
//   OutputRouter router(task, {chat::ReasoningSyntax::think_tags(), chat::ToolCallFormat::qwen});
//   per token:  router.feed(detokenizer.push(id), events);
//               if (router.reasoning_cap_reached()) inject(router.close_reasoning(events));
//   at the end: router.finish(events);  reason = router.called_tools() ? tool_calls : stop
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine.h"
#include "text/chat/reasoning_parser.h"
#include "text/chat/tool_calls.h"

namespace fl::server {

struct OutputSyntax {
  chat::ReasoningSyntax reasoning;
  std::optional<chat::ToolCallFormat> tool_calls;  // nullopt: the model has no tool-call syntax
};

class OutputRouter {
 public:
  // Output starts inside reasoning when the rendered prompt leaves a reasoning block open (e.g. a
  // Qwen prompt ending in "<think>\n"); the thinking budget comes from task.thinking.
  OutputRouter(const GenerationTask& task, OutputSyntax syntax);

  // One decoded piece (usually one token's text; may be empty). Counts one reasoning token per
  // call while reasoning.
  void feed(std::string_view piece, std::vector<EngineEvent>& out);
  // End of generation: releases held text (an unfinished tool call stays in the answer as text).
  void finish(std::vector<EngineEvent>& out);

  // The thinking budget is spent: call close_reasoning(), feed the returned text to the model
  // (not to feed()), and generation continues with the answer.
  bool reasoning_cap_reached() const;
  std::string close_reasoning(std::vector<EngineEvent>& out);

  int64_t reasoning_tokens() const;
  bool called_tools() const { return called_tools_; }
  // Tool calls the model wrote but that did not parse (left in the answer as text).
  std::vector<std::string> tool_call_errors() const;

 private:
  void route(const std::vector<chat::ChannelEvent>& channel, std::vector<EngineEvent>& out);
  void answer(std::string_view text, std::vector<EngineEvent>& out);
  void tool_events(const std::vector<chat::ToolCallEvent>& events, std::vector<EngineEvent>& out);

  bool raw_;  // completion: no parsing
  std::optional<chat::ReasoningParser> reasoning_;
  std::optional<chat::ToolCallExtractor> tools_;
  bool called_tools_ = false;
};

}  // namespace fl::server
