#include "text/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>

#include <fmt/format.h>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/pytext.h"
#include "text/jinja/value_ops.h"

namespace fl::jinja {

// ---- CallArgs ----

std::optional<Value> CallArgs::take(size_t index, std::string_view name) {
  if (index < positional.size()) return positional[index];
  for (auto it = keyword.begin(); it != keyword.end(); ++it) {
    if (it->first == name) {
      Value v = std::move(it->second);
      keyword.erase(it);
      return v;
    }
  }
  return std::nullopt;
}

Value CallArgs::take_or(size_t index, std::string_view name, Value fallback) {
  auto v = take(index, name);
  return v ? std::move(*v) : std::move(fallback);
}

void CallArgs::expect_done(std::string_view function, size_t max_positional) const {
  if (positional.size() > max_positional)
    fail("{}() takes at most {} argument(s) ({} given)", function, max_positional, positional.size());
  if (!keyword.empty()) fail("{}() got an unexpected keyword argument '{}'", function, keyword.front().first);
}

// ---- Frame ----

const Value* Frame::find(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent_.get())
    for (const auto& [key, value] : f->vars_)
      if (key == name) return &value;
  return nullptr;
}

void Frame::set(std::string_view name, Value value) {
  for (auto& [key, existing] : vars_) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

std::shared_ptr<Frame> Frame::make(std::shared_ptr<Frame> parent) {
  auto f = std::make_shared<Frame>(std::move(parent));
  RenderArena::track_other(f, [](void* p) { static_cast<Frame*>(p)->clear(); });
  return f;
}

// ---- callables the interpreter creates ----

namespace {

class MacroCallable : public Callable {
 public:
  MacroCallable(const Stmt& stmt, std::shared_ptr<Frame> closure, std::string name)
      : Callable(std::move(name)), stmt_(stmt), closure_(std::move(closure)) {}
  Value call(Interpreter& in, CallArgs& args) override { return in.call_macro(stmt_, closure_, args, name()); }

 private:
  const Stmt& stmt_;
  std::shared_ptr<Frame> closure_;
};

class LoopRecurse : public Callable {
 public:
  LoopRecurse(const Stmt& stmt, std::shared_ptr<Frame> outer, int64_t depth)
      : Callable("loop"), stmt_(stmt), outer_(std::move(outer)), depth_(depth) {}
  Value call(Interpreter& in, CallArgs& args) override {
    if (args.positional.size() != 1 || !args.keyword.empty()) fail("loop() takes exactly one argument");
    return in.render_loop_recursive(stmt_, outer_, args.positional[0], depth_ + 1);
  }

 private:
  const Stmt& stmt_;
  std::shared_ptr<Frame> outer_;
  int64_t depth_;
};

// Methods of markupsafe.Markup (3.0): replace escapes `new`, ljust/rjust/center escape the fill
// character, join escapes the items, format escapes its arguments; these and the case/strip
// methods return Markup, split and friends return Markup pieces; the rest behave as on str.
Value call_markup_method(Interpreter& in, const std::string& name, const Value& self, MethodFn fn, CallArgs& args) {
  static const char* const kMarkupResult[] = {"capitalize", "title", "lower", "upper", "replace", "ljust", "rjust",
                                              "lstrip", "rstrip", "center", "strip", "swapcase", "removeprefix",
                                              "removesuffix", "partition", "rpartition", "format", "join",
                                              "split", "rsplit", "splitlines"};
  auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (name == n) return true;
    return false;
  };
  auto escape_at = [&](size_t index) {
    if (index < args.positional.size() && args.positional[index].is_string() && !args.positional[index].is_markup())
      args.positional[index] = Value(html_escape_text(args.positional[index].as_string()));
  };
  if (is({"replace", "ljust", "rjust", "center"})) escape_at(1);
  if (is({"format"}))
    for (size_t k = 0; k < args.positional.size(); ++k) escape_at(k);
  if (is({"format"}))
    for (auto& [key, v] : args.keyword)
      if (v.is_string() && !v.is_markup()) v = Value(html_escape_text(v.as_string()));
  if (is({"join"}) && !args.positional.empty()) {
    std::vector<Value> items = in.iterate(args.positional[0]);
    for (auto& item : items)
      if (item.is_string() && !item.is_markup()) item = Value(html_escape_text(item.as_string()));
    args.positional[0] = Value::list(std::move(items));
  }
  Value result = fn(in, Value(self.as_string()), args);
  if (std::find(std::begin(kMarkupResult), std::end(kMarkupResult), name) == std::end(kMarkupResult)) return result;
  auto mark = [](const Value& v) { return v.is_string() ? Value::markup(v.as_string()) : v; };
  if (result.is_string()) return mark(result);
  if (result.is_list()) {
    std::vector<Value> items;
    for (const auto& item : result.items()) items.push_back(mark(item));
    return result.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  return result;
}

class BoundMethod : public Callable {
 public:
  BoundMethod(std::string name, Value self, MethodFn fn) : Callable(std::move(name)), self_(std::move(self)), fn_(fn) {}
  Value call(Interpreter& in, CallArgs& args) override {
    if (self_.is_markup()) return call_markup_method(in, name(), self_, fn_, args);
    return fn_(in, self_, args);
  }

 private:
  Value self_;
  MethodFn fn_;
};

class LoopCycle : public Callable {
 public:
  explicit LoopCycle(int64_t index0) : Callable("loop.cycle"), index0_(index0) {}
  Value call(Interpreter&, CallArgs& args) override {
    if (args.positional.empty()) fail("loop.cycle() needs at least one argument");
    return args.positional[static_cast<size_t>(index0_) % args.positional.size()];
  }

 private:
  int64_t index0_;
};

bool checked_add(int64_t a, int64_t b, int64_t& r) { return !__builtin_add_overflow(a, b, &r); }
bool checked_sub(int64_t a, int64_t b, int64_t& r) { return !__builtin_sub_overflow(a, b, &r); }
bool checked_mul(int64_t a, int64_t b, int64_t& r) { return !__builtin_mul_overflow(a, b, &r); }

[[noreturn]] void overflow() { fail("integer result does not fit in 64 bits"); }

Value int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1)
      if (!checked_mul(result, base, result)) overflow();
    exp >>= 1;
    if (exp > 0 && !checked_mul(base, base, base)) overflow();
  }
  return Value(result);
}

