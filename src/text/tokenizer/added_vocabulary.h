#pragma once
// Added tokens (special tokens like <bos>, and plain added tokens like Gemma's "\n\n" or "<td>"):
// found in the text before anything else and never cut by BPE. Matching follows HF tokenizers:
// leftmost-longest over all contents; tokens with normalized=false are looked for in the raw
// text, those with normalized=true in the normalized text (against their normalized content);
// single_word, lstrip and rstrip adjust or reject a match.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fl {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A stretch of text: either a matched added token (id >= 0) or plain text (id < 0).
struct TextSpan {
  size_t start, end;
  int32_t id;
};

// A byte trie over token contents, answering "longest content starting here".
class TokenTrie {
 public:
  void insert(std::string_view content, int32_t token_index);
  // Index of the longest content that is a prefix of text[pos..], and its length; -1 if none.
  int32_t longest_match(std::string_view text, size_t pos, size_t& length) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token_index = -1;
  };
  std::vector<Node> nodes_{Node{}};
  int32_t root_children_[256] = {};  // direct table for the first byte (0 = none)
  bool root_init_ = false;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalized_contents[i]` is tokens[i].content after the tokenizer's normalizer (used for
  // tokens with normalized=true).
  AddedVocabulary(std::vector<AddedToken> tokens, const std::vector<std::string>& normalized_contents);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

  // Splits `text` into spans covering it, using the raw-text tokens (normalized=false) or the
  // normalized-text tokens (normalized=true).
  void split(std::string_view text, bool normalized_tokens, std::vector<TextSpan>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  TokenTrie raw_trie_;
  TokenTrie normalized_trie_;
};

}  // namespace fl
