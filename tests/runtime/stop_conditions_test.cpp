// Stop conditions and the text stream on crafted token streams: EOS ids, max tokens, a full
// context, stop strings across token (and piece) boundaries, reasoning routing and its cap, tool
// calls, special tokens.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/generation_config.h"
#include "runtime/stop_conditions.h"
#include "runtime/text_stream.h"
#include "util/tiny_chat_model.h"

namespace fl {
namespace {

namespace tiny = test::tiny;

// ---- TokenStopChecker ----

TEST(TokenStopChecker, EosEndsBeforeAnythingElse) {
  TokenStopChecker c({{1, 106, 50}, /*max_tokens=*/3, /*context=*/10});
  EXPECT_EQ(c.check(106, 1, 5), StopCause::eos_token);
  EXPECT_EQ(c.check(50, 3, 10), StopCause::eos_token);  // even when the budget and context are spent
  EXPECT_EQ(c.check(7, 1, 5), StopCause::none);
  EXPECT_TRUE(c.is_eos(1));
  EXPECT_FALSE(c.is_eos(2));
}

TEST(TokenStopChecker, MaxTokensCountsGeneratedTokens) {
  TokenStopChecker c({{1}, 3, 100});
  std::vector<int32_t> stream = {10, 11, 12, 13};
  std::vector<StopCause> causes;
  for (size_t i = 0; i < stream.size(); ++i) causes.push_back(c.check(stream[i], static_cast<int64_t>(i) + 1, 20 + i));
  EXPECT_EQ(causes, (std::vector<StopCause>{StopCause::none, StopCause::none, StopCause::max_tokens, StopCause::max_tokens}));
}

TEST(TokenStopChecker, ZeroMaxTokensMeansUntilTheContextIsFull) {
  TokenStopChecker c({{1}, 0, 8});
  // With 6 prompt tokens, tokens 1 and 2 are fed at positions 6 and 7; the third finds no position.
  EXPECT_EQ(c.check(5, 1, 6), StopCause::none);
  EXPECT_EQ(c.check(5, 2, 7), StopCause::none);
  EXPECT_EQ(c.check(5, 3, 8), StopCause::context_full);
}

TEST(TokenStopChecker, RejectsBadPolicies) {
  EXPECT_THROW(TokenStopChecker({{}, -1, 8}), Error);
  EXPECT_THROW(TokenStopChecker({{}, 0, 0}), Error);
}

TEST(FinishReason, Mapping) {
  EXPECT_EQ(finish_reason_of(StopCause::eos_token, false), FinishReason::stop);
  EXPECT_EQ(finish_reason_of(StopCause::stop_string, false), FinishReason::stop);
  EXPECT_EQ(finish_reason_of(StopCause::eos_token, true), FinishReason::tool_calls);
  EXPECT_EQ(finish_reason_of(StopCause::max_tokens, true), FinishReason::length);
  EXPECT_EQ(finish_reason_of(StopCause::context_full, false), FinishReason::length);
  EXPECT_EQ(finish_reason_of(StopCause::cancelled, false), FinishReason::cancelled);
  EXPECT_STREQ(finish_reason_name(FinishReason::length), "length");
}

// ---- StopStringMatcher ----

std::string feed_all(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.feed(p);
  if (!m.matched()) out += m.flush();
  return out;
}

TEST(StopStringMatcher, MatchAcrossPiecesIsNeverEmitted) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abc S"), "abc ");  // "S" could start STOP: held
  EXPECT_EQ(m.held_bytes(), 1u);
  EXPECT_EQ(m.feed("T"), "");
  EXPECT_EQ(m.feed("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_string(), "STOP");
  EXPECT_EQ(m.feed("later"), "");  // everything after a match is dropped
}

TEST(StopStringMatcher, FalseStartIsReleased) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.feed("ST"), "");
  EXPECT_EQ(m.feed("OX"), "STOX");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.feed("xxST"), "xx");
  EXPECT_EQ(m.flush(), "ST");  // the end of the stream: cannot become STOP any more
}

TEST(StopStringMatcher, FirstCompleteOfSeveralWins) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(feed_all(m, {"hel", "lo", " wor", "ld"}), "hel");
  EXPECT_EQ(m.matched_string(), "lo w");
}

TEST(StopStringMatcher, TheStopCompleteFirstWinsHoweverTheTextIsCut) {
  // "abcdef" starts first but "cd" is complete first: generation stops there, in one piece or many.
  for (const std::vector<std::string>& pieces : std::vector<std::vector<std::string>>{
           {"abcdefg"}, {"ab", "cd", "efg"}, {"abc", "defg"}, {"a", "b", "c", "d", "e", "f", "g"}}) {
    StopStringMatcher m({"abcdef", "cd"});
    EXPECT_EQ(feed_all(m, pieces), "ab");
    EXPECT_EQ(m.matched_string(), "cd");
  }
  StopStringMatcher tie({"cd", "bcd"});  // the same end: the one starting first
  EXPECT_EQ(feed_all(tie, {"abcde"}), "a");
  EXPECT_EQ(tie.matched_string(), "bcd");
}

