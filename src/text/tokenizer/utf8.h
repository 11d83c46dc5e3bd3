#pragma once
// UTF-8 helpers for the tokenizer: decoding with the Unicode "maximal subpart" replacement policy
// (the one WHATWG TextDecoder, Rust's String::from_utf8_lossy and Python's errors="replace" use),
// and the few Unicode character classes that HF tokenizers' Rust code tests with char methods.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fl::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Decodes one code point at s[pos]. Returns the number of bytes consumed (>= 1 when pos < size).
// An invalid or truncated sequence consumes its maximal subpart and yields U+FFFD with
// `valid` false.
size_t decode(std::string_view s, size_t pos, char32_t& cp, bool& valid);

void append(std::string& out, char32_t cp);

// True when s is well-formed UTF-8.
bool is_valid(std::string_view s);

// s with every ill-formed subsequence replaced by U+FFFD (maximal-subpart policy).
std::string sanitize(std::string_view s);

// Number of code points in valid UTF-8.
size_t count_chars(std::string_view s);

// Byte length of the UTF-8 sequence that starts with lead byte b (1 for invalid leads).
inline size_t sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 1;
}

// Unicode White_Space (Rust char::is_whitespace, regex \s).
bool is_whitespace(char32_t c);
// General category N* (Rust char::is_numeric).
bool is_numeric(char32_t c);
// Letters and letter numbers (an approximation of the Alphabetic property: L*, Nl).
bool is_alphabetic(char32_t c);
// Word characters as Rust's regex \w defines them: Alphabetic, marks, Nd, Pc, joiners.
bool is_word(char32_t c);
// General category P* or ASCII punctuation/symbols (HF's Punctuation pre-tokenizer).
bool is_punctuation(char32_t c);

}  // namespace fl::utf8
