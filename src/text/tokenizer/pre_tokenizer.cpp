#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

// GPT-2's word regex, which the ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

using Ranges = std::vector<std::pair<size_t, size_t>>;

// Every character for which pred is true is its own match (HF's Pattern for Fn(char) -> bool).
template <typename Pred>
void char_matches(std::string_view text, Pred pred, Ranges& out) {
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8::decode(text, i, cp, valid);
    if (pred(cp)) out.emplace_back(i, i + len);
    i += len;
  }
}

}  // namespace

std::vector<std::string_view> split_pieces(std::string_view text, const Ranges& matches, SplitBehavior behavior,
                                           bool invert) {
  // (start, end, is_delimiter) covering the whole text, as HF's find_matches produces them.
  struct Part {
    size_t start, end;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (prev < s) parts.push_back({prev, s, false});
    parts.push_back({s, e, true});
    prev = e;
  }
  if (prev < text.size() || parts.empty()) parts.push_back({prev, text.size(), false});
  if (invert)
    for (Part& p : parts) p.is_match = !p.is_match;

  std::vector<Part> out;
  out.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::removed:
      for (const Part& p : parts)
        if (!p.is_match) out.push_back(p);
      break;
    case SplitBehavior::isolated:
      out = parts;
      break;
    case SplitBehavior::merged_with_previous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty())
          out.back().end = p.end;
        else
          out.push_back(p);
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool previous_match = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.is_match && !previous_match && !out.empty())
          out.back().start = p.start;
        else
          out.push_back(p);
        previous_match = p.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::contiguous: {
      bool previous_match = false;
      bool first = true;
      for (const Part& p : parts) {
        if (!first && p.is_match == previous_match)
          out.back().end = p.end;
        else
          out.push_back(p);
        previous_match = p.is_match;
        first = false;
      }
      break;
    }
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(out.size());
  for (const Part& p : out)
    if (p.end > p.start) pieces.push_back(text.substr(p.start, p.end - p.start));
  return pieces;
}

PreTokenizer::PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {
  for (const auto& s : steps_)
    if (s.kind == PreTokenizerStep::Kind::byte_level && s.use_regex) {
      gpt2_pattern_ = TextPattern::regex(kGpt2Pattern);
      break;
    }
}

void PreTokenizer::pre_tokenize(std::string_view text, bool at_input_start, std::vector<std::string>& words) const {
  if (text.empty()) return;
  // Each piece remembers whether it begins the whole input (Metaspace's "first" scheme asks).
  struct Piece {
    std::string text;
    bool at_start;
  };
  std::vector<Piece> pieces{{std::string(text), at_input_start}};
  std::vector<Piece> next;
  Ranges matches;
  auto emit_views = [&](const Piece& parent, const std::string& base, const std::vector<std::string_view>& views) {
    for (std::string_view v : views) next.push_back({std::string(v), parent.at_start && v.data() == base.data()});
  };
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (Piece& piece : pieces) {
      matches.clear();
      std::string& s = piece.text;
      switch (step.kind) {
        case PreTokenizerStep::Kind::split:
          step.pattern.find_all(s, matches);
          emit_views(piece, s, split_pieces(s, matches, step.behavior, step.invert));
          break;
        case PreTokenizerStep::Kind::byte_level: {
          // HF prepends only to non-empty text that does not already start with a space.
          if (step.add_prefix_space && !s.empty() && s[0] != ' ') s.insert(0, " ");
          if (step.use_regex) {
            gpt2_pattern_.find_all(s, matches);
            for (std::string_view v : split_pieces(s, matches, SplitBehavior::isolated, false))
              next.push_back({byte_level_encode(v), piece.at_start && v.data() == s.data()});
          } else {
            next.push_back({byte_level_encode(s), piece.at_start});
          }
          break;
        }
        case PreTokenizerStep::Kind::metaspace: {
          std::string m = TextPattern::literal(" ").replace_all(s, step.replacement);
          const bool starts = m.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!m.empty() && !starts &&
              (step.prepend_scheme == PrependScheme::always || (step.prepend_scheme == PrependScheme::first && piece.at_start)))
            m.insert(0, step.replacement);
          if (step.split) {
            TextPattern::literal(step.replacement).find_all(m, matches);
            emit_views(piece, m, split_pieces(m, matches, SplitBehavior::merged_with_next, false));
          } else {
            next.push_back({std::move(m), piece.at_start});
          }
          break;
        }
        case PreTokenizerStep::Kind::digits:
          char_matches(s, utf8::is_numeric, matches);
          emit_views(piece, s, split_pieces(s, matches, step.individual_digits ? SplitBehavior::isolated : SplitBehavior::contiguous, false));
          break;
        case PreTokenizerStep::Kind::whitespace_split:
          char_matches(s, utf8::is_whitespace, matches);
          emit_views(piece, s, split_pieces(s, matches, SplitBehavior::removed, false));
          break;
        case PreTokenizerStep::Kind::punctuation:
          char_matches(s, utf8::is_punctuation, matches);
          emit_views(piece, s, split_pieces(s, matches, step.behavior, false));
          break;
      }
    }
    pieces.swap(next);
  }
  for (auto& p : pieces)
    if (!p.text.empty()) words.push_back(std::move(p.text));
}

}  // namespace fl
