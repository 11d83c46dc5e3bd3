// Methods templates call on values, with Python's behaviour: str.startswith/strip/split/...,
// dict.get/items/keys/values/..., list.append/index/count/... (message.get('content'),
// content.split('</think>')[-1].lstrip('\n'), ns.items.append(x)).
#include <algorithm>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/pytext.h"
#include "text/jinja/value_ops.h"

namespace fl::jinja {
namespace {

std::optional<std::string> optional_chars(const Value& v, const char* method) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  return str_arg(v, std::string(method) + "() argument");
}

const std::string& self_str(const Value& self) { return self.as_string(); }

// Code-point index range [start, end) of str.find-style optional arguments, as byte offsets.
void substring_range(const std::string& s, CallArgs& args, size_t first_index, size_t& begin, size_t& end) {
  auto offsets = py::code_point_offsets(s);
  const auto n = static_cast<int64_t>(offsets.size()) - 1;
  auto norm = [&](const std::optional<Value>& v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    int64_t i = int_arg(*v, "index");
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  int64_t b = norm(args.take(first_index, "start"), 0);
  int64_t e = norm(args.take(first_index + 1, "end"), n);
  begin = offsets[b];
  end = std::max(offsets[b], offsets[std::max(e, b)]);
}

Value fix_affix(const Value& self, CallArgs& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  if (args.positional.empty()) fail("{}() takes at least 1 argument (0 given)", name);
  Value pattern = args.positional[0];
  size_t begin, end;
  substring_range(self_str(self), args, 1, begin, end);
  std::string_view s = std::string_view(self_str(self)).substr(begin, end - begin);
  auto check = [&](const Value& p) {
    const std::string& x = str_arg(p, std::string(name) + "() argument");
    if (x.size() > s.size()) return false;
    return prefix ? s.substr(0, x.size()) == x : s.substr(s.size() - x.size()) == x;
  };
  if (pattern.is_tuple() || pattern.is_list()) {
    for (const auto& p : pattern.items())
      if (check(p)) return Value(true);
    return Value(false);
  }
  return Value(check(pattern));
}

Value str_startswith(Interpreter&, const Value& self, CallArgs& args) { return fix_affix(self, args, true); }
Value str_endswith(Interpreter&, const Value& self, CallArgs& args) { return fix_affix(self, args, false); }

Value strip_method(const Value& self, CallArgs& args, bool left, bool right, const char* name) {
  Value chars = args.take_or(0, "chars", Value::none());
  args.expect_done(name, 1);
  return Value(py::strip(self_str(self), optional_chars(chars, name), left, right));
}
Value str_strip(Interpreter&, const Value& self, CallArgs& args) { return strip_method(self, args, true, true, "strip"); }
Value str_lstrip(Interpreter&, const Value& self, CallArgs& args) { return strip_method(self, args, true, false, "lstrip"); }
Value str_rstrip(Interpreter&, const Value& self, CallArgs& args) { return strip_method(self, args, false, true, "rstrip"); }

Value split_method(Interpreter& in, const Value& self, CallArgs& args, bool right) {
  const char* name = right ? "rsplit" : "split";
  Value sep = args.take_or(0, "sep", Value::none());
  Value maxsplit = args.take_or(1, "maxsplit", Value(int64_t{-1}));
  args.expect_done(name, 2);
  auto sep_str = optional_chars(sep, name);
  if (sep_str && sep_str->empty()) fail("empty separator");
  int64_t limit = int_arg(maxsplit, "maxsplit");
  auto parts = right ? py::rsplit(self_str(self), sep_str, limit) : py::split(self_str(self), sep_str, limit);
  in.check_size(parts.size());
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}
Value str_split(Interpreter& in, const Value& self, CallArgs& args) { return split_method(in, self, args, false); }
Value str_rsplit(Interpreter& in, const Value& self, CallArgs& args) { return split_method(in, self, args, true); }

Value str_splitlines(Interpreter&, const Value& self, CallArgs& args) {
  Value keepends = args.take_or(0, "keepends", Value(false));
  args.expect_done("splitlines", 1);
  std::vector<Value> out;
  for (auto& line : py::splitlines(self_str(self), keepends.truthy())) out.emplace_back(std::move(line));
  return Value::list(std::move(out));
}

Value str_replace(Interpreter& in, const Value& self, CallArgs& args) {
  Value old = args.take_or(0, "old", Value::undefined());
  Value replacement = args.take_or(1, "new", Value::undefined());
  Value count = args.take_or(2, "count", Value(int64_t{-1}));
  args.expect_done("replace", 3);
  const std::string& o = str_arg(old, "replace() argument 1");
  const std::string& r = str_arg(replacement, "replace() argument 2");
  const std::string& s = self_str(self);
  // Bound the result before building it: each replacement can grow the string by |new|.
  if (r.size() > o.size()) {
    size_t hits = o.empty() ? py::code_point_count(s) + 1 : 0;
    if (!o.empty())
      for (size_t p = s.find(o); p != std::string::npos; p = s.find(o, p + o.size())) ++hits;
    in.check_size(s.size() + hits * (r.size() - o.size()));
  }
  return Value(py::replace(s, o, r, int_arg(count, "count")));
}

#define NO_ARG_STR_METHOD(fname, pyname, expr)                  \
  Value fname(Interpreter&, const Value& self, CallArgs& args) { \
    args.expect_done(pyname, 0);                                 \
    const std::string& s = self_str(self);                       \
    return Value(expr);                                          \
  }

NO_ARG_STR_METHOD(str_upper, "upper", py::upper(s))
NO_ARG_STR_METHOD(str_lower, "lower", py::lower(s))
NO_ARG_STR_METHOD(str_title, "title", py::title(s))
NO_ARG_STR_METHOD(str_capitalize, "capitalize", py::capitalize(s))
NO_ARG_STR_METHOD(str_swapcase, "swapcase", py::swapcase(s))
NO_ARG_STR_METHOD(str_isupper, "isupper", py::is_upper(s))
NO_ARG_STR_METHOD(str_islower, "islower", py::is_lower(s))

template <typename Pred>
bool all_code_points(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size())
    if (!pred(py::next_code_point(s, pos))) return false;
  return true;
}
NO_ARG_STR_METHOD(str_isspace, "isspace", all_code_points(s, py::is_space))
NO_ARG_STR_METHOD(str_isalpha, "isalpha", all_code_points(s, py::is_alpha_cp))
NO_ARG_STR_METHOD(str_isdigit, "isdigit", all_code_points(s, py::is_digit_cp))
NO_ARG_STR_METHOD(str_isalnum, "isalnum", all_code_points(s, py::is_alnum_cp))

Value find_method_impl(const Value& self, CallArgs& args, bool reverse, bool raise, const char* name) {
  if (args.positional.empty()) fail("{}() takes at least 1 argument (0 given)", name);
  const std::string& sub = str_arg(args.positional[0], std::string(name) + "() argument");
  const std::string& s = self_str(self);
  size_t begin, end;
  substring_range(s, args, 1, begin, end);
  std::string_view window = std::string_view(s).substr(begin, end - begin);
  size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos) {
    if (raise) fail("substring not found");
    return Value(int64_t{-1});
  }
  return Value(static_cast<int64_t>(py::code_point_count(std::string_view(s).substr(0, begin + hit))));
}
Value str_find(Interpreter&, const Value& self, CallArgs& args) { return find_method_impl(self, args, false, false, "find"); }
Value str_rfind(Interpreter&, const Value& self, CallArgs& args) { return find_method_impl(self, args, true, false, "rfind"); }
Value str_index(Interpreter&, const Value& self, CallArgs& args) { return find_method_impl(self, args, false, true, "index"); }
Value str_rindex(Interpreter&, const Value& self, CallArgs& args) { return find_method_impl(self, args, true, true, "rindex"); }