// Python's float // and % (Objects/floatobject.c float_divmod).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  if (wx == 0.0) fail("float division by zero");
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

// Python slice index normalisation (PySlice_AdjustIndices).
int64_t slice_index(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  fail("slice {} must be an integer or none, not '{}'", what, v.type_name());
}

}  // namespace

// ---- RAII helpers ----

struct Interpreter::Position {
  Interpreter& in;
  int line, column, uncaught;
  Position(Interpreter& interp, int l, int c)
      : in(interp), line(interp.line_), column(interp.column_), uncaught(std::uncaught_exceptions()) {
    in.line_ = l;
    in.column_ = c;
  }
  ~Position() {
    // On an exception keep the innermost position: that is where the error happened.
    if (std::uncaught_exceptions() == uncaught) {
      in.line_ = line;
      in.column_ = column;
    }
  }
};

struct Interpreter::Depth {
  Interpreter& in;
  explicit Depth(Interpreter& interp) : in(interp) {
    if (++in.depth_ > in.options_.limits.max_depth)
      fail("template nesting exceeds the limit of {} (runaway recursion?)", in.options_.limits.max_depth);
  }
  ~Depth() { --in.depth_; }
};

namespace {
struct FrameSwap {
  std::shared_ptr<Frame>& slot;
  std::shared_ptr<Frame> saved;
  FrameSwap(std::shared_ptr<Frame>& s, std::shared_ptr<Frame> f) : slot(s), saved(std::move(s)) { slot = std::move(f); }
  ~FrameSwap() { slot = std::move(saved); }
};
}  // namespace

