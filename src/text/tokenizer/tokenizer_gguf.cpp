// Builds the tokenizer's parts (tokenizer_impl.h) from GGUF tokenizer metadata; see
// tokenizer_gguf.h for the keys and what each model and pre-tokenizer name means.
//
// A SentencePiece ("llama") vocabulary has scores instead of merges: encoding repeatedly joins the
// adjacent pair whose concatenation is a piece with the highest score, leftmost first on ties.
// That is BPE over the table of every pair (a, b) that spells a piece, ranked by the piece's
// score, with equal scores sharing a rank, so it runs on the same BpeModel as a tokenizer.json
// (which is also how Hugging Face converts these vocabularies).
#include "text/tokenizer/tokenizer_gguf.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

namespace key = gguf_tokenizer_key;

constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581

// The split regexes of Llama 3 and Qwen 2 (and later Qwen), as their tokenizer.json files give
// them; ByteLevel then maps bytes to characters without a regex of its own.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// SentencePiece pieces are at most a few dozen characters (its trainer's default limit is 16).
constexpr size_t kMaxPieceBytes = 1024;

constexpr std::string_view kSupportedPre = "llama-bpe, llama3, llama-v3, qwen2, gpt-2";

// Checked access to the metadata, every error naming the source and the key.
class Metadata {
 public:
  Metadata(std::span<const GgufMetadataEntry> entries, std::string_view source) : source_(source) {
    for (const GgufMetadataEntry& e : entries)
      if (!by_key_.emplace(e.key, &e.value).second) fail("{}: metadata key '{}' appears twice", source_, e.key);
  }

  const std::string& source() const { return source_; }

  template <typename... Args>
  [[noreturn]] void error(std::string_view key, fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}: {}", source_, key, fmt::format(format, std::forward<Args>(args)...));
  }

  const GgufValue* find(std::string_view key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? nullptr : it->second;
  }

  std::optional<std::string_view> string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::string) error(key, "expected a string, found {}", gguf_value_type_name(v->type));
    return std::string_view(v->text);
  }

  std::optional<bool> boolean(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::boolean) error(key, "expected a bool, found {}", gguf_value_type_name(v->type));
    return v->integer != 0;
  }

  // A token id: an integer in [0, n_tokens).
  std::optional<int32_t> token_id(std::string_view key, size_t n_tokens) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer()) error(key, "expected an integer token id, found {}", gguf_value_type_name(v->type));
    // u64 values above INT64_MAX arrive negative: out of range either way.
    if (v->integer < 0 || static_cast<uint64_t>(v->integer) >= n_tokens)
      error(key, "token id {} is out of range (the vocabulary has {} tokens)", v->integer, n_tokens);
    return static_cast<int32_t>(v->integer);
  }

  // An array whose items all satisfy `accept` (`what` names the expected element type).
  template <typename Accept>
  const std::vector<GgufValue>* array(std::string_view key, std::string_view what, Accept accept) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (v->type != GgufValueType::array) error(key, "expected an array of {}, found {}", what, gguf_value_type_name(v->type));
    for (size_t i = 0; i < v->items.size(); ++i)
      if (!accept(v->items[i]))
        error(key, "item {} is {}, expected {}", i, gguf_value_type_name(v->items[i].type), what);
    return &v->items;
  }

 private:
  std::string source_;
  std::map<std::string, const GgufValue*, std::less<>> by_key_;
};

bool is_string(const GgufValue& v) { return v.type == GgufValueType::string; }

// Every pair of pieces that spells a normal or user-defined piece, ranked by that piece's score
// (highest first; equal scores share a rank so that SentencePiece's leftmost-first tie rule
// applies). User-defined pieces are included because Hugging Face's conversion keeps them in the
// BPE vocabulary (Gemma's "▁▁" runs are merged, not only matched); llama.cpp's converter writes
// them with spaces for "▁", which no merge spells, so for its files this changes nothing.
std::vector<BpeMerge> merges_from_scores(const Metadata& md, const Vocab& vocab, const std::vector<float>& scores,
                                         const std::vector<GgufTokenType>& types) {
  std::vector<int32_t> pieces;
  for (int32_t id = 0; id < static_cast<int32_t>(types.size()); ++id) {
    if (types[id] != GgufTokenType::normal && types[id] != GgufTokenType::user_defined) continue;
    const std::string_view t = *vocab.token(id);
    // Every split of a piece is looked up, so a piece costs its length squared.
    if (t.size() > kMaxPieceBytes)
      md.error(key::kTokens, "token {} is {} bytes long; SentencePiece pieces are short (at most {} bytes accepted)", id,
               t.size(), kMaxPieceBytes);
    if (!t.empty() && utf8::sequence_length(static_cast<unsigned char>(t[0])) < t.size()) pieces.push_back(id);
  }
  std::stable_sort(pieces.begin(), pieces.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  std::vector<BpeMerge> merges;
  merges.reserve(pieces.size() * 2);
  int32_t rank = -1;
  float previous = 0.0f;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int32_t id = pieces[i];
    if (i == 0 || scores[id] != previous) ++rank;
    previous = scores[id];
    const std::string_view t = *vocab.token(id);
    for (size_t cut = utf8::sequence_length(static_cast<unsigned char>(t[0])); cut < t.size();
         cut += utf8::sequence_length(static_cast<unsigned char>(t[cut]))) {
      const auto left = vocab.find(t.substr(0, cut));
      if (!left) continue;
      if (const auto right = vocab.find(t.substr(cut))) merges.push_back({*left, *right, id, rank});
    }
  }
  return merges;
}