Value str_count(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.empty()) fail("count() takes at least 1 argument (0 given)");
  const std::string& sub = str_arg(args.positional[0], "count() argument");
  const std::string& s = self_str(self);
  size_t begin, end;
  substring_range(s, args, 1, begin, end);
  std::string_view window = std::string_view(s).substr(begin, end - begin);
  if (sub.empty()) return Value(static_cast<int64_t>(py::code_point_count(window) + 1));
  int64_t n = 0;
  for (size_t p = window.find(sub); p != std::string_view::npos; p = window.find(sub, p + sub.size())) ++n;
  return Value(n);
}

Value str_join(Interpreter& in, const Value& self, CallArgs& args) {
  if (args.positional.size() != 1) fail("join() takes exactly one argument");
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(args.positional[0])) {
    if (!first) out += self_str(self);
    first = false;
    out += str_arg(item, "join() item");
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value affix_remove(const Value& self, CallArgs& args, bool prefix) {
  if (args.positional.size() != 1) fail("{}() takes exactly one argument", prefix ? "removeprefix" : "removesuffix");
  const std::string& a = str_arg(args.positional[0], "argument");
  const std::string& s = self_str(self);
  if (prefix && s.compare(0, a.size(), a) == 0) return Value(s.substr(a.size()));
  if (!prefix && s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0)
    return Value(s.substr(0, s.size() - a.size()));
  return self;
}
Value str_removeprefix(Interpreter&, const Value& self, CallArgs& args) { return affix_remove(self, args, true); }
Value str_removesuffix(Interpreter&, const Value& self, CallArgs& args) { return affix_remove(self, args, false); }

Value partition_impl(const Value& self, CallArgs& args, bool reverse) {
  if (args.positional.size() != 1) fail("partition() takes exactly one argument");
  const std::string& sep = str_arg(args.positional[0], "partition() argument");
  if (sep.empty()) fail("empty separator");
  const std::string& s = self_str(self);
  size_t hit = reverse ? s.rfind(sep) : s.find(sep);
  if (hit == std::string::npos) {
    if (reverse) return Value::tuple({Value(""), Value(""), self});
    return Value::tuple({self, Value(""), Value("")});
  }
  return Value::tuple({Value(s.substr(0, hit)), Value(sep), Value(s.substr(hit + sep.size()))});
}
Value str_partition(Interpreter&, const Value& self, CallArgs& args) { return partition_impl(self, args, false); }
Value str_rpartition(Interpreter&, const Value& self, CallArgs& args) { return partition_impl(self, args, true); }

Value justify(Interpreter& in, const Value& self, CallArgs& args, int mode, const char* name) {
  Value width = args.take_or(0, "width", Value::undefined());
  Value fill = args.take_or(1, "fillchar", Value(" "));
  args.expect_done(name, 2);
  const int64_t w = int_arg(width, "width");
  const std::string& f = str_arg(fill, "fillchar");
  if (py::code_point_count(f) != 1) fail("The fill character must be exactly one character long");
  const std::string& s = self_str(self);
  const auto len = static_cast<int64_t>(py::code_point_count(s));
  if (w <= len) return self;
  in.check_size(static_cast<size_t>(w) * f.size());
  const int64_t pad = w - len;
  int64_t left = mode == 0 ? pad / 2 + (pad & w & 1) : (mode < 0 ? 0 : pad);
  int64_t right = pad - left;
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += f;
  out += s;
  for (int64_t k = 0; k < right; ++k) out += f;
  return Value(std::move(out));
}
Value str_center(Interpreter& in, const Value& self, CallArgs& args) { return justify(in, self, args, 0, "center"); }
Value str_ljust(Interpreter& in, const Value& self, CallArgs& args) { return justify(in, self, args, -1, "ljust"); }
Value str_rjust(Interpreter& in, const Value& self, CallArgs& args) { return justify(in, self, args, 1, "rjust"); }

// str.format with automatic or numbered fields and keyword fields, no format specs beyond
// plain conversion ({} {0} {name}; {{ and }} escape braces).
Value str_format(Interpreter& in, const Value& self, CallArgs& args) {
  const std::string& s = self_str(self);
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '}' ) {
      if (k + 1 < s.size() && s[k + 1] == '}') ++k;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < s.size() && s[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t close = s.find('}', k);
    if (close == std::string::npos) fail("Single '{{' encountered in format string");
    std::string field = s.substr(k + 1, close - k - 1);
    if (field.find_first_of(":!") != std::string::npos) fail("str.format() specs are not supported in templates");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) fail("Replacement index {} out of range", auto_index);
      v = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t i = std::stoul(field);
      if (i >= args.positional.size()) fail("Replacement index {} out of range", i);
      v = &args.positional[i];
    } else {
      for (const auto& [key, value] : args.keyword)
        if (key == field) v = &value;
      if (!v) fail("KeyError: '{}'", field);
    }
    out += to_str(*v);
    in.check_size(out.size());
    k = close;
  }
  return Value(std::move(out));
}

