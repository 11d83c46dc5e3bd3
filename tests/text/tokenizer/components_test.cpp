// The tokenizer's building blocks on their own: UTF-8 handling, regex matching, split behaviours,
// normalizers, pre-tokenizers, added-token matching, BPE and decoders, each against results worked
// out by hand from HF tokenizers' documented semantics.
#include <gtest/gtest.h>

#include "core/error.h"
#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

std::vector<std::string> strings(const std::vector<std::string_view>& v) { return {v.begin(), v.end()}; }

NormalizerStep norm_step(NormalizerStep::Kind k) {
  NormalizerStep s;
  s.kind = k;
  return s;
}
PreTokenizerStep pre_step(PreTokenizerStep::Kind k) {
  PreTokenizerStep s;
  s.kind = k;
  return s;
}
DecoderStep dec_step(DecoderStep::Kind k) {
  DecoderStep s;
  s.kind = k;
  return s;
}

TEST(Utf8, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::sanitize("abc"), "abc");
  EXPECT_EQ(utf8::sanitize("a\x80" "b"), "a\uFFFD" "b");
  // A truncated 3-byte sequence is one maximal subpart: one U+FFFD.
  EXPECT_EQ(utf8::sanitize("a\xE2\x82" "b"), "a\uFFFD" "b");
  EXPECT_EQ(utf8::sanitize("\xE2\x82"), "\uFFFD");
  // Overlong forms and surrogates: every byte is its own subpart.
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x99" " "), "\uFFFD ");
  EXPECT_EQ(utf8::sanitize(std::string("\0x", 2)), std::string("\0x", 2));
  EXPECT_TRUE(utf8::is_valid("h\xC3\xA9llo \xF0\x9F\x99\x82"));
  EXPECT_FALSE(utf8::is_valid("\xFF"));
}

TEST(Utf8, CharacterClasses) {
  EXPECT_TRUE(utf8::is_whitespace(0x3000));
  EXPECT_TRUE(utf8::is_whitespace(0x85));
  EXPECT_FALSE(utf8::is_whitespace(0x200B));  // zero width space is not White_Space
  EXPECT_TRUE(utf8::is_numeric(0x00BD));      // ½
  EXPECT_TRUE(utf8::is_numeric(0x0663));      // Arabic-Indic 3
  EXPECT_FALSE(utf8::is_numeric('a'));
  EXPECT_TRUE(utf8::is_word(0x0301));  // combining acute
  EXPECT_TRUE(utf8::is_word('_'));
  EXPECT_FALSE(utf8::is_word('-'));
  EXPECT_TRUE(utf8::is_punctuation('!'));
  EXPECT_TRUE(utf8::is_punctuation(0x3002));  // ideographic full stop
}

TEST(ByteLevel, TableRoundTrips) {
  EXPECT_EQ(byte_level_encode(" "), "\xC4\xA0");  // Ġ
  EXPECT_EQ(byte_level_encode("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level_encode("a"), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string back;
  ASSERT_TRUE(byte_level_decode(byte_level_encode(all), back));
  EXPECT_EQ(back, all);
  std::string none;
  EXPECT_FALSE(byte_level_decode("\xE2\x96\x81", none));  // ▁ is not in the table
  EXPECT_TRUE(none.empty());
}

TEST(Regex, FindsMatchesAndReportsBadPatterns) {
  Regex re(R"(\s+(?!\S)|\s+)");
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all("a   b", m);
  ASSERT_EQ(m.size(), 2u);  // "  " then " " (the lookahead leaves one space for the word)
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{3, 4}));
  m.clear();
  Regex(R"(\p{L}+)").find_all("caf\xC3\xA9 42", m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].second, 5u);
  // Empty matches advance one character at a time and never loop.
  m.clear();
  Regex("x*").find_all("ab", m);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_THROW(Regex("(unclosed"), Error);
  EXPECT_THROW(Regex("\\p{NoSuchProperty}"), Error);
}

