#include "text/jinja/template.h"

#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"

namespace fl::jinja {

Template::Template(std::string_view source, TemplateOptions options) : options_(std::move(options)) {
  LexOptions lex;
  lex.trim_blocks = options_.trim_blocks;
  lex.lstrip_blocks = options_.lstrip_blocks;
  lex.keep_trailing_newline = options_.keep_trailing_newline;
  program_ = std::make_unique<Program>(parse(tokenize(source, lex, options_.name), options_.name));
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& variables, const RenderOptions& options) const {
  Interpreter interpreter(options, options_);
  try {
    return interpreter.render(*program_, variables);
  } catch (const TemplateError&) {
    throw;
  } catch (const RaisedByTemplate& e) {
    throw TemplateError(options_.name, interpreter.line_, interpreter.column_, e.what(), true);
  } catch (const fl::Error& e) {
    throw TemplateError(options_.name, interpreter.line_, interpreter.column_, e.what(), false);
  } catch (const std::bad_alloc&) {
    throw TemplateError(options_.name, interpreter.line_, interpreter.column_, "out of memory while rendering", false);
  }
}

std::string Template::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  return render(Value::from_json(variables), options);
}

}  // namespace fl::jinja
