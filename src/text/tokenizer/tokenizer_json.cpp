// Loads HF tokenizer.json (and the bos/eos declarations of tokenizer_config.json) into the
// tokenizer's parts. simdjson parses the big file: Gemma 3's is 33 MB with 515k merges, and a DOM
// parse plus table building stays well under a second. Every problem in the file is an fl::Error
// that names the file and the JSON path.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "io/gguf.h"
#include "text/tokenizer/model_tokenizer.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// Files larger than this are not tokenizers (the largest real ones are ~35 MB).
constexpr size_t kMaxTokenizerJsonBytes = size_t{1} << 30;

// A JSON value with its path, for checked access and messages like
// "tokenizer.json: model.merges[7]: expected a string".
class Json {
 public:
  Json(element e, std::string path, const std::string& source) : e_(e), path_(std::move(path)), source_(&source) {}

  const std::string& path() const { return path_; }
  element raw() const { return e_; }
  bool is_null() const { return e_.type() == element_type::NULL_VALUE; }
  bool is_object() const { return e_.type() == element_type::OBJECT; }
  bool is_array() const { return e_.type() == element_type::ARRAY; }
  bool is_string() const { return e_.type() == element_type::STRING; }

  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}: {}", *source_, path_.empty() ? "(top level)" : path_, fmt::format(format, std::forward<Args>(args)...));
  }

  // The member `key`, or nullopt when absent. Requires an object.
  std::optional<Json> find(std::string_view key) const {
    if (!is_object()) error("expected an object");
    element child;
    if (e_.get_object().at_key(key).get(child) != simdjson::SUCCESS) return std::nullopt;
    return Json(child, path_.empty() ? std::string(key) : path_ + "." + std::string(key), *source_);
  }
  Json at(std::string_view key) const {
    auto v = find(key);
    if (!v) error("missing \"{}\"", key);
    return *v;
  }
  // Absent and null both mean "not set".
  std::optional<Json> find_non_null(std::string_view key) const {
    auto v = find(key);
    if (!v || v->is_null()) return std::nullopt;
    return v;
  }

  std::string_view str() const {
    std::string_view s;
    if (e_.get_string().get(s) != simdjson::SUCCESS) error("expected a string");
    return s;
  }
  int64_t integer() const {
    int64_t v;
    if (e_.get_int64().get(v) != simdjson::SUCCESS) error("expected an integer");
    return v;
  }
  bool boolean() const {
    bool v;
    if (e_.get_bool().get(v) != simdjson::SUCCESS) error("expected true or false");
    return v;
  }
  double number() const {
    double v;
    if (e_.get_double().get(v) == simdjson::SUCCESS) return v;
    int64_t i;
    if (e_.get_int64().get(i) == simdjson::SUCCESS) return static_cast<double>(i);
    error("expected a number");
  }
  std::vector<Json> items() const {
    simdjson::dom::array arr;
    if (e_.get_array().get(arr) != simdjson::SUCCESS) error("expected an array");
    std::vector<Json> out;
    out.reserve(arr.size());
    size_t i = 0;
    for (element child : arr) out.emplace_back(child, fmt::format("{}[{}]", path_, i++), *source_);
    return out;
  }

  bool bool_or(std::string_view key, bool fallback) const {
    auto v = find_non_null(key);
    return v ? v->boolean() : fallback;
  }
  std::string string_or(std::string_view key, std::string_view fallback) const {
    auto v = find_non_null(key);
    return std::string(v ? v->str() : fallback);
  }
  std::string_view type() const { return at("type").str(); }

 private:
  element e_;
  std::string path_;
  const std::string* source_;
};

TextPattern parse_pattern(const Json& j) {
  if (auto s = j.find("String")) return TextPattern::literal(std::string(s->str()));
  if (auto r = j.find("Regex")) {
    try {
      return TextPattern::regex(r->str());
    } catch (const Error& e) {
      r->error("{}", e.what());
    }
  }
  j.error("pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}");
}

char32_t single_char(const Json& j) {
  const std::string_view s = j.str();
  char32_t cp;
  bool valid;
  if (s.empty() || utf8::decode(s, 0, cp, valid) != s.size()) j.error("expected a single character, got {:?}", s);
  return cp;
}