// ---- dict ----

Value dict_get(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.empty() || args.positional.size() > 2 || !args.keyword.empty())
    fail("get() takes 1 or 2 arguments");
  const Value& key = args.positional[0];
  if (key.is_string())
    if (const Value* v = self.dict_data().find(key.as_string())) return *v;
  return args.positional.size() > 1 ? args.positional[1] : Value::none();
}

Value dict_items(Interpreter&, const Value& self, CallArgs& args) {
  args.expect_done("items", 0);
  std::vector<Value> out;
  for (const auto& [key, value] : self.dict_data().entries()) out.push_back(Value::tuple({Value(key), value}));
  return Value::list(std::move(out));
}

Value dict_keys(Interpreter&, const Value& self, CallArgs& args) {
  args.expect_done("keys", 0);
  std::vector<Value> out;
  for (const auto& [key, value] : self.dict_data().entries()) out.emplace_back(key);
  return Value::list(std::move(out));
}

Value dict_values(Interpreter&, const Value& self, CallArgs& args) {
  args.expect_done("values", 0);
  std::vector<Value> out;
  for (const auto& [key, value] : self.dict_data().entries()) out.push_back(value);
  return Value::list(std::move(out));
}

Value dict_copy(Interpreter&, const Value& self, CallArgs& args) {
  args.expect_done("copy", 0);
  return Value::dict(self.dict_data());
}

