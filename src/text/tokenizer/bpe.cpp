#include "text/tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include <fmt/format.h>

#include "core/error.h"
#include "text/tokenizer/utf8.h"

namespace fl {

// A fast 64-bit hash of a short byte string (multiply-xorshift over 8-byte words).
uint64_t Vocab::hash(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (s.size() * 0xC2B2AE3D27D4EB4FULL);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0x94D049BB133111EBULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  return h;
}

Vocab::Vocab(const std::vector<std::pair<std::string_view, int32_t>>& entries, std::string_view what) {
  int32_t max_id = -1;
  size_t bytes = 0;
  for (const auto& [token, id] : entries) {
    if (id < 0 || id > kMaxId) fail("{}: token id {} of {:?} is out of range (0..{})", what, id, token, kMaxId);
    max_id = std::max(max_id, id);
    bytes += token.size();
  }
  // Ids may have holes (HF allows it) but not so many that a tiny file claims gigabytes.
  if (static_cast<size_t>(max_id) >= 2 * entries.size() + 4096)
    fail("{}: token ids are too sparse ({} tokens, largest id {})", what, entries.size(), max_id);
  if (bytes > 0xFFFFFFF0u) fail("{}: token strings total {} bytes, too large", what, bytes);
  arena_.reserve(bytes);
  offsets_.assign(static_cast<size_t>(max_id + 1), {0, kNoToken});
  for (const auto& [token, id] : entries) {
    if (offsets_[id].second != kNoToken)
      fail("{}: id {} is given to two tokens ({:?} and {:?})", what, id,
           std::string_view(arena_.data() + offsets_[id].first, offsets_[id].second), token);
    offsets_[id] = {static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(token.size())};
    arena_.append(token);
  }
  size_t cap = 16;
  while (cap < entries.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{0, -1, 0, 0});
  mask_ = cap - 1;
  for (const auto& [token, id] : entries) {
    const uint64_t h = hash(token);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot = Slot{tag, id, offsets_[id].first, offsets_[id].second};
        break;
      }
      if (slot.tag == tag && *this->token(slot.id) == token)
        fail("{}: token {:?} is listed twice (ids {} and {})", what, token, slot.id, id);
    }
  }
  count_ = entries.size();
}

std::optional<int32_t> Vocab::find(std::string_view token, uint64_t h) const {
  if (slots_.empty()) return std::nullopt;
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = slots_[i];
    if (slot.id < 0) return std::nullopt;
    if (slot.tag == tag && slot.length == token.size() &&
        std::memcmp(arena_.data() + slot.offset, token.data(), token.size()) == 0)
      return slot.id;
  }
}

// Open-addressing hash map from a pair of token ids to (rank, merged id). Lookups are the inner
// loop of BPE, and std::unordered_map's nodes cost a cache miss each.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t new_id;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Slot> slots;
  size_t mask = 0;

  static uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots.assign(cap, Slot{kEmpty, 0, 0});
    mask = cap - 1;
  }
  // A later duplicate replaces an earlier one, as in HF (the map is built by collecting pairs).
  void insert(uint64_t k, int32_t rank, int32_t new_id) {
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == k) {
        slots[i] = Slot{k, rank, new_id};
        return;
      }
    }
  }
  const Slot* find(uint64_t k) const {
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

BpeModel::BpeModel(std::shared_ptr<const Vocab> vocab,
                   const std::vector<std::pair<std::string_view, std::string_view>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)), merges_(std::make_unique<MergeTable>(merges.size())) {
  const Vocab& v = *vocab_;
  init_special_ids();

  const size_t prefix_len = options_.continuing_subword_prefix.size();
  // Merges are resolved in blocks: hash and prefetch every lookup of the block first, so the
  // cache misses of the (large) vocabulary index overlap instead of queueing.
  constexpr size_t kBlock = 32;
  std::string joined[kBlock];
  uint64_t hashes[kBlock][3];
  for (size_t block = 0; block < merges.size(); block += kBlock) {
    const size_t n = std::min(kBlock, merges.size() - block);
    for (size_t k = 0; k < n; ++k) {
      const auto& [a, b] = merges[block + k];
      // HF drops the continuing-subword prefix from the right part when joining.
      if (b.size() < prefix_len)
        fail("merge {} ({:?} {:?}): right part is shorter than the subword prefix", block + k, a, b);
      joined[k].assign(a);
      joined[k].append(b.substr(prefix_len));
      hashes[k][0] = Vocab::hash(a);
      hashes[k][1] = Vocab::hash(b);
      hashes[k][2] = Vocab::hash(joined[k]);
      for (uint64_t h : hashes[k]) v.prefetch(h);
    }
    for (size_t k = 0; k < n; ++k) {
      const size_t rank = block + k;
      const auto& [a, b] = merges[rank];
      const auto a_id = v.find(a, hashes[k][0]);
      if (!a_id) fail("merge {} ({:?} {:?}) refers to {:?}, which is not in the vocabulary", rank, a, b, a);
      const auto b_id = v.find(b, hashes[k][1]);
      if (!b_id) fail("merge {} ({:?} {:?}) refers to {:?}, which is not in the vocabulary", rank, a, b, b);
      const auto new_id = v.find(joined[k], hashes[k][2]);
      if (!new_id) fail("merge {} ({:?} {:?}) makes {:?}, which is not in the vocabulary", rank, a, b, joined[k]);
      merges_->insert(MergeTable::key(*a_id, *b_id), static_cast<int32_t>(rank), *new_id);
    }
  }
  merge_count_ = merges.size();
}

