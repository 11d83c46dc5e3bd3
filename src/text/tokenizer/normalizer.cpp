#include "text/tokenizer/normalizer.h"

#include <cstdlib>

#include <utf8proc.h>

#include "core/error.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

std::string unicode_normalize(std::string_view text, int options) {
  if (text.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

// Rust's char::to_lowercase, one character at a time (no context-dependent final sigma).
std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < text.size();) {
    i += utf8::decode(text, i, cp, valid);
    if (cp == 0x130) {  // the one unconditional one-to-many lowercase mapping
      out += 'i';
      utf8::append(out, 0x307);
      continue;
    }
    utf8::append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  char32_t cp;
  bool valid;
  if (left) {
    while (begin < end) {
      const size_t len = utf8::decode(text, begin, cp, valid);
      if (!utf8::is_whitespace(cp)) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      utf8::decode(text, start, cp, valid);
      if (!utf8::is_whitespace(cp)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8::decode(text, i, cp, valid);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME)
      out.append(text.data() + i, len);
    i += len;
  }
  return out;
}

}  // namespace

std::string Normalizer::normalize(std::string_view input) const {
  std::string text(input);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::nfc: text = unicode_normalize(text, UTF8PROC_COMPOSE); break;
      case NormalizerStep::Kind::nfd: text = unicode_normalize(text, UTF8PROC_DECOMPOSE); break;
      case NormalizerStep::Kind::nfkc: text = unicode_normalize(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
      case NormalizerStep::Kind::nfkd: text = unicode_normalize(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
      case NormalizerStep::Kind::replace: text = step.pattern.replace_all(text, step.content); break;
      case NormalizerStep::Kind::prepend:
        if (!text.empty()) text.insert(0, step.content);
        break;
      case NormalizerStep::Kind::lowercase: text = lowercase(text); break;
      case NormalizerStep::Kind::strip: text = strip(text, step.strip_left, step.strip_right); break;
      case NormalizerStep::Kind::strip_accents: text = strip_accents(text); break;
      case NormalizerStep::Kind::byte_level: text = byte_level_encode(text); break;
    }
  }
  return text;
}

}  // namespace fl
