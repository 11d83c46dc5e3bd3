// JSON mode's prefix check (JsonPrefix) against nlohmann's parser, and sample_allowed on crafted
// logits.
#include "runtime/json_prefix.h"

#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace fl {
namespace {

// Every byte accepted, and whether the whole is one complete object.
struct Verdict {
  bool accepted = true;
  bool complete = false;
};
Verdict check(std::string_view text) {
  JsonPrefix p;
  Verdict v;
  v.accepted = p.feed(text);
  v.complete = v.accepted && p.complete();
  return v;
}

TEST(JsonPrefix, CompleteObjects) {
  for (const char* doc : {"{}", " {\"a\": 1}", "{\"a\":[1,2,{\"b\":null}],\"c\":true,\"d\":false}",
                          "{\"n\": -0.5e+10, \"m\": 0, \"k\": 12.25E-3, \"z\": -0}",
                          "{\"s\": \"tab\\tquote\\\"slash\\/u\\u00e9\\uD83D\\uDE00\"}", "{\"e\": {}, \"f\": []}\n",
                          "{\"utf8\": \"\xc3\xa9t\xc3\xa9\"}"}) {
    const Verdict v = check(doc);
    EXPECT_TRUE(v.accepted) << doc;
    EXPECT_TRUE(v.complete) << doc;
    // Every proper prefix is accepted and incomplete (the last byte is the closing brace or
    // whitespace after it).
    std::string s(doc);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    for (size_t n = 0; n + 1 < s.size(); ++n) {
      const Verdict part = check(s.substr(0, n));
      EXPECT_TRUE(part.accepted) << s.substr(0, n);
      EXPECT_FALSE(part.complete) << s.substr(0, n);
    }
  }
}

TEST(JsonPrefix, RefusesWhatCannotBecomeAnObject) {
  for (const char* bad : {"[1]", "\"x\"", "1", "x", "{a:1}", "{\"a\":1,}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":1.e5}",
                          "{\"a\":tru e}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{} x",
                          "{}{}", "{\"a\" 1}", "{\"a\":}", "{,}", "{\"a\":[1 2]}", "{\"a\":-}", "{\"a\":+1}",
                          "{\"a\":NaN}", "{'a':1}"}) {
    EXPECT_FALSE(check(bad).accepted) << bad;
  }
  // Bounded whitespace and depth.
  EXPECT_TRUE(check("{" + std::string(JsonPrefix::kMaxWhitespaceRun, ' ')).accepted);
  EXPECT_FALSE(check("{" + std::string(JsonPrefix::kMaxWhitespaceRun + 1, ' ')).accepted);
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_TRUE(check(deep).accepted);
  EXPECT_FALSE(check(deep + "[").accepted);
}

// Random objects (nlohmann's output with random spacing) are complete; random one-byte edits of
// them are judged as nlohmann judges them.
TEST(JsonPrefix, AgreesWithNlohmannOnRandomDocuments) {
  std::mt19937 rng(7);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (depth > 3 ? pick(4) : pick(6)) {
      case 0: return pick(2) == 0;
      case 1: return nullptr;
      case 2: return pick(2) ? nlohmann::json(pick(100000) - 500) : nlohmann::json(pick(1000) / 7.0);
      case 3: return std::string(static_cast<size_t>(pick(5)), static_cast<char>('a' + pick(26)));
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = pick(4); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = pick(4); i > 0; --i) o[std::string(1, static_cast<char>('a' + pick(26)))] = value(depth + 1);
        return o;
      }
    }
  };
  const std::string alphabet = "{}[]:,\" 0123456789.-+eEtrufalsn\\/ab";
  int edits_checked = 0, edits_valid = 0;
  for (int n = 0; n < 400; ++n) {
    nlohmann::json doc = nlohmann::json::object();
    for (int i = pick(5); i > 0; --i) doc[std::string(1, static_cast<char>('a' + pick(26)))] = value(1);
    const std::string text = doc.dump(pick(2) ? -1 : 1);
    const Verdict v = check(text);
    ASSERT_TRUE(v.accepted && v.complete) << text;

    std::string edited = text;
    const size_t at = static_cast<size_t>(pick(static_cast<int>(edited.size())));
    switch (pick(3)) {
      case 0: edited[at] = alphabet[static_cast<size_t>(pick(static_cast<int>(alphabet.size())))]; break;
      case 1: edited.erase(at, 1); break;
      default: edited.insert(at, 1, alphabet[static_cast<size_t>(pick(static_cast<int>(alphabet.size())))]);
    }
    const bool nlohmann_object = nlohmann::json::accept(edited) && nlohmann::json::parse(edited).is_object();
    const Verdict e = check(edited);
    EXPECT_EQ(e.accepted && e.complete, nlohmann_object) << edited;
    ++edits_checked;
    edits_valid += nlohmann_object;
  }
  EXPECT_GT(edits_valid, 10);                  // some edits stay valid
  EXPECT_GT(edits_checked - edits_valid, 100);  // and many do not
}

TEST(SampleAllowed, TakesTheBestAllowedTokenOrNone) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler s(greedy);
  const std::vector<float> logits = {5, 4, 3, 2, 1, 0};
  EXPECT_EQ(sample_allowed(s, logits, [](int32_t t) { return t != 0; }), 1);
  EXPECT_EQ(sample_allowed(s, logits, [](int32_t t) { return t == 5; }), 5);
  EXPECT_EQ(sample_allowed(s, logits, [](int32_t) { return false; }), -1);
  // Past the sampler's tries: a scan finds the one allowed token.
  std::vector<float> many(100);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<float>(100 - i);
  EXPECT_EQ(sample_allowed(s, many, [](int32_t t) { return t == 90; }), 90);

  // With top-k 2 and temperature, only allowed tokens come out.
  SamplingParams top2;
  top2.temperature = 1.0f;
  top2.top_k = 2;
  top2.seed = 3;
  Sampler t(top2);
  for (int i = 0; i < 50; ++i) {
    const int32_t id = sample_allowed(t, logits, [](int32_t x) { return x >= 3; });
    EXPECT_GE(id, 3);
  }
}

}  // namespace
}  // namespace fl
