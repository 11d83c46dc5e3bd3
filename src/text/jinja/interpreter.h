#pragma once
// The tree-walking evaluator behind Template::render, and the interface the builtin filters,
// tests, methods and globals (builtins.h) use to call back into it. Internal to fl_jinja.
//
// Scoping follows Jinja2: the template body is one frame; every for-loop iteration, macro call
// and with block gets a fresh child frame (so `set` inside a loop is forgotten at the next
// iteration, which is why templates use namespace()); `if` shares its parent's frame; macros
// close over the frame they were defined in and see later assignments to it.
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace fl::jinja {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Argument `index` if given positionally, else keyword `name` (removed from `keyword`).
  std::optional<Value> take(size_t index, std::string_view name);
  Value take_or(size_t index, std::string_view name, Value fallback);
  // Fails if keyword arguments are left over or more than `max_positional` were passed.
  void expect_done(std::string_view function, size_t max_positional) const;
};

class Frame {
 public:
  explicit Frame(std::shared_ptr<Frame> parent) : parent_(std::move(parent)) {}
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
  void clear() { vars_.clear(); }
  // A new frame, recorded in the current RenderArena.
  static std::shared_ptr<Frame> make(std::shared_ptr<Frame> parent);

 private:
  std::shared_ptr<Frame> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};

class Interpreter {
 public:
  Interpreter(const RenderOptions& options, const TemplateOptions& template_options);

  std::string render(const Program& program, const Value& variables);

  // ---- for builtins ----
  const Limits& limits() const { return options_.limits; }
  void check_size(size_t bytes) const;  // a string or list of this size may be built
  void count_iteration();               // one loop iteration or call
  Value call(const Value& fn, CallArgs& args);
  Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
  bool apply_test(std::string_view name, const Value& input, CallArgs& args);
  Value get_attr(const Value& object, std::string_view name);
  Value get_item(const Value& object, const Value& key);
  std::vector<Value> iterate(const Value& v);  // Python iter(): list items, dict keys, characters
  std::tm now() const;
  [[noreturn]] void fail_undefined(const Value& v) const;

  // Used by the macro and loop callables.
  struct MacroCall;
  Value call_macro(const Stmt& macro, const std::shared_ptr<Frame>& closure, CallArgs& args,
                   const std::string& display_name);
  Value render_loop_recursive(const Stmt& loop, const std::shared_ptr<Frame>& outer, const Value& iterable,
                              int64_t depth);

 private:
  enum class Flow { normal, break_, continue_ };

  Flow render_body(const StmtList& body, std::string& out);
  Flow render_stmt(const Stmt& s, std::string& out);
  Flow render_for(const Stmt& s, std::string& out, const Value& iterable, int64_t depth,
                  const std::shared_ptr<Frame>& outer);
  void assign(const Expr& target, const Value& value);
  void bind_target(Frame& frame, const Expr& target, const Value& value);
  void append_output(std::string& out, std::string_view text) const;

  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_slice(const Value& object, const Expr& slice);
  CallArgs eval_args(const Arguments& args);

  struct Position;  // RAII: records the node being evaluated, for error locations
  struct Depth;     // RAII: nesting limit

  RenderOptions options_;
  TemplateOptions template_options_;
  std::shared_ptr<Frame> globals_;
  std::shared_ptr<Frame> frame_;
  int depth_ = 0;
  int64_t iterations_ = 0;
  const Value* block_input_ = nullptr;  // the rendered body a {% filter %} / {% set x | f %} applies to

 public:
  int line_ = 0, column_ = 0;  // innermost node being evaluated (read by Template for errors)
};

}  // namespace fl::jinja