PrependScheme parse_prepend_scheme(const Json& j) {
  if (auto p = j.find_non_null("prepend_scheme")) {
    const auto s = p->str();
    if (s == "always") return PrependScheme::always;
    if (s == "first") return PrependScheme::first;
    if (s == "never") return PrependScheme::never;
    p->error("unknown prepend_scheme {:?} (always, first, never)", s);
  }
  // Older files: add_prefix_space true/false.
  return j.bool_or("add_prefix_space", true) ? PrependScheme::always : PrependScheme::never;
}

// ---- normalizer ----

void parse_normalizer(const Json& j, std::vector<NormalizerStep>& steps, int depth = 0) {
  if (depth > 16) j.error("normalizer sequences nested too deeply");
  const auto type = j.type();
  NormalizerStep step;
  using K = NormalizerStep::Kind;
  if (type == "Sequence") {
    for (const Json& child : j.at("normalizers").items()) parse_normalizer(child, steps, depth + 1);
    return;
  } else if (type == "NFC") {
    step.kind = K::nfc;
  } else if (type == "NFD") {
    step.kind = K::nfd;
  } else if (type == "NFKC") {
    step.kind = K::nfkc;
  } else if (type == "NFKD") {
    step.kind = K::nfkd;
  } else if (type == "Replace") {
    step.kind = K::replace;
    step.pattern = parse_pattern(j.at("pattern"));
    step.content = std::string(j.at("content").str());
  } else if (type == "Prepend") {
    step.kind = K::prepend;
    step.content = std::string(j.at("prepend").str());
  } else if (type == "Lowercase") {
    step.kind = K::lowercase;
  } else if (type == "Strip") {
    step.kind = K::strip;
    step.strip_left = j.bool_or("strip_left", true);
    step.strip_right = j.bool_or("strip_right", true);
  } else if (type == "StripAccents") {
    step.kind = K::strip_accents;
  } else if (type == "ByteLevel") {
    step.kind = K::byte_level;
  } else {
    j.error("normalizer type {:?} is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Replace, Prepend, "
            "Lowercase, Strip, StripAccents, ByteLevel)", type);
  }
  steps.push_back(std::move(step));
}

// ---- pre-tokenizer ----

SplitBehavior parse_behavior(const Json& j) {
  const auto s = j.str();
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  j.error("unknown split behavior {:?}", s);
}

