#include "text/jinja/value_ops.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "text/jinja/pytext.h"

namespace fl::jinja {
namespace {

thread_local ValueOpsLimits g_limits;
thread_local int64_t g_compare_steps = 0;  // since the limits were installed (one render)

void check_text(const std::string& out) {
  if (out.size() > g_limits.max_text_bytes)
    fail("a value's text form exceeds the limit of {} bytes", g_limits.max_text_bytes);
}

struct CompareBudget {
  void step() {
    if (++g_compare_steps > g_limits.max_compare_steps)
      fail("comparisons exceed the limit of {} steps in one render", g_limits.max_compare_steps);
  }
};

void check_depth(int depth) {
  if (depth > kMaxNesting) fail("value nested more than {} levels deep (a container holding itself?)", kMaxNesting);
}

void append_repr(std::string& out, const Value& v, int depth);

void append_str(std::string& out, const Value& v, int depth) {
  switch (v.type()) {
    case Value::Type::undefined: return;
    case Value::Type::string: out += v.as_string(); return;
    default: append_repr(out, v, depth);
  }
}

void append_repr(std::string& out, const Value& v, int depth) {
  check_depth(depth);
  check_text(out);
  switch (v.type()) {
    case Value::Type::undefined: out += "Undefined"; return;
    case Value::Type::none: out += "None"; return;
    case Value::Type::boolean: out += v.as_bool() ? "True" : "False"; return;
    case Value::Type::integer: out += std::to_string(v.as_int()); return;
    case Value::Type::floating: out += py::format_float(v.as_double()); return;
    case Value::Type::string:
      if (v.is_markup()) {
        out += "Markup(" + py::repr_string(v.as_string()) + ")";
      } else {
        out += py::repr_string(v.as_string());
      }
      return;
    case Value::Type::list: {
      const bool tuple = v.is_tuple();
      out += tuple ? '(' : '[';
      const auto& items = v.items();
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += ", ";
        append_repr(out, items[k], depth + 1);
      }
      if (tuple && items.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Value::Type::dict:
    case Value::Type::ns: {
      if (v.is_ns()) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.dict_data().entries()) {
        if (!first) out += ", ";
        first = false;
        out += py::repr_string(key);
        out += ": ";
        append_repr(out, item, depth + 1);
      }
      out += '}';
      if (v.is_ns()) out += '>';
      return;
    }
    case Value::Type::callable: out += "<function " + v.callable_ref().name() + ">"; return;
    case Value::Type::loop: {
      const auto& loop = v.loop_data();
      out += "<LoopContext " + std::to_string(loop.index0 + 1) + "/" + std::to_string(loop.items->items.size()) + ">";
      return;
    }
  }
}

struct JsonWriter {
  const JsonOptions& options;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += *options.indent;
  }

