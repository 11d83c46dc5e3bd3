// OutputRouter: generated text -> reasoning, answer and tool-call events, for Qwen-style
// (<think>, <tool_call>) and Gemma-style (<|channel>thought) output.
#include "server/output_router.h"

#include <gtest/gtest.h>

namespace fl::server {
namespace {

using Kind = EngineEvent::Kind;

std::vector<EngineEvent> run(OutputRouter& router, const std::vector<std::string>& pieces) {
  std::vector<EngineEvent> out;
  for (const auto& p : pieces) router.feed(p, out);
  router.finish(out);
  return out;
}

std::string text_of(const std::vector<EngineEvent>& events, Kind kind) {
  std::string s;
  for (const auto& e : events)
    if (e.kind == kind) s += e.text;
  return s;
}

GenerationTask chat_task(std::string prompt) {
  GenerationTask t;
  t.kind = TaskKind::chat;
  t.prompt_text = std::move(prompt);
  t.max_tokens = 100;
  return t;
}

const OutputSyntax kQwen{chat::ReasoningSyntax::think_tags(), chat::ToolCallFormat::qwen};

TEST(ServeOutputRouter, QwenReasoningThenAnswer) {
  OutputRouter router(chat_task("<|im_start|>assistant\n<think>\n"), kQwen);
  auto events = run(router, {"Let me", " think.", "</think>", "\n\n", "The answer", " is 4."});
  EXPECT_EQ(text_of(events, Kind::reasoning), "Let me think.");
  EXPECT_EQ(text_of(events, Kind::content), "The answer is 4.");
  EXPECT_GE(router.reasoning_tokens(), 2);
  EXPECT_FALSE(router.called_tools());
}

TEST(ServeOutputRouter, QwenToolCallBecomesAnEvent) {
  GenerationTask task = chat_task("<|im_start|>assistant\n<think>\n\n</think>\n\n");
  task.tools.push_back({"get_weather", "", R"({"type":"object","properties":{"city":{"type":"string"}}})"});
  OutputRouter router(task, kQwen);
  auto events = run(router, {"Checking.", "<tool_call>", "\n{\"name\": \"get_weather\", ",
                             "\"arguments\": {\"city\": \"Paris\"}}\n", "</tool_call>"});
  EXPECT_EQ(text_of(events, Kind::content), "Checking.");
  EXPECT_EQ(text_of(events, Kind::reasoning), "");
  int calls = 0;
  for (const auto& e : events) {
    if (e.kind != Kind::tool_call) continue;
    ++calls;
    EXPECT_EQ(e.tool_call.name, "get_weather");
    EXPECT_EQ(e.tool_call.arguments_json, R"({"city":"Paris"})");
    EXPECT_EQ(e.tool_call.id.rfind("call_", 0), 0u);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(router.called_tools());

  // Without tools in the request the same text stays text; with tool_choice none too.
  task.tool_choice.mode = ToolChoice::Mode::none;
  OutputRouter plain(task, kQwen);
  auto text = run(plain, {"<tool_call>", "{}", "</tool_call>"});
  EXPECT_EQ(text_of(text, Kind::content), "<tool_call>{}</tool_call>");
}

TEST(ServeOutputRouter, ThinkingBudgetClosesReasoning) {
  GenerationTask task = chat_task("<|im_start|>assistant\n<think>\n");
  task.thinking.budget_tokens = 2;
  OutputRouter router(task, kQwen);
  std::vector<EngineEvent> out;
  router.feed("a", out);
  EXPECT_FALSE(router.reasoning_cap_reached());
  router.feed("b", out);
  ASSERT_TRUE(router.reasoning_cap_reached());
  EXPECT_EQ(router.close_reasoning(out), "\n</think>\n\n");
  router.feed("answer", out);
  router.finish(out);
  EXPECT_EQ(text_of(out, Kind::reasoning), "ab");
  EXPECT_EQ(text_of(out, Kind::content), "answer");
}

TEST(ServeOutputRouter, GemmaChannel) {
  OutputRouter router(chat_task("<start_of_turn>model\n"),
                      {chat::ReasoningSyntax::gemma4(), chat::ToolCallFormat::gemma4});
  auto events = run(router, {"<|channel>thought\n", "hmm", "<channel|>", "Hi"});
  EXPECT_EQ(text_of(events, Kind::reasoning), "hmm");
  EXPECT_EQ(text_of(events, Kind::content), "Hi");
}

TEST(ServeOutputRouter, CompletionsAreNotParsed) {
  GenerationTask task = chat_task("<think>\n");
  task.kind = TaskKind::completion;
  OutputRouter router(task, kQwen);
  auto events = run(router, {"<think>", "x", "</think>"});
  EXPECT_EQ(text_of(events, Kind::content), "<think>x</think>");
  EXPECT_EQ(text_of(events, Kind::reasoning), "");
}

}  // namespace
}  // namespace fl::server
