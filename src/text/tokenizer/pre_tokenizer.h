#pragma once
// Pre-tokenizers: cut a normalized stretch of text into the words that BPE encodes one by one,
// with HF tokenizers' semantics (split behaviours, ByteLevel's byte mapping, Metaspace's "▁").
// A Sequence is flattened into steps applied in order to every piece.
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/regex.h"

namespace fl {

// What happens to the delimiter a Split finds (HF SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

enum class PrependScheme { always, first, never };

struct PreTokenizerStep {
  enum class Kind { split, byte_level, metaspace, digits, whitespace_split, punctuation };
  Kind kind = Kind::split;
  // split
  TextPattern pattern;
  bool invert = false;
  SplitBehavior behavior = SplitBehavior::isolated;  // also punctuation's
  // byte_level
  bool add_prefix_space = false;
  bool use_regex = true;
  // metaspace
  std::string replacement = "\xE2\x96\x81";  // U+2581
  PrependScheme prepend_scheme = PrependScheme::always;
  bool split = true;
  // digits
  bool individual_digits = false;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps);

  bool empty() const { return steps_.empty(); }
  // Appends the words of `text`. `at_input_start` says that `text` begins the whole input
  // (Metaspace's prepend_scheme "first" looks at it).
  void pre_tokenize(std::string_view text, bool at_input_start, std::vector<std::string>& words) const;

 private:
  std::vector<PreTokenizerStep> steps_;
  TextPattern gpt2_pattern_;  // ByteLevel's own split regex, compiled once when a step needs it
};

// The pieces of `text` after splitting at `matches` (sorted, non-overlapping [start, end) byte
// ranges) with the given behaviour; `invert` swaps which parts count as delimiters. Empty pieces
// are dropped. Exposed for tests.
std::vector<std::string_view> split_pieces(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
                                           SplitBehavior behavior, bool invert);

}  // namespace fl
