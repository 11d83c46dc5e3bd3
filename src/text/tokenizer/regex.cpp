#include "text/tokenizer/regex.h"

#include <mutex>

#include <oniguruma.h>

#include "core/error.h"
#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), n > 0 ? static_cast<size_t>(n) : 0);
}

void init_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
    // Bound the backtracking of one search (all start positions together; Oniguruma leaves it
    // unlimited) so a pathological pattern from a tokenizer.json fails with an error instead of
    // running for hours. Real pre-tokenizer patterns stay far below it even on megabytes of
    // whitespace; the per-start limit keeps Oniguruma's default (10M).
    onig_set_retry_limit_in_search(100'000'000);
  });
}

}  // namespace

struct Regex::Impl {
  OnigRegex regex = nullptr;
};

Regex::Regex(std::string_view pattern) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  init_oniguruma();
  if (!utf8::is_valid(pattern)) fail("regex pattern is not valid UTF-8");
  OnigErrorInfo info{};
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern_.data());
  // HF's onig crate compiles with the default (Ruby) syntax and no options.
  const int rc = onig_new(&impl_->regex, p, p + pattern_.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_RUBY, &info);
  if (rc != ONIG_NORMAL) {
    impl_->regex = nullptr;
    fail("invalid regex /{}/: {}", pattern_, onig_message(rc, &info));
  }
}

Regex::~Regex() {
  if (impl_ && impl_->regex) onig_free(impl_->regex);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  OnigRegion* region = onig_region_new();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = str + text.size();
  size_t search_from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (search_from <= text.size()) {
    const int r = onig_search(impl_->regex, str, end, str + search_from, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      onig_region_free(region, 1);
      fail("regex /{}/ failed on the input: {}", pattern_, onig_message(r, nullptr));
    }
    const size_t s = static_cast<size_t>(region->beg[0]);
    const size_t e = static_cast<size_t>(region->end[0]);
    if (s == e && have_last && last_end == e) {
      // Step over one character so an empty match cannot repeat forever.
      search_from += search_from < text.size() ? utf8::sequence_length(static_cast<unsigned char>(text[search_from])) : 1;
      continue;
    }
    out.emplace_back(s, e);
    have_last = true;
    last_end = e;
    search_from = e;
  }
  onig_region_free(region, 1);
}

}  // namespace fl

namespace fl {

TextPattern TextPattern::literal(std::string text) {
  TextPattern p;
  p.literal_ = std::move(text);
  return p;
}

TextPattern TextPattern::regex(std::string_view pattern) {
  TextPattern p;
  p.regex_ = std::make_shared<const Regex>(pattern);
  return p;
}

void TextPattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) {
    regex_->find_all(text, out);
    return;
  }
  if (literal_.empty()) return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos; pos = text.find(literal_, pos + literal_.size()))
    out.emplace_back(pos, pos + literal_.size());
}

std::string TextPattern::replace_all(std::string_view text, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (auto [s, e] : matches) {
    out.append(text.data() + prev, s - prev);
    out.append(content);
    prev = e;
  }
  out.append(text.data() + prev, text.size() - prev);
  return out;
}

}  // namespace fl