std::unique_ptr<BpeModel> BpeModel::from_id_merges(std::shared_ptr<const Vocab> vocab,
                                                   const std::vector<BpeMerge>& merges, BpeOptions options) {
  auto model = std::make_unique<BpeModel>(std::move(vocab), std::vector<std::pair<std::string_view, std::string_view>>{},
                                          std::move(options));
  model->merges_ = std::make_unique<MergeTable>(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const BpeMerge& m = merges[i];
    for (int32_t id : {m.left, m.right, m.result})
      if (!model->vocab_->token(id)) fail("merge {}: id {} is not in the vocabulary", i, id);
    if (m.rank < 0) fail("merge {}: negative rank {}", i, m.rank);
    model->merges_->insert(MergeTable::key(m.left, m.right), m.rank, m.result);
  }
  model->merge_count_ = merges.size();
  return model;
}

void BpeModel::init_special_ids() {
  const Vocab& v = *vocab_;
  if (options_.unk_token) {
    unk_id_ = v.find(*options_.unk_token);
    if (!unk_id_) fail("BPE unk_token {:?} is not in the vocabulary", *options_.unk_token);
  }
  for (int b = 0; b < 256; ++b) byte_ids_[b] = v.find(fmt::format("<0x{:02X}>", b)).value_or(-1);
}

BpeModel::~BpeModel() = default;

namespace {

// Words at least this long are not cached (HF uses the same bound).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue is a max-heap: "less" means later rank, then later position.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  const Vocab& v = *vocab_;
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, uint32_t len) {
    const int32_t idx = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, idx - 1, -1, len});
    if (idx > 0) symbols[idx - 1].next = idx;
  };

  // An unknown character waiting to be added (HF fuses consecutive ones when fuse_unk is set).
  bool have_unk = false;
  uint32_t unk_len = 0;
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8::sequence_length(static_cast<unsigned char>(word[i]));
    const size_t clen = std::min(len, word.size() - i);
    const bool first = i == 0, last = i + clen >= word.size();
    std::string_view s = word.substr(i, clen);
    if ((!first && !options_.continuing_subword_prefix.empty()) || (last && !options_.end_of_word_suffix.empty())) {
      piece.clear();
      if (!first) piece += options_.continuing_subword_prefix;
      piece += s;
      if (last) piece += options_.end_of_word_suffix;
      s = piece;
    }
    i += clen;
    if (auto id = v.find(s)) {
      if (have_unk) {
        add(*unk_id_, unk_len);
        have_unk = false;
      }
      add(*id, static_cast<uint32_t>(clen));
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (have_unk && options_.fuse_unk) {
        unk_len += static_cast<uint32_t>(clen);
      } else {
        if (have_unk) add(*unk_id_, unk_len);
        have_unk = true;
        unk_len = static_cast<uint32_t>(clen);
      }
    }
    // Without an unknown token HF drops the character.
  }
  if (have_unk) add(*unk_id_, unk_len);

  if (symbols.size() > 1 && merge_count_ > 0) {
    std::vector<Candidate> storage;
    storage.reserve(symbols.size() * 2);
    std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(storage));
    for (size_t k = 0; k + 1 < symbols.size(); ++k)
      if (const auto* m = merges_->find(MergeTable::key(symbols[k].id, symbols[k + 1].id)))
        queue.push(Candidate{m->rank, static_cast<int32_t>(k), m->new_id});
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& cur = symbols[top.pos];
      if (cur.len == 0 || cur.next < 0) continue;
      const int32_t right_pos = cur.next;
      Symbol right = symbols[right_pos];
      // Skip entries made stale by an earlier merge around this position.
      const auto* m = merges_->find(MergeTable::key(cur.id, right.id));
      if (!m || m->new_id != top.new_id) continue;
      cur.id = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      symbols[right_pos].len = 0;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      if (cur.prev >= 0) {
        if (const auto* pm = merges_->find(MergeTable::key(symbols[cur.prev].id, cur.id)))
          queue.push(Candidate{pm->rank, cur.prev, pm->new_id});
      }
      if (cur.next >= 0) {
        if (const auto* nm = merges_->find(MergeTable::key(cur.id, symbols[cur.next].id)))
          queue.push(Candidate{nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = vocab_->find(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace fl
