#pragma once
// The BPE model: a vocabulary (token string <-> id) and ranked merges, and the merge loop that
// turns one pre-tokenized word into ids with HF tokenizers' exact semantics (lowest rank first,
// leftmost on ties; byte fallback and unknown-token fusing per character).
//
// The representation is deliberately loader-neutral: tokenizer.json fills it from its "model"
// object, and a GGUF loader can fill it from tokenizer.ggml.tokens / tokenizer.ggml.merges
// (merges there are "a b" strings, the same form as older tokenizer.json files).
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fl {

// Token strings by id (ids may have holes) and the reverse lookup. Immutable once built.
class Vocab {
 public:
  // Largest id accepted: real vocabularies are below 2^20; this bounds memory on hostile input.
  static constexpr int32_t kMaxId = (1 << 24) - 1;

  Vocab() = default;
  // entries: (token, id) pairs. Throws fl::Error on a negative or too large id, an id given to two
  // tokens, or a token listed twice. `what` names the source in messages.
  Vocab(const std::vector<std::pair<std::string_view, int32_t>>& entries, std::string_view what);

  std::optional<int32_t> find(std::string_view token) const { return find(token, hash(token)); }
  // The same with the hash precomputed; prefetch() lets a caller overlap the memory accesses of a
  // batch of lookups (the loader does ~1.5M of them for Gemma 3's merges).
  static uint64_t hash(std::string_view token);
  std::optional<int32_t> find(std::string_view token, uint64_t hash) const;
  void prefetch(uint64_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hash & mask_]);
  }
  // The token with this id, or nullopt for a hole or an out-of-range id.
  std::optional<std::string_view> token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= offsets_.size() || offsets_[id].second == kNoToken) return std::nullopt;
    return std::string_view(arena_.data() + offsets_[id].first, offsets_[id].second);
  }
  size_t size() const { return count_; }        // number of tokens
  int32_t id_end() const { return static_cast<int32_t>(offsets_.size()); }  // max id + 1

 private:
  static constexpr uint32_t kNoToken = 0xFFFFFFFF;
  std::string arena_;
  std::vector<std::pair<uint32_t, uint32_t>> offsets_;  // (offset, length) into arena_ by id
  // Open-addressing index from token string to id, id -1 when empty. A slot carries the token's
  // place in the arena so a probe costs one cache miss before the final compare: loading Gemma 3
  // does ~1.8M lookups, where std::unordered_map's node chasing dominated.
  struct Slot {
    uint32_t tag;
    int32_t id;
    uint32_t offset;
    uint32_t length;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

// A merge resolved to ids: symbols `left` and `right`, adjacent, become `result`. Lower ranks merge
// first; merges of equal rank go leftmost first (SentencePiece's score order, where every pair
// that spells the same piece has that piece's score).
struct BpeMerge {
  int32_t left, right, result, rank;
};

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // merges: (left, right) token pairs in rank order. Throws fl::Error when a merge names a token
  // that is not in the vocabulary or whose concatenation is not, or when unk_token is unknown.
  BpeModel(std::shared_ptr<const Vocab> vocab, const std::vector<std::pair<std::string_view, std::string_view>>& merges,
           BpeOptions options);
  // Merges already resolved to ids (a GGUF SentencePiece vocabulary derives them from scores).
  // Throws fl::Error for an id that is not in the vocabulary or a negative rank.
  static std::unique_ptr<BpeModel> from_id_merges(std::shared_ptr<const Vocab> vocab, const std::vector<BpeMerge>& merges,
                                                  BpeOptions options);
  ~BpeModel();

  // Appends the ids of one word. Thread-safe (the word cache is locked).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return *vocab_; }
  const BpeOptions& options() const { return options_; }
  size_t merge_count() const { return merge_count_; }

 private:
  struct MergeTable;
  void init_special_ids();  // unk_id_ and byte_ids_ from the options and the vocabulary
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::shared_ptr<const Vocab> vocab_;
  BpeOptions options_;
  std::unique_ptr<MergeTable> merges_;
  size_t merge_count_ = 0;
  std::optional<int32_t> unk_id_;
  int32_t byte_ids_[256];  // id of "<0xXX>" for byte fallback, or -1

  // Words seen recently (HF caches short words the same way); cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace fl
