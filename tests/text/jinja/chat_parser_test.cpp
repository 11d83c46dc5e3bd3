// The streaming reasoning-channel parser and the tool-call parsers.
//
// Reasoning: Gemma 4 channels and <think> tags, stray markers, thinking off, every way of cutting
// a sample stream into pieces, the thinking cap, and the three ways hipfire's Gemma parser failed
// (holding text that only starts like a marker, dropping held text at the end of the stream,
// letting plain text pile up unreleased).
// Tool calls: Gemma 4's call syntax and Qwen's JSON and XML forms, checked as the inverse of what
// the real chat templates write (rendered here with fireline's Jinja interpreter), plus malformed
// input, streaming, and the OpenAI shape.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat/chat_template.h"
#include "text/chat/reasoning_parser.h"
#include "text/chat/tool_calls.h"
#include "text/jinja/template.h"

using json = nlohmann::ordered_json;
using namespace fl::chat;

namespace {

const std::string kTemplates = std::string(FIRELINE_SHARED_DIR) + "/data/templates/";

struct Routed {
  std::string reasoning, answer;
  bool operator==(const Routed& o) const { return reasoning == o.reasoning && answer == o.answer; }
};

void add(Routed& r, const std::vector<ChannelEvent>& events) {
  for (const auto& e : events) (e.kind == ChannelEvent::Kind::reasoning ? r.reasoning : r.answer) += e.text;
}

Routed run(const ReasoningSyntax& syntax, bool start_reasoning, const std::vector<std::string>& pieces) {
  ReasoningParser p(syntax, start_reasoning);
  Routed r;
  for (const auto& piece : pieces) {
    std::vector<ChannelEvent> events;
    p.feed(piece, events);
    add(r, events);
  }
  std::vector<ChannelEvent> events;
  p.finish(events);
  add(r, events);
  return r;
}

// Every way to cut `text` into two and into three pieces must route exactly like one piece.
void expect_split_invariant(const ReasoningSyntax& syntax, bool start_reasoning, const std::string& text,
                            const Routed& want) {
  ASSERT_EQ(run(syntax, start_reasoning, {text}), want) << text;
  for (size_t i = 0; i <= text.size(); ++i) {
    EXPECT_EQ(run(syntax, start_reasoning, {text.substr(0, i), text.substr(i)}), want) << "cut at " << i;
    for (size_t j = i; j <= text.size(); ++j)
      ASSERT_EQ(run(syntax, start_reasoning, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}), want)
          << "cuts at " << i << ", " << j;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run(syntax, start_reasoning, bytes), want) << "byte by byte";
}

// ---- Gemma 4 ----

TEST(ReasoningGemma4, ThoughtThenAnswer) {
  expect_split_invariant(ReasoningSyntax::gemma4(), false,
                         "<|channel>thought\nThe user asks 2+2 <b>.<channel|>It is 4 <|not a marker.",
                         {"The user asks 2+2 <b>.", "It is 4 <|not a marker."});
}

TEST(ReasoningGemma4, ThinkingOffAfterThePrefilledEmptyBlock) {
  // The 31B template ends the prompt with "<|channel>thought\n<channel|>": output is all answer,
  // and a stray closer the model repeats does not leak.
  const auto syntax = ReasoningSyntax::gemma4();
  std::string prompt = "<|turn>model\n<|channel>thought\n<channel|>";
  EXPECT_FALSE(starts_in_reasoning(prompt, syntax));
  expect_split_invariant(syntax, false, "<channel|>Paris is the capital.", {"", "Paris is the capital."});
}

TEST(ReasoningGemma4, StrayMarkersNeverLeak) {
  expect_split_invariant(ReasoningSyntax::gemma4(), false, "<|channel>Hello<|turn> world<turn|><|channel|>!",
                         {"", "Hello world!"});
  // A thought block arriving mid-answer (E2B with thinking off may still think) is reasoning.
  expect_split_invariant(ReasoningSyntax::gemma4(), false, "Sure. <|channel>thought\nhm<channel|>Done",
                         {"hm", "Sure. Done"});
}

TEST(ReasoningGemma4, HeaderWithoutNewline) {
  expect_split_invariant(ReasoningSyntax::gemma4(), false, "<|channel>thoughtx<channel|>y", {"x", "y"});
}

// ---- <think> tags (Qwen3.5) ----