TEST(Split, EveryBehaviour) {
  const std::string text = "a  b";
  std::vector<std::pair<size_t, size_t>> spaces{{1, 2}, {2, 3}};
  using B = SplitBehavior;
  EXPECT_EQ(strings(split_pieces(text, spaces, B::removed, false)), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(strings(split_pieces(text, spaces, B::isolated, false)), (std::vector<std::string>{"a", " ", " ", "b"}));
  // HF merges a delimiter into the previous piece only when that piece is not a delimiter itself.
  EXPECT_EQ(strings(split_pieces(text, spaces, B::merged_with_previous, false)), (std::vector<std::string>{"a ", " ", "b"}));
  EXPECT_EQ(strings(split_pieces(text, spaces, B::merged_with_next, false)), (std::vector<std::string>{"a", " ", " b"}));
  EXPECT_EQ(strings(split_pieces(text, spaces, B::contiguous, false)), (std::vector<std::string>{"a", "  ", "b"}));
  // invert: the matches are the content, the rest is the delimiter.
  EXPECT_EQ(strings(split_pieces(text, spaces, B::removed, true)), (std::vector<std::string>{" ", " "}));
  EXPECT_EQ(strings(split_pieces("", {}, B::isolated, false)), std::vector<std::string>{});
  EXPECT_EQ(strings(split_pieces(" x", {{0, 1}}, B::merged_with_previous, false)), (std::vector<std::string>{" ", "x"}));
}

TEST(Normalizer, Steps) {
  using K = NormalizerStep::Kind;
  auto one = [](NormalizerStep s) { return Normalizer({std::move(s)}); };
  EXPECT_EQ(one(norm_step(K::nfc)).normalize("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(one(norm_step(K::nfd)).normalize("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(one(norm_step(K::nfkc)).normalize("\xEF\xAC\x81"), "fi");  // ﬁ
  NormalizerStep rep = norm_step(K::replace);
  rep.pattern = TextPattern::literal(" ");
  rep.content = "\xE2\x96\x81";
  EXPECT_EQ(one(rep).normalize(" a b "), "\xE2\x96\x81" "a\xE2\x96\x81" "b\xE2\x96\x81");
  NormalizerStep pre = norm_step(K::prepend);
  pre.content = "_";
  EXPECT_EQ(one(pre).normalize("x"), "_x");
  EXPECT_EQ(one(pre).normalize(""), "");  // HF prepends only to non-empty text
  EXPECT_EQ(one(norm_step(K::lowercase)).normalize("\xC4\xB0X\xC3\x89"), "i\xCC\x87x\xC3\xA9");  // İ -> i̇
  NormalizerStep strip = norm_step(K::strip);
  strip.strip_left = true;
  EXPECT_EQ(one(strip).normalize(" \t\xE3\x80\x80x "), "x ");
  EXPECT_EQ(one(norm_step(K::strip_accents)).normalize("e\xCC\x81"), "e");
  // A sequence applies in order.
  Normalizer seq({norm_step(K::nfd), norm_step(K::strip_accents), norm_step(K::lowercase)});
  EXPECT_EQ(seq.normalize("\xC3\x89T\xC3\x89"), "ete");
}

TEST(PreTokenizer, ByteLevelAndMetaspace) {
  PreTokenizerStep bl = pre_step(PreTokenizerStep::Kind::byte_level);
  bl.add_prefix_space = true;
  std::vector<std::string> words;
  PreTokenizer({bl}).pre_tokenize("Hello world!", true, words);
  EXPECT_EQ(words, (std::vector<std::string>{"\xC4\xA0Hello", "\xC4\xA0world", "!"}));

  PreTokenizerStep ms = pre_step(PreTokenizerStep::Kind::metaspace);
  ms.prepend_scheme = PrependScheme::first;
  words.clear();
  PreTokenizer({ms}).pre_tokenize("a b", true, words);
  EXPECT_EQ(words, (std::vector<std::string>{"\xE2\x96\x81" "a", "\xE2\x96\x81" "b"}));
  words.clear();
  PreTokenizer({ms}).pre_tokenize("a b", false, words);  // not the start of the input: no prefix
  EXPECT_EQ(words, (std::vector<std::string>{"a", "\xE2\x96\x81" "b"}));

  PreTokenizerStep digits = pre_step(PreTokenizerStep::Kind::digits);
  digits.individual_digits = true;
  words.clear();
  PreTokenizer({digits}).pre_tokenize("ab12", true, words);
  EXPECT_EQ(words, (std::vector<std::string>{"ab", "1", "2"}));
  words.clear();
  PreTokenizer({pre_step(PreTokenizerStep::Kind::whitespace_split)}).pre_tokenize(" a  b\t", true, words);
  EXPECT_EQ(words, (std::vector<std::string>{"a", "b"}));
}

TEST(AddedVocabulary, LeftmostLongestAndFlags) {
  std::vector<AddedToken> tokens(5);
  tokens[0] = {"<a>", 10, true, false, false, false, false};
  tokens[1] = {"<a><b>", 11, true, false, false, false, false};
  tokens[2] = {"[L]", 12, false, false, true, false, false};
  tokens[3] = {"[R]", 13, false, false, false, true, false};
  tokens[4] = {"w", 14, false, true, false, false, false};
  std::vector<std::string> contents;
  for (auto& t : tokens) contents.push_back(t.content);
  AddedVocabulary added(tokens, contents);
  auto split = [&](std::string_view text) {
    std::vector<TextSpan> spans;
    added.split(text, false, spans);
    std::vector<std::string> out;
    for (auto& s : spans) out.push_back((s.id >= 0 ? "#" + std::to_string(s.id) + ":" : "") + std::string(text.substr(s.start, s.end - s.start)));
    return out;
  };
  EXPECT_EQ(split("x<a><b>y<a>"), (std::vector<std::string>{"x", "#11:<a><b>", "y", "#10:<a>"}));
  EXPECT_EQ(split("x  [L]  y"), (std::vector<std::string>{"x", "#12:  [L]", "  y"}));
  EXPECT_EQ(split("x  [R]  y"), (std::vector<std::string>{"x  ", "#13:[R]  ", "y"}));
  // single_word: "w" only matches where no word character touches it.
  EXPECT_EQ(split("a w b"), (std::vector<std::string>{"a ", "#14:w", " b"}));
  EXPECT_EQ(split("awb w"), (std::vector<std::string>{"awb ", "#14:w"}));
  EXPECT_EQ(split(""), (std::vector<std::string>{""}));
}

TEST(Bpe, MergesByRankThenLeftmost) {
  std::vector<std::pair<std::string_view, int32_t>> entries{{"a", 0}, {"b", 1}, {"ab", 2}, {"ba", 3}, {"aba", 4}};
  auto vocab = std::make_shared<Vocab>(entries, "test");
  // "aba": (a,b) rank 0 at 0 wins over (b,a) rank 1; then (ab,a) -> aba.
  BpeModel m(vocab, {{"a", "b"}, {"b", "a"}, {"ab", "a"}}, {});
  std::vector<int32_t> ids;
  m.encode_word("aba", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{4}));
  // Ties on rank go to the leftmost pair: "abab" -> ab ab.
  ids.clear();
  m.encode_word("abab", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 2}));
  // Cached words give the same answer.
  ids.clear();
  m.encode_word("abab", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 2}));
}

