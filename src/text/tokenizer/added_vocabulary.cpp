#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "text/tokenizer/utf8.h"

namespace fl {

void TokenTrie::insert(std::string_view content, int32_t token_index) {
  int32_t node = 0;
  for (unsigned char b : content) {
    auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const std::pair<unsigned char, int32_t>& c, unsigned char x) { return c.first < x; });
    if (it != children.end() && it->first == b) {
      node = it->second;
      continue;
    }
    const int32_t child = static_cast<int32_t>(nodes_.size());
    children.insert(it, {b, child});  // `children` is not used after nodes_ grows
    if (node == 0) root_children_[b] = child;
    nodes_.emplace_back();
    node = child;
  }
  // The first token with a given content wins, as in HF's Aho-Corasick build.
  if (nodes_[node].token_index < 0) nodes_[node].token_index = token_index;
}

int32_t TokenTrie::longest_match(std::string_view text, size_t pos, size_t& length) const {
  if (pos >= text.size()) return -1;
  int32_t node = root_children_[static_cast<unsigned char>(text[pos])];
  if (node == 0) return -1;
  int32_t best = -1;
  for (size_t i = pos + 1;; ++i) {
    if (nodes_[node].token_index >= 0) {
      best = nodes_[node].token_index;
      length = i - pos;
    }
    if (i >= text.size()) break;
    const auto& children = nodes_[node].children;
    const unsigned char b = static_cast<unsigned char>(text[i]);
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const std::pair<unsigned char, int32_t>& c, unsigned char x) { return c.first < x; });
    if (it == children.end() || it->first != b) break;
    node = it->second;
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const std::vector<std::string>& normalized_contents)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    if (t.normalized) {
      if (!normalized_contents[i].empty()) normalized_trie_.insert(normalized_contents[i], static_cast<int32_t>(i));
    } else {
      raw_trie_.insert(t.content, static_cast<int32_t>(i));
    }
  }
}

namespace {

// The character that ends just before `pos` / starts at `pos`.
char32_t char_before(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  char32_t cp;
  bool valid;
  utf8::decode(s, start, cp, valid);
  return cp;
}

char32_t char_at(std::string_view s, size_t pos, size_t* len = nullptr) {
  char32_t cp;
  bool valid;
  const size_t n = utf8::decode(s, pos, cp, valid);
  if (len) *len = n;
  return cp;
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized_tokens, std::vector<TextSpan>& out) const {
  const TokenTrie& trie = normalized_tokens ? normalized_trie_ : raw_trie_;
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  const size_t first_span = out.size();
  size_t start_offset = 0;  // end of the last emitted span
  size_t pos = 0;           // where the next search starts (the end of the last match, kept or not)
  while (pos < text.size()) {
    size_t len = 0;
    const int32_t index = trie.longest_match(text, pos, len);
    if (index < 0) {
      pos += utf8::sequence_length(static_cast<unsigned char>(text[pos]));
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + len;
    pos = stop;
    if (token.single_word) {
      const bool word_before = start > 0 && utf8::is_word(char_before(text, start));
      const bool word_after = stop < text.size() && utf8::is_word(char_at(text, stop));
      if (word_before || word_after) continue;  // not a whole word: leave it to the text around
    }
    if (token.lstrip) {
      // Take the whitespace on the left, but not what an earlier match already took.
      size_t s = start;
      while (s > start_offset && utf8::is_whitespace(char_before(text, s))) {
        size_t p = s - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        s = p;
      }
      start = s;
    }
    if (token.rstrip) {
      size_t n = 0;
      while (stop < text.size() && utf8::is_whitespace(char_at(text, stop, &n))) stop += n;
      pos = stop;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size() || out.size() == first_span) out.push_back({start_offset, text.size(), -1});
}

}  // namespace fl
