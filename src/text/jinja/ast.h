#pragma once
// The parsed form of a template: expressions and statements as plain tagged structs. The parser
// builds it once per template; the interpreter walks it for every render and never changes it.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace fl::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

// Arguments of a call, filter or test: f(a, b, k=v, *rest, **more).
struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star;       // *rest
  ExprPtr star_star;  // **more
};

struct Expr {
  enum class Kind : uint8_t {
    literal,  // value
    name,     // name
    list,     // items
    tuple,    // items
    dict,     // items = key0, value0, key1, value1, ...
    getattr,  // object.name
    getitem,  // object[index]
    slice,    // object[start:stop:step]; items = start, stop, step (any may be null)
    call,     // object(arguments)
    filter,   // object | name(arguments); object is null inside {% filter %} and {% set x | f %}
    test,     // object is [not] name(arguments)
    negate,   // -object
    plus,     // +object
    not_,     // not object
    binary,   // object OP index, op in {+ - * / // % ** ~}
    compare,  // object op0 items[0] op1 items[1] ... (chained comparisons, in, not in)
    and_,     // object and index
    or_,      // object or index
    cond,     // object if index else third (third may be null)
  };
  Kind kind;
  int line = 0, column = 0;
  Value value;
  std::string name;
  ExprPtr object, index, third;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  Arguments args;
  bool negated = false;  // `is not`
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when the parameter has no default
};

struct Stmt {
  enum class Kind : uint8_t {
    text,          // text
    output,        // {{ expr }}
    if_,           // branches (cond, body) + else_body
    for_,          // for target in expr [if cond] [recursive]: body {% else %} else_body
    set,           // set target = expr
    set_block,     // set name [| filters]: body  (filter in expr, its innermost object null)
    macro,         // macro name(params): body
    call_block,    // call(params) expr: body
    filter_block,  // filter expr: body
    with,          // with assignments: body
    do_,           // do expr
    scope,         // {% generation %} body (rendered as is)
    break_,
    continue_,
  };
  Kind kind;
  int line = 0, column = 0;
  std::string text;  // text; macro name; set_block target
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  bool recursive = false;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  StmtList body, else_body;
  std::vector<MacroParam> params;
  std::vector<std::pair<ExprPtr, ExprPtr>> assignments;  // with
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // macro / call block
};

struct Program {
  StmtList body;
};

}  // namespace fl::jinja