// "left right" strings, split at the first space after the first byte (as llama.cpp does, so a
// left part may itself be a space).
std::vector<std::pair<std::string_view, std::string_view>> parse_merges(const Metadata& md,
                                                                        const std::vector<GgufValue>& items) {
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string_view line = items[i].text;
    const size_t space = line.size() < 2 ? std::string_view::npos : line.find(' ', 1);
    if (space == std::string_view::npos || space + 1 >= line.size())
      md.error(key::kMerges, "merge {} {:?} is not two tokens separated by a space", i, line);
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return merges;
}

void configure_gpt2(const Metadata& md, Tokenizer::Impl& m, BpeOptions& options, std::vector<NormalizerStep>& normalizer,
                    std::vector<PreTokenizerStep>& pre) {
  const auto name = md.string(key::kPre);
  if (!name)
    md.error(key::kPre, "missing: a \"gpt2\" vocabulary needs its pre-tokenizer named (supported: {})", kSupportedPre);
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::split;
  split.behavior = SplitBehavior::isolated;
  PreTokenizerStep bytes;
  bytes.kind = PreTokenizerStep::Kind::byte_level;
  bytes.add_prefix_space = false;
  bytes.use_regex = false;
  if (*name == "llama-bpe" || *name == "llama3" || *name == "llama-v3") {
    split.pattern = TextPattern::regex(kLlama3Pattern);
    options.ignore_merges = true;  // Llama 3: a word that is a token is that token
    pre = {split, bytes};
  } else if (*name == "qwen2") {
    NormalizerStep nfc;
    nfc.kind = NormalizerStep::Kind::nfc;
    normalizer.push_back(std::move(nfc));
    split.pattern = TextPattern::regex(kQwen2Pattern);
    pre = {split, bytes};
  } else if (*name == "gpt-2") {
    bytes.use_regex = true;
    pre = {bytes};
  } else {
    md.error(key::kPre, "pre-tokenizer {:?} is not supported for a \"gpt2\" vocabulary (supported: {})", *name,
             kSupportedPre);
  }
  DecoderStep decode;
  decode.kind = DecoderStep::Kind::byte_level;
  m.decoder = Decoder({decode});
}

void configure_sentencepiece(const Metadata& md, Tokenizer::Impl& m, BpeOptions& options,
                             std::vector<NormalizerStep>& normalizer) {
  if (const auto name = md.string(key::kPre); name && *name != "default")
    md.error(key::kPre, "pre-tokenizer {:?} is not supported for a \"llama\" (SentencePiece) vocabulary, which "
             "splits no words (expected \"default\" or no key)", *name);
  options.byte_fallback = true;
  options.fuse_unk = true;
  const bool space_prefix = md.boolean(key::kAddSpacePrefix).value_or(true);
  if (space_prefix) {
    NormalizerStep prepend;
    prepend.kind = NormalizerStep::Kind::prepend;
    prepend.content = std::string(kSentencePieceSpace);
    normalizer.push_back(std::move(prepend));
  }
  NormalizerStep replace;
  replace.kind = NormalizerStep::Kind::replace;
  replace.pattern = TextPattern::literal(" ");
  replace.content = std::string(kSentencePieceSpace);
  normalizer.push_back(std::move(replace));

  std::vector<DecoderStep> steps(3);
  steps[0].kind = DecoderStep::Kind::replace;
  steps[0].pattern = TextPattern::literal(std::string(kSentencePieceSpace));
  steps[0].content.assign(1, ' ');
  steps[1].kind = DecoderStep::Kind::byte_fallback;
  steps[2].kind = DecoderStep::Kind::fuse;
  if (space_prefix) {
    DecoderStep strip;
    strip.kind = DecoderStep::Kind::strip;
    strip.strip_char = ' ';
    strip.strip_start = 1;
    steps.push_back(strip);
  }
  m.decoder = Decoder(std::move(steps));
}

