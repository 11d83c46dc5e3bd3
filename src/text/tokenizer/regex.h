#pragma once
// Oniguruma, the regex engine HF tokenizers uses, behind a small interface: compile once, find
// all non-overlapping matches. Patterns come from tokenizer.json (Split pre-tokenizers, Replace
// normalizers/decoders), so compile errors are reported as fl::Error naming the pattern.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fl {

class Regex {
 public:
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [start, end) byte ranges of all matches in `text` (valid UTF-8), scanning left to
  // right the way the onig crate's find_iter does: an empty match right where the previous match
  // ended is skipped. Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace fl

namespace fl {

// A tokenizer.json pattern: {"String": "..."} (a literal) or {"Regex": "..."}.
class TextPattern {
 public:
  static TextPattern literal(std::string text);
  static TextPattern regex(std::string_view pattern);

  // Non-overlapping matches, left to right. An empty literal matches nothing.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  // Replaces every match with `content`.
  std::string replace_all(std::string_view text, std::string_view content) const;

  bool is_regex() const { return regex_ != nullptr; }
  // The literal text (empty for a regex).
  const std::string& literal_text() const { return literal_; }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

}  // namespace fl
