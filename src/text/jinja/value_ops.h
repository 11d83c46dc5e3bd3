#pragma once
// Python's str(), repr(), ==, < and json.dumps on template values. These are what decide the
// exact bytes a template prints, so each follows CPython 3 (and Jinja2 3.1 for undefined).
// Containers can hold themselves (x.append(x)); every recursive walk here stops with an fl::Error
// past kMaxNesting levels instead of overflowing the stack.
#include <cstdint>
#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace fl::jinja {

constexpr int kMaxNesting = 256;

// Bounds on the work str()/repr()/tojson and comparisons may do: the size of one text form, and
// the comparison steps of one render. A value can share a list
// many times over (ns.a = [ns.a, ns.a], repeated), so its printed form can be exponentially larger
// than the memory it takes; while a render runs, the interpreter installs these limits and every
// writer and comparison fails cleanly once past them.
struct ValueOpsLimits {
  size_t max_text_bytes = SIZE_MAX;
  int64_t max_compare_steps = INT64_MAX;
};
class ScopedValueOpsLimits {
 public:
  explicit ScopedValueOpsLimits(ValueOpsLimits limits);
  ~ScopedValueOpsLimits();
  ScopedValueOpsLimits(const ScopedValueOpsLimits&) = delete;
  ScopedValueOpsLimits& operator=(const ScopedValueOpsLimits&) = delete;

 private:
  ValueOpsLimits saved_;
  int64_t saved_steps_;
};

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