TEST(ReasoningThinkTags, OutputStartsInsideReasoningWhenThePromptOpenedIt) {
  const auto syntax = ReasoningSyntax::think_tags();
  EXPECT_TRUE(starts_in_reasoning("<|im_start|>assistant\n<think>\n", syntax));
  EXPECT_FALSE(starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", syntax));
  expect_split_invariant(syntax, true, "2+2 is 4, check: <tag> ok.\n</think>\n\nThe answer is 4.",
                         {"2+2 is 4, check: <tag> ok.\n", "The answer is 4."});
}

TEST(ReasoningThinkTags, PromptsFromTheRealTemplates) {
  const auto syntax = ReasoningSyntax::think_tags();
  ChatTemplate qwen(load_chat_template(kTemplates + "qwen3.5-0.8b.jinja"));
  ChatInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  in.add_generation_prompt = true;
  in.enable_thinking = true;
  EXPECT_TRUE(starts_in_reasoning(qwen.apply(in), syntax));
  in.enable_thinking = false;
  EXPECT_FALSE(starts_in_reasoning(qwen.apply(in), syntax));
  ChatTemplate gemma(load_chat_template(kTemplates + "gemma4-31b-jul2026.jinja"));
  for (bool thinking : {true, false}) {
    in.enable_thinking = thinking;
    EXPECT_FALSE(starts_in_reasoning(gemma.apply(in), ReasoningSyntax::gemma4())) << thinking;
  }
}

TEST(ReasoningThinkTags, ThinkingOff) {
  expect_split_invariant(ReasoningSyntax::think_tags(), false, "Just the answer </think> here.",
                         {"", "Just the answer  here."});
}

// ---- the three hipfire failure modes ----

TEST(ReasoningFailureModes, TextThatOnlyStartsLikeAMarkerIsReleased) {
  for (bool gemma : {true, false}) {
    const auto syntax = gemma ? ReasoningSyntax::gemma4() : ReasoningSyntax::think_tags();
    ReasoningParser p(syntax, !gemma);
    std::vector<ChannelEvent> events;
    p.feed(gemma ? "x <|ch" : "x </thi", events);  // could still be a marker: held
    std::string first;
    for (const auto& e : events) first += e.text;
    EXPECT_EQ(first, "x ");
    events.clear();
    p.feed(gemma ? "at about it" : "nking cap", events);  // "<|chat", "</thinking": not markers
    std::string rest;
    for (const auto& e : events) rest += e.text;
    EXPECT_EQ(rest, gemma ? "<|chat about it" : "</thinking cap") << "released as soon as it cannot be a marker";
  }
}

TEST(ReasoningFailureModes, HeldTextIsFlushedAtTheEndNotDropped) {
  {
    ReasoningParser p(ReasoningSyntax::gemma4(), false);
    std::vector<ChannelEvent> events;
    p.feed("The end <|chan", events);
    p.finish(events);
    Routed r;
    add(r, events);
    EXPECT_EQ(r.answer, "The end <|chan");
  }
  {
    ReasoningParser p(ReasoningSyntax::think_tags(), true);
    std::vector<ChannelEvent> events;
    p.feed("cut off mid-thought <", events);
    p.finish(events);
    Routed r;
    add(r, events);
    EXPECT_EQ(r.reasoning, "cut off mid-thought <");
  }
  {
    // A complete marker held only because a longer one could follow is still a marker at the end.
    ReasoningParser p(ReasoningSyntax::think_tags(), true);
    std::vector<ChannelEvent> events;
    p.feed("done</think>", events);
    p.finish(events);
    Routed r;
    add(r, events);
    EXPECT_EQ(r.reasoning, "done");
    EXPECT_EQ(r.answer, "");
    EXPECT_FALSE(p.in_reasoning());
  }
}

TEST(ReasoningFailureModes, PlainTextNeverPilesUp) {
  const std::string text = "A long answer with no markers at all, fed one character at a time; ü and 漢字 too.";
  for (bool gemma : {true, false}) {
    ReasoningParser p(gemma ? ReasoningSyntax::gemma4() : ReasoningSyntax::think_tags(), false);
    std::string emitted;
    for (size_t k = 0; k < text.size(); ++k) {
      std::vector<ChannelEvent> events;
      p.feed(text.substr(k, 1), events);
      for (const auto& e : events) emitted += e.text;
      EXPECT_EQ(emitted, text.substr(0, k + 1)) << "held back text at byte " << k;
    }
  }
  // With '<' in the text, at most a possible marker prefix is held.
  ReasoningParser p(ReasoningSyntax::gemma4(), false);
  std::string emitted, fed;
  const std::string tricky = "a<b <<| <|tu <|turnip <chan <channel <|channel>x";
  for (char c : tricky) {
    std::vector<ChannelEvent> events;
    fed += c;
    p.feed(std::string(1, c), events);
    for (const auto& e : events) emitted += e.text;
    EXPECT_LT(fed.size() - emitted.size(), std::string("<|channel>thought\n").size());
  }
}

// ---- thinking cap ----

TEST(ReasoningCap, ForceCloseAfterNTokens) {
  for (bool gemma : {true, false}) {
    const auto syntax = gemma ? ReasoningSyntax::gemma4() : ReasoningSyntax::think_tags();
    std::vector<std::string> tokens = {"step", " one", " two", " three <"};
    if (gemma) tokens.insert(tokens.begin(), "<|channel>thought\n");  // the header is a reasoning token too
    ReasoningParser p(syntax, !gemma, /*max_reasoning_tokens=*/static_cast<int64_t>(tokens.size()));
    std::vector<ChannelEvent> events;
    std::string injected;
    for (const auto& t : tokens) {
      EXPECT_FALSE(p.cap_reached());
      p.feed(t, events);
    }
    ASSERT_TRUE(p.cap_reached());
    injected = p.force_close(events);
    EXPECT_EQ(injected, gemma ? "<channel|>" : "\n</think>\n\n");
    EXPECT_FALSE(p.in_reasoning());
    p.feed("Answer.", events);
    p.finish(events);
    Routed r;
    add(r, events);
    EXPECT_EQ(r.reasoning, "step one two three <");  // the held '<' went out as reasoning
    EXPECT_EQ(r.answer, "Answer.");
  }
}

TEST(ReasoningCap, NoCapMeansNoForcing) {
  ReasoningParser p(ReasoningSyntax::think_tags(), true);
  std::vector<ChannelEvent> events;
  for (int k = 0; k < 1000; ++k) p.feed(" word", events);
  EXPECT_FALSE(p.cap_reached());
  EXPECT_EQ(p.reasoning_tokens(), 1000);
}

// ---- tool calls ----

std::string render_template(const std::string& file, const json& messages, const json& tools) {
  ChatTemplate t(load_chat_template(kTemplates + file));
  ChatInputs in;
  in.messages = messages;
  in.tools = tools;
  return t.apply(in);
}

// The last open...close span (system prompts may show an example call first).
std::string between(const std::string& s, const std::string& open, const std::string& close) {
  size_t a = s.rfind(open);
  size_t b = s.find(close, a == std::string::npos ? 0 : a + open.size());
  if (a == std::string::npos || b == std::string::npos) return {};
  return s.substr(a + open.size(), b - a - open.size());
}

const json kArgumentCases = json::array({
    json::parse(R"({"city": "Paris"})"),
    json::parse(R"({"query": "fireline \"H200\" ünï {braces} [brackets], commas: yes", "max_results": 3, "score": -2.5})"),
    json::parse(R"({"flags": [true, false, null], "nested": {"deep": {"list": [1, [2, 3], {"k": "v"}]}}, "empty": {}, "none": []})"),
    json::parse(R"({"tiny": 1e-07, "big": 12345678901, "zero": 0, "neg": -1})"),
});