Tokenizer build(const Metadata& md) {
  auto m = std::make_shared<Tokenizer::Impl>();
  m->source = md.source();

  const auto model = md.string(key::kModel);
  if (!model) md.error(key::kModel, "missing (the file has no tokenizer metadata)");
  const bool gpt2 = *model == "gpt2", sentencepiece = *model == "llama";
  if (!gpt2 && !sentencepiece)
    md.error(key::kModel, "tokenizer model {:?} is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" "
             "SentencePiece)", *model);

  const auto* tokens = md.array(key::kTokens, "strings", is_string);
  if (!tokens) md.error(key::kTokens, "missing");
  const size_t n = tokens->size();
  if (n == 0) md.error(key::kTokens, "the vocabulary is empty");
  if (n > static_cast<size_t>(Vocab::kMaxId) + 1)
    md.error(key::kTokens, "{} tokens is more than the {} supported", n, Vocab::kMaxId + 1);

  std::vector<GgufTokenType> types(n, GgufTokenType::normal);
  if (const auto* items = md.array(key::kTokenType, "integers", [](const GgufValue& v) { return v.is_integer(); })) {
    if (items->size() != n) md.error(key::kTokenType, "has {} entries for {} tokens", items->size(), n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*items)[i].integer;
      if (t < 1 || t > 6) md.error(key::kTokenType, "token {} has type {} (expected 1..6)", i, t);
      types[i] = static_cast<GgufTokenType>(t);
    }
  }
  std::vector<float> scores;
  if (const auto* items = md.array(key::kScores, "floats", [](const GgufValue& v) { return v.is_float(); })) {
    if (items->size() != n) md.error(key::kScores, "has {} entries for {} tokens", items->size(), n);
    scores.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const double s = (*items)[i].real;
      if (!std::isfinite(s)) md.error(key::kScores, "token {} has score {}", i, s);
      scores.push_back(static_cast<float>(s));
    }
  }

  std::vector<std::pair<std::string_view, int32_t>> entries;
  entries.reserve(n);
  for (size_t i = 0; i < n; ++i) entries.emplace_back((*tokens)[i].text, static_cast<int32_t>(i));
  m->vocab = std::make_shared<Vocab>(entries, fmt::format("{}: {}", md.source(), key::kTokens));

  BpeOptions options;
  std::optional<int32_t> unk = md.token_id(key::kUnknownId, n);
  if (!unk) {
    auto it = std::find(types.begin(), types.end(), GgufTokenType::unknown);
    if (it != types.end()) unk = static_cast<int32_t>(it - types.begin());
  }
  if (unk) options.unk_token = std::string((*tokens)[*unk].text);

  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre;
  if (gpt2) {
    configure_gpt2(md, *m, options, normalizer, pre);
    const auto* merges = md.array(key::kMerges, "strings", is_string);
    if (!merges) md.error(key::kMerges, "missing: a \"gpt2\" vocabulary needs its merges");
    try {
      m->model = std::make_unique<BpeModel>(m->vocab, parse_merges(md, *merges), std::move(options));
    } catch (const Error& e) {
      md.error(key::kMerges, "{}", e.what());
    }
  } else {
    if (scores.empty()) md.error(key::kScores, "missing: a \"llama\" (SentencePiece) vocabulary merges by score");
    configure_sentencepiece(md, *m, options, normalizer);
    m->model = BpeModel::from_id_merges(m->vocab, merges_from_scores(md, *m->vocab, scores, types), std::move(options));
  }
  m->normalizer = Normalizer(std::move(normalizer));
  m->pre_tokenizer = PreTokenizer(std::move(pre));

  // Control and user-defined tokens are found in the raw text before anything else.
  std::vector<AddedToken> added;
  std::vector<std::string> contents;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != GgufTokenType::control && types[i] != GgufTokenType::user_defined) continue;
    const std::string& content = (*tokens)[i].text;
    if (content.empty()) continue;
    AddedToken t;
    t.content = content;
    t.id = static_cast<int32_t>(i);
    t.special = types[i] == GgufTokenType::control;
    t.normalized = false;
    m->added_by_id.emplace(t.id, added.size());
    m->added_by_content.emplace(t.content, t.id);
    contents.push_back(content);
    added.push_back(std::move(t));
  }
  m->added = AddedVocabulary(std::move(added), contents);

  m->bos_id = md.token_id(key::kBosId, n);
  m->eos_id = md.token_id(key::kEosId, n);
  const auto add_bos = md.boolean(key::kAddBos), add_eos = md.boolean(key::kAddEos);
  if (add_bos.value_or(false) && !m->bos_id) md.error(key::kAddBos, "is true but there is no {}", key::kBosId);
  if (add_eos.value_or(false) && !m->eos_id) md.error(key::kAddEos, "is true but there is no {}", key::kEosId);
  PostTemplate post;
  if (add_bos.value_or(sentencepiece) && m->bos_id) post.items.push_back(*m->bos_id);
  post.items.push_back(PostTemplate::kSequence);
  if (add_eos.value_or(false)) post.items.push_back(*m->eos_id);
  if (post.items.size() > 1) m->post_processors.push_back(std::move(post));

  m->vocab_end = m->vocab->id_end();
  return Tokenizer::from_impl(std::move(m));
}

}  // namespace

bool has_gguf_tokenizer(const GgufFile& file) { return file.find_metadata(gguf_tokenizer_key::kModel) != nullptr; }

Tokenizer tokenizer_from_gguf(const GgufFile& file) {
  return tokenizer_from_gguf_metadata(file.metadata(), file.path() + " (GGUF tokenizer metadata)");
}

Tokenizer tokenizer_from_gguf_metadata(std::span<const GgufMetadataEntry> metadata, std::string_view source) {
  return build(Metadata(metadata, source));
}

}  // namespace fl
