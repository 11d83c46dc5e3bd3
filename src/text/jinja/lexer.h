#pragma once
// Splits template source into tokens the way Jinja2's lexer does, whitespace control included:
// `{%-`/`-%}` strip all whitespace on that side, trim_blocks drops the first newline after a block
// or comment tag, lstrip_blocks drops spaces and tabs before a block or comment tag that starts a
// line, `+` turns either off for one tag, and newlines are normalised to "\n" with one trailing
// newline dropped (keep_trailing_newline=False). Comments vanish here; {% raw %} bodies become
// text. Every token carries its line and column for error messages.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fl::jinja {

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

enum class TokenType : uint8_t {
  text,            // literal template text
  variable_begin,  // {{
  variable_end,    // }}
  block_begin,     // {%
  block_end,       // %}
  name,
  string,   // value holds the decoded string
  integer,  // value holds the digits (underscores removed)
  floating,
  op,  // value holds the operator: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } ;
  eof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int column = 1;
};

// Throws TemplateError naming the line and column of the first lexical error.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options, const std::string& template_name);

}  // namespace fl::jinja
