// Jinja2 3.1's builtin filters, with Hugging Face's tojson (json.dumps with ensure_ascii=False,
// insertion-ordered keys, optional indent / separators / sort_keys). Each follows the Jinja2
// implementation's behaviour, including its treatment of undefined inputs (an undefined string
// is "", an undefined sequence is empty).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/pytext.h"
#include "text/jinja/value_ops.h"

namespace fl::jinja {
namespace {

Value arg_or(CallArgs& args, size_t index, std::string_view name, Value fallback) {
  return args.take_or(index, name, std::move(fallback));
}

// str(x) as Jinja2's soft_str does it.
std::string text_of(const Value& v) { return v.is_string() ? v.as_string() : to_str(v); }

// Filters built on soft_str(s).method() return Markup when given Markup.
Value like(const Value& input, std::string text) {
  return input.is_markup() ? Value::markup(std::move(text)) : Value(std::move(text));
}

// Attribute lookup for map/sort/groupby/selectattr: "a.b.0" walks attributes and indices.
Value lookup_attribute(Interpreter& in, const Value& item, const Value& attribute) {
  if (attribute.is_int()) return in.get_item(item, attribute);
  std::string path = text_of(attribute);
  Value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? in.get_item(v, Value(static_cast<int64_t>(std::strtoll(part.c_str(), nullptr, 10)))) : in.get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// The key Jinja2 sorts and compares by: strings lower-cased unless case-sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py::lower(v.as_string()));
  return v;
}

Value f_abs(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("abs", 0);
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.as_int();
    if (i == INT64_MIN) fail("integer result does not fit in 64 bits");
    return Value(i < 0 ? -i : i);
  }
  fail("bad operand type for abs(): '{}'", v.type_name());
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& args) {
  Value name = arg_or(args, 0, "name", Value::undefined());
  args.expect_done("attr", 1);
  // Jinja2's attr() looks up attributes only, never dict items.
  const std::string attr = str_arg(name, "attr() name");
  if (v.is_dict() && !find_method(v, attr)) return Value::undefined(fmt::format("'dict object' has no attribute '{}'", attr));
  return in.get_attr(v, attr);
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& args) {
  Value count = arg_or(args, 0, "linecount", Value::undefined());
  Value fill = arg_or(args, 1, "fill_with", Value::none());
  args.expect_done("batch", 2);
  int64_t n = int_arg(count, "batch() linecount");
  if (n <= 0) fail("batch() linecount must be positive");
  std::vector<Value> out, current;
  for (auto& item : in.iterate(v)) {
    current.push_back(std::move(item));
    if (static_cast<int64_t>(current.size()) == n) {
      out.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(current.size()) < n) current.push_back(fill);
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("capitalize", 0);
  return like(v, py::capitalize(text_of(v)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& args) {
  Value width = arg_or(args, 0, "width", Value(int64_t{80}));
  args.expect_done("center", 1);
  CallArgs inner;
  inner.positional.push_back(width);
  return in.call(in.get_attr(v.is_string() ? v : Value(text_of(v)), "center"), inner);
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default_value", Value(""));
  Value boolean = arg_or(args, 1, "boolean", Value(false));
  args.expect_done("default", 2);
  if (v.is_undefined() || (boolean.truthy() && !v.truthy())) return fallback;
  return v;
}

std::vector<Value> dict_items_of(const Value& v, const char* filter) {
  if (!v.is_dict()) fail("{}() needs a dict, not {}", filter, v.type_name());
  std::vector<Value> out;
  for (const auto& [key, value] : v.dict_data().entries()) out.push_back(Value::tuple({Value(key), value}));
  return out;
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& args) {
  Value case_sensitive = arg_or(args, 0, "case_sensitive", Value(false));
  Value by = arg_or(args, 1, "by", Value("key"));
  Value reverse = arg_or(args, 2, "reverse", Value(false));
  args.expect_done("dictsort", 3);
  size_t pos;
  if (by.is_string() && by.as_string() == "key") {
    pos = 0;
  } else if (by.is_string() && by.as_string() == "value") {
    pos = 1;
  } else {
    fail("You can only sort by either \"key\" or \"value\"");
  }
  std::vector<Value> items = dict_items_of(v, "dictsort");
  const bool cs = case_sensitive.truthy();
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return compare(sort_key(a.items()[pos], cs), sort_key(b.items()[pos], cs)) < 0;
  });
  if (reverse.truthy()) std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_escape(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("escape", 0);
  Value out = html_escape(v);
  in.check_size(out.as_string().size());
  return out;
}

Value f_forceescape(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("forceescape", 0);
  std::string out = html_escape_text(text_of(v));
  in.check_size(out.size());
  return Value::markup(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("first", 0);
  if (v.is_list()) return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items().front();
  auto items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("last", 0);
  if (v.is_list()) return v.items().empty() ? Value::undefined("No last item, sequence was empty.") : v.items().back();
  auto items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python float(str): optional whitespace, sign, digits, inf/nan, underscores between digits.
std::optional<double> parse_python_float(std::string text) {
  text = py::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t k = 0; k < text.size(); ++k) {
    if (text[k] == '_' && k > 0 && k + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[k - 1])) &&
        std::isdigit(static_cast<unsigned char>(text[k + 1])))
      continue;
    clean += text[k];
  }
  if (clean.empty()) return std::nullopt;
  std::string lower = py::lower(clean);
  std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    double d = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -d : d;
  }
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value(0.0));
  args.expect_done("float", 1);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string())
    if (auto d = parse_python_float(v.as_string())) return Value(*d);
  return fallback;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& args) {
  if (!args.keyword.empty() && !args.positional.empty()) fail("format() can't handle positional and keyword arguments at the same time");
  if (!args.keyword.empty()) {
    DictData d;
    for (auto& [key, value] : args.keyword) d.set(key, value);
      return like(v, python_percent_format(in, text_of(v), Value::dict(std::move(d)), v.is_markup()));
  }
  return like(v, python_percent_format(in, text_of(v), Value::tuple(args.positional), v.is_markup()));
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& args) {
  Value attribute = arg_or(args, 0, "attribute", Value::undefined());
  Value fallback = arg_or(args, 1, "default", Value::none());
  Value case_sensitive = arg_or(args, 2, "case_sensitive", Value(false));
  args.expect_done("groupby", 3);
  const bool cs = case_sensitive.truthy();
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : in.iterate(v)) {
    Value key = lookup_attribute(in, item, attribute);
    if (key.is_undefined() && !fallback.is_none()) key = fallback;
    keyed.emplace_back(std::move(key), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return compare(sort_key(a.first, cs), sort_key(b.first, cs)) < 0;
  });
  std::vector<Value> groups;
  for (size_t k = 0; k < keyed.size();) {
    size_t j = k;
    std::vector<Value> members;
    while (j < keyed.size() && equals(sort_key(keyed[j].first, cs), sort_key(keyed[k].first, cs)))
      members.push_back(keyed[j++].second);
    groups.push_back(Value::tuple({keyed[k].first, Value::list(std::move(members))}));
    k = j;
  }
  return Value::list(std::move(groups));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& args) {
  Value width = arg_or(args, 0, "width", Value(int64_t{4}));
  Value first = arg_or(args, 1, "first", Value(false));
  Value blank = arg_or(args, 2, "blank", Value(false));
  args.expect_done("indent", 3);
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else {
    int64_t w = int_arg(width, "indent() width");
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)));
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
  }
  // Jinja2 appends a newline so that splitlines() keeps a trailing empty line.
  std::string s = text_of(v) + "\n";
  auto lines = py::splitlines(s, false);
  in.check_size(s.size() + lines.size() * indention.size());
  std::string rv;
  if (blank.truthy()) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + indention;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        if (!lines[k].empty()) rv += indention;
        rv += lines[k];
      }
    }
  }
  if (first.truthy()) rv = indention + rv;
  return like(v, std::move(rv));
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value(int64_t{0}));
  Value base = arg_or(args, 1, "base", Value(int64_t{10}));
  args.expect_done("int", 2);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    std::string t = py::strip(v.as_string(), std::nullopt, true, true);
    std::string clean;
    for (char c : t)
      if (c != '_') clean += c;
    const int b = static_cast<int>(int_arg(base, "int() base"));
    if (!clean.empty() && b >= 2 && b <= 36) {
      errno = 0;
      char* end = nullptr;
      long long r = std::strtoll(clean.c_str(), &end, b);
      if (errno == 0 && end == clean.c_str() + clean.size()) return Value(static_cast<int64_t>(r));
    }
    // Jinja2 then tries int(float(value)).
    if (auto d = parse_python_float(v.as_string()))
      if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value(static_cast<int64_t>(std::trunc(*d)));
  }
  return fallback;
}