void parse_pre_tokenizer(const Json& j, std::vector<PreTokenizerStep>& steps, int depth = 0) {
  if (depth > 16) j.error("pre-tokenizer sequences nested too deeply");
  const auto type = j.type();
  PreTokenizerStep step;
  using K = PreTokenizerStep::Kind;
  if (type == "Sequence") {
    for (const Json& child : j.at("pretokenizers").items()) parse_pre_tokenizer(child, steps, depth + 1);
    return;
  } else if (type == "Split") {
    step.kind = K::split;
    step.pattern = parse_pattern(j.at("pattern"));
    step.behavior = parse_behavior(j.at("behavior"));
    step.invert = j.bool_or("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = K::byte_level;
    step.add_prefix_space = j.bool_or("add_prefix_space", true);
    step.use_regex = j.bool_or("use_regex", true);
  } else if (type == "Metaspace") {
    step.kind = K::metaspace;
    step.replacement.clear();
    utf8::append(step.replacement, j.find_non_null("replacement") ? single_char(j.at("replacement")) : char32_t{0x2581});
    step.prepend_scheme = parse_prepend_scheme(j);
    step.split = j.bool_or("split", true);
  } else if (type == "Digits") {
    step.kind = K::digits;
    step.individual_digits = j.bool_or("individual_digits", false);
  } else if (type == "WhitespaceSplit") {
    step.kind = K::whitespace_split;
  } else if (type == "Whitespace") {
    // HF: keep runs of word characters and runs of other non-space characters.
    step.kind = K::split;
    step.pattern = TextPattern::regex(R"(\w+|[^\w\s]+)");
    step.behavior = SplitBehavior::removed;
    step.invert = true;
  } else if (type == "Punctuation") {
    step.kind = K::punctuation;
    step.behavior = j.find_non_null("behavior") ? parse_behavior(j.at("behavior")) : SplitBehavior::isolated;
  } else if (type == "BertPreTokenizer") {
    step.kind = K::whitespace_split;
    steps.push_back(step);
    step.kind = K::punctuation;
    step.behavior = SplitBehavior::isolated;
  } else {
    j.error("pre-tokenizer type {:?} is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Digits, "
            "Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer)", type);
  }
  steps.push_back(std::move(step));
}

// ---- decoder ----

void parse_decoder(const Json& j, std::vector<DecoderStep>& steps, int depth = 0) {
  if (depth > 16) j.error("decoder sequences nested too deeply");
  const auto type = j.type();
  DecoderStep step;
  using K = DecoderStep::Kind;
  if (type == "Sequence") {
    for (const Json& child : j.at("decoders").items()) parse_decoder(child, steps, depth + 1);
    return;
  } else if (type == "ByteLevel") {
    step.kind = K::byte_level;
  } else if (type == "Replace") {
    step.kind = K::replace;
    step.pattern = parse_pattern(j.at("pattern"));
    step.content = std::string(j.at("content").str());
  } else if (type == "ByteFallback") {
    step.kind = K::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = K::fuse;
  } else if (type == "Strip") {
    step.kind = K::strip;
    step.strip_char = single_char(j.at("content"));
    const int64_t start = j.at("start").integer(), stop = j.at("stop").integer();
    if (start < 0 || stop < 0 || start > 1'000'000 || stop > 1'000'000) j.error("Strip start/stop out of range");
    step.strip_start = static_cast<size_t>(start);
    step.strip_stop = static_cast<size_t>(stop);
  } else if (type == "Metaspace") {
    step.kind = K::metaspace;
    step.replacement = j.find_non_null("replacement") ? single_char(j.at("replacement")) : char32_t{0x2581};
    step.prepend_scheme = parse_prepend_scheme(j);
  } else {
    j.error("decoder type {:?} is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
            "Metaspace)", type);
  }
  steps.push_back(std::move(step));
}

// ---- post-processor ----

// The ids of a template's special token, from the template's own special_tokens map.
std::vector<int32_t> template_special_ids(const Json& where, std::string_view name, const std::optional<Json>& specials) {
  if (specials) {
    auto entry = specials->find(name);
    if (!entry) where.error("special token {:?} is not in the template's special_tokens", name);
    std::vector<int32_t> ids;
    for (const Json& id : entry->at("ids").items()) {
      const int64_t v = id.integer();
      if (v < 0 || v > Vocab::kMaxId) id.error("id {} out of range", v);
      ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
  }
  where.error("special token {:?} has no special_tokens entry", name);
}

PostTemplate parse_template(const Json& j) {
  const Json single = j.at("single");
  const auto specials = j.find_non_null("special_tokens");
  PostTemplate t;
  if (single.is_string()) {
    // "<s> $A </s>" form: words separated by spaces; $A / $0 / $A:1 is the sequence.
    std::string_view s = single.str();
    size_t pos = 0;
    while (pos < s.size()) {
      size_t end = s.find(' ', pos);
      if (end == std::string_view::npos) end = s.size();
      std::string_view word = s.substr(pos, end - pos);
      pos = end + 1;
      if (word.empty()) continue;
      std::string_view name = word.substr(0, word.find(':'));
      if (name == "$" || name == "$A" || name == "$0") {
        t.items.push_back(PostTemplate::kSequence);
      } else if (name.starts_with("$")) {
        single.error("template piece {:?} is not supported for a single sequence", word);
      } else {
        for (int32_t id : template_special_ids(single, name, specials)) t.items.push_back(id);
      }
    }
  } else {
    for (const Json& item : single.items()) {
      if (auto seq = item.find("Sequence")) {
        const auto id = seq->at("id").str();
        if (id != "A") seq->error("sequence {:?} cannot appear in a single-sequence template", id);
        t.items.push_back(PostTemplate::kSequence);
      } else if (auto sp = item.find("SpecialToken")) {
        for (int32_t id : template_special_ids(*sp, sp->at("id").str(), specials)) t.items.push_back(id);
      } else {
        item.error("template item must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}");
      }
    }
  }
  return t;
}

int32_t token_pair_id(const Json& pair) {
  const auto items = pair.items();
  if (items.size() != 2) pair.error("expected [token, id]");
  const int64_t id = items[1].integer();
  if (id < 0 || id > Vocab::kMaxId) items[1].error("id {} out of range", id);
  return static_cast<int32_t>(id);
}

void parse_post_processor(const Json& j, Tokenizer::Impl& m, int depth = 0) {
  if (depth > 16) j.error("post-processor sequences nested too deeply");
  const auto type = j.type();
  if (type == "Sequence") {
    for (const Json& child : j.at("processors").items()) parse_post_processor(child, m, depth + 1);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; adds no tokens.
  } else if (type == "TemplateProcessing") {
    m.post_processors.push_back(parse_template(j));
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    m.post_processors.push_back(PostTemplate{{token_pair_id(j.at("cls")), PostTemplate::kSequence, token_pair_id(j.at("sep"))}});
  } else {
    j.error("post-processor type {:?} is not supported (supported: Sequence, ByteLevel, TemplateProcessing, "
            "BertProcessing, RobertaProcessing)", type);
  }
}

// ---- model ----

void parse_model(const Json& j, Tokenizer::Impl& m) {
  auto type_value = j.find_non_null("type");
  const std::string_view type = type_value ? type_value->str() : (j.find("merges") ? "BPE" : "");
  if (type != "BPE")
    j.error("model type {:?} is not supported: fireline implements BPE tokenizers only (WordPiece, WordLevel and "
            "Unigram are not supported)", type);

  if (auto dropout = j.find_non_null("dropout"); dropout && dropout->number() != 0.0)
    dropout->error("BPE dropout makes encoding random and is not supported");

  // Vocabulary: {"token": id, ...}. Raw simdjson in the loop: this object has ~262k members.
  const Json vocab_json = j.at("vocab");
  simdjson::dom::object vocab_obj;
  if (vocab_json.raw().get_object().get(vocab_obj) != simdjson::SUCCESS) vocab_json.error("expected an object");
  std::vector<std::pair<std::string_view, int32_t>> entries;
  entries.reserve(vocab_obj.size());
  for (auto field : vocab_obj) {
    int64_t id;
    if (field.value.get_int64().get(id) != simdjson::SUCCESS)
      vocab_json.error("token {:?}: id is not an integer", field.key);
    if (id < 0 || id > Vocab::kMaxId) vocab_json.error("token {:?}: id {} out of range (0..{})", field.key, id, Vocab::kMaxId);
    entries.emplace_back(field.key, static_cast<int32_t>(id));
  }
  m.vocab = std::make_shared<Vocab>(entries, fmt::format("{}: model.vocab", m.source));

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...].
  const Json merges_json = j.at("merges");
  simdjson::dom::array merges_arr;
  if (merges_json.raw().get_array().get(merges_arr) != simdjson::SUCCESS) merges_json.error("expected an array");
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(merges_arr.size());
  size_t index = 0;
  for (element item : merges_arr) {
    std::string_view line;
    if (item.get_string().get(line) == simdjson::SUCCESS) {
      // HF splits the legacy form at its single space; tokens with spaces need the pair form.
      const size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
        merges_json.error("merge {} {:?} is not two tokens separated by one space", index, line);
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else {
      simdjson::dom::array pair;
      std::string_view a, b;
      if (item.get_array().get(pair) != simdjson::SUCCESS || pair.size() != 2 || pair.at(0).get_string().get(a) != simdjson::SUCCESS ||
          pair.at(1).get_string().get(b) != simdjson::SUCCESS)
        merges_json.error("merge {} is neither \"a b\" nor [\"a\", \"b\"]", index);
      merges.emplace_back(a, b);
    }
    ++index;
  }

  BpeOptions options;
  if (auto unk = j.find_non_null("unk_token")) options.unk_token = std::string(unk->str());
  options.byte_fallback = j.bool_or("byte_fallback", false);
  options.fuse_unk = j.bool_or("fuse_unk", false);
  options.ignore_merges = j.bool_or("ignore_merges", false);
  options.continuing_subword_prefix = j.string_or("continuing_subword_prefix", "");
  options.end_of_word_suffix = j.string_or("end_of_word_suffix", "");
  try {
    m.model = std::make_unique<BpeModel>(m.vocab, merges, std::move(options));
  } catch (const Error& e) {
    j.error("{}", e.what());
  }
}

// ---- added tokens ----

void parse_added_tokens(const Json& list, Tokenizer::Impl& m) {
  std::vector<AddedToken> tokens;
  for (const Json& item : list.items()) {
    AddedToken t;
    const int64_t id = item.at("id").integer();
    if (id < 0 || id > Vocab::kMaxId) item.error("id {} out of range (0..{})", id, Vocab::kMaxId);
    t.id = static_cast<int32_t>(id);
    t.content = std::string(item.at("content").str());
    t.special = item.bool_or("special", false);
    t.single_word = item.bool_or("single_word", false);
    t.lstrip = item.bool_or("lstrip", false);
    t.rstrip = item.bool_or("rstrip", false);
    t.normalized = item.bool_or("normalized", !t.special);
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    if (auto vid = m.vocab->find(t.content); vid && *vid != t.id)
      item.error("added token {:?} has id {} but the vocabulary gives it id {}", t.content, t.id, *vid);
    if (m.added_by_id.count(t.id)) item.error("id {} is given to two added tokens", t.id);
    if (auto it = m.added_by_content.find(t.content); it != m.added_by_content.end())
      item.error("added token {:?} is listed twice (ids {} and {})", t.content, it->second, t.id);
    m.added_by_id.emplace(t.id, tokens.size());
    m.added_by_content.emplace(t.content, t.id);
    tokens.push_back(std::move(t));
  }
  std::vector<std::string> normalized;
  normalized.reserve(tokens.size());
  for (const AddedToken& t : tokens)
    normalized.push_back(t.normalized && !m.normalizer.empty() ? m.normalizer.normalize(t.content) : t.content);
  m.added = AddedVocabulary(std::move(tokens), normalized);
}

// bos_token / eos_token of tokenizer_config.json: a string, {"content": ...}, or null.
// nlohmann parses this small file: simdjson rejects its huge model_max_length integers.
std::optional<int32_t> config_token_id(const nlohmann::json& config, const char* key, const Tokenizer::Impl& m,
                                       std::string_view source) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  const nlohmann::json* content = &*it;
  if (it->is_object()) {
    auto c = it->find("content");
    if (c == it->end()) fail("{}: {}: missing \"content\"", source, key);
    content = &*c;
  }
  if (!content->is_string()) fail("{}: {}: expected a string", source, key);
  const std::string name = content->get<std::string>();
  if (auto a = m.added_by_content.find(name); a != m.added_by_content.end()) return a->second;
  if (auto id = m.vocab->find(name)) return *id;
  fail("{}: {}: token {:?} is not in the vocabulary", source, key, name);
}

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

// `text` must be followed by simdjson::SIMDJSON_PADDING readable bytes.
element parse_document(simdjson::dom::parser& parser, std::string_view text, std::string_view source) {
  element doc;
  const auto err = parser.parse(text.data(), text.size(), /*realloc_if_needed=*/false).get(doc);
  if (err != simdjson::SUCCESS) fail("{}: not valid JSON: {}", source, simdjson::error_message(err));
  return doc;
}

// Loads from JSON text followed by at least simdjson::SIMDJSON_PADDING readable bytes.
Tokenizer tokenizer_from_padded_json(std::string_view padded, std::string_view tokenizer_config_json,
                                     std::string_view source) {
  if (padded.size() > kMaxTokenizerJsonBytes)
    fail("{}: {} bytes is too large for a tokenizer.json", source, padded.size());
  auto m = std::make_shared<Tokenizer::Impl>();
  m->source = std::string(source);
  const auto t0 = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  simdjson::dom::parser parser;
  const Json root(parse_document(parser, padded, source), "", m->source);
  log_debug("{}: JSON parsed in {:.0f} ms", source, ms_since(t0));
  if (!root.is_object()) root.error("expected a JSON object");

  // The normalizer comes first: normalized added tokens are matched in normalized form.
  if (auto n = root.find_non_null("normalizer")) {
    std::vector<NormalizerStep> steps;
    parse_normalizer(*n, steps);
    m->normalizer = Normalizer(std::move(steps));
  }
  if (auto p = root.find_non_null("pre_tokenizer")) {
    std::vector<PreTokenizerStep> steps;
    parse_pre_tokenizer(*p, steps);
    m->pre_tokenizer = PreTokenizer(std::move(steps));
  }
  const auto t1 = std::chrono::steady_clock::now();
  parse_model(root.at("model"), *m);
  log_debug("{}: BPE model ({} tokens, {} merges) built in {:.0f} ms", source, m->vocab->size(), m->model->merge_count(),
            ms_since(t1));
  if (auto a = root.find_non_null("added_tokens")) parse_added_tokens(*a, *m);
  if (auto p = root.find_non_null("post_processor")) parse_post_processor(*p, *m);
  if (auto d = root.find_non_null("decoder")) {
    std::vector<DecoderStep> steps;
    parse_decoder(*d, steps);
    m->decoder = Decoder(std::move(steps));
  }

  m->vocab_end = m->vocab->id_end();
  for (const AddedToken& t : m->added.tokens()) m->vocab_end = std::max(m->vocab_end, t.id + 1);
  for (const PostTemplate& t : m->post_processors)
    for (int32_t id : t.items)
      if (id != PostTemplate::kSequence && !m->token(id))
        fail("{}: post_processor adds id {}, which is not a token", source, id);

  if (!tokenizer_config_json.empty()) {
    const std::string config_source = fmt::format("{} (tokenizer_config.json)", source);
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(tokenizer_config_json);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", config_source, e.what());
    }
    if (!config.is_object()) fail("{}: expected a JSON object", config_source);
    m->bos_id = config_token_id(config, "bos_token", *m, config_source);
    m->eos_id = config_token_id(config, "eos_token", *m, config_source);
  }
  return Tokenizer::from_impl(std::move(m));
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                               std::string_view source) {
  if (tokenizer_json.size() > kMaxTokenizerJsonBytes)
    fail("{}: {} bytes is too large for a tokenizer.json", source, tokenizer_json.size());
  const simdjson::padded_string padded(tokenizer_json);
  return tokenizer_from_padded_json(std::string_view(padded.data(), padded.size()), tokenizer_config_json, source);
}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) {
    file /= "tokenizer.json";
    if (!fs::exists(file, ec)) fail("{}: directory has no tokenizer.json", path);
  } else if (!fs::exists(file, ec)) {
    fail("{}: no such file or directory", path);
  }
  if (!fs::is_regular_file(file, ec)) fail("{}: not a regular file", file.string());
  if (starts_with_gguf_magic(file.string())) return load_gguf_tokenizer(GgufFile(file.string()));
  const auto size = fs::file_size(file, ec);
  if (ec) fail("{}: cannot read: {}", file.string(), ec.message());
  if (size > kMaxTokenizerJsonBytes) fail("{}: {} bytes is too large for a tokenizer.json", file.string(), size);
  std::string config;
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config_path, ec)) config = read_text_file(config_path.string());

  // Parse the file in place from a populated read-only map when the page it ends in has room for
  // simdjson's padding (the bytes past the end of a file read as zeros): this saves copying
  // 33 MB and one page fault per 4 KB, which dominate loading on a virtual machine.
  const long page = sysconf(_SC_PAGESIZE);
  const size_t tail = size % static_cast<size_t>(page);
  if (size > 0 && tail != 0 && static_cast<size_t>(page) - tail >= simdjson::SIMDJSON_PADDING) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      ::close(fd);
      if (map != MAP_FAILED) {
        struct Unmap {
          void* p;
          size_t n;
          ~Unmap() { ::munmap(p, n); }
        } unmap{map, size};
        return tokenizer_from_padded_json(std::string_view(static_cast<const char*>(map), size), config, file.string());
      }
    }
  }
  simdjson::padded_string json;
  if (simdjson::padded_string::load(file.string()).get(json) != simdjson::SUCCESS) fail("{}: cannot read the file", file.string());
  return tokenizer_from_padded_json(std::string_view(json.data(), json.size()), config, file.string());
}

}  // namespace fl