TEST(ToolCallsGemma4, InverseOfTheTemplate) {
  for (const auto& args : kArgumentCases) {
    json messages = json::array({{{"role", "user"}, {"content", "go"}},
                                 {{"role", "assistant"},
                                  {"content", ""},
                                  {"tool_calls", {{{"type", "function"}, {"function", {{"name", "do_it"}, {"arguments", args}}}}}}}});
    for (const char* file : {"gemma4-31b-jul2026.jinja", "gemma4-e2b-jul2026.jinja"}) {
      std::string prompt = render_template(file, messages, nullptr);
      std::string body = between(prompt, "<|tool_call>", "<tool_call|>");
      ASSERT_FALSE(body.empty()) << prompt;
      ToolCall call = parse_gemma4_tool_call(body);
      EXPECT_EQ(call.name, "do_it");
      // The template sorts keys (dictsort); compare as unordered JSON.
      EXPECT_EQ(nlohmann::json::parse(call.arguments.dump()), nlohmann::json::parse(args.dump())) << body;
    }
  }
}

TEST(ToolCallsGemma4, OlderTemplatesPrintNoneAndQuotedKeys) {
  ToolCall call = parse_gemma4_tool_call(R"(call:f{a:None,<|"|>b c<|"|>:True,d:[1,2.5]})");
  EXPECT_EQ(call.arguments, json::parse(R"({"a": null, "b c": true, "d": [1, 2.5]})"));
}

