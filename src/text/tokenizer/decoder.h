#pragma once
// Decoders: turn the token strings of a list of ids back into text, with HF tokenizers'
// semantics (tokenizers' decode_chain, then the pieces joined). A Sequence is flattened.
//
// Decoding is also done in windows for streaming (StreamingDetokenizer): `at_start` says the
// first token begins the whole output and `at_end` that the last token ends it. Steps whose
// effect depends on position (Metaspace's first token, Strip after a Fuse, the " " that joins
// tokens when there is no decoder) use them so that decoding consecutive windows and joining
// the results gives the one-shot text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/regex.h"

namespace fl {

struct DecoderStep {
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace };
  Kind kind = Kind::fuse;
  TextPattern pattern;  // replace
  std::string content;  // replace: replacement text
  char32_t strip_char = ' ';  // strip
  size_t strip_start = 0, strip_stop = 0;
  char32_t replacement = 0x2581;  // metaspace
  PrependScheme prepend_scheme = PrependScheme::always;
};

class Decoder {
 public:
  Decoder() = default;  // no decoder: tokens joined with " " (as HF does)
  explicit Decoder(std::vector<DecoderStep> steps);

  std::string decode(std::vector<std::string> tokens, bool at_start = true, bool at_end = true) const;
  // The bytes one token adds to the text in the middle of an output (no Strip at its ends, no
  // Metaspace prefix dropped), raw: a byte-level or byte-fallback token that is part of a UTF-8
  // character gives that part, where decode() would give U+FFFD. (OpenAI's logprobs `bytes`.)
  std::string token_bytes(std::string token) const;

  // --- what StreamingDetokenizer needs to know to cut safely between windows ---
  bool has_byte_fallback() const { return has_byte_fallback_; }
  // False when a step after a Fuse (or ByteLevel) could act across the cut (a multi-character
  // Replace, say); such chains are decoded only once the stream ends.
  bool windowable() const { return windowable_; }
  // A Strip after a Fuse that trims the end of the whole text: its character, or 0.
  char32_t trailing_strip_char() const { return trailing_strip_char_; }
  // A Strip after a Fuse that trims the start of the whole text.
  bool has_leading_strip() const { return leading_strip_; }

 private:
  std::vector<DecoderStep> steps_;
  bool has_byte_fallback_ = false;
  bool windowable_ = true;
  char32_t trailing_strip_char_ = 0;
  bool leading_strip_ = false;
};

// "<0xE2>" -> 0xE2; -1 for anything else.
int byte_fallback_value(std::string_view token);

}  // namespace fl
