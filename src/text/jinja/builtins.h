#pragma once
// The builtin filters, tests, methods (str.startswith, dict.get, list.append, ...) and globals
// (range, namespace, dict, raise_exception, strftime_now) a template can use. Each is a plain
// function looked up by name; they follow Jinja2 3.1 and Python 3 semantics. Internal to fl_jinja.
#include <string_view>

#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace fl::jinja {

using FilterFn = Value (*)(Interpreter& in, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter& in, const Value& input, CallArgs& args);
using MethodFn = Value (*)(Interpreter& in, const Value& self, CallArgs& args);

FilterFn find_filter(std::string_view name);  // nullptr when unknown
TestFn find_test(std::string_view name);
MethodFn find_method(const Value& self, std::string_view name);

// Declares range, namespace, dict, raise_exception, strftime_now, joiner, cycler in `globals`.
void install_globals(Frame& globals);

// Thrown by raise_exception(): the template's own message, reported as such.
class RaisedByTemplate : public fl::Error {
 public:
  using fl::Error::Error;
};

// Shared helpers for the builtin files.
std::string str_arg(const Value& v, std::string_view what);  // must be a string
int64_t int_arg(const Value& v, std::string_view what);      // must be an integer (or bool)
// Python's `format % args`; with escape_args (a Markup format) string conversions are escaped.
std::string python_percent_format(Interpreter& in, const std::string& format, const Value& args,
                                  bool escape_args = false);
std::string strftime_python(const std::tm& tm, const std::string& format);
size_t value_length(const Value& v);  // len(v)

}  // namespace fl::jinja
