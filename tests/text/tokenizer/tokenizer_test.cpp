// Whole tokenizers built from the small committed fixtures (tests/text/tokenizer/fixtures):
// a byte-level BPE in the Llama 3 / Qwen style and a SentencePiece-style BPE with byte fallback
// in the Gemma style; plus every kind of bad tokenizer.json the loader must reject clearly.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer/tokenizer.h"
#include "util/test_util.h"

namespace fl {
namespace {

using nlohmann::json;

const std::string kFixtures = FIRELINE_TOKENIZER_FIXTURES;

json fixture_json(const std::string& name) {
  std::ifstream in(kFixtures + "/" + name + "/tokenizer.json");
  return json::parse(in);
}

Tokenizer from(const json& j) { return Tokenizer::from_json(j.dump()); }

std::vector<int32_t> ids(std::initializer_list<int32_t> v) { return v; }

// The message of the fl::Error that loading `text` throws must mention `needle`.
void expect_load_text_error(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_json(text);
    FAIL() << "no error, expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}
void expect_load_error(const json& j, const std::string& needle) { expect_load_text_error(j.dump(), needle); }

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& v, bool skip = false,
                       std::vector<std::string>* pieces = nullptr) {
  StreamingDetokenizer s(tok, skip);
  std::string out;
  for (int32_t id : v) {
    std::string p = s.push(id);
    if (pieces) pieces->push_back(p);
    out += p;
  }
  std::string rest = s.finish();
  if (pieces) pieces->push_back(rest);
  return out + rest;
}

// ---- byte-level BPE (tiny_bytelevel: 256 byte tokens, a few merges, <s> added by the template) ----

class ByteLevelFixture : public ::testing::Test {
 protected:
  Tokenizer tok = Tokenizer::load(kFixtures + "/tiny_bytelevel");
};

TEST_F(ByteLevelFixture, EncodesWithMergesAndTemplate) {
  // "hello": he + ll + o (the "e ll" merge never applies once "h e" has fired).
  EXPECT_EQ(tok.encode("hello world"), ids({300, 257, 259, 111, 268}));
  EXPECT_EQ(tok.encode("hello world", false), ids({257, 259, 111, 268}));
  EXPECT_EQ(tok.encode("", true), ids({300}));
  EXPECT_EQ(tok.encode("", false), ids({}));
  // Digits come in groups of up to three (Llama 3's \p{N}{1,3}); "123" merges fully.
  EXPECT_EQ(tok.encode("1234", false), ids({272, '4'}));
  EXPECT_EQ(tok.bos_id(), 300);
  EXPECT_EQ(tok.eos_id(), 301);
  EXPECT_EQ(tok.vocab_size(), 307);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0world"), 268);
  EXPECT_EQ(tok.id_to_token(268), "\xC4\xA0world");
  EXPECT_EQ(tok.id_to_token(300), "<s>");
  EXPECT_EQ(tok.id_to_token(290), std::nullopt);  // a hole between the merges and the added tokens
  EXPECT_EQ(tok.id_to_token(-1), std::nullopt);
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(303));
  EXPECT_FALSE(tok.is_special(65));
}

TEST_F(ByteLevelFixture, AddedTokensBeforeBpe) {
  EXPECT_EQ(tok.encode("a<s>b</s>", false), ids({'a', 300, 'b', 301}));
  // special tokens are matched in the text whatever add_special_tokens says (HF's default).
  EXPECT_EQ(tok.encode("<|sep|>", true), ids({300, 302}));
  EXPECT_EQ(tok.encode("x<tag>y", false), ids({'x', 303, 'y'}));
  // lstrip / rstrip swallow the neighbouring whitespace; single_word needs word boundaries.
  EXPECT_EQ(tok.encode("a  [L] b", false), ids({'a', 304, ' ', 'b'}));
  EXPECT_EQ(tok.encode("a [R]  b", false), ids({'a', ' ', 305, 'b'}));
  EXPECT_EQ(tok.encode("a [W] b", false), ids({'a', ' ', 306, ' ', 'b'}));
  EXPECT_EQ(tok.encode("a[W]b", false), ids({'a', '[', 'W', ']', 'b'}));
}

TEST_F(ByteLevelFixture, DecodesAndRoundTrips) {
  for (std::string s : {"hello world", "  spaces\tand\ttabs\n\nnewlines  ", "caf\xC3\xA9 \xF0\x9F\x99\x82 \xE6\x97\xA5\xE6\x9C\xAC",
                        "<s>the world</s><tag>[W]", ""}) {
    SCOPED_TRACE(s);
    EXPECT_EQ(tok.decode(tok.encode(s, false)), s);
  }
  EXPECT_EQ(tok.decode(tok.encode("hi there")), "<s>hi there");
  EXPECT_EQ(tok.decode(tok.encode("hi <|sep|> there"), /*skip_special_tokens=*/true), "hi  there");
  // Unknown ids are skipped, as HF does.
  EXPECT_EQ(tok.decode(ids({'a', 290, 99999, -5, 'b'})), "ab");
  // A lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(tok.decode(ids({'a', 0x80 + 0, 'b'})), tok.decode(ids({'a'})) + tok.decode(ids({0x80})) + "b");
}

TEST_F(ByteLevelFixture, InvalidUtf8InputBecomesReplacementCharacters) {
  const std::string bad = "a\x80" "b\xE2\x82";
  EXPECT_EQ(tok.encode(bad, false), tok.encode("a\uFFFD" "b\uFFFD", false));
  EXPECT_EQ(tok.decode(tok.encode(bad, false)), "a\uFFFD" "b\uFFFD");
}

TEST_F(ByteLevelFixture, StreamingNeverSplitsACharacter) {
  // Each byte of 🙂 (F0 9F 99 82) is its own token here: nothing comes out until the last one.
  const auto v = tok.encode("a\xF0\x9F\x99\x82" "b", false);
  ASSERT_EQ(v.size(), 6u);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(tok, v, false, &pieces), "a\xF0\x9F\x99\x82" "b");
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x99\x82", "b", ""}));
  // An unfinished character at the end comes out as U+FFFD at finish(), like decode().
  const std::vector<int32_t> cut(v.begin(), v.begin() + 3);
  EXPECT_EQ(stream_all(tok, cut), tok.decode(cut));
  EXPECT_EQ(stream_all(tok, cut), "a\uFFFD");
  // Special tokens: kept or skipped exactly as decode() does.
  const auto with_special = tok.encode("x</s>y<s>");
  EXPECT_EQ(stream_all(tok, with_special), tok.decode(with_special));
  EXPECT_EQ(stream_all(tok, with_special, true), tok.decode(with_special, true));
}

