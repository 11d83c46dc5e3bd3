#include "text/jinja/lexer.h"

#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/pytext.h"
#include "text/jinja/template_error.h"

namespace fl::jinja {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Python's str.rstrip() (all Unicode whitespace).
void rstrip_unicode(std::string& text) { text = py::strip(text, std::nullopt, false, true); }

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& options, const std::string& name) : options_(options), name_(name) {
    // Jinja2 normalises every newline sequence to "\n" and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit(TokenType::text, src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[tag + 1];
      size_t inner = tag + 2;
      const char modifier = inner < src_.size() ? src_[inner] : '\0';
      if (modifier == '-' || modifier == '+') ++inner;

      // {% raw %} is recognised before anything else, as Jinja2's root rule does.
      size_t raw_end_of_tag = 0;
      bool raw_strip_after = false, raw_keep_after = false;
      const bool is_raw = kind == '%' && match_raw_tag(inner, "raw", raw_end_of_tag, raw_strip_after, raw_keep_after);

      std::string text = src_.substr(pos_, tag - pos_);
      apply_text_rules(text, modifier, kind != '{');
      emit(TokenType::text, std::move(text), pos_);
      line_starting_ = false;

      if (is_raw) {
        lex_raw(raw_end_of_tag, raw_strip_after, raw_keep_after);
      } else if (kind == '#') {
        lex_comment(inner, tag);
      } else {
        lex_tag(kind, inner, tag);
      }
    }
    Token eof{TokenType::eof, "", 0, 0};
    locate(src_.size(), eof.line, eof.column);
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  void locate(size_t offset, int& line, int& column) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(index + 1);
    column = static_cast<int>(offset - line_starts_[index] + 1);
  }

  [[noreturn]] void error(size_t offset, const std::string& message) const {
    int line, column;
    locate(offset, line, column);
    throw TemplateError(name_, line, column, message, false);
  }

  void emit(TokenType type, std::string value, size_t offset) {
    if (type == TokenType::text && value.empty()) return;
    Token t{type, std::move(value), 0, 0};
    locate(offset, t.line, t.column);
    tokens_.push_back(std::move(t));
  }

  // Whitespace control for the text in front of a tag: `-` strips it all; otherwise
  // lstrip_blocks removes the spaces and tabs between the start of the line and a block or
  // comment tag, when nothing else is on that line before the tag.
  void apply_text_rules(std::string& text, char modifier, bool block_or_comment) const {
    if (modifier == '-') {
      rstrip_unicode(text);
    } else if (options_.lstrip_blocks && modifier != '+' && block_or_comment) {
      size_t line_start = text.rfind('\n');
      line_start = line_start == std::string::npos ? 0 : line_start + 1;
      if (line_start > 0 || line_starting_) {
        bool only_blanks = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start), text.end(),
                                       [](char c) { return c == ' ' || c == '\t'; });
        if (only_blanks) text.resize(line_start);
      }
    }
  }

  // After a tag: `-` strips all following whitespace; otherwise trim_blocks removes one newline
  // after block and comment tags (never after `}}`).
  void apply_after_rules(bool strip, bool keep, bool block_or_comment) {
    size_t start = pos_;
    if (strip) {
      while (pos_ < src_.size()) {
        size_t next = pos_;
        if (!py::is_space(py::next_code_point(src_, next))) break;
        pos_ = next;
      }
    } else if (options_.trim_blocks && !keep && block_or_comment && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  // Matches `\s*NAME\s*[-+]?%}` at `at`; on success sets the offset after the tag.
  bool match_raw_tag(size_t at, std::string_view word, size_t& end, bool& strip_after, bool& keep_after) const {
    size_t p = at;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.compare(p, word.size(), word) != 0) return false;
    p += word.size();
    if (p < src_.size() && is_name_char(src_[p])) return false;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    strip_after = keep_after = false;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
      strip_after = src_[p] == '-';
      keep_after = src_[p] == '+';
      ++p;
    }
    if (src_.compare(p, 2, "%}") != 0) return false;
    end = p + 2;
    return true;
  }

  void lex_raw(size_t tag_end, bool strip_after, bool /*keep_after*/) {
    pos_ = tag_end;
    // Jinja2's rule for the opening {% raw %} honours `-%}` but not trim_blocks.
    apply_after_rules(strip_after, true, true);
    for (size_t k = src_.find("{%", pos_); k != std::string::npos; k = src_.find("{%", k + 1)) {
      size_t inner = k + 2;
      const char modifier = inner < src_.size() ? src_[inner] : '\0';
      if (modifier == '-' || modifier == '+') ++inner;
      size_t end;
      bool s, kp;
      if (!match_raw_tag(inner, "endraw", end, s, kp)) continue;
      std::string text = src_.substr(pos_, k - pos_);
      apply_text_rules(text, modifier, true);
      emit(TokenType::text, std::move(text), pos_);
      pos_ = end;
      apply_after_rules(s, kp, true);
      return;
    }
    error(tag_end, "missing {% endraw %} for this {% raw %} block");
  }

  void lex_comment(size_t inner, size_t tag) {
    size_t end = src_.find("#}", inner);
    if (end == std::string::npos) error(tag, "missing end of comment tag '#}'");
    const char before = end > inner ? src_[end - 1] : '\0';
    pos_ = end + 2;
    apply_after_rules(before == '-', before == '+', true);
  }

  void lex_tag(char kind, size_t inner, size_t tag) {
    const bool block = kind == '%';
    emit(block ? TokenType::block_begin : TokenType::variable_begin, block ? "{%" : "{{", tag);
    pos_ = inner;
    std::vector<char> balance;
    while (true) {
      while (pos_ < src_.size() && is_ascii_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) error(tag, block ? "unexpected end of template: the tag opened here has no '%}'"
                                                : "unexpected end of template: the '{{' opened here has no '}}'");
      if (balance.empty()) {
        if (block) {
          if (src_.compare(pos_, 3, "-%}") == 0 || src_.compare(pos_, 3, "+%}") == 0) {
            const char m = src_[pos_];
            emit(TokenType::block_end, "%}", pos_);
            pos_ += 3;
            apply_after_rules(m == '-', m == '+', true);
            return;
          }
          if (src_.compare(pos_, 2, "%}") == 0) {
            emit(TokenType::block_end, "%}", pos_);
            pos_ += 2;
            apply_after_rules(false, false, true);
            return;
          }
        } else {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            emit(TokenType::variable_end, "}}", pos_);
            pos_ += 3;
            apply_after_rules(true, false, false);
            return;
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            emit(TokenType::variable_end, "}}", pos_);
            pos_ += 2;
            line_starting_ = false;
            return;
          }
        }
      }
      lex_expression_token(balance);
    }
  }

  void lex_expression_token(std::vector<char>& balance) {
    const size_t start = pos_;
    const char c = src_[pos_];
    if (is_name_start(c)) {
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      emit(TokenType::name, src_.substr(start, pos_ - start), start);
      return;
    }
    if (c == '\'' || c == '"') {
      emit(TokenType::string, lex_string(c), start);
      return;
    }
    if (is_digit(c)) {
      lex_number();
      return;
    }
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (auto op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        pos_ += 2;
        emit(TokenType::op, std::string(op), start);
        return;
      }
    }
    static constexpr std::string_view kOne = "+-/*%~[](){}=.:|,;<>";
    if (kOne.find(c) == std::string_view::npos) {
      error(start, fmt::format("unexpected character '{}' in tag", c == '!' ? "!" : std::string(1, c)));
    }
    if (c == '(' || c == '[' || c == '{') balance.push_back(c);
    if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : (c == ']' ? '[' : '{');
      if (balance.empty()) error(start, fmt::format("unexpected '{}'", c));
      if (balance.back() != open) {
        const char want = balance.back() == '(' ? ')' : (balance.back() == '[' ? ']' : '}');
        error(start, fmt::format("unexpected '{}', expected '{}'", c, want));
      }
      balance.pop_back();
    }
    ++pos_;
    emit(TokenType::op, std::string(1, c), start);
  }

  // Python string literal escapes (what Jinja2 gets from the unicode-escape codec).
  std::string lex_string(char quote) {
    const size_t start = pos_;
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) error(start, "unterminated string literal");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) error(start, "unterminated string literal");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          char32_t cp = 0;
          for (size_t k = 0; k < digits; ++k) {
            if (pos_ + k >= src_.size() || !is_hex(src_[pos_ + k]))
              error(pos_ - 2, fmt::format("truncated \\{} escape in string literal", e));
            const char h = src_[pos_ + k];
            cp = cp * 16 + static_cast<char32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) error(pos_ - 2, "illegal Unicode character in string literal");
          pos_ += digits;
          py::append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k)
              cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
            py::append_utf8(out, cp);
          } else {
            out += '\\';  // Python keeps unknown escapes as written
            --pos_;
          }
      }
    }
  }

  // Jinja2 number syntax: digits with optional underscores, a fraction, an exponent.
  void lex_number() {
    const size_t start = pos_;
    if (src_[start] == '0' && start + 2 < src_.size()) {
      const char r = static_cast<char>(src_[start + 1] | 0x20);
      const int radix = r == 'x' ? 16 : (r == 'o' ? 8 : (r == 'b' ? 2 : 0));
      auto digit = [&](char c) {
        int d = is_digit(c) ? c - '0' : (is_hex(c) ? (c | 0x20) - 'a' + 10 : 99);
        return d < radix ? d : -1;
      };
      if (radix && (digit(src_[start + 2]) >= 0 || (src_[start + 2] == '_' && start + 3 < src_.size() && digit(src_[start + 3]) >= 0))) {
        size_t p = start + 2;
        unsigned long long value = 0;
        while (p < src_.size() && (digit(src_[p]) >= 0 || (src_[p] == '_' && p + 1 < src_.size() && digit(src_[p + 1]) >= 0))) {
          if (src_[p] != '_') {
            if (value > (~0ULL >> 5)) error(start, "integer literal is too large");
            value = value * static_cast<unsigned>(radix) + static_cast<unsigned>(digit(src_[p]));
          }
          ++p;
        }
        pos_ = p;
        emit(TokenType::integer, std::to_string(value), start);
        return;
      }
    }
    auto digits = [&](size_t& p) {
      size_t first = p;
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p > first && p + 1 < src_.size() && is_digit(src_[p + 1])))) ++p;
      return p > first;
    };
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    size_t p = start;
    digits(p);
    bool is_float = false;
    if (!after_dot) {
      size_t q = p;
      if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
        ++q;
        digits(q);
        p = q;
        is_float = true;
      }
      q = p;
      if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
        ++q;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          digits(q);
          p = q;
          is_float = true;
        }
      }
    }
    if (!is_float && src_[start] == '0') {
      // Jinja2 (like Python 3) has no leading-zero decimals: "0" then whatever follows.
      p = start + 1;
      while (p < src_.size() && (src_[p] == '0' || (src_[p] == '_' && p + 1 < src_.size() && src_[p + 1] == '0'))) ++p;
    }
    std::string text;
    for (size_t k = start; k < p; ++k)
      if (src_[k] != '_') text += src_[k];
    pos_ = p;
    emit(is_float ? TokenType::floating : TokenType::integer, std::move(text), start);
  }

  LexOptions options_;
  const std::string& name_;
  std::string src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  bool line_starting_ = true;
};

}  // namespace

TemplateError::TemplateError(const std::string& template_name, int line, int column, std::string detail,
                             bool raised_by_template)
    : fl::Error(fmt::format("{}:{}:{}: {}", template_name, line, column, detail)),
      line_(line),
      column_(column),
      detail_(std::move(detail)),
      raised_(raised_by_template) {}

std::vector<Token> tokenize(std::string_view source, const LexOptions& options, const std::string& template_name) {
  return Lexer(source, options, template_name).run();
}

}  // namespace fl::jinja