TEST(StopStringMatcher, HoldsTheLongestPossiblePrefix) {
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.feed("xaaa"), "xa");  // "aa" could still become "aab"
  EXPECT_EQ(m.feed("b!"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcher, EveryChunkingGivesTheSameText) {
  const std::string text = "one two <end> three";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1)
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      StopStringMatcher m({"<end>", "two  "});
      std::string out = feed_all(m, {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)});
      ASSERT_EQ(out, "one two ") << cut1 << "," << cut2;
      ASSERT_TRUE(m.matched());
    }
}

TEST(StopStringMatcher, MultiByteCharacters) {
  StopStringMatcher m({"\xc3\xa9t\xc3\xa9"});  // "été"
  EXPECT_EQ(feed_all(m, {"l'\xc3\xa9", "t", "\xc3\xa9 dernier"}), "l'");
}

TEST(StopStringMatcher, NoStopsPassesThrough) {
  StopStringMatcher m({});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.feed("anything"), "anything");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, EmptyStopIsRefused) { EXPECT_THROW(StopStringMatcher({"a", ""}), Error); }

// ---- generation_config.json ----

TEST(GenerationConfig, Gemma4Values) {
  auto d = parse_generation_config(
      R"({"bos_token_id": 2, "do_sample": true, "eos_token_id": [1, 106, 50], "pad_token_id": 0,
          "temperature": 1.0, "top_k": 64, "top_p": 0.95, "suppress_tokens": [258883]})",
      {1, 106}, "g.json");
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{1, 106, 50}));
  EXPECT_EQ(d.bos_id, 2);
  EXPECT_EQ(d.sampling.top_k, 64);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.95f);
  ASSERT_EQ(d.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(d.sampling.logit_bias[0].first, 258883);
  EXPECT_TRUE(std::isinf(d.sampling.logit_bias[0].second));
}

TEST(GenerationConfig, FallsBackToConfigJsonEos) {
  EXPECT_EQ(parse_generation_config("", {1, 106}, "g.json").eos_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(parse_generation_config(R"({"temperature": 0.6})", {1, 106}, "g.json").eos_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(parse_generation_config(R"({"eos_token_id": 7})", {1}, "g.json").eos_ids, (std::vector<int32_t>{7}));
}

TEST(GenerationConfig, DoSampleFalseIsGreedy) {
  EXPECT_EQ(parse_generation_config(R"({"do_sample": false, "temperature": 0.7})", {}, "g").sampling.temperature, 0.0f);
}

TEST(GenerationConfig, BadValuesNameTheFileAndKey) {
  for (const char* bad : {R"({"eos_token_id": "x"})", R"({"eos_token_id": [-1]})", R"({"top_k": 1.5})",
                          R"({"temperature": "hot"})", R"({"top_p": 3})", "[1]", "{not json"}) {
    try {
      parse_generation_config(bad, {}, "gen.json");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gen.json"), std::string::npos) << e.what();
    }
  }
}

// ---- TextStream on token streams of the tiny tokenizer ----

TextStreamOptions options(std::vector<std::string> stop, bool gemma_reasoning = false, bool start_in_reasoning = false,
                          int64_t cap = 0, bool tools = false) {
  TextStreamOptions o;
  o.stop = std::move(stop);
  if (gemma_reasoning) o.reasoning = chat::ReasoningSyntax::gemma4();
  o.start_in_reasoning = start_in_reasoning;
  o.max_reasoning_tokens = cap;
  if (tools) o.tool_calls = chat::ToolCallFormat::gemma4;
  return o;
}

class TextStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = new Tokenizer(Tokenizer::from_json(tiny::tokenizer_json())); }
  static void TearDownTestSuite() { delete tokenizer_; }

  std::vector<int32_t> ids(const std::string& text) const { return tokenizer_->encode(text, false); }

  struct Collected {
    std::string reasoning, content;
    std::vector<chat::ToolCall> calls;
  };
  static void collect(const std::vector<TextEvent>& events, Collected& c) {
    for (const auto& e : events) {
      if (e.kind == TextEvent::Kind::reasoning) c.reasoning += e.text;
      if (e.kind == TextEvent::Kind::content) c.content += e.text;
      if (e.kind == TextEvent::Kind::tool_call) c.calls.push_back(e.call);
    }
  }
  Collected run(TextStream& s, const std::vector<int32_t>& stream) const {
    Collected c;
    std::vector<TextEvent> events;
    for (int32_t id : stream) {
      s.push(id, events);
      if (s.stop_matched()) break;
    }
    s.finish(events);
    collect(events, c);
    return c;
  }

  static Tokenizer* tokenizer_;
};
Tokenizer* TextStreamTest::tokenizer_ = nullptr;

