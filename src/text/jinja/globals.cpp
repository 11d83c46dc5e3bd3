// Global functions (range, namespace, dict, raise_exception, strftime_now, joiner) and the
// helpers the builtin files share: Python's %-formatting and strftime.
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/pytext.h"
#include "text/jinja/value_ops.h"

namespace fl::jinja {
namespace {

using GlobalFn = Value (*)(Interpreter& in, CallArgs& args);

class BuiltinFunction : public Callable {
 public:
  BuiltinFunction(std::string name, GlobalFn fn) : Callable(std::move(name)), fn_(fn) {}
  Value call(Interpreter& in, CallArgs& args) override { return fn_(in, args); }

 private:
  GlobalFn fn_;
};

// Jinja2's sandbox refuses ranges longer than this (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

Value range_fn(Interpreter& in, CallArgs& args) {
  args.expect_done("range", 3);
  if (args.positional.empty()) fail("range expected at least 1 argument, got 0");
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = int_arg(args.positional[0], "range() argument");
  } else {
    start = int_arg(args.positional[0], "range() argument");
    stop = int_arg(args.positional[1], "range() argument");
    if (args.positional.size() == 3) step = int_arg(args.positional[2], "range() argument");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  // Count in floating point to avoid overflow on extreme bounds.
  const double span = (static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step);
  const double count = span > 0 ? std::ceil(span) : 0.0;
  if (count > static_cast<double>(kMaxRange))
    fail("range too big: the sandbox blocks ranges larger than {} items", kMaxRange);
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) items.emplace_back(start + k * step);
  return Value::list(std::move(items));
}

DictData dict_from_args(Interpreter& in, CallArgs& args, const char* fn) {
  if (args.positional.size() > 1) fail("{}() expected at most 1 positional argument, got {}", fn, args.positional.size());
  DictData data;
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict() || src.is_ns()) {
      for (const auto& [key, value] : src.dict_data().entries()) data.set(key, value);
    } else {
      for (const auto& pair : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(pair);
        if (kv.size() != 2) fail("{}() sequence elements must be pairs", fn);
        if (!kv[0].is_string()) fail("{}() keys must be strings", fn);
        data.set(kv[0].as_string(), kv[1]);
      }
    }
  }
  for (auto& [key, value] : args.keyword) data.set(key, value);
  return data;
}

Value namespace_fn(Interpreter& in, CallArgs& args) { return Value::ns(dict_from_args(in, args, "namespace")); }
Value dict_fn(Interpreter& in, CallArgs& args) { return Value::dict(dict_from_args(in, args, "dict")); }

Value raise_exception_fn(Interpreter&, CallArgs& args) {
  std::string message = args.positional.empty() ? std::string() : to_str(args.positional[0]);
  throw RaisedByTemplate(message);
}

Value strftime_now_fn(Interpreter& in, CallArgs& args) {
  Value format = args.take_or(0, "format", Value::undefined("strftime_now() needs a format"));
  args.expect_done("strftime_now", 1);
  return Value(strftime_python(in.now(), str_arg(format, "strftime_now() format")));
}

class Joiner : public Callable {
 public:
  explicit Joiner(std::string sep) : Callable("joiner"), sep_(std::move(sep)) {}
  Value call(Interpreter&, CallArgs&) override {
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(sep_);
  }

 private:
  std::string sep_;
  bool used_ = false;
};

Value joiner_fn(Interpreter&, CallArgs& args) {
  Value sep = args.take_or(0, "sep", Value(", "));
  args.expect_done("joiner", 1);
  return Value::callable(std::make_shared<Joiner>(to_str(sep)));
}

const char* const kDays[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
const char* const kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                               "July",    "August",   "September", "October", "November", "December"};

}  // namespace

void install_globals(Frame& globals) {
  auto add = [&](const char* name, GlobalFn fn) {
    globals.set(name, Value::callable(std::make_shared<BuiltinFunction>(name, fn)));
  };
  add("range", range_fn);
  add("namespace", namespace_fn);
  add("dict", dict_fn);
  add("raise_exception", raise_exception_fn);
  add("strftime_now", strftime_now_fn);
  add("joiner", joiner_fn);
}

std::string str_arg(const Value& v, std::string_view what) {
  if (!v.is_string()) fail("{} must be a string, not {}", what, v.type_name());
  return v.as_string();
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{} must be an integer, not {}", what, v.type_name());
  return v.as_int();
}