TEST(Bpe, UnknownCharactersAndByteFallback) {
  std::vector<std::pair<std::string_view, int32_t>> entries{{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  auto vocab = std::make_shared<Vocab>(entries, "test");
  BpeOptions fuse;
  fuse.unk_token = "<unk>";
  fuse.fuse_unk = true;
  std::vector<int32_t> ids;
  BpeModel(vocab, {}, fuse).encode_word("a\xE2\x82\xAC\xE2\x82\xAC" "a", ids);  // a €€ a
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 0, 1}));
  BpeOptions nofuse;
  nofuse.unk_token = "<unk>";
  ids.clear();
  BpeModel(vocab, {}, nofuse).encode_word("\xE2\x82\xAC\xE2\x82\xAC", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 0}));
  BpeOptions fallback = fuse;
  fallback.byte_fallback = true;
  ids.clear();
  BpeModel(vocab, {}, fallback).encode_word("a\xC3\xA9\xE2\x82\xAC", ids);  // é has byte tokens, € does not
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 0}));
  ids.clear();
  BpeModel(vocab, {}, BpeOptions{}).encode_word("a\xE2\x82\xAC", ids);  // no unk: dropped, as HF does
  EXPECT_EQ(ids, (std::vector<int32_t>{1}));
}

TEST(Bpe, SubwordPrefixAndSuffix) {
  std::vector<std::pair<std::string_view, int32_t>> entries{{"a", 0}, {"##b", 1}, {"ab", 2}, {"c</w>", 3}, {"##c</w>", 4}};
  auto vocab = std::make_shared<Vocab>(entries, "test");
  BpeOptions o;
  o.continuing_subword_prefix = "##";
  o.end_of_word_suffix = "</w>";
  BpeModel m(vocab, {{"a", "##b"}}, o);
  std::vector<int32_t> ids;
  m.encode_word("abc", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 4}));
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  std::vector<std::pair<std::string_view, int32_t>> entries{{"a", 0}, {"b", 1}, {"ab", 2}, {"abb", 3}, {"bb", 4}};
  auto vocab = std::make_shared<Vocab>(entries, "test");
  BpeOptions o;
  std::vector<int32_t> ids;
  BpeModel(vocab, {{"b", "b"}, {"a", "b"}}, o).encode_word("abb", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 4}));  // merges alone never reach "abb"
  o.ignore_merges = true;
  ids.clear();
  BpeModel(vocab, {{"b", "b"}, {"a", "b"}}, o).encode_word("abb", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{3}));
}