TEST_F(TextStreamTest, TokenizerIsTheSizeOfTheFixtureVocabulary) {
  EXPECT_EQ(tokenizer_->vocab_size(), tiny::kVocab);
  EXPECT_EQ(tokenizer_->token_to_id("<channel|>"), tiny::kChannelClose);
  EXPECT_EQ(tokenizer_->encode("Hello", true).front(), tiny::kBos);
  EXPECT_EQ(ids(" Hello world").size(), 2u);  // "▁Hello", "▁world"
}

TEST_F(TextStreamTest, PlainTextEqualsDecode) {
  std::vector<int32_t> stream = ids(" Hello world, tell me a story. \xc3\xa9t\xc3\xa9!");
  TextStream s(*tokenizer_, {});
  EXPECT_EQ(run(s, stream).content, tokenizer_->decode(stream));
}

TEST_F(TextStreamTest, StopStringAcrossTokenBoundary) {
  std::vector<int32_t> stream = ids(" Hello world and more");
  ASSERT_GE(stream.size(), 3u);
  TextStream s(*tokenizer_, options({"lo wor"}));
  std::vector<TextEvent> events;
  Collected c;
  s.push(stream[0], events);  // " Hello": "lo" could start the stop string and is held
  collect(events, c);
  EXPECT_EQ(c.content, " Hel");
  events.clear();
  s.push(stream[1], events);  // " world" completes it
  EXPECT_TRUE(s.stop_matched());
  EXPECT_EQ(s.matched_stop(), "lo wor");
  s.push(stream[2], events);  // ignored after the match
  s.finish(events);
  collect(events, c);
  EXPECT_EQ(c.content, " Hel");
}

TEST_F(TextStreamTest, PartialStopAtTheEndIsReleased) {
  TextStream s(*tokenizer_, options({"world peace"}));
  EXPECT_EQ(run(s, ids(" Hello world")).content, " Hello world");
}

TEST_F(TextStreamTest, OtherSpecialTokensAreNotText) {
  TextStream s(*tokenizer_, {});
  std::vector<int32_t> stream = {tiny::kBos, tiny::kPad};
  for (int32_t id : ids(" hi")) stream.push_back(id);
  stream.push_back(tiny::kThink);
  EXPECT_EQ(run(s, stream).content, " hi");
}

TEST_F(TextStreamTest, ReasoningChannelIsSplitOut) {
  TextStream s(*tokenizer_, options({}, true));
  std::vector<int32_t> stream = ids("<|channel>thought\nthe sky<channel|>blue");
  EXPECT_EQ(stream.front(), tiny::kChannelOpen);
  Collected c = run(s, stream);
  EXPECT_EQ(c.reasoning, "the sky");
  EXPECT_EQ(c.content, "blue");
}

TEST_F(TextStreamTest, ReasoningCapClosesTheThought) {
  TextStream s(*tokenizer_, options({}, true, true, 3));
  std::vector<int32_t> stream = ids(" the sky is blue");
  ASSERT_EQ(stream.size(), 4u);
  std::vector<TextEvent> events;
  Collected c;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(s.reasoning_cap_reached());
    s.push(stream[i], events);
  }
  EXPECT_TRUE(s.reasoning_cap_reached());
  EXPECT_EQ(s.reasoning_tokens(), 3);
  EXPECT_EQ(s.close_reasoning(events), "<channel|>");
  EXPECT_FALSE(s.in_reasoning());
  s.push(stream[3], events);
  s.finish(events);
  collect(events, c);
  EXPECT_EQ(c.reasoning, " the sky is");
  EXPECT_EQ(c.content, " blue");
  EXPECT_EQ(s.reasoning_tokens(), 3);
}

TEST_F(TextStreamTest, StopStringHeldInsideAThoughtStaysReasoningWhenCapped) {
  TextStream s(*tokenizer_, options({"sky!"}, true, true, 2));
  std::vector<TextEvent> events;
  for (int32_t id : ids(" the sky")) s.push(id, events);
  ASSERT_TRUE(s.reasoning_cap_reached());
  s.close_reasoning(events);
  for (int32_t id : ids(" blue")) s.push(id, events);
  s.finish(events);
  Collected c;
  collect(events, c);
  EXPECT_EQ(c.reasoning, " the sky");
  EXPECT_EQ(c.content, " blue");
}

TEST_F(TextStreamTest, ToolCallBecomesAnEvent) {
  TextStream s(*tokenizer_, options({}, true, false, 0, true));
  Collected c = run(s, ids("ok<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"));
  EXPECT_EQ(c.content, "ok");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(c.calls[0].arguments.dump(), R"({"city":"Paris"})");
}

}  // namespace
}  // namespace fl