Value f_items(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("items", 0);
  if (v.is_undefined()) return Value::list();
  return Value::list(dict_items_of(v, "items"));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& args) {
  Value sep = arg_or(args, 0, "d", Value(""));
  Value attribute = arg_or(args, 1, "attribute", Value::none());
  args.expect_done("join", 2);
  const std::string separator = text_of(sep);
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    if (!first) out += separator;
    first = false;
    out += text_of(attribute.is_none() ? item : lookup_attribute(in, item, attribute));
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value f_length(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("length", 0);
  return Value(static_cast<int64_t>(value_length(v)));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("list", 0);
  return Value::list(in.iterate(v));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("lower", 0);
  return like(v, py::lower(text_of(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("upper", 0);
  return like(v, py::upper(text_of(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    Value attribute = arg_or(args, SIZE_MAX, "attribute", Value::undefined("map() needs a filter name or attribute="));
    Value fallback = arg_or(args, SIZE_MAX, "default", Value::undefined());
    args.expect_done("map", 0);
    if (attribute.is_undefined()) in.fail_undefined(attribute);
    for (const auto& item : in.iterate(v)) {
      Value x = lookup_attribute(in, item, attribute);
      out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
    }
    return Value::list(std::move(out));
  }
  std::string filter = str_arg(args.positional[0], "map() filter name");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const auto& item : in.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.apply_filter(filter, item, copy));
  }
  return Value::list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& args, bool want_max) {
  Value case_sensitive = arg_or(args, 0, "case_sensitive", Value(false));
  Value attribute = arg_or(args, 1, "attribute", Value::none());
  args.expect_done(want_max ? "max" : "min", 2);
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined(want_max ? "No aggregated item, sequence was empty." : "No aggregated item, sequence was empty.");
  const bool cs = case_sensitive.truthy();
  auto key = [&](const Value& x) { return sort_key(attribute.is_none() ? x : lookup_attribute(in, x, attribute), cs); };
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    int c = compare(key(items[k]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return items[best];
}
Value f_max(Interpreter& in, const Value& v, CallArgs& args) { return min_max(in, v, args, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& args) { return min_max(in, v, args, false); }

Value f_pprint(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("pprint", 0);
  return Value(repr(v));
}

// select / reject / selectattr / rejectattr share this.
Value select_impl(Interpreter& in, const Value& v, CallArgs& args, bool use_attr, bool keep_matching) {
  size_t next = 0;
  Value attribute;
  if (use_attr) {
    if (args.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) test = str_arg(args.positional[next++], "test name");
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
  test_args.keyword = args.keyword;
  std::vector<Value> out;
  for (const auto& item : in.iterate(v)) {
    Value subject = use_attr ? lookup_attribute(in, item, attribute) : item;
    bool ok;
    if (test) {
      CallArgs copy = test_args;
      ok = in.apply_test(*test, subject, copy);
    } else {
      ok = subject.truthy();
    }
    if (ok == keep_matching) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& args) { return select_impl(in, v, args, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& args) { return select_impl(in, v, args, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& args) { return select_impl(in, v, args, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& args) { return select_impl(in, v, args, true, false); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& args) {
  CallArgs inner;
  inner.positional.push_back(arg_or(args, 0, "old", Value::undefined()));
  inner.positional.push_back(arg_or(args, 1, "new", Value::undefined()));
  Value count = arg_or(args, 2, "count", Value::none());
  args.expect_done("replace", 3);
  inner.positional.push_back(count.is_none() ? Value(int64_t{-1}) : count);
  return in.call(in.get_attr(Value(text_of(v)), "replace"), inner);
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& args) {
  args.expect_done("reverse", 0);
  if (v.is_string()) {
    auto offsets = py::code_point_offsets(v.as_string());
    std::string out;
    for (size_t k = offsets.size() - 1; k > 0; --k) out.append(v.as_string(), offsets[k - 1], offsets[k] - offsets[k - 1]);
    return Value(std::move(out));
  }
  auto items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python's round(x, n): correctly rounded, ties to even on the exact binary value; the C library's
// "%.*f" rounds the same way.
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits < -300) return std::copysign(0.0, x);
  if (digits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-digits));
  double y = x / scale;
  double r = std::nearbyint(y);
  return r * scale;
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  Value precision = arg_or(args, 0, "precision", Value(int64_t{0}));
  Value method = arg_or(args, 1, "method", Value("common"));
  args.expect_done("round", 2);
  const std::string m = text_of(method);
  if (m != "common" && m != "ceil" && m != "floor") fail("method must be common, ceil or floor");
  if (!v.is_number()) fail("round() needs a number, not {}", v.type_name());
  const int64_t p = int_arg(precision, "round() precision");
  const double x = v.as_double();
  if (m == "common") {
    if (v.is_int() || v.is_bool()) return Value(v.as_int());  // Python's round(int, n) stays an int
    return Value(python_round(x, p));
  }
  const double scale = std::pow(10.0, static_cast<double>(p));
  return Value((m == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("safe", 0);
  return Value::markup(text_of(v));
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& args) {
  Value slices_v = arg_or(args, 0, "slices", Value::undefined());
  Value fill = arg_or(args, 1, "fill_with", Value::none());
  args.expect_done("slice", 2);
  const int64_t slices = int_arg(slices_v, "slice() slices");
  if (slices <= 0) fail("slice() slices must be positive");
  auto seq = in.iterate(v);
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && k >= extra) part.push_back(fill);
    out.push_back(Value::list(std::move(part)));
  }
  return Value::list(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& args) {
  Value reverse = arg_or(args, 0, "reverse", Value(false));
  Value case_sensitive = arg_or(args, 1, "case_sensitive", Value(false));
  Value attribute = arg_or(args, 2, "attribute", Value::none());
  args.expect_done("sort", 3);
  auto items = in.iterate(v);
  const bool cs = case_sensitive.truthy();
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items)
    keyed.emplace_back(sort_key(attribute.is_none() ? item : lookup_attribute(in, item, attribute), cs), item);
  const bool rev = reverse.truthy();
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return rev ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_string(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("string", 0);
  return like(v, text_of(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& args) {
  Value attribute = arg_or(args, 0, "attribute", Value::none());
  Value start = arg_or(args, 1, "start", Value(int64_t{0}));
  args.expect_done("sum", 2);
  Value total = start;
  bool is_float = total.is_float();
  double fsum = total.as_double();
  int64_t isum = total.is_number() ? total.as_int() : 0;
  if (!total.is_number()) fail("sum() start must be a number");
  for (const auto& item : in.iterate(v)) {
    Value x = attribute.is_none() ? item : lookup_attribute(in, item, attribute);
    if (!x.is_number()) fail("unsupported operand type(s) for +: 'int' and '{}'", x.type_name());
    if (x.is_float()) is_float = true;
    fsum += x.as_double();
    if (!is_float && __builtin_add_overflow(isum, x.as_int(), &isum)) fail("integer result does not fit in 64 bits");
  }
  return is_float ? Value(fsum) : Value(isum);
}

Value f_title(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("title", 0);
  // Jinja2: split on runs of "-", whitespace, "(", "{", "[", "<" (kept), upper-case the first
  // character of every piece and lower-case the rest.
  const std::string s = text_of(v);
  std::string out;
  size_t pos = 0;
  bool at_start = true;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t cp = py::next_code_point(s, pos);
    const bool delimiter = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py::is_space(cp);
    if (delimiter) {
      out.append(s, start, pos - start);
      at_start = true;
      continue;
    }
    std::string one(s, start, pos - start);
    out += at_start ? py::upper(one) : py::lower(one);
    at_start = false;
  }
  return like(v, std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& args) {
  JsonOptions options;
  Value indent = arg_or(args, 0, "indent", Value::none());
  Value ensure_ascii = arg_or(args, SIZE_MAX, "ensure_ascii", Value(false));
  Value separators = arg_or(args, SIZE_MAX, "separators", Value::none());
  Value sort_keys = arg_or(args, SIZE_MAX, "sort_keys", Value(false));
  args.expect_done("tojson", 1);
  if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    int64_t n = int_arg(indent, "tojson() indent");
    if (n > 64) fail("tojson() indent {} is too large", n);
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  }
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.items().size() != 2) fail("tojson() separators must be a pair of strings");
    options.item_separator = str_arg(separators.items()[0], "separator");
    options.key_separator = str_arg(separators.items()[1], "separator");
  }
  options.ensure_ascii = ensure_ascii.truthy();
  options.sort_keys = sort_keys.truthy();
  std::string out = to_json_text(v, options);
  in.check_size(out.size());
  return Value(std::move(out));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  Value chars = arg_or(args, 0, "chars", Value::none());
  args.expect_done("trim", 1);
  std::optional<std::string> set;
  if (!chars.is_none()) set = str_arg(chars, "trim() chars");
  return like(v, py::strip(text_of(v), set, true, true));
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& args) {
  Value length_v = arg_or(args, 0, "length", Value(int64_t{255}));
  Value killwords = arg_or(args, 1, "killwords", Value(false));
  Value end_v = arg_or(args, 2, "end", Value("..."));
  Value leeway_v = arg_or(args, 3, "leeway", Value(int64_t{5}));
  args.expect_done("truncate", 4);
  const std::string s = text_of(v);
  const std::string end = text_of(end_v);
  const int64_t length = int_arg(length_v, "truncate() length");
  const int64_t leeway = leeway_v.is_none() ? 5 : int_arg(leeway_v, "truncate() leeway");
  auto offsets = py::code_point_offsets(s);
  const auto n = static_cast<int64_t>(offsets.size()) - 1;
  const auto end_len = static_cast<int64_t>(py::code_point_count(end));
  if (length < end_len) fail("expected length >= {}, got {}", end_len, length);
  if (leeway < 0) fail("expected leeway >= 0, got {}", leeway);
  if (n <= length + leeway) return Value(s);
  const int64_t cut = std::max<int64_t>(0, length - end_len);
  std::string head = s.substr(0, offsets[cut]);
  if (killwords.truthy()) return Value(head + end);
  size_t space = head.rfind(' ');
  if (space != std::string::npos) head.resize(space);
  return Value(head + end);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& args) {
  Value case_sensitive = arg_or(args, 0, "case_sensitive", Value(false));
  Value attribute = arg_or(args, 1, "attribute", Value::none());
  args.expect_done("unique", 2);
  const bool cs = case_sensitive.truthy();
  std::vector<Value> out, seen;
  for (const auto& item : in.iterate(v)) {
    Value key = sort_key(attribute.is_none() ? item : lookup_attribute(in, item, attribute), cs);
    bool dup = false;
    for (const auto& s : seen)
      if (equals(s, key)) {
        dup = true;
        break;
      }
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("wordcount", 0);
  const std::string s = text_of(v);
  int64_t words = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = py::next_code_point(s, pos);
    const bool word_char = cp == '_' || py::is_alnum_cp(cp);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value(words);
}

Value f_bool(Interpreter&, const Value& v, CallArgs& args) {
  args.expect_done("bool", 0);
  return Value(v.truthy());
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
      {"e", f_escape},          {"escape", f_escape},     {"forceescape", f_forceescape},
      {"first", f_first},       {"float", f_float},       {"format", f_format},
      {"groupby", f_groupby},   {"indent", f_indent},     {"int", f_int},
      {"items", f_items},       {"join", f_join},         {"last", f_last},
      {"length", f_length},     {"list", f_list},         {"lower", f_lower},
      {"map", f_map},           {"max", f_max},           {"min", f_min},
      {"pprint", f_pprint},     {"reject", f_reject},     {"rejectattr", f_rejectattr},
      {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},
      {"safe", f_safe},         {"select", f_select},     {"selectattr", f_selectattr},
      {"slice", f_slice},       {"sort", f_sort},         {"string", f_string},
      {"sum", f_sum},           {"title", f_title},       {"tojson", f_tojson},
      {"trim", f_trim},         {"truncate", f_truncate}, {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount}, {"bool", f_bool},
  };
  return table;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

}  // namespace fl::jinja
