#pragma once
// Normalizers: text-to-text rewrites applied to each stretch of input between added tokens
// before pre-tokenization, with HF tokenizers' semantics. A Sequence is flattened into steps.
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/regex.h"

namespace fl {

struct NormalizerStep {
  enum class Kind { nfc, nfd, nfkc, nfkd, replace, prepend, lowercase, strip, strip_accents, byte_level };
  Kind kind = Kind::nfc;
  TextPattern pattern;   // replace
  std::string content;   // replace: the replacement; prepend: the prefix
  bool strip_left = false, strip_right = false;  // strip
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // `text` is valid UTF-8; so is the result.
  std::string normalize(std::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace fl
