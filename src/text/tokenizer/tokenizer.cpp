#include "text/tokenizer/tokenizer.h"

#include "core/error.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/utf8.h"

namespace fl {

std::optional<std::string_view> Tokenizer::Impl::token(int32_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return std::string_view(added.tokens()[it->second].content);
  return vocab->token(id);
}

bool Tokenizer::Impl::is_special(int32_t id) const {
  auto it = added_by_id.find(id);
  return it != added_by_id.end() && added.tokens()[it->second].special;
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& m = *impl_;
  // Invalid UTF-8 is replaced (maximal subparts -> U+FFFD) before anything else; see docs.
  std::string sanitized;
  std::string_view text = input;
  if (!utf8::is_valid(input)) {
    sanitized = utf8::sanitize(input);
    text = sanitized;
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextSpan> raw_spans, normalized_spans;
  std::vector<std::string> words;
  m.added.split(text, /*normalized_tokens=*/false, raw_spans);
  for (const TextSpan& span : raw_spans) {
    if (span.id >= 0) {
      ids.push_back(span.id);
      continue;
    }
    const std::string_view piece = text.substr(span.start, span.end - span.start);
    const std::string normalized = m.normalizer.empty() ? std::string(piece) : m.normalizer.normalize(piece);
    normalized_spans.clear();
    m.added.split(normalized, /*normalized_tokens=*/true, normalized_spans);
    for (const TextSpan& sub : normalized_spans) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      words.clear();
      m.pre_tokenizer.pre_tokenize(std::string_view(normalized).substr(sub.start, sub.end - sub.start),
                                   span.start == 0 && sub.start == 0, words);
      for (const std::string& w : words) m.model->encode_word(w, ids);
    }
  }

  if (add_special_tokens) {
    for (const PostTemplate& t : m.post_processors) {
      std::vector<int32_t> out;
      out.reserve(ids.size() + t.items.size());
      for (int32_t item : t.items) {
        if (item == PostTemplate::kSequence)
          out.insert(out.end(), ids.begin(), ids.end());
        else
          out.push_back(item);
      }
      ids.swap(out);
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto t = m.token(id);
    if (!t) continue;
    if (skip_special_tokens && m.is_special(id)) continue;
    tokens.emplace_back(*t);
  }
  return m.decoder.decode(std::move(tokens));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) return it->second;
  return impl_->vocab->find(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto t = impl_->token(id);
  if (!t) return std::nullopt;
  return std::string(*t);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  auto t = impl_->token(id);
  if (!t) return {};
  return impl_->decoder.token_bytes(std::string(*t));
}

bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_end; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }

// ---- streaming ----

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

namespace {

std::vector<std::string> window_tokens(const Tokenizer::Impl& m, const std::vector<int32_t>& ids) {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) tokens.emplace_back(*m.token(id));
  return tokens;
}

bool ends_with_char(std::string_view s, char32_t c) {
  std::string enc;
  utf8::append(enc, c);
  return s.size() >= enc.size() && s.substr(s.size() - enc.size()) == enc;
}

}  // namespace

std::string StreamingDetokenizer::push(int32_t id) {
  const Tokenizer::Impl& m = tokenizer_.impl();
  const auto token = m.token(id);
  if (!token || (skip_special_ && m.is_special(id))) return {};  // decode() skips these too
  window_.push_back(id);

  // Cut after this token only where decoding the rest separately cannot change the text:
  // not inside a run of byte-fallback tokens (HF decodes a run as a whole), not while the text
  // ends in U+FFFD (possibly an unfinished byte-level character), not before a character a
  // final Strip could still remove, and not before a leading Strip has seen real text.
  const Decoder& d = m.decoder;
  if (!d.windowable()) return {};
  if (d.has_byte_fallback() && byte_fallback_value(*token) >= 0) return {};
  std::string text = d.decode(window_tokens(m, window_), at_start_, /*at_end=*/false);
  if (ends_with_char(text, utf8::kReplacement)) return {};
  if (d.trailing_strip_char() != 0 && ends_with_char(text, d.trailing_strip_char())) return {};
  if (d.has_leading_strip() && at_start_ && text.empty()) return {};
  window_.clear();
  at_start_ = false;
  return text;
}

std::string StreamingDetokenizer::finish() {
  const Tokenizer::Impl& m = tokenizer_.impl();
  std::string text = window_.empty() ? std::string() : m.decoder.decode(window_tokens(m, window_), at_start_, true);
  window_.clear();
  at_start_ = true;
  return text;
}

}  // namespace fl