  void write(const Value& v, int level) {
    check_depth(level);
    check_text(out);
    switch (v.type()) {
      case Value::Type::none: out += "null"; return;
      case Value::Type::boolean: out += v.as_bool() ? "true" : "false"; return;
      case Value::Type::integer: out += std::to_string(v.as_int()); return;
      case Value::Type::floating: {
        double d = v.as_double();
        if (std::isnan(d)) out += "NaN";
        else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
        else out += py::format_float(d);
        return;
      }
      case Value::Type::string: py::append_json_string(out, v.as_string(), options.ensure_ascii); return;
      case Value::Type::list: {
        const auto& items = v.items();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep;
          if (options.indent) newline(level + 1);
          write(items[k], level + 1);
        }
        if (options.indent) newline(level);
        out += ']';
        return;
      }
      case Value::Type::dict: {
        const auto& entries = v.dict_data().entries();
        if (entries.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<std::string, Value>*> order;
        order.reserve(entries.size());
        for (const auto& e : entries) order.push_back(&e);
        if (options.sort_keys)
          std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += '{';
        for (size_t k = 0; k < order.size(); ++k) {
          if (k) out += item_sep;
          if (options.indent) newline(level + 1);
          py::append_json_string(out, order[k]->first, options.ensure_ascii);
          out += key_sep;
          write(order[k]->second, level + 1);
        }
        if (options.indent) newline(level);
        out += '}';
        return;
      }
      case Value::Type::undefined: fail("Object of type Undefined is not JSON serializable");
      default: fail("Object of type {} is not JSON serializable", v.type_name());
    }
  }
};

bool equals_at(const Value& a, const Value& b, int depth, CompareBudget& budget) {
  check_depth(depth);
  budget.step();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::undefined:
    case Value::Type::none: return true;
    case Value::Type::string: return a.as_string() == b.as_string();
    case Value::Type::list: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equals_at(x[k], y[k], depth + 1, budget)) return false;
      return true;
    }
    case Value::Type::dict: {
      const auto& x = a.dict_data();
      const auto& y = b.dict_data();
      if (x.size() != y.size()) return false;
      for (const auto& [key, item] : x.entries()) {
        const Value* other = y.find(key);
        if (!other || !equals_at(item, *other, depth + 1, budget)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int compare_at(const Value& a, const Value& b, int depth, CompareBudget& budget) {
  check_depth(depth);
  budget.step();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (y < x ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (y < x ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals_at(x[k], y[k], depth + 1, budget)) continue;
      return compare_at(x[k], y[k], depth + 1, budget);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

Value deep_copy_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.type()) {
    case Value::Type::list: {
      std::vector<Value> items;
      items.reserve(v.items().size());
      for (const auto& item : v.items()) items.push_back(deep_copy_at(item, depth + 1));
      return v.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Value::Type::dict:
    case Value::Type::ns: {
      DictData data;
      for (const auto& [key, item] : v.dict_data().entries()) data.set(key, deep_copy_at(item, depth + 1));
      return v.is_ns() ? Value::ns(std::move(data)) : Value::dict(std::move(data));
    }
    default: return v;
  }
}

}  // namespace

Value deep_copy(const Value& v) { return deep_copy_at(v, 0); }

std::string html_escape_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value html_escape(const Value& v) {
  if (v.is_markup()) return v;
  return Value::markup(html_escape_text(to_str(v)));
}

std::string to_str(const Value& v) {
  std::string out;
  append_str(out, v, 0);
  check_text(out);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v, 0);
  check_text(out);
  return out;
}

std::string to_json_text(const Value& v, const JsonOptions& options) {
  JsonWriter w{options, {}, {}, {}};
  w.item_sep = options.item_separator ? *options.item_separator : (options.indent ? "," : ", ");
  w.key_sep = options.key_separator ? *options.key_separator : ": ";
  w.write(v, 0);
  check_text(w.out);
  return std::move(w.out);
}

bool equals(const Value& a, const Value& b) {
  CompareBudget budget;
  return equals_at(a, b, 0, budget);
}

int compare(const Value& a, const Value& b) {
  CompareBudget budget;
  return compare_at(a, b, 0, budget);
}

ScopedValueOpsLimits::ScopedValueOpsLimits(ValueOpsLimits limits) : saved_(g_limits), saved_steps_(g_compare_steps) {
  g_limits = limits;
  g_compare_steps = 0;
}
ScopedValueOpsLimits::~ScopedValueOpsLimits() {
  g_limits = saved_;
  g_compare_steps = saved_steps_;
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::string:
      if (!item.is_string())
        fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::list:
      for (const auto& x : container.items())
        if (equals(x, item)) return true;
      return false;
    case Value::Type::dict:
      return item.is_string() && container.dict_data().find(item.as_string()) != nullptr;
    case Value::Type::undefined: return false;  // Jinja2's Undefined iterates as empty
    default: fail("argument of type '{}' is not iterable", container.type_name());
  }
}

}  // namespace fl::jinja