TEST_F(ByteLevelFixture, TokenBytesAreTheRawBytesOfEachToken) {
  // 🙂's four bytes are four tokens: each gives its byte (decode() of one alone gives U+FFFD), and
  // the pieces joined are the text.
  const auto v = tok.encode(
      "a\xF0\x9F\x99\x82"
      "b",
      false);
  ASSERT_EQ(v.size(), 6u);
  std::string joined;
  for (int32_t id : v) joined += tok.token_bytes(id);
  EXPECT_EQ(joined,
            "a\xF0\x9F\x99\x82"
            "b");
  EXPECT_EQ(tok.token_bytes(v[1]), "\xF0");
  EXPECT_EQ(tok.decode(ids({v[1]})), "\uFFFD");
  // A special token's own text; an id without a token, nothing.
  const auto eos = tok.encode("</s>", false);
  ASSERT_EQ(eos.size(), 1u);
  EXPECT_EQ(tok.token_bytes(eos[0]), "</s>");
  EXPECT_EQ(tok.token_bytes(99999), "");
  EXPECT_EQ(tok.token_bytes(-1), "");
}

// ---- SentencePiece-style BPE (tiny_spm: Replace " "->"▁", byte fallback, <bos> template) ----

class SpmFixture : public ::testing::Test {
 protected:
  Tokenizer tok = Tokenizer::load(kFixtures + "/tiny_spm/tokenizer.json");
};

TEST_F(SpmFixture, EncodesLikeGemma) {
  EXPECT_EQ(tok.encode("hello world"), ids({2, 277, 282}));
  EXPECT_EQ(tok.encode("hello world", false), ids({277, 282}));
  // é is not in the vocabulary: its two bytes become <0xC3> <0xA9> (4 + byte value).
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), ids({262, 4 + 0xC3, 4 + 0xA9}));
  // Spaces become ▁ and merge; "\n" is an added token matched in the raw text.
  EXPECT_EQ(tok.encode("    x\nhello", false), ids({284, 273, 261, 277}));
  EXPECT_EQ(tok.encode("<start_of_turn>hello", false), ids({287, 277}));
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 1);
}