// ---- Interpreter ----

Interpreter::Interpreter(const RenderOptions& options, const TemplateOptions& template_options)
    : options_(options), template_options_(template_options) {}

std::string Interpreter::render(const Program& program, const Value& variables) {
  if (!variables.is_dict() && !variables.is_undefined() && !variables.is_none())
    fail("template variables must be a dict, not {}", variables.type_name());
  RenderArena arena;
  // Comparisons may walk a shared structure many times over; a render gets 10 steps per allowed
  // loop iteration (sorting a few thousand items stays far inside that).
  ScopedValueOpsLimits value_limits(
      {options_.limits.max_output_bytes, std::max<int64_t>(options_.limits.max_iterations, 10000) * 10});
  globals_ = Frame::make(nullptr);
  install_globals(*globals_);
  frame_ = Frame::make(globals_);
  // A deep copy, so that a template that mutates a list (x.append) never changes the caller's data.
  if (variables.is_dict())
    for (const auto& [key, value] : variables.dict_data().entries()) frame_->set(key, deep_copy(value));
  std::string out;
  render_body(program.body, out);
  frame_.reset();
  globals_.reset();
  return out;
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes)
    fail("a value of {} bytes exceeds the limit of {} bytes", bytes, options_.limits.max_output_bytes);
}

void Interpreter::append_output(std::string& out, std::string_view text) const {
  if (out.size() + text.size() > options_.limits.max_output_bytes)
    fail("rendered output exceeds the limit of {} bytes", options_.limits.max_output_bytes);
  out.append(text);
}

void Interpreter::count_iteration() {
  if (++iterations_ > options_.limits.max_iterations)
    fail("template exceeds the limit of {} loop iterations and calls", options_.limits.max_iterations);
}