size_t value_length(const Value& v) {
  switch (v.type()) {
    case Value::Type::undefined: return 0;
    case Value::Type::string: return py::code_point_count(v.as_string());
    case Value::Type::list: return v.items().size();
    case Value::Type::dict: return v.dict_data().size();
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

// Python's printf-style `format % args` for the conversions templates use.
std::string python_percent_format(Interpreter& in, const std::string& format, const Value& args, bool escape_args) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.items();
  } else if (args.is_dict()) {
    mapping = &args;
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] != '%') {
      out += format[k];
      continue;
    }
    if (++k >= format.size()) fail("incomplete format");
    const Value* arg = nullptr;
    if (format[k] == '(') {
      size_t close = format.find(')', k);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      const Value* v = mapping->dict_data().find(std::string_view(format).substr(k + 1, close - k - 1));
      if (!v) fail("format key '{}' not found", format.substr(k + 1, close - k - 1));
      arg = v;
      used_mapping = true;
      k = close + 1;
    }
    std::string flags;
    while (k < format.size() && std::string_view("-+ #0").find(format[k]) != std::string_view::npos) flags += format[k++];
    std::string width, precision;
    while (k < format.size() && std::isdigit(static_cast<unsigned char>(format[k]))) width += format[k++];
    if (k < format.size() && format[k] == '.') {
      ++k;
      while (k < format.size() && std::isdigit(static_cast<unsigned char>(format[k]))) precision += format[k++];
      if (precision.empty()) precision = "0";
    }
    if (k >= format.size()) fail("incomplete format");
    if (width.size() > 4 || precision.size() > 4) fail("format width or precision too large");
    const char conv = format[k];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (next >= positional.size()) fail("not enough arguments for format string");
      arg = &positional[next++];
    }
    std::string piece;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        piece = conv == 's' ? to_str(*arg) : repr(*arg);
        if (escape_args && !arg->is_markup()) piece = html_escape_text(piece);
        if (!precision.empty()) {
          auto offsets = py::code_point_offsets(piece);
          size_t keep = std::min<size_t>(std::stoul(precision), offsets.size() - 1);
          piece.resize(offsets[keep]);
        }
        size_t w = width.empty() ? 0 : std::stoul(width);
        size_t len = py::code_point_count(piece);
        if (len < w) {
          std::string pad(w - len, ' ');
          piece = flags.find('-') != std::string::npos ? piece + pad : pad + piece;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg->is_number()) fail("%{} format: a number is required, not {}", conv, arg->type_name());
        if (conv == 'c') {
          py::append_utf8(piece, static_cast<char32_t>(arg->as_int()));
          break;
        }
        long long v = arg->is_float() ? static_cast<long long>(std::trunc(arg->as_double())) : arg->as_int();
        std::string spec = "%" + flags + width + (precision.empty() ? "" : "." + precision) + "ll" +
                           (conv == 'i' || conv == 'u' ? 'd' : conv);
        char buf[16384];
        std::snprintf(buf, sizeof buf, spec.c_str(), v);
        piece = buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_number()) fail("%{} format: a real number is required, not {}", conv, arg->type_name());
        std::string spec = "%" + flags + width + (precision.empty() ? "" : "." + precision) + conv;
        char buf[16384];
        std::snprintf(buf, sizeof buf, spec.c_str(), arg->as_double());
        piece = buf;
        break;
      }
      default: fail("unsupported format character '{}'", conv);
    }
    out += piece;
    in.check_size(out.size());
  }
  if (!mapping && next < positional.size()) fail("not all arguments converted during string formatting");
  (void)used_mapping;
  return out;
}

std::string strftime_python(const std::tm& tm, const std::string& format) {
  std::string out;
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] != '%' || k + 1 >= format.size()) {
      out += format[k];
      continue;
    }
    const char c = format[++k];
    const int wday = ((tm.tm_wday % 7) + 7) % 7;
    const int mon = ((tm.tm_mon % 12) + 12) % 12;
    switch (c) {
      case 'a': out += std::string(kDays[wday]).substr(0, 3); break;
      case 'A': out += kDays[wday]; break;
      case 'b':
      case 'h': out += std::string(kMonths[mon]).substr(0, 3); break;
      case 'B': out += kMonths[mon]; break;
      case 'd': out += fmt::format("{:02}", tm.tm_mday); break;
      case 'e': out += fmt::format("{:2}", tm.tm_mday); break;
      case 'H': out += fmt::format("{:02}", tm.tm_hour); break;
      case 'I': out += fmt::format("{:02}", tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12); break;
      case 'j': out += fmt::format("{:03}", tm.tm_yday + 1); break;
      case 'm': out += fmt::format("{:02}", tm.tm_mon + 1); break;
      case 'M': out += fmt::format("{:02}", tm.tm_min); break;
      case 'p': out += tm.tm_hour < 12 ? "AM" : "PM"; break;
      case 'S': out += fmt::format("{:02}", tm.tm_sec); break;
      case 'f': out += "000000"; break;
      case 'w': out += std::to_string(wday); break;
      case 'y': out += fmt::format("{:02}", (tm.tm_year + 1900) % 100); break;
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case '%': out += '%'; break;
      default: {
        char buf[128];
        char spec[3] = {'%', c, '\0'};
        size_t n = std::strftime(buf, sizeof buf, spec, &tm);
        out.append(buf, n);
      }
    }
  }
  return out;
}

}  // namespace fl::jinja