TEST_F(SpmFixture, DecodesByteFallbackAndSpaces) {
  for (std::string s : {"hello world", " leading and trailing ", "caf\xC3\xA9 \xE2\x80\x99 \xF0\x9F\x99\x82\n\nx",
                        "<start_of_turn>hello\n"}) {
    SCOPED_TRACE(s);
    const auto v = tok.encode(s, false);
    EXPECT_EQ(tok.decode(v), s);
    EXPECT_EQ(stream_all(tok, v), s);
  }
  EXPECT_EQ(tok.decode(tok.encode("hello")), "<bos>hello");
  EXPECT_EQ(tok.decode(tok.encode("hello"), true), "hello");
}

TEST_F(SpmFixture, TokenBytesGiveSpacesAndFallbackBytes) {
  // "▁" is a space; é's byte-fallback tokens <0xC3> <0xA9> one byte each; joined: the text.
  const std::string text = " caf\xC3\xA9 and\n";
  const auto v = tok.encode(text, false);
  std::string joined;
  for (int32_t id : v) joined += tok.token_bytes(id);
  EXPECT_EQ(joined, text);
  EXPECT_EQ(tok.token_bytes(4 + 0xC3), "\xC3");
  EXPECT_EQ(tok.token_bytes(284), tok.decode(ids({284})));  // an ordinary token: as decoded
}

TEST_F(SpmFixture, StreamingHoldsByteRunsUntilTheyEnd) {
  // ’ (E2 80 99) falls back to three byte tokens; HF decodes a run as a whole, so the stream
  // releases it when the next ordinary token arrives.
  const auto v = tok.encode("a\xE2\x80\x99" "b", false);
  ASSERT_EQ(v.size(), 5u);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(tok, v, false, &pieces), "a\xE2\x80\x99" "b");
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "\xE2\x80\x99" "b", ""}));
  // An invalid run: one U+FFFD per byte, in the stream exactly as in decode().
  const std::vector<int32_t> bad{269, 4 + 0xE2, 4 + 0x80, 270};
  EXPECT_EQ(tok.decode(bad), "a\uFFFD\uFFFD" "b");
  EXPECT_EQ(stream_all(tok, bad), tok.decode(bad));
  const std::vector<int32_t> bad_end{269, 4 + 0xE2, 4 + 0x80};
  EXPECT_EQ(stream_all(tok, bad_end), tok.decode(bad_end));
}

TEST_F(SpmFixture, StreamingRandomIdSequencesMatchDecode) {
  // Any id sequence at all (what a model may sample) streams to exactly what decode() gives.
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> v(next() % 12);
    for (int32_t& id : v) id = static_cast<int32_t>(next() % 300);
    EXPECT_EQ(stream_all(tok, v), tok.decode(v));
    EXPECT_EQ(stream_all(tok, v, true), tok.decode(v, true));
  }
}

TEST(Tokenizer, MergesInStringAndPairFormAreTheSame) {
  json pairs = fixture_json("tiny_spm");
  json strings = pairs;
  for (auto& m : strings["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const std::string text = "hello world abc hello";
  EXPECT_EQ(from(strings).encode(text), from(pairs).encode(text));
  EXPECT_EQ(from(strings).encode(text), ids({2, 277, 282, 260, 286, 260, 277}));
}

TEST(Tokenizer, PostProcessorsAddWhatTheyDeclare) {
  json j = fixture_json("tiny_spm");
  // No post-processor (Llama 3 style ByteLevel processor): nothing is added, so no double BOS
  // when the chat template already starts with one.
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  EXPECT_EQ(from(j).encode("<bos>hello"), ids({2, 277}));
  j["post_processor"] = nullptr;
  EXPECT_EQ(from(j).encode("hello"), ids({277}));
  // Template in string form, with a suffix.
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", "<bos> $A <eos>"},
                         {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}},
                                             {"<eos>", {{"id", "<eos>"}, {"ids", {1}}, {"tokens", {"<eos>"}}}}}}};
  EXPECT_EQ(from(j).encode("hello"), ids({2, 277, 1}));
  EXPECT_EQ(from(j).encode("hello", false), ids({277}));
  // A Sequence (Llama 3.1 style: ByteLevel then TemplateProcessing).
  json seq = {{"type", "Sequence"},
              {"processors", {{{"type", "ByteLevel"}}, fixture_json("tiny_spm")["post_processor"]}}};
  j["post_processor"] = seq;
  EXPECT_EQ(from(j).encode("hello"), ids({2, 277}));
  j["post_processor"] = {{"type", "BertProcessing"}, {"cls", {"<bos>", 2}}, {"sep", {"<eos>", 1}}};
  EXPECT_EQ(from(j).encode("hello"), ids({2, 277, 1}));
}

