#include "text/tokenizer/decoder.h"

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/utf8.h"

namespace fl {

int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

Decoder::Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {
  bool fused = false;
  for (const DecoderStep& s : steps_) {
    switch (s.kind) {
      case DecoderStep::Kind::byte_fallback:
        has_byte_fallback_ = true;
        if (fused) windowable_ = false;
        break;
      case DecoderStep::Kind::byte_level:
        if (fused) windowable_ = false;
        fused = true;
        break;
      case DecoderStep::Kind::fuse:
        fused = true;
        break;
      case DecoderStep::Kind::replace:
        // After fusing, a pattern longer than one character could match across a window cut.
        if (fused && (s.pattern.is_regex() || utf8::count_chars(s.pattern.literal_text()) != 1)) windowable_ = false;
        break;
      case DecoderStep::Kind::strip:
        if (fused) {
          if (s.strip_start > 0) leading_strip_ = true;
          if (s.strip_stop > 0) {
            if (trailing_strip_char_ != 0 && trailing_strip_char_ != s.strip_char) windowable_ = false;
            trailing_strip_char_ = s.strip_char;
          }
        }
        break;
      case DecoderStep::Kind::metaspace:
        break;
    }
  }
}

namespace {

std::vector<std::string> byte_level(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& t : tokens)
    if (!byte_level_decode(t, bytes)) bytes += t;  // tokens outside the table pass through as UTF-8
  std::vector<std::string> out;
  out.push_back(utf8::sanitize(bytes));
  return out;
}

// HF: a run of byte tokens becomes its UTF-8 text, or one U+FFFD per byte when it is not valid.
void flush_bytes(std::string& run, std::vector<std::string>& out) {
  if (run.empty()) return;
  if (utf8::is_valid(run)) {
    out.push_back(run);
  } else {
    for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
  }
  run.clear();
}

std::vector<std::string> byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  for (std::string& t : tokens) {
    const int b = byte_fallback_value(t);
    if (b >= 0) {
      run += static_cast<char>(b);
      continue;
    }
    flush_bytes(run, out);
    out.push_back(std::move(t));
  }
  flush_bytes(run, out);
  return out;
}

std::string strip(const std::string& token, char32_t c, size_t start, size_t stop) {
  std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < token.size();) {
    chars.emplace_back(i, 0);
    i += utf8::decode(token, i, chars.back().second, valid);
  }
  (void)cp;
  size_t start_cut = 0;
  for (size_t i = 0; i < start && i < chars.size() && chars[i].second == c; ++i) start_cut = i + 1;
  size_t stop_cut = chars.size();
  for (size_t i = 0; i < stop && i < chars.size() && chars[chars.size() - 1 - i].second == c; ++i) stop_cut = chars.size() - 1 - i;
  if (stop_cut <= start_cut) return {};
  const size_t b0 = chars[start_cut].first;
  const size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
  return token.substr(b0, b1 - b0);
}

std::string metaspace(const std::string& token, char32_t replacement, bool drop) {
  std::string out;
  out.reserve(token.size());
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < token.size();) {
    const size_t len = utf8::decode(token, i, cp, valid);
    if (cp == replacement) {
      // HF drops every replacement character of the very first token, not just a leading one.
      if (!drop) out += ' ';
    } else {
      out.append(token, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens, bool at_start, bool at_end) const {
  if (steps_.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 || !at_start) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  bool fused = false;
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::byte_level:
        tokens = byte_level(tokens);
        fused = true;
        break;
      case DecoderStep::Kind::replace:
        for (std::string& t : tokens) t = step.pattern.replace_all(t, step.content);
        break;
      case DecoderStep::Kind::byte_fallback:
        tokens = byte_fallback(tokens);
        break;
      case DecoderStep::Kind::fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        fused = true;
        break;
      }
      case DecoderStep::Kind::strip:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // Once fused, the one piece is the whole window: trim only the true start and end.
          const size_t start = fused && !at_start ? 0 : step.strip_start;
          const size_t stop = fused && !at_end ? 0 : step.strip_stop;
          tokens[i] = strip(tokens[i], step.strip_char, start, stop);
        }
        break;
      case DecoderStep::Kind::metaspace:
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = metaspace(tokens[i], step.replacement, i == 0 && at_start && step.prepend_scheme != PrependScheme::never);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Decoder::token_bytes(std::string token) const {
  if (steps_.empty()) return token;
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::byte_level: {
        std::string bytes;
        if (!byte_level_decode(token, bytes)) bytes = token;
        token = std::move(bytes);
        break;
      }
      case DecoderStep::Kind::replace: token = step.pattern.replace_all(token, step.content); break;
      case DecoderStep::Kind::byte_fallback: {
        const int b = byte_fallback_value(token);
        if (b >= 0) token.assign(1, static_cast<char>(b));
        break;
      }
      case DecoderStep::Kind::fuse:
      case DecoderStep::Kind::strip: break;  // inside an output: nothing to join or trim
      case DecoderStep::Kind::metaspace: token = metaspace(token, step.replacement, false); break;
    }
  }
  return token;
}

}  // namespace fl