std::tm Interpreter::now() const {
  if (options_.now) return *options_.now;
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

void Interpreter::fail_undefined(const Value& v) const {
  if (v.undefined_hint().empty()) fail("undefined value used");
  fail("{}", v.undefined_hint());
}

// ---- statements ----

Interpreter::Flow Interpreter::render_body(const StmtList& body, std::string& out) {
  for (const auto& s : body) {
    Flow flow = render_stmt(*s, out);
    if (flow != Flow::normal) return flow;
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::render_stmt(const Stmt& s, std::string& out) {
  if (s.kind == Stmt::Kind::text) {
    append_output(out, s.text);
    return Flow::normal;
  }
  Position pos(*this, s.line, s.column);
  Depth depth(*this);
  switch (s.kind) {
    case Stmt::Kind::text: break;
    case Stmt::Kind::output: {
      Value v = eval(*s.expr);
      if (v.is_string()) {
        append_output(out, v.as_string());
      } else {
        append_output(out, to_str(v));
      }
      break;
    }
    case Stmt::Kind::if_: {
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond).truthy()) return render_body(body, out);
      return render_body(s.else_body, out);
    }
    case Stmt::Kind::for_: {
      Value iterable = eval(*s.expr);
      render_for(s, out, iterable, 0, frame_);
      break;
    }
    case Stmt::Kind::set: assign(*s.target, eval(*s.expr)); break;
    case Stmt::Kind::set_block: {
      std::string body;
      render_body(s.body, body);
      Value v(std::move(body));
      if (s.expr) {
        const Value* saved = block_input_;
        block_input_ = &v;
        Value filtered = eval(*s.expr);
        block_input_ = saved;
        v = std::move(filtered);
      }
      frame_->set(s.text, std::move(v));
      break;
    }
    case Stmt::Kind::macro:
      frame_->set(s.text, Value::callable(std::make_shared<MacroCallable>(s, frame_, s.text)));
      break;
    case Stmt::Kind::call_block: {
      CallArgs args = eval_args(s.expr->args);
      args.keyword.emplace_back("caller", Value::callable(std::make_shared<MacroCallable>(s, frame_, "caller")));
      Value fn = eval(*s.expr->object);
      append_output(out, to_str(call(fn, args)));
      break;
    }
    case Stmt::Kind::filter_block: {
      std::string body;
      render_body(s.body, body);
      Value v(std::move(body));
      const Value* saved = block_input_;
      block_input_ = &v;
      Value filtered = eval(*s.expr);
      block_input_ = saved;
      append_output(out, to_str(filtered));
      break;
    }
    case Stmt::Kind::with: {
      auto frame = Frame::make(frame_);
      for (const auto& [target, value] : s.assignments) bind_target(*frame, *target, eval(*value));
      FrameSwap swap(frame_, frame);
      return render_body(s.body, out);
    }
    case Stmt::Kind::do_: eval(*s.expr); break;
    case Stmt::Kind::scope: return render_body(s.body, out);
    case Stmt::Kind::break_: return Flow::break_;
    case Stmt::Kind::continue_: return Flow::continue_;
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::render_for(const Stmt& s, std::string& out, const Value& iterable, int64_t depth,
                                          const std::shared_ptr<Frame>& outer) {
  std::vector<Value> candidates = iterate(iterable);
  auto items = std::make_shared<ListData>();
  RenderArena::track(items);
  if (s.cond) {
    for (auto& item : candidates) {
      count_iteration();
      auto frame = Frame::make(outer);
      bind_target(*frame, *s.target, item);
      FrameSwap swap(frame_, frame);
      if (eval(*s.cond).truthy()) items->items.push_back(std::move(item));
    }
  } else {
    items->items = std::move(candidates);
  }
  std::shared_ptr<Callable> recurse;
  if (s.recursive) recurse = std::make_shared<LoopRecurse>(s, outer, depth);
  const size_t n = items->items.size();
  for (size_t k = 0; k < n; ++k) {
    count_iteration();
    auto frame = Frame::make(outer);
    auto loop = std::make_shared<LoopData>();
    loop->items = items;
    loop->index0 = static_cast<int64_t>(k);
    loop->depth0 = depth;
    loop->recurse = recurse;
    frame->set("loop", Value::loop(std::move(loop)));
    bind_target(*frame, *s.target, items->items[k]);
    FrameSwap swap(frame_, frame);
    Flow flow = render_body(s.body, out);
    if (flow == Flow::break_) break;
  }
  if (n == 0) {
    auto frame = Frame::make(outer);
    FrameSwap swap(frame_, frame);
    render_body(s.else_body, out);
  }
  return Flow::normal;
}

Value Interpreter::render_loop_recursive(const Stmt& loop, const std::shared_ptr<Frame>& outer,
                                         const Value& iterable, int64_t depth) {
  Depth guard(*this);
  std::string out;
  render_for(loop, out, iterable, depth, outer);
  return Value(std::move(out));
}

void Interpreter::bind_target(Frame& frame, const Expr& target, const Value& value) {
  if (target.kind == Expr::Kind::name) {
    frame.set(target.name, value);
    return;
  }
  // Tuple unpacking: the value must yield exactly as many items as there are names.
  std::vector<Value> parts = iterate(value);
  if (parts.size() != target.items.size()) {
    if (parts.size() > target.items.size()) fail("too many values to unpack (expected {})", target.items.size());
    fail("not enough values to unpack (expected {}, got {})", target.items.size(), parts.size());
  }
  for (size_t k = 0; k < parts.size(); ++k) bind_target(frame, *target.items[k], parts[k]);
}

void Interpreter::assign(const Expr& target, const Value& value) {
  if (target.kind == Expr::Kind::getattr) {
    const Value* ns = frame_->find(target.object->name);
    if (!ns || !ns->is_ns()) fail("cannot assign attribute on non-namespace object '{}'", target.object->name);
    ns->dict_mut().set(target.name, value);
    return;
  }
  bind_target(*frame_, target, value);
}

Value Interpreter::call_macro(const Stmt& macro, const std::shared_ptr<Frame>& closure, CallArgs& args,
                              const std::string& display_name) {
  count_iteration();
  Depth depth(*this);
  auto frame = Frame::make(closure);
  std::vector<const MacroParam*> pending;
  for (size_t k = 0; k < macro.params.size(); ++k) {
    const auto& param = macro.params[k];
    if (k < args.positional.size()) {
      frame->set(param.name, args.positional[k]);
      for (const auto& [key, v] : args.keyword)
        if (key == param.name) fail("macro '{}' got multiple values for argument '{}'", display_name, key);
    } else if (auto v = args.take(k, param.name)) {
      frame->set(param.name, std::move(*v));
    } else if (param.default_value) {
      pending.push_back(&param);
    } else {
      frame->set(param.name, Value::undefined(fmt::format("parameter '{}' was not provided", param.name)));
    }
  }
  if (args.positional.size() > macro.params.size()) {
    if (!macro.uses_varargs)
      fail("macro '{}' takes not more than {} argument(s)", display_name, macro.params.size());
    std::vector<Value> rest(args.positional.begin() + static_cast<std::ptrdiff_t>(macro.params.size()),
                            args.positional.end());
    frame->set("varargs", Value::tuple(std::move(rest)));
  } else if (macro.uses_varargs) {
    frame->set("varargs", Value::tuple({}));
  }
  if (auto caller = args.take(SIZE_MAX, "caller")) frame->set("caller", std::move(*caller));
  if (!args.keyword.empty()) {
    if (!macro.uses_kwargs) fail("macro '{}' takes no keyword argument '{}'", display_name, args.keyword.front().first);
    DictData kwargs;
    for (auto& [key, v] : args.keyword) kwargs.set(key, std::move(v));
    frame->set("kwargs", Value::dict(std::move(kwargs)));
  } else if (macro.uses_kwargs) {
    frame->set("kwargs", Value::dict());
  }
  FrameSwap swap(frame_, frame);
  for (const MacroParam* param : pending) frame->set(param->name, eval(*param->default_value));
  std::string out;
  render_body(macro.body, out);
  return Value(std::move(out));
}

// ---- expressions ----

CallArgs Interpreter::eval_args(const Arguments& args) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const auto& a : args.positional) out.positional.push_back(eval(*a));
  if (args.star) {
    for (auto& v : iterate(eval(*args.star))) out.positional.push_back(std::move(v));
  }
  for (const auto& [key, a] : args.keyword) out.keyword.emplace_back(key, eval(*a));
  if (args.star_star) {
    Value more = eval(*args.star_star);
    if (!more.is_dict()) fail("argument after ** must be a mapping, not {}", more.type_name());
    for (const auto& [key, v] : more.dict_data().entries()) out.keyword.emplace_back(key, v);
  }
  for (size_t i = 0; i < out.keyword.size(); ++i)
    for (size_t j = i + 1; j < out.keyword.size(); ++j)
      if (out.keyword[i].first == out.keyword[j].first)
        fail("got multiple values for keyword argument '{}'", out.keyword[i].first);
  return out;
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_callable()) return fn.callable_ref().call(*this, args);
  if (fn.is_loop()) {
    if (!fn.loop_data().recurse) fail("loop() can only be called in a loop marked 'recursive'");
    return fn.loop_data().recurse->call(*this, args);
  }
  if (fn.is_undefined()) fail_undefined(fn);
  fail("'{}' object is not callable", fn.type_name());
}

