#pragma once
// Tokens -> AST, following Jinja2's grammar and operator precedence:
//   a if b else c  <  or  <  and  <  not  <  comparisons, in, not in  <  + -  <  ~  <  * / // %
//   <  **  <  unary - +  <  postfix (.attr [index] (call))  then | filters and `is` tests.
// Statements: if/elif/else, for (else, inline if, recursive), set (incl. block set and
// namespace attributes), macro, call, filter, with, do, raw (in the lexer), break/continue,
// generation. Nesting is limited so that hostile input cannot exhaust the stack.
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace fl::jinja {

constexpr int kMaxParseNesting = 128;

// Throws TemplateError naming the line and column of the first syntax error.
Program parse(std::vector<Token> tokens, const std::string& template_name);

}  // namespace fl::jinja
