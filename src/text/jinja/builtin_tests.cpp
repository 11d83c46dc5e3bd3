// Jinja2's builtin tests (`x is defined`, `x is string`, `n is divisibleby 3`, ...), with Python's
// notion of the types: bool counts as a number but not as an integer; a dict is a sequence and
// an iterable; Jinja2's Undefined is iterable and a sequence (it iterates as empty).
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/pytext.h"
#include "text/jinja/value_ops.h"

namespace fl::jinja {
namespace {

Value one_arg(CallArgs& args, const char* test) {
  if (args.positional.size() != 1 || !args.keyword.empty()) fail("test '{}' takes exactly one argument", test);
  return args.positional[0];
}

void no_args(CallArgs& args, const char* test) {
  if (!args.positional.empty() || !args.keyword.empty()) fail("test '{}' takes no arguments", test);
}

#define SIMPLE_TEST(fname, tname, expr)                        \
  bool fname(Interpreter&, const Value& v, CallArgs& args) {   \
    no_args(args, tname);                                      \
    return expr;                                               \
  }

SIMPLE_TEST(test_defined, "defined", !v.is_undefined())
SIMPLE_TEST(test_undefined, "undefined", v.is_undefined())
SIMPLE_TEST(test_none, "none", v.is_none())
SIMPLE_TEST(test_boolean, "boolean", v.is_bool())
SIMPLE_TEST(test_true, "true", v.is_bool() && v.as_bool())
SIMPLE_TEST(test_false, "false", v.is_bool() && !v.as_bool())
SIMPLE_TEST(test_integer, "integer", v.is_int())
SIMPLE_TEST(test_float, "float", v.is_float())
SIMPLE_TEST(test_number, "number", v.is_number())
SIMPLE_TEST(test_string, "string", v.is_string())
SIMPLE_TEST(test_mapping, "mapping", v.is_dict())
SIMPLE_TEST(test_sequence, "sequence", v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(test_iterable, "iterable", v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(test_callable, "callable", v.is_callable() || (v.is_loop() && v.loop_data().recurse))
SIMPLE_TEST(test_escaped, "escaped", false)
SIMPLE_TEST(test_lower, "lower", v.is_string() && py::is_lower(v.as_string()))
SIMPLE_TEST(test_upper, "upper", v.is_string() && py::is_upper(v.as_string()))

int64_t mod_of(const Value& v, const Value& n, const char* test) {
  if (!v.is_number() || !n.is_number()) fail("test '{}' needs numbers, not {} and {}", test, v.type_name(), n.type_name());
  if (v.is_float() || n.is_float()) {
    double d = n.as_double();
    if (d == 0.0) fail("float modulo by zero");
    double r = std::fmod(v.as_double(), d);
    if (r != 0.0 && ((r < 0) != (d < 0))) r += d;
    return r == 0.0 ? 0 : 1;
  }
  int64_t d = n.as_int();
  if (d == 0) fail("integer modulo by zero");
  if (d == -1) return 0;
  int64_t r = v.as_int() % d;
  if (r != 0 && ((r < 0) != (d < 0))) r += d;
  return r;
}

bool test_odd(Interpreter&, const Value& v, CallArgs& args) {
  no_args(args, "odd");
  return mod_of(v, Value(int64_t{2}), "odd") == 1;
}
bool test_even(Interpreter&, const Value& v, CallArgs& args) {
  no_args(args, "even");
  return mod_of(v, Value(int64_t{2}), "even") == 0;
}
bool test_divisibleby(Interpreter&, const Value& v, CallArgs& args) {
  return mod_of(v, one_arg(args, "divisibleby"), "divisibleby") == 0;
}

bool test_eq(Interpreter&, const Value& v, CallArgs& args) { return equals(v, one_arg(args, "eq")); }
bool test_ne(Interpreter&, const Value& v, CallArgs& args) { return !equals(v, one_arg(args, "ne")); }
bool test_lt(Interpreter&, const Value& v, CallArgs& args) { return compare(v, one_arg(args, "lt")) < 0; }
bool test_le(Interpreter&, const Value& v, CallArgs& args) { return compare(v, one_arg(args, "le")) <= 0; }
bool test_gt(Interpreter&, const Value& v, CallArgs& args) { return compare(v, one_arg(args, "gt")) > 0; }
bool test_ge(Interpreter&, const Value& v, CallArgs& args) { return compare(v, one_arg(args, "ge")) >= 0; }
bool test_in(Interpreter&, const Value& v, CallArgs& args) { return contains(one_arg(args, "in"), v); }

bool test_sameas(Interpreter&, const Value& v, CallArgs& args) {
  Value other = one_arg(args, "sameas");
  if (v.type() != other.type()) return false;
  switch (v.type()) {
    case Value::Type::undefined:
    case Value::Type::none: return true;
    case Value::Type::boolean:
    case Value::Type::integer:
    case Value::Type::floating:
    case Value::Type::string: return equals(v, other);
    default: return v.identity() == other.identity();
  }
}

bool test_filter(Interpreter&, const Value& v, CallArgs& args) {
  no_args(args, "filter");
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool test_test(Interpreter&, const Value& v, CallArgs& args) {
  no_args(args, "test");
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", test_defined},   {"undefined", test_undefined}, {"none", test_none},
      {"boolean", test_boolean},   {"true", test_true},           {"false", test_false},
      {"integer", test_integer},   {"float", test_float},         {"number", test_number},
      {"string", test_string},     {"mapping", test_mapping},     {"sequence", test_sequence},
      {"iterable", test_iterable}, {"callable", test_callable},   {"escaped", test_escaped},
      {"lower", test_lower},       {"upper", test_upper},         {"odd", test_odd},
      {"even", test_even},         {"divisibleby", test_divisibleby},
      {"eq", test_eq},             {"equalto", test_eq},          {"==", test_eq},
      {"ne", test_ne},             {"!=", test_ne},               {"lt", test_lt},
      {"lessthan", test_lt},       {"<", test_lt},                {"le", test_le},
      {"<=", test_le},             {"gt", test_gt},               {"greaterthan", test_gt},
      {">", test_gt},              {"ge", test_ge},               {">=", test_ge},
      {"in", test_in},             {"sameas", test_sameas},       {"filter", test_filter},
      {"test", test_test},
  };
  return table;
}

}  // namespace

TestFn find_test(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

}  // namespace fl::jinja
