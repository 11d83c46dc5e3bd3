#pragma once
// Python's str(), repr(), ==, < and json.dumps on template values. These are what decide the
// exact bytes a template prints, so each follows CPython 3 (and Jinja2 3.1 for undefined).
// Containers can hold themselves (x.append(x)); every recursive walk here stops with an fl::Error
// past kMaxNesting levels instead of overflowing the stack.
#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace fl::jinja {

constexpr int kMaxNesting = 256;

std::string to_str(const Value& v);  // str(v); undefined prints as ""
std::string repr(const Value& v);    // repr(v)

struct JsonOptions {
  std::optional<std::string> indent;  // json.dumps(indent=...): spaces (or the given string) per level
  std::optional<std::string> item_separator;  // default ", " (or "," when indenting)
  std::optional<std::string> key_separator;   // default ": "
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// json.dumps(v, ...) as Hugging Face's tojson filter calls it (ensure_ascii=False by default).
std::string to_json_text(const Value& v, const JsonOptions& options = {});

// markupsafe.escape: & < > " ' become entities; a Markup value is returned unchanged.
Value html_escape(const Value& v);
std::string html_escape_text(std::string_view s);

// A copy that shares nothing mutable with `v` (lists, dicts and namespaces are copied).
Value deep_copy(const Value& v);

bool equals(const Value& a, const Value& b);
// a < b as Python orders it: -1, 0 or 1; throws fl::Error for types Python cannot order.
int compare(const Value& a, const Value& b);
// `item in container` (substring for strings, key for dicts, element for lists).
bool contains(const Value& container, const Value& item);

}  // namespace fl::jinja