Value Interpreter::apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("no filter named '{}'", name);
  return f(*this, input, args);
}

bool Interpreter::apply_test(std::string_view name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("no test named '{}'", name);
  return t(*this, input, args);
}

Value Interpreter::get_attr(const Value& object, std::string_view name) {
  switch (object.type()) {
    case Value::Type::undefined: fail_undefined(object);  // Jinja2's Undefined raises here
    case Value::Type::ns: {
      const Value* v = object.dict_data().find(name);
      return v ? *v : Value::undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
    }
    case Value::Type::loop: {
      const auto& loop = object.loop_data();
      const auto& items = loop.items->items;
      const auto n = static_cast<int64_t>(items.size());
      const int64_t i = loop.index0;
      if (name == "index") return Value(i + 1);
      if (name == "index0") return Value(i);
      if (name == "revindex") return Value(n - i);
      if (name == "revindex0") return Value(n - i - 1);
      if (name == "first") return Value(i == 0);
      if (name == "last") return Value(i == n - 1);
      if (name == "length") return Value(n);
      if (name == "depth") return Value(loop.depth0 + 1);
      if (name == "depth0") return Value(loop.depth0);
      if (name == "previtem") return i > 0 ? items[i - 1] : Value::undefined("there is no previous item");
      if (name == "nextitem") return i + 1 < n ? items[i + 1] : Value::undefined("there is no next item");
      if (name == "cycle") return Value::callable(std::make_shared<LoopCycle>(i));
      return Value::undefined(fmt::format("'LoopContext' object has no attribute '{}'", name));
    }
    default: break;
  }
  if (MethodFn method = find_method(object, name))
    return Value::callable(std::make_shared<BoundMethod>(std::string(name), object, method));
  if (object.is_dict()) {
    const Value* v = object.dict_data().find(name);
    return v ? *v : Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return Value::undefined(fmt::format("'{}' object has no attribute '{}'", object.type_name(), name));
}

Value Interpreter::get_item(const Value& object, const Value& key) {
  switch (object.type()) {
    case Value::Type::undefined: fail_undefined(object);
    case Value::Type::dict: {
      if (key.is_string()) {
        if (const Value* v = object.dict_data().find(key.as_string())) return *v;
        return get_attr(object, key.as_string());  // Jinja2 falls back to attributes (d['items'])
      }
      return Value::undefined(fmt::format("'dict object' has no attribute {}", repr(key)));
    }
    case Value::Type::list:
    case Value::Type::string: {
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.as_int();
        if (object.is_list()) {
          const auto n = static_cast<int64_t>(object.items().size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined(fmt::format("{} object has no element {}", object.type_name(), key.as_int()));
          return object.items()[static_cast<size_t>(i)];
        }
        auto offsets = py::code_point_offsets(object.as_string());
        const auto n = static_cast<int64_t>(offsets.size()) - 1;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(fmt::format("str object has no element {}", key.as_int()));
        return Value(object.as_string().substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
      if (key.is_string()) return get_attr(object, key.as_string());
      return Value::undefined(fmt::format("{} indices must be integers, not {}", object.type_name(), key.type_name()));
    }
    case Value::Type::ns:
    case Value::Type::loop:
      if (key.is_string()) return get_attr(object, key.as_string());
      return Value::undefined("not subscriptable with a non-string key");
    default:
      if (key.is_string()) return get_attr(object, key.as_string());
      return Value::undefined(fmt::format("'{}' object is not subscriptable", object.type_name()));
  }
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::undefined: return {};
    case Value::Type::list: return v.items();
    case Value::Type::dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_data().size());
      for (const auto& [key, value] : v.dict_data().entries()) keys.emplace_back(key);
      return keys;
    }
    case Value::Type::string: {
      std::vector<Value> chars;
      const std::string& s = v.as_string();
      auto offsets = py::code_point_offsets(s);
      chars.reserve(offsets.size());
      for (size_t k = 0; k + 1 < offsets.size(); ++k) chars.emplace_back(s.substr(offsets[k], offsets[k + 1] - offsets[k]));
      return chars;
    }
    default: fail("'{}' object is not iterable", v.type_name());
  }
}