TEST(Tokenizer, NormalizedAddedTokensMatchTheNormalizedText) {
  json j = fixture_json("tiny_spm");
  // "a b" with normalized=true is looked for as "a▁b" after the Replace normalizer.
  j["model"]["vocab"]["a\xE2\x96\x81" "b"] = 400;
  j["added_tokens"].push_back({{"id", 400}, {"content", "a b"}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", true}, {"special", false}});
  const Tokenizer tok = from(j);
  EXPECT_EQ(tok.encode("xa by", false), ids({273, 400, 4 + 'y'}));
  // The added token's content wins when decoding its id (HF looks added tokens up first).
  EXPECT_EQ(tok.id_to_token(400), "a b");
  EXPECT_EQ(tok.decode(tok.encode("xa by", false)), "xa by");
}

TEST(Tokenizer, MetaspacePreTokenizerAndDecoder) {
  json j = fixture_json("tiny_spm");
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  const Tokenizer tok = from(j);
  // "first": the ▁ is prepended at the start of the input only, not after the added token.
  EXPECT_EQ(tok.encode("world", false), ids({282}));
  EXPECT_EQ(tok.encode("<start_of_turn>world", false), ids({287, 266, 279, 281}));
  EXPECT_EQ(tok.decode(tok.encode("world hello", false)), "world hello");
  const auto v = tok.encode("hello world", false);
  EXPECT_EQ(stream_all(tok, v), tok.decode(v));
}

TEST(Tokenizer, Llama2StyleLeadingStripStreams) {
  json j = fixture_json("tiny_spm");
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  j["pre_tokenizer"] = nullptr;
  j["decoder"]["decoders"].push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  const Tokenizer tok = from(j);
  EXPECT_EQ(tok.encode("world", false), ids({282}));
  for (std::string s : {"world hello", " world", "hello", "\xC3\xA9t\xC3\xA9"}) {
    SCOPED_TRACE(s);
    const auto v = tok.encode(s, false);
    EXPECT_EQ(tok.decode(v), s);
    EXPECT_EQ(stream_all(tok, v), s);
  }
}

TEST(Tokenizer, LoadsFromFileOrDirectory) {
  EXPECT_EQ(Tokenizer::load(kFixtures + "/tiny_spm").encode("hello"), ids({2, 277}));
  EXPECT_EQ(Tokenizer::load(kFixtures + "/tiny_spm/tokenizer.json").bos_id(), 2);
  // Without a tokenizer_config.json, BOS and EOS are not declared.
  test::TempDir dir;
  test::write_file(dir.file("tokenizer.json"), fixture_json("tiny_spm").dump());
  EXPECT_EQ(Tokenizer::load(dir.path().string()).bos_id(), std::nullopt);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  // The BPE word cache is shared; threads encoding at once must see the single-thread answers.
  const Tokenizer tok = Tokenizer::load(kFixtures + "/tiny_bytelevel");
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("hello world " + std::to_string(i * 7919) + " the world\n" + std::string(i % 5, ' ') + "x");
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok.encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 13 + t * 7 + round) % texts.size();
          if (tok.encode(texts[k]) != want[k]) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- bad input: each a clear fl::Error ----

TEST(TokenizerErrors, MalformedFiles) {
  expect_load_text_error("", "not valid JSON");
  expect_load_text_error("{\"model\": ", "not valid JSON");
  expect_load_text_error("[1, 2]", "expected a JSON object");
  expect_load_text_error("{}", "missing \"model\"");
  expect_load_text_error("\xFF\xFE{}", "not valid JSON");
  test::TempDir dir;
  try {
    Tokenizer::load(dir.file("nope.json"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::load(dir.path().string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos) << e.what();
  }
  test::write_file(dir.file("tokenizer.json"), fixture_json("tiny_spm").dump());
  test::write_file(dir.file("tokenizer_config.json"), "{\"bos_token\": \"<nope>\"}");
  try {
    Tokenizer::load(dir.path().string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("<nope>"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, UnsupportedComponents) {
  json j = fixture_json("tiny_spm");
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, "model type \"WordPiece\" is not supported");
  j["model"]["type"] = "Unigram";
  expect_load_error(j, "not supported");
  j = fixture_json("tiny_spm");
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  expect_load_error(j, "normalizer type \"Precompiled\" is not supported");
  j = fixture_json("tiny_spm");
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_load_error(j, "pre-tokenizer type \"UnicodeScripts\" is not supported");
  j = fixture_json("tiny_spm");
  j["decoder"] = {{"type", "CTC"}};
  expect_load_error(j, "decoder type \"CTC\" is not supported");
  j = fixture_json("tiny_spm");
  j["post_processor"] = {{"type", "Whatever"}};
  expect_load_error(j, "post-processor type \"Whatever\" is not supported");
  j = fixture_json("tiny_spm");
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, "dropout");
  j = fixture_json("tiny_spm");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(oops"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_load_error(j, "pre_tokenizer.pattern.Regex: invalid regex");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Sideways"}, {"invert", false}};
  expect_load_error(j, "unknown split behavior");
}

TEST(TokenizerErrors, BrokenVocabularyAndMerges) {
  json j = fixture_json("tiny_spm");
  j["model"]["merges"].push_back({"h", "zz"});
  expect_load_error(j, "refers to \"zz\", which is not in the vocabulary");
  j = fixture_json("tiny_spm");
  j["model"]["merges"].push_back({"x", "x"});
  expect_load_error(j, "makes \"xx\", which is not in the vocabulary");
  j = fixture_json("tiny_spm");
  j["model"]["merges"].push_back("a b c");
  expect_load_error(j, "is not two tokens separated by one space");
  j["model"]["merges"].back() = 7;
  expect_load_error(j, "merge 13 is neither");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"]["dup"] = 5;
  expect_load_error(j, "id 5 is given to two tokens");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"]["neg"] = -3;
  expect_load_error(j, "out of range");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"]["huge"] = 4000000000LL;
  expect_load_error(j, "out of range");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"]["sparse"] = 10'000'000;
  expect_load_error(j, "too sparse");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"]["float"] = 1.5;
  expect_load_error(j, "id is not an integer");
  j = fixture_json("tiny_spm");
  j["model"]["vocab"] = json::array();
  expect_load_error(j, "model.vocab: expected an object");
  j = fixture_json("tiny_spm");
  j["model"]["unk_token"] = "<missing>";
  expect_load_error(j, "unk_token \"<missing>\" is not in the vocabulary");
}

TEST(TokenizerErrors, BrokenAddedTokensAndTemplates) {
  json j = fixture_json("tiny_spm");
  j["added_tokens"].push_back({{"id", 7}, {"content", "<bos>"}, {"special", true}});
  expect_load_error(j, "has id 7 but the vocabulary gives it id 2");
  j = fixture_json("tiny_spm");
  j["added_tokens"].push_back({{"id", 2}, {"content", "<other>"}, {"special", true}});
  expect_load_error(j, "is given to two added tokens");
  j = fixture_json("tiny_spm");
  j["added_tokens"].push_back({{"content", "<noid>"}});
  expect_load_error(j, "missing \"id\"");
  j = fixture_json("tiny_spm");
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>";
  expect_load_error(j, "special token \"<nope>\" is not in the template's special_tokens");
  j = fixture_json("tiny_spm");
  j["post_processor"]["special_tokens"]["<bos>"]["ids"] = {99999};
  expect_load_error(j, "post_processor adds id 99999, which is not a token");
  j = fixture_json("tiny_spm");
  j["decoder"]["decoders"][0]["pattern"] = {{"Neither", "x"}};
  expect_load_error(j, "pattern must be");
}

}  // namespace
}  // namespace fl