TEST(Bpe, RejectsBrokenTables) {
  std::vector<std::pair<std::string_view, int32_t>> entries{{"a", 0}, {"b", 1}, {"ab", 2}};
  auto vocab = std::make_shared<Vocab>(entries, "test");
  EXPECT_THROW(BpeModel(vocab, {{"a", "x"}}, {}), Error);
  EXPECT_THROW(BpeModel(vocab, {{"b", "a"}}, {}), Error);  // "ba" is not a token
  BpeOptions o;
  o.unk_token = "<unk>";
  EXPECT_THROW(BpeModel(vocab, {}, o), Error);
  EXPECT_THROW(Vocab({{"a", 0}, {"b", 0}}, "test"), Error);  // duplicate id
  EXPECT_THROW(Vocab({{"a", 0}, {"a", 1}}, "test"), Error);  // duplicate token
  EXPECT_THROW(Vocab({{"a", -1}}, "test"), Error);
  EXPECT_THROW(Vocab({{"a", 5'000'000}}, "test"), Error);  // far too sparse
}

std::string decode(const Decoder& d, std::vector<std::string> tokens) { return d.decode(std::move(tokens)); }

TEST(Decoder, GemmaStyleChain) {
  DecoderStep replace = dec_step(DecoderStep::Kind::replace);
  replace.pattern = TextPattern::literal("\xE2\x96\x81");
  replace.content = " ";
  Decoder d({replace, dec_step(DecoderStep::Kind::byte_fallback), dec_step(DecoderStep::Kind::fuse)});
  EXPECT_EQ(decode(d, {"\xE2\x96\x81" "a", "<0xE2>", "<0x80>", "<0x99>", "s"}), " a\xE2\x80\x99s");
  // An invalid run becomes one U+FFFD per byte (HF's ByteFallback).
  EXPECT_EQ(decode(d, {"x", "<0xE2>", "<0x80>", "y"}), "x\uFFFD\uFFFDy");
  EXPECT_EQ(decode(d, {"<0xFF>"}), "\uFFFD");
  EXPECT_TRUE(d.has_byte_fallback());
  EXPECT_TRUE(d.windowable());
}

