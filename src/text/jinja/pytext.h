#pragma once
// Python's string semantics on UTF-8 bytes: what str.strip(), str.split(), str.title(), repr() and
// float repr do, because chat templates are written against Python and their output must match
// Python's byte for byte. Strings are treated as code-point sequences; a byte that is not valid
// UTF-8 counts as one code point of its own and is carried through unchanged.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fl::jinja::py {

// Decodes the code point at s[pos], advancing pos. Invalid bytes decode to 0xDC00 + byte (as
// Python's surrogateescape does) and advance by one.
char32_t next_code_point(std::string_view s, size_t& pos);
void append_utf8(std::string& out, char32_t cp);

// Byte offsets of every code point start, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);
size_t code_point_count(std::string_view s);

// str.isspace() for one code point.
bool is_space(char32_t cp);

// str.strip/lstrip/rstrip: without `chars`, Unicode whitespace; with it, any code point in it.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// str.split / str.rsplit; no separator means runs of whitespace. maxsplit < 0 means no limit.
// An empty separator is an error in Python; callers check it.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);

// str.replace(old, new, count); count < 0 replaces all. An empty `old` inserts between code points.
std::string replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize(): first upper, rest lower
std::string swapcase(std::string_view s);
bool is_upper(std::string_view s);  // str.isupper()
bool is_lower(std::string_view s);  // str.islower()
bool is_alpha_cp(char32_t cp);
bool is_digit_cp(char32_t cp);
bool is_alnum_cp(char32_t cp);

// repr(str): single quotes unless the text holds ' and no ", escapes as Python 3 does.
std::string repr_string(std::string_view s);
// repr(float) / str(float): shortest round-trip digits, ".0" on integral values, exponent form
// below 1e-4 and from 1e16 on; inf, -inf, nan.
std::string format_float(double d);
// json.dumps(str, ensure_ascii=...): the quoted, escaped string.
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

}  // namespace fl::jinja::py