Value Interpreter::eval_slice(const Value& object, const Expr& slice) {
  Value start = slice.items[0] ? eval(*slice.items[0]) : Value::none();
  Value stop = slice.items[1] ? eval(*slice.items[1]) : Value::none();
  Value step_v = slice.items[2] ? eval(*slice.items[2]) : Value::none();
  if (object.is_undefined()) fail_undefined(object);
  if (!object.is_list() && !object.is_string()) fail("'{}' object is not subscriptable", object.type_name());
  std::vector<size_t> offsets;
  int64_t n;
  if (object.is_string()) {
    offsets = py::code_point_offsets(object.as_string());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    n = static_cast<int64_t>(object.items().size());
  }
  const int64_t step = step_v.is_none() ? 1 : slice_index(step_v, "step");
  if (step == 0) fail("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = slice_index(v, "index");
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t lo = adjust(start, step < 0 ? n - 1 : 0);
  const int64_t hi = adjust(stop, step < 0 ? -1 : n);
  std::vector<int64_t> picks;
  if (step > 0) {
    for (int64_t i = lo; i < hi; i += step) picks.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += step) picks.push_back(i);
  }
  if (object.is_string()) {
    const std::string& s = object.as_string();
    std::string out;
    for (int64_t i : picks) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    return Value(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (int64_t i : picks) out.push_back(object.items()[static_cast<size_t>(i)]);
  return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value Interpreter::eval(const Expr& e) {
  Position pos(*this, e.line, e.column);
  Depth depth(*this);
  switch (e.kind) {
    case Expr::Kind::literal: return e.value;
    case Expr::Kind::name: {
      const Value* v = frame_->find(e.name);
      return v ? *v : Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case Expr::Kind::list:
    case Expr::Kind::tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& item : e.items) items.push_back(eval(*item));
      return e.kind == Expr::Kind::tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::dict: {
      DictData data;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k]);
        if (!key.is_string()) fail("dict keys must be strings in templates, not {}", key.type_name());
        data.set(key.as_string(), eval(*e.items[k + 1]));
      }
      return Value::dict(std::move(data));
    }
    case Expr::Kind::getattr: return get_attr(eval(*e.object), e.name);
    case Expr::Kind::getitem: {
      Value object = eval(*e.object);
      if (e.index->kind == Expr::Kind::slice) return eval_slice(object, *e.index);
      return get_item(object, eval(*e.index));
    }
    case Expr::Kind::slice: fail("a slice can only be used inside []");
    case Expr::Kind::call: {
      Value fn = eval(*e.object);
      CallArgs args = eval_args(e.args);
      return call(fn, args);
    }
    case Expr::Kind::filter: {
      Value input;
      if (e.object) {
        input = eval(*e.object);
      } else {
        FL_ASSERT(block_input_ != nullptr);
        input = *block_input_;
      }
      CallArgs args = eval_args(e.args);
      return apply_filter(e.name, input, args);
    }
    case Expr::Kind::test: {
      Value input = eval(*e.object);
      CallArgs args = eval_args(e.args);
      return Value(apply_test(e.name, input, args) != e.negated);
    }
    case Expr::Kind::negate:
    case Expr::Kind::plus: {
      Value v = eval(*e.object);
      if (v.is_undefined()) fail_undefined(v);
      const bool neg = e.kind == Expr::Kind::negate;
      if (v.is_float()) return Value(neg ? -v.as_double() : v.as_double());
      if (v.is_int() || v.is_bool()) {
        int64_t i = v.as_int();
        if (neg && i == INT64_MIN) overflow();
        return Value(neg ? -i : i);
      }
      fail("bad operand type for unary {}: '{}'", neg ? '-' : '+', v.type_name());
    }
    case Expr::Kind::not_: return Value(!eval(*e.object).truthy());
    case Expr::Kind::binary: return eval_binary(e);
    case Expr::Kind::compare: return eval_compare(e);
    case Expr::Kind::and_: {
      Value a = eval(*e.object);
      return a.truthy() ? eval(*e.index) : a;
    }
    case Expr::Kind::or_: {
      Value a = eval(*e.object);
      return a.truthy() ? a : eval(*e.index);
    }
    case Expr::Kind::cond: {
      if (eval(*e.index).truthy()) return eval(*e.object);
      if (e.third) return eval(*e.third);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  fail("unknown expression");
}

Value Interpreter::eval_binary(const Expr& e) {
  Value a = eval(*e.object);
  Value b = eval(*e.index);
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_size(s.size() + t.size());
    return Value(s + t);
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  const char* opname = op.c_str();
  if (op == "+") {
    if (numbers) {
      if (floats) return Value(a.as_double() + b.as_double());
      int64_t r;
      if (!checked_add(a.as_int(), b.as_int(), r)) overflow();
      return Value(r);
    }
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      if (a.is_markup() || b.is_markup()) {
        // markupsafe: Markup + str escapes the str side (even with autoescaping off).
        return Value::markup((a.is_markup() ? a.as_string() : html_escape_text(a.as_string())) +
                             (b.is_markup() ? b.as_string() : html_escape_text(b.as_string())));
      }
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      check_size(a.items().size() + b.items().size());
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string()) fail("can only concatenate str (not \"{}\") to str", b.type_name());
    if (a.is_list()) fail("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name());
  } else if (op == "-") {
    if (numbers) {
      if (floats) return Value(a.as_double() - b.as_double());
      int64_t r;
      if (!checked_sub(a.as_int(), b.as_int(), r)) overflow();
      return Value(r);
    }
  } else if (op == "*") {
    if (numbers) {
      if (floats) return Value(a.as_double() * b.as_double());
      int64_t r;
      if (!checked_mul(a.as_int(), b.as_int(), r)) overflow();
      return Value(r);
    }
    const Value* seq = nullptr;
    const Value* count = nullptr;
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) seq = &a, count = &b;
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) seq = &b, count = &a;
    if (seq) {
      const int64_t times = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        const std::string& s = seq->as_string();
        if (times > 0 && !s.empty()) check_size(s.size() > SIZE_MAX / static_cast<size_t>(times) ? SIZE_MAX : s.size() * times);
        std::string out;
        for (int64_t k = 0; k < times && !s.empty(); ++k) out += s;
        return seq->is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
      }
      const auto& items = seq->items();
      if (times > 0 && !items.empty())
        check_size(items.size() > SIZE_MAX / static_cast<size_t>(times) ? SIZE_MAX : items.size() * times);
      std::vector<Value> out;
      for (int64_t k = 0; k < times && !items.empty(); ++k) out.insert(out.end(), items.begin(), items.end());
      return seq->is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
  } else if (op == "/") {
    if (numbers) {
      if (b.as_double() == 0.0) fail("division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (numbers && !floats) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value(int64_t{0});
        overflow();
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    if (numbers) {
      double q, r;
      float_divmod(a.as_double(), b.as_double(), q, r);
      return Value(op == "//" ? q : r);
    }
    if (op == "%" && a.is_string()) {
      std::string text = python_percent_format(*this, a.as_string(), b, a.is_markup());
      return a.is_markup() ? Value::markup(std::move(text)) : Value(std::move(text));
    }
  } else if (op == "**") {
    if (numbers) {
      if (!floats && b.as_int() >= 0) return int_pow(a.as_int(), b.as_int());
      const double x = a.as_double(), y = b.as_double();
      if (x == 0.0 && y < 0) fail("0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) fail("a negative number cannot be raised to a fractional power");
      const double r = std::pow(x, y);
      if (std::isinf(r) && !std::isinf(x) && !std::isinf(y)) fail("numerical result out of range");
      return Value(r);
    }
  }
  fail("unsupported operand type(s) for {}: '{}' and '{}'", opname, a.type_name(), b.type_name());
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.object);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.items[k]);
    const std::string& op = e.ops[k];
    bool result;
    if (op == "==") {
      result = equals(left, right);
    } else if (op == "!=") {
      result = !equals(left, right);
    } else if (op == "in" || op == "not in") {
      result = contains(right, left) == (op == "in");
    } else {
      if (left.is_undefined()) fail_undefined(left);
      if (right.is_undefined()) fail_undefined(right);
      const int c = compare(left, right);
      result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!result) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace fl::jinja