TEST(ToolCallsGemma4, ExtractFromOutput) {
  int n = 0;
  auto ids = [&] { return "id" + std::to_string(n++); };
  auto r = extract_tool_calls("Checking.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
                              "<|tool_call>call:get_time{}<tool_call|><|tool_response>",
                              ToolCallFormat::gemma4, nullptr, ids);
  EXPECT_EQ(r.content, "Checking.");
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.tool_calls, json::parse(R"([
    {"id": "id0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
    {"id": "id1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}])"));
}

TEST(ToolCallsGemma4, MalformedCallsStayAsTextWithAnError) {
  for (const std::string bad : {"<|tool_call>call:f{a:<|\"|>unterminated}<tool_call|>", "<|tool_call>f{a:1}<tool_call|>",
                                "<|tool_call>call:f{a:1<tool_call|>", "<|tool_call>call:{a:1}<tool_call|>",
                                "<|tool_call>call:f{a:nope}<tool_call|>", "<|tool_call>call:f{a:1} trailing<tool_call|>"}) {
    auto r = extract_tool_calls("before " + bad + " after", ToolCallFormat::gemma4);
    EXPECT_TRUE(r.tool_calls.empty()) << bad;
    EXPECT_EQ(r.content, "before " + bad + " after");
    ASSERT_EQ(r.errors.size(), 1u) << bad;
  }
  auto r = extract_tool_calls("text <|tool_call>call:f{a:1", ToolCallFormat::gemma4);
  EXPECT_EQ(r.content, "text <|tool_call>call:f{a:1");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("not terminated"), std::string::npos);
}

TEST(ToolCallsQwen, JsonForm) {
  auto r = extract_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
      ToolCallFormat::qwen, nullptr, [] { return std::string("abc"); });
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city":"Paris","days":2})"));
  // Arguments given as a JSON string, and "parameters" instead of "arguments", are accepted.
  EXPECT_EQ(parse_qwen_tool_call(R"({"name": "f", "arguments": "{\"a\": 1}"})").arguments, json::parse(R"({"a":1})"));
  EXPECT_EQ(parse_qwen_tool_call(R"({"name": "f", "parameters": {"a": 1}})").arguments, json::parse(R"({"a":1})"));
}

TEST(ToolCallsQwen, XmlFormIsTheInverseOfTheQwen35Template) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "do_it", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "code": {"type": "string"}, "n": {"type": "integer"},
                     "flag": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"}}}}}])");
  const json args = json::parse(R"({"city": "Paris\nFrance", "code": "007", "n": 5, "flag": false,
                                     "opts": {"a": [1, null]}, "tags": ["x", "y"]})");
  json messages = json::array({{{"role", "user"}, {"content", "go"}},
                               {{"role", "assistant"},
                                {"content", ""},
                                {"tool_calls", {{{"type", "function"}, {"function", {{"name", "do_it"}, {"arguments", args}}}}}}}});
  std::string prompt = render_template("qwen3.5-0.8b.jinja", messages, tools);
  std::string body = between(prompt, "<tool_call>", "</tool_call>");
  ASSERT_FALSE(body.empty()) << prompt;
  ToolCall call = parse_qwen_tool_call(body, tools);
  EXPECT_EQ(call.name, "do_it");
  EXPECT_EQ(call.arguments, args) << body;  // "007" stays a string because the schema says so
}

TEST(ToolCallsQwen, MalformedCallsStayAsText) {
  for (const std::string bad : {"<tool_call>not json</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                                "<tool_call><function=f><parameter=a>1</function></tool_call>"}) {
    auto r = extract_tool_calls(bad, ToolCallFormat::qwen);
    EXPECT_TRUE(r.tool_calls.empty()) << bad;
    EXPECT_EQ(r.content, bad);
    EXPECT_EQ(r.errors.size(), 1u) << bad;
  }
}

TEST(ToolCallsStreaming, EverySplitGivesTheSameEvents) {
  const std::string text = "pre <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"</tool\"}}</tool_call> mid <tool_call";
  auto run_pieces = [&](const std::vector<std::string>& pieces) {
    ToolCallExtractor x(ToolCallFormat::qwen);
    std::vector<ToolCallEvent> events;
    for (const auto& p : pieces) x.feed(p, events);
    x.finish(events);
    std::string flat;
    for (const auto& e : events) flat += e.kind == ToolCallEvent::Kind::text ? "T:" + e.text : "C:" + e.call.arguments.dump();
    return flat;
  };
  const std::string want = run_pieces({text});
  EXPECT_EQ(want, "T:pre C:{\"a\":\"</tool\"}T: mid <tool_call");
  for (size_t i = 0; i <= text.size(); ++i) EXPECT_EQ(run_pieces({text.substr(0, i), text.substr(i)}), want) << i;
}

TEST(ToolCallsIds, NineAlphanumerics) {
  for (int k = 0; k < 100; ++k) {
    std::string id = make_tool_call_id();
    ASSERT_EQ(id.size(), 9u);
    for (char c : id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  }
}

}  // namespace