Value dict_update(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.size() > 1) fail("update expected at most 1 argument");
  if (!args.positional.empty()) {
    const Value& other = args.positional[0];
    if (!other.is_dict()) fail("update() argument must be a dict, not {}", other.type_name());
    for (const auto& [key, value] : other.dict_data().entries()) self.dict_mut().set(key, value);
  }
  for (auto& [key, value] : args.keyword) self.dict_mut().set(key, value);
  return Value::none();
}

Value dict_pop(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.empty() || args.positional.size() > 2) fail("pop expected 1 or 2 arguments");
  const Value& key = args.positional[0];
  if (key.is_string()) {
    if (const Value* v = self.dict_data().find(key.as_string())) {
      Value out = *v;
      self.dict_mut().erase(key.as_string());
      return out;
    }
  }
  if (args.positional.size() > 1) return args.positional[1];
  fail("KeyError: {}", repr(key));
}

Value dict_setdefault(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.empty() || args.positional.size() > 2) fail("setdefault expected 1 or 2 arguments");
  const std::string& key = str_arg(args.positional[0], "dict key");
  if (const Value* v = self.dict_data().find(key)) return *v;
  Value v = args.positional.size() > 1 ? args.positional[1] : Value::none();
  self.dict_mut().set(key, v);
  return v;
}

// ---- list ----

void check_mutable(const Value& self, const char* name) {
  if (self.is_tuple()) fail("'tuple' object has no attribute '{}'", name);
}

Value list_append(Interpreter& in, const Value& self, CallArgs& args) {
  check_mutable(self, "append");
  if (args.positional.size() != 1 || !args.keyword.empty()) fail("append() takes exactly one argument");
  in.check_size(self.items().size() + 1);
  self.list_mut().items.push_back(args.positional[0]);
  return Value::none();
}

Value list_extend(Interpreter& in, const Value& self, CallArgs& args) {
  check_mutable(self, "extend");
  if (args.positional.size() != 1 || !args.keyword.empty()) fail("extend() takes exactly one argument");
  std::vector<Value> more = in.iterate(args.positional[0]);
  in.check_size(self.items().size() + more.size());
  auto& items = self.list_mut().items;
  items.insert(items.end(), more.begin(), more.end());
  return Value::none();
}

Value list_insert(Interpreter& in, const Value& self, CallArgs& args) {
  check_mutable(self, "insert");
  if (args.positional.size() != 2) fail("insert expected 2 arguments");
  auto& items = self.list_mut().items;
  in.check_size(items.size() + 1);
  auto n = static_cast<int64_t>(items.size());
  int64_t i = int_arg(args.positional[0], "insert() index");
  if (i < 0) i = std::max<int64_t>(0, i + n);
  i = std::min(i, n);
  items.insert(items.begin() + i, args.positional[1]);
  return Value::none();
}

