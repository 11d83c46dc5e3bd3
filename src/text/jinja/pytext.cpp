#include "text/jinja/pytext.h"

#include "core/utf8.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include <utf8proc.h>

namespace fl::jinja::py {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // invalid byte b decodes to kEscapeBase + b (b >= 0x80)

bool is_escaped_byte(char32_t cp) { return cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF; }

utf8proc_category_t category(char32_t cp) {
  if (is_escaped_byte(cp)) return UTF8PROC_CATEGORY_CS;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

bool is_cased(char32_t cp) {
  auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

char32_t to_upper_cp(char32_t cp) {
  if (is_escaped_byte(cp)) return cp;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
char32_t to_lower_cp(char32_t cp) {
  if (is_escaped_byte(cp)) return cp;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}
char32_t to_title_cp(char32_t cp) {
  if (is_escaped_byte(cp)) return cp;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}

template <typename F>
std::string map_code_points(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_utf8(out, f(next_code_point(s, pos)));
  return out;
}

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> cps;
  size_t pos = 0;
  while (pos < s.size()) cps.push_back(next_code_point(s, pos));
  return cps;
}

bool in_set(char32_t cp, const std::vector<char32_t>& set) {
  for (char32_t c : set)
    if (c == cp) return true;
  return false;
}

}  // namespace

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int len = 0;
  char32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++pos;
    return kEscapeBase + b0;
  }
  if (pos + len > s.size()) {
    ++pos;
    return kEscapeBase + b0;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[pos + k]);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return kEscapeBase + b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++pos;
    return kEscapeBase + b0;
  }
  pos += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (is_escaped_byte(cp)) {
    out += static_cast<char>(cp - kEscapeBase);
  } else {
    fl::append_utf8(out, cp);
  }
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    next_code_point(s, pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0, pos = 0;
  while (pos < s.size()) {
    next_code_point(s, pos);
    ++n;
  }
  return n;
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars) set = decode(*chars);
  auto strip_it = [&](char32_t cp) { return chars ? in_set(cp, set) : is_space(cp); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!strip_it(next_code_point(s, next))) break;
      begin = next;
    }
  }
  if (right && begin < end) {
    auto offsets = code_point_offsets(s.substr(begin, end - begin));
    size_t k = offsets.size() - 1;  // offsets[k] == end - begin
    while (k > 0) {
      size_t pos = offsets[k - 1];
      std::string_view rest = s.substr(begin);
      if (!strip_it(next_code_point(rest, pos))) break;
      --k;
    }
    end = begin + offsets[k];
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t hit = s.find(*sep, start);
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, hit - start));
      start = hit + sep->size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  size_t pos = 0;
  while (pos < s.size()) {
    // skip whitespace
    size_t word = pos;
    while (word < s.size()) {
      size_t next = word;
      if (!is_space(next_code_point(s, next))) break;
      word = next;
    }
    if (word >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      parts.emplace_back(s.substr(word));  // Python keeps trailing whitespace here
      return parts;
    }
    size_t end = word;
    while (end < s.size()) {
      size_t next = end;
      if (is_space(next_code_point(s, next))) break;
      end = next;
    }
    parts.emplace_back(s.substr(word, end - word));
    pos = end;
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> parts;
  if (sep) {
    size_t end = s.size();
    while (static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
  } else {
    auto offsets = code_point_offsets(s);
    std::vector<char32_t> cps = decode(s);
    int64_t k = static_cast<int64_t>(cps.size());
    while (k > 0) {
      while (k > 0 && is_space(cps[k - 1])) --k;
      if (k == 0) break;
      if (static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.emplace_back(s.substr(0, offsets[k]));
        k = 0;
        break;
      }
      int64_t start = k;
      while (start > 0 && !is_space(cps[start - 1])) --start;
      parts.emplace_back(s.substr(offsets[start], offsets[k] - offsets[start]));
      k = start;
    }
  }
  return {parts.rbegin(), parts.rend()};
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0, pos = 0;
  while (pos < s.size()) {
    size_t at = pos;
    char32_t cp = next_code_point(s, pos);
    bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
                    cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    lines.emplace_back(s.substr(start, (keepends ? pos : at) - start));
    start = pos;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count) {
  std::string out;
  if (old.empty()) {
    auto offsets = code_point_offsets(s);
    int64_t done = 0;
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      out += s.substr(offsets[k], offsets[k + 1] - offsets[k]);
    }
    if (count < 0 || done < count) out += replacement;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, start);
    if (hit == std::string_view::npos) break;
    out += s.substr(start, hit - start);
    out += replacement;
    start = hit + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

std::string upper(std::string_view s) { return map_code_points(s, to_upper_cp); }
std::string lower(std::string_view s) { return map_code_points(s, to_lower_cp); }
std::string swapcase(std::string_view s) {
  return map_code_points(s, [](char32_t cp) {
    auto c = category(cp);
    if (c == UTF8PROC_CATEGORY_LU) return to_lower_cp(cp);
    if (c == UTF8PROC_CATEGORY_LL) return to_upper_cp(cp);
    return cp;
  });
}

std::string title(std::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](char32_t cp) {
    char32_t out = previous_cased ? to_lower_cp(cp) : to_title_cp(cp);
    previous_cased = is_cased(cp);
    return out;
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_code_points(s, [&](char32_t cp) {
    char32_t out = first ? to_title_cp(cp) : to_lower_cp(cp);
    first = false;
    return out;
  });
}

bool is_upper(std::string_view s) {
  bool any_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    auto c = category(next_code_point(s, pos));
    if (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) return false;
    if (c == UTF8PROC_CATEGORY_LU) any_cased = true;
  }
  return any_cased;
}

bool is_lower(std::string_view s) {
  bool any_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    auto c = category(next_code_point(s, pos));
    if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) return false;
    if (c == UTF8PROC_CATEGORY_LL) any_cased = true;
  }
  return any_cased;
}

bool is_alpha_cp(char32_t cp) {
  auto c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool is_digit_cp(char32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }
bool is_alnum_cp(char32_t cp) {
  auto c = category(cp);
  return is_alpha_cp(cp) || c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = next_code_point(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else {
      auto c = category(cp);
      bool printable = cp == ' ' || !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF ||
                                      c == UTF8PROC_CATEGORY_CS || c == UTF8PROC_CATEGORY_CO ||
                                      c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
                                      c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
      if (printable) {
        append_utf8(out, cp);
      } else {
        char buf[16];
        if (cp < 0x100) {
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
        } else if (cp < 0x10000) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        } else {
          std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
        }
        out += buf;
      }
    }
  }
  out += quote;
  return out;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits in scientific form: [-]D[.DDD]e[+-]XX
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  bool negative = false;
  if (!sci.empty() && sci[0] == '-') {
    negative = true;
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exponent = std::stoi(std::string(sci.substr(e + 1)));
  // Python: value = 0.DIGITS * 10^decpt
  int decpt = exponent + 1;
  std::string out = negative ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    int x = decpt - 1;
    out += 'e';
    out += x < 0 ? '-' : '+';
    int ax = x < 0 ? -x : x;
    if (ax < 10) out += '0';
    out += std::to_string(ax);
  } else if (decpt <= 0) {
    out += "0.";
    out += std::string(-decpt, '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out += std::string(decpt - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t cp = next_code_point(s, pos);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {  // json.dumps escapes DEL too when ensure_ascii
      if (cp >= 0x10000 && !is_escaped_byte(cp)) {
        char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += '"';
}

}  // namespace fl::jinja::py