TEST(Decoder, ByteLevelIsLossyOverAllBytes) {
  Decoder d({dec_step(DecoderStep::Kind::byte_level)});
  EXPECT_EQ(decode(d, {"\xC4\xA0h", "i"}), " hi");
  // "âĢ" "Ļ" are the three bytes of ’ split over two tokens.
  EXPECT_EQ(decode(d, {"\xC3\xA2\xC4\xA2", "\xC4\xBB"}), "\xE2\x80\x99");
  EXPECT_EQ(decode(d, {"\xC3\xA2\xC4\xA2"}), "\uFFFD");
  // Tokens outside the byte table (added tokens) pass through.
  EXPECT_EQ(decode(d, {"<|x|>", "\xE2\x96\x81"}), "<|x|>\xE2\x96\x81");
}

TEST(Decoder, MetaspaceStripAndNoDecoder) {
  DecoderStep ms = dec_step(DecoderStep::Kind::metaspace);
  Decoder meta({ms});
  // HF drops every ▁ of the first token, and turns the others into spaces.
  EXPECT_EQ(decode(meta, {"\xE2\x96\x81" "a\xE2\x96\x81", "\xE2\x96\x81" "b"}), "a b");
  EXPECT_EQ(meta.decode({"\xE2\x96\x81" "b"}, /*at_start=*/false, true), " b");
  DecoderStep strip = dec_step(DecoderStep::Kind::strip);
  strip.strip_char = ' ';
  strip.strip_start = 1;
  Decoder llama2({dec_step(DecoderStep::Kind::fuse), strip});
  EXPECT_EQ(decode(llama2, {" a", " b"}), "a b");
  EXPECT_EQ(llama2.decode({" b"}, /*at_start=*/false, true), " b");
  EXPECT_TRUE(llama2.has_leading_strip());
  Decoder none;
  EXPECT_EQ(decode(none, {"a", "b"}), "a b");
  EXPECT_EQ(none.decode({"c"}, /*at_start=*/false, true), " c");
}

TEST(Decoder, TokenBytesKeepPartsOfCharacters) {
  Decoder bytes({dec_step(DecoderStep::Kind::byte_level)});
  // "âĢ" is the first two bytes of ’: decode() says U+FFFD, token_bytes the bytes.
  EXPECT_EQ(bytes.token_bytes("\xC3\xA2\xC4\xA2"), "\xE2\x80");
  EXPECT_EQ(bytes.token_bytes("\xC4\xA0h"), " h");
  EXPECT_EQ(bytes.token_bytes("<|x|>"), "<|x|>");  // outside the byte table: as it is
  DecoderStep replace = dec_step(DecoderStep::Kind::replace);
  replace.pattern = TextPattern::literal("\xE2\x96\x81");
  replace.content = " ";
  Decoder gemma({replace, dec_step(DecoderStep::Kind::byte_fallback), dec_step(DecoderStep::Kind::fuse)});
  EXPECT_EQ(gemma.token_bytes("\xE2\x96\x81"
                              "a"),
            " a");
  EXPECT_EQ(gemma.token_bytes("<0xE2>"), "\xE2");
  // Metaspace inside an output keeps its space; Strip trims only the ends of a whole output.
  Decoder meta({dec_step(DecoderStep::Kind::metaspace)});
  EXPECT_EQ(meta.token_bytes("\xE2\x96\x81"
                             "b"),
            " b");
  DecoderStep strip = dec_step(DecoderStep::Kind::strip);
  strip.strip_char = ' ';
  strip.strip_start = 1;
  Decoder llama2({dec_step(DecoderStep::Kind::fuse), strip});
  EXPECT_EQ(llama2.token_bytes(" b"), " b");
  EXPECT_EQ(Decoder().token_bytes("c"), "c");
}

TEST(Decoder, ByteFallbackValue) {
  EXPECT_EQ(byte_fallback_value("<0x0A>"), 10);
  EXPECT_EQ(byte_fallback_value("<0xff>"), 255);
  EXPECT_EQ(byte_fallback_value("<0xG0>"), -1);
  EXPECT_EQ(byte_fallback_value("<0x0A"), -1);
  EXPECT_EQ(byte_fallback_value("0x0A>"), -1);
}

}  // namespace
}  // namespace fl
