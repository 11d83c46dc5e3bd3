#pragma once
// fl::jinja::Template: a sandboxed Jinja interpreter for Hugging Face chat templates.
//
// It renders the way transformers does (Jinja2 3.1 ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, keep_trailing_newline off, tojson = json.dumps with
// ensure_ascii=False, raise_exception and strftime_now as globals) so that the prompt it builds is
// byte-identical to the one the model was trained on. Values follow Python: see value.h. Where
// @huggingface/jinja (our test oracle) and Jinja2 disagree, Jinja2 wins, except that an attribute
// of an undefined value is again undefined (as in @huggingface/jinja) rather than an error.
//
// Sandboxed: a template cannot reach files, the environment or the host; it can only compute on
// the values it is given. Every render runs under Limits, so a hostile or broken template ends in
// a TemplateError, never a hang, a crash or unbounded memory.
//
//   fl::jinja::Template t(source, {.name = "gemma4"});
//   std::string prompt = t.render(nlohmann::ordered_json{{"messages", msgs}, {"add_generation_prompt", true}});
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/jinja/template_error.h"
#include "text/jinja/value.h"

namespace fl::jinja {

struct Program;

struct TemplateOptions {
  std::string name = "template";  // used in error messages ("NAME:LINE:COL: ...")
  bool trim_blocks = true;        // Hugging Face's settings
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

struct Limits {
  // Nesting of statements, expressions and macro calls being evaluated at once (protects the
  // C++ stack; real chat templates stay under ~60).
  int max_depth = 500;
  // Loop iterations plus macro calls in one render.
  int64_t max_iterations = 1'000'000;
  // Size of the rendered text, and of any single string or list a template builds.
  size_t max_output_bytes = size_t{32} << 20;
};

struct RenderOptions {
  Limits limits;
  // What strftime_now() formats; the current local time when unset. Tests fix it.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses the template; throws TemplateError (with line and column) on a syntax error.
  explicit Template(std::string_view source, TemplateOptions options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the given variables (a dict). Throws TemplateError on any failure, including
  // raise_exception() in the template and exceeded limits.
  std::string render(const Value& variables, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

  const std::string& name() const { return options_.name; }

 private:
  TemplateOptions options_;
  std::unique_ptr<Program> program_;
};

}  // namespace fl::jinja