Value list_pop(Interpreter&, const Value& self, CallArgs& args) {
  check_mutable(self, "pop");
  auto& items = self.list_mut().items;
  if (items.empty()) fail("pop from empty list");
  auto n = static_cast<int64_t>(items.size());
  int64_t i = args.positional.empty() ? n - 1 : int_arg(args.positional[0], "pop() index");
  if (i < 0) i += n;
  if (i < 0 || i >= n) fail("pop index out of range");
  Value out = items[static_cast<size_t>(i)];
  items.erase(items.begin() + i);
  return out;
}

Value list_remove(Interpreter&, const Value& self, CallArgs& args) {
  check_mutable(self, "remove");
  if (args.positional.size() != 1) fail("remove() takes exactly one argument");
  auto& items = self.list_mut().items;
  for (auto it = items.begin(); it != items.end(); ++it) {
    if (equals(*it, args.positional[0])) {
      items.erase(it);
      return Value::none();
    }
  }
  fail("list.remove(x): x not in list");
}

Value list_index(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.empty()) fail("index expected at least 1 argument");
  const auto& items = self.items();
  for (size_t k = 0; k < items.size(); ++k)
    if (equals(items[k], args.positional[0])) return Value(static_cast<int64_t>(k));
  fail("{} is not in list", repr(args.positional[0]));
}

Value list_count(Interpreter&, const Value& self, CallArgs& args) {
  if (args.positional.size() != 1) fail("count() takes exactly one argument");
  int64_t n = 0;
  for (const auto& item : self.items())
    if (equals(item, args.positional[0])) ++n;
  return Value(n);
}

Value list_copy(Interpreter&, const Value& self, CallArgs& args) {
  args.expect_done("copy", 0);
  return Value::list(self.items());
}

using MethodTable = std::unordered_map<std::string_view, MethodFn>;

const MethodTable& string_methods() {
  static const MethodTable table = {
      {"startswith", str_startswith}, {"endswith", str_endswith},   {"strip", str_strip},
      {"lstrip", str_lstrip},         {"rstrip", str_rstrip},       {"split", str_split},
      {"rsplit", str_rsplit},         {"splitlines", str_splitlines}, {"replace", str_replace},
      {"upper", str_upper},           {"lower", str_lower},         {"title", str_title},
      {"capitalize", str_capitalize}, {"swapcase", str_swapcase},   {"isupper", str_isupper},
      {"islower", str_islower},       {"isspace", str_isspace},     {"isalpha", str_isalpha},
      {"isdigit", str_isdigit},       {"isalnum", str_isalnum},     {"find", str_find},
      {"rfind", str_rfind},           {"index", str_index},         {"rindex", str_rindex},
      {"count", str_count},           {"join", str_join},           {"removeprefix", str_removeprefix},
      {"removesuffix", str_removesuffix}, {"partition", str_partition}, {"rpartition", str_rpartition},
      {"center", str_center},         {"ljust", str_ljust},         {"rjust", str_rjust},
      {"format", str_format},
  };
  return table;
}

const MethodTable& dict_methods() {
  static const MethodTable table = {
      {"get", dict_get},       {"items", dict_items}, {"keys", dict_keys},
      {"values", dict_values}, {"copy", dict_copy},   {"update", dict_update},
      {"pop", dict_pop},       {"setdefault", dict_setdefault},
  };
  return table;
}

const MethodTable& list_methods() {
  static const MethodTable table = {
      {"append", list_append}, {"extend", list_extend}, {"insert", list_insert},
      {"pop", list_pop},       {"remove", list_remove}, {"index", list_index},
      {"count", list_count},   {"copy", list_copy},
  };
  return table;
}

}  // namespace

MethodFn find_method(const Value& self, std::string_view name) {
  const MethodTable* table = nullptr;
  if (self.is_string()) table = &string_methods();
  else if (self.is_dict()) table = &dict_methods();
  else if (self.is_list()) table = &list_methods();
  if (!table) return nullptr;
  auto it = table->find(name);
  return it == table->end() ? nullptr : it->second;
}

}  // namespace fl::jinja
