#include "text/jinja/parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include <fmt/format.h>

#include "text/jinja/template_error.h"

namespace fl::jinja {
namespace {

const char* describe(TokenType type) {
  switch (type) {
    case TokenType::text: return "template text";
    case TokenType::variable_begin: return "'{{'";
    case TokenType::variable_end: return "'}}'";
    case TokenType::block_begin: return "'{%'";
    case TokenType::block_end: return "'%}'";
    case TokenType::name: return "name";
    case TokenType::string: return "string";
    case TokenType::integer: return "integer";
    case TokenType::floating: return "float";
    case TokenType::op: return "operator";
    case TokenType::eof: return "end of template";
  }
  return "token";
}

std::string describe(const Token& t) {
  if (t.type == TokenType::name || t.type == TokenType::op) return "'" + t.value + "'";
  return describe(t.type);
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

  Program parse_program() {
    Program program;
    program.body = subparse({});
    if (cur().type != TokenType::eof) error(cur(), fmt::format("unexpected {}", describe(cur())));
    return program;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return t_[p_]; }
  const Token& look(size_t ahead = 1) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  void advance() {
    if (t_[p_].type != TokenType::eof) ++p_;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::op && cur().value == op; }
  bool is_name(std::string_view name) const { return cur().type == TokenType::name && cur().value == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) error(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != TokenType::name) error(cur(), fmt::format("expected a name, got {}", describe(cur())));
    std::string v = cur().value;
    advance();
    return v;
  }
  void expect_block_end() {
    if (cur().type != TokenType::block_end) error(cur(), fmt::format("expected '%}}', got {}", describe(cur())));
    advance();
  }

  [[noreturn]] void error(const Token& at, const std::string& message) const {
    throw TemplateError(name_, at.line, at.column, message, false);
  }

  struct Nest {
    Parser& p;
    Nest(Parser& parser, const Token& at) : p(parser) {
      if (++p.depth_ > kMaxParseNesting)
        p.error(at, fmt::format("template nested more than {} levels deep", kMaxParseNesting));
    }
    ~Nest() { --p.depth_; }
  };

  // Operator chains (a + b + c ..., x.y.z ..., v|f|g ...) build left-deep trees that the
  // interpreter walks recursively, so every link of a chain counts as one level of nesting.
  struct Chain {
    Parser& p;
    int links = 0;
    explicit Chain(Parser& parser) : p(parser) {}
    void link(const Token& at) {
      ++links;
      if (++p.depth_ > kMaxParseNesting)
        p.error(at, fmt::format("expression nested more than {} levels deep", kMaxParseNesting));
    }
    ~Chain() { p.depth_ -= links; }
  };

  template <typename T>
  std::unique_ptr<T> node(const Token& at) {
    auto n = std::make_unique<T>();
    n->line = at.line;
    n->column = at.column;
    return n;
  }
  ExprPtr expr_node(Expr::Kind kind, const Token& at) {
    auto e = node<Expr>(at);
    e->kind = kind;
    return e;
  }
  StmtPtr stmt_node(Stmt::Kind kind, const Token& at) {
    auto s = node<Stmt>(at);
    s->kind = kind;
    return s;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `end_tags`; returns with that name as the current
  // token (its '{%' consumed).
  StmtList subparse(std::initializer_list<std::string_view> end_tags) {
    StmtList body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::text: {
          auto s = stmt_node(Stmt::Kind::text, t);
          s->text = t.value;
          advance();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::variable_begin: {
          auto s = stmt_node(Stmt::Kind::output, t);
          advance();
          s->expr = parse_tuple(true, {});
          if (cur().type != TokenType::variable_end)
            error(cur(), fmt::format("expected '}}}}', got {}", describe(cur())));
          advance();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::block_begin: {
          advance();
          if (cur().type == TokenType::name &&
              std::find(end_tags.begin(), end_tags.end(), cur().value) != end_tags.end())
            return body;
          body.push_back(parse_statement());
          break;
        }
        case TokenType::eof: {
          if (end_tags.size() > 0) {
            std::string wanted;
            for (auto tag : end_tags) wanted += (wanted.empty() ? "'" : " or '") + std::string(tag) + "'";
            error(t, fmt::format("unexpected end of template, expected {}", wanted));
          }
          return body;
        }
        default: error(t, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != TokenType::name) error(t, fmt::format("expected a tag name after '{{%', got {}", describe(t)));
    Nest nest(*this, t);
    const std::string& tag = t.value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "do") {
      auto s = stmt_node(Stmt::Kind::do_, t);
      advance();
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    if (tag == "generation") {
      auto s = stmt_node(Stmt::Kind::scope, t);
      advance();
      expect_block_end();
      s->body = subparse({"endgeneration"});
      advance();
      expect_block_end();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(t, fmt::format("'{}' outside of a loop", tag));
      auto s = stmt_node(tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, t);
      advance();
      expect_block_end();
      return s;
    }
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block")
      error(t, fmt::format("'{}' is not supported: chat templates are single files", tag));
    error(t, fmt::format("unknown tag '{}'", tag));
  }

  StmtPtr parse_if() {
    auto s = stmt_node(Stmt::Kind::if_, cur());
    advance();  // if
    while (true) {
      ExprPtr cond = parse_tuple(false, {});
      expect_block_end();
      StmtList body = subparse({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect_block_end();
        s->else_body = subparse({"endif"});
      }
      advance();  // endif
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for() {
    auto s = stmt_node(Stmt::Kind::for_, cur());
    advance();  // for
    s->target = parse_assign_target(false, {"in"});
    if (!skip_name("in")) error(cur(), fmt::format("expected 'in' in for loop, got {}", describe(cur())));
    s->expr = parse_tuple(false, {"recursive"});
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (skip_name("else")) {
      expect_block_end();
      s->else_body = subparse({"endfor"});
    }
    advance();  // endfor
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const Token& at = cur();
    advance();  // set
    ExprPtr target = parse_assign_target(true, {});
    if (skip_op("=")) {
      auto s = stmt_node(Stmt::Kind::set, at);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    if (target->kind != Expr::Kind::name) error(at, "a block set needs a plain variable name");
    auto s = stmt_node(Stmt::Kind::set_block, at);
    s->text = target->name;
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    expect_block_end();
    s->body = subparse({"endset"});
    advance();
    expect_block_end();
    return s;
  }

  // Macro and call-block parameter lists: (a, b=1, c='x').
  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam param;
      const Token& at = cur();
      param.name = expect_name();
      for (const auto& other : params)
        if (other.name == param.name) error(at, fmt::format("duplicate parameter '{}'", param.name));
      if (skip_op("=")) {
        param.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        error(at, fmt::format("parameter '{}' without a default follows a parameter with one", param.name));
      }
      params.push_back(std::move(param));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro() {
    auto s = stmt_node(Stmt::Kind::macro, cur());
    advance();  // macro
    s->text = expect_name();
    s->params = parse_signature();
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved_loops;
    advance();
    expect_block_end();
    scan_special_names(*s);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = stmt_node(Stmt::Kind::call_block, cur());
    advance();  // call
    if (is_op("(")) s->params = parse_signature();
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::call) error(*&cur(), "expected a call after {% call %}");
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endcall"});
    loop_depth_ = saved_loops;
    advance();
    expect_block_end();
    scan_special_names(*s);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = stmt_node(Stmt::Kind::filter_block, cur());
    advance();  // filter
    s->expr = parse_filter(nullptr, true);
    expect_block_end();
    s->body = subparse({"endfilter"});
    advance();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = stmt_node(Stmt::Kind::with, cur());
    advance();  // with
    while (cur().type != TokenType::block_end) {
      if (!s->assignments.empty()) expect_op(",");
      ExprPtr target = parse_assign_target(false, {});
      expect_op("=");
      s->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    advance();
    expect_block_end();
    return s;
  }

  // set/for/with targets: a name, a tuple of names, or (for set) namespace.attribute.
  ExprPtr parse_assign_target(bool with_namespace, std::initializer_list<std::string_view> extra_end) {
    const Token& at = cur();
    if (with_namespace && at.type == TokenType::name && look().type == TokenType::op && look().value == ".") {
      auto e = expr_node(Expr::Kind::getattr, at);
      auto obj = expr_node(Expr::Kind::name, at);
      obj->name = at.value;
      advance();
      advance();
      e->object = std::move(obj);
      e->name = expect_name();
      return e;
    }
    ExprPtr target = parse_tuple_of_names(extra_end);
    return target;
  }

  ExprPtr parse_tuple_of_names(std::initializer_list<std::string_view> extra_end) {
    const Token& at = cur();
    std::vector<ExprPtr> names;
    bool is_tuple = false;
    while (true) {
      if (!names.empty()) expect_op(",");
      if (is_tuple_end(extra_end) || is_op("=")) break;
      if (skip_op("(")) {
        names.push_back(parse_tuple_of_names({}));
        expect_op(")");
      } else {
        auto n = expr_node(Expr::Kind::name, cur());
        n->name = expect_name();
        if (n->name == "true" || n->name == "false" || n->name == "none" || n->name == "True" ||
            n->name == "False" || n->name == "None")
          error(at, fmt::format("cannot assign to '{}'", n->name));
        names.push_back(std::move(n));
      }
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (names.empty()) error(at, "expected a variable name");
    if (!is_tuple) return std::move(names[0]);
    auto t = expr_node(Expr::Kind::tuple, at);
    t->items = std::move(names);
    return t;
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::variable_end || t.type == TokenType::block_end || t.type == TokenType::eof) return true;
    if (t.type == TokenType::op && t.value == ")") return true;
    if (t.type == TokenType::name)
      for (auto word : extra_end)
        if (t.value == word) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses = false) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) error(cur(), fmt::format("expected an expression, got {}", describe(cur())));
    }
    auto t = expr_node(Expr::Kind::tuple, at);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this, cur());
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    Chain chain(*this);
    while (is_name("if")) {
      const Token& at = cur();
      chain.link(at);
      advance();
      auto c = expr_node(Expr::Kind::cond, at);
      c->object = std::move(expr);
      c->index = parse_or();
      if (skip_name("else")) c->third = parse_condexpr();
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    Chain chain(*this);
    while (is_name("or")) {
      chain.link(cur());
      auto e = expr_node(Expr::Kind::or_, cur());
      advance();
      e->object = std::move(left);
      e->index = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    Chain chain(*this);
    while (is_name("and")) {
      chain.link(cur());
      auto e = expr_node(Expr::Kind::and_, cur());
      advance();
      e->object = std::move(left);
      e->index = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this, cur());
      auto e = expr_node(Expr::Kind::not_, cur());
      advance();
      e->object = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    Chain chain(*this);
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::op &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" || t.value == ">" || t.value == ">=")) {
        ops.push_back(t.value);
        advance();
      } else if (is_name("in")) {
        ops.push_back("in");
        advance();
      } else if (is_name("not") && look().type == TokenType::name && look().value == "in") {
        ops.push_back("not in");
        advance();
        advance();
      } else {
        break;
      }
      chain.link(t);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = expr_node(Expr::Kind::compare, at);
    e->object = std::move(first);
    e->ops = std::move(ops);
    e->items = std::move(operands);
    return e;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    auto e = expr_node(Expr::Kind::binary, at);
    e->name = std::move(op);
    e->object = std::move(left);
    e->index = std::move(right);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    Chain chain(*this);
    while (is_op("+") || is_op("-")) {
      const Token at = cur();
      chain.link(at);
      advance();
      left = binary(at, at.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    Chain chain(*this);
    while (is_op("~")) {
      const Token at = cur();
      chain.link(at);
      advance();
      left = binary(at, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    Chain chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = cur();
      chain.link(at);
      advance();
      left = binary(at, at.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    Chain chain(*this);
    while (is_op("**")) {
      const Token at = cur();
      chain.link(at);
      advance();
      left = binary(at, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this, cur());
    const Token& at = cur();
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = expr_node(at.value == "-" ? Expr::Kind::negate : Expr::Kind::plus, at);
      advance();
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::name: {
        auto e = expr_node(Expr::Kind::literal, t);
        if (t.value == "true" || t.value == "True") {
          e->value = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->value = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.value;
        }
        advance();
        return e;
      }
      case TokenType::string: {
        auto e = expr_node(Expr::Kind::literal, t);
        std::string s;
        while (cur().type == TokenType::string) {
          s += cur().value;
          advance();
        }
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::integer: {
        auto e = expr_node(Expr::Kind::literal, t);
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(t.value.c_str(), &end, 10);
        if (errno == ERANGE) error(t, fmt::format("integer literal {} is too large", t.value));
        e->value = Value(static_cast<int64_t>(v));
        advance();
        return e;
      }
      case TokenType::floating: {
        auto e = expr_node(Expr::Kind::literal, t);
        e->value = Value(std::strtod(t.value.c_str(), nullptr));
        advance();
        return e;
      }
      case TokenType::op: {
        if (t.value == "(") {
          advance();
          ExprPtr inner = parse_tuple(true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.value == "[") {
          auto e = expr_node(Expr::Kind::list, t);
          advance();
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.value == "{") {
          auto e = expr_node(Expr::Kind::dict, t);
          advance();
          while (!is_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      }
      default: break;
    }
    error(t, fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      if (is_op(".") || is_op("[") || is_op("(")) chain.link(cur());
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) chain.link(cur());
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token at = cur();
    if (skip_op(".")) {
      const Token& attr = cur();
      if (attr.type == TokenType::name) {
        auto e = expr_node(Expr::Kind::getattr, at);
        e->object = std::move(node);
        e->name = attr.value;
        advance();
        return e;
      }
      if (attr.type != TokenType::integer) error(attr, fmt::format("expected a name or number after '.', got {}", describe(attr)));
      auto e = expr_node(Expr::Kind::getitem, at);
      e->object = std::move(node);
      e->index = parse_primary();
      return e;
    }
    expect_op("[");
    std::vector<ExprPtr> subs;
    while (!is_op("]")) {
      if (!subs.empty()) expect_op(",");
      subs.push_back(parse_subscribed());
    }
    expect_op("]");
    if (subs.empty()) error(at, "expected a subscript inside '[]'");
    auto e = expr_node(Expr::Kind::getitem, at);
    e->object = std::move(node);
    if (subs.size() == 1) {
      e->index = std::move(subs[0]);
    } else {
      auto t = expr_node(Expr::Kind::tuple, at);
      t->items = std::move(subs);
      e->index = std::move(t);
    }
    return e;
  }

  // `expr`, or a slice `start:stop:step` with any part left out (a slice node with no object).
  ExprPtr parse_subscribed() {
    const Token& at = cur();
    std::vector<ExprPtr> parts;
    if (is_op(":")) {
      advance();
      parts.push_back(nullptr);
    } else {
      ExprPtr first = parse_expression(true);
      if (!is_op(":")) return first;
      advance();
      parts.push_back(std::move(first));
    }
    if (is_op(":")) {
      parts.push_back(nullptr);
    } else if (!is_op("]") && !is_op(",")) {
      parts.push_back(parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
    if (skip_op(":")) {
      parts.push_back(!is_op("]") && !is_op(",") ? parse_expression(true) : nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = expr_node(Expr::Kind::slice, at);
    s->items = std::move(parts);
    return s;
  }

  Arguments parse_call_args() {
    const Token at = cur();
    expect_op("(");
    Arguments args;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) error(at, "invalid syntax for a function call");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!args.star && !args.star_star);
        advance();
        args.star = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!args.star_star);
        advance();
        args.star_star = parse_expression(true);
      } else if (cur().type == TokenType::name && look().type == TokenType::op && look().value == "=") {
        ensure(!args.star_star);
        std::string key = cur().value;
        advance();
        advance();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!args.star && !args.star_star && args.keyword.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = expr_node(Expr::Kind::call, cur());
    e->object = std::move(node);
    e->args = parse_call_args();
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    Chain chain(*this);
    while (is_op("|") || start_inline) {
      chain.link(cur());
      if (!start_inline) advance();
      start_inline = false;
      auto e = expr_node(Expr::Kind::filter, cur());
      e->name = expect_name();
      while (skip_op(".")) e->name += "." + expect_name();
      if (is_op("(")) e->args = parse_call_args();
      e->object = std::move(node);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    auto e = expr_node(Expr::Kind::test, cur());
    advance();  // is
    e->negated = skip_name("not");
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    const Token& t = cur();
    if (is_op("(")) {
      e->args = parse_call_args();
    } else if ((t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
                t.type == TokenType::floating || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error(t, "tests cannot be chained with 'is'");
      e->args.positional.push_back(parse_postfix(parse_primary()));
    }
    e->object = std::move(node);
    return e;
  }

  // Which of caller / varargs / kwargs a macro or call block body refers to (Jinja2 only passes
  // extra arguments to macros that use them).
  void scan_special_names(Stmt& s) {
    auto visit_name = [&](const std::string& n) {
      if (n == "caller") s.uses_caller = true;
      if (n == "varargs") s.uses_varargs = true;
      if (n == "kwargs") s.uses_kwargs = true;
    };
    for (const auto& child : s.body) scan_stmt(*child, visit_name);
  }

  template <typename F>
  void scan_expr(const Expr* e, F& f) {
    if (!e) return;
    if (e->kind == Expr::Kind::name) f(e->name);
    scan_expr(e->object.get(), f);
    scan_expr(e->index.get(), f);
    scan_expr(e->third.get(), f);
    for (const auto& item : e->items) scan_expr(item.get(), f);
    for (const auto& a : e->args.positional) scan_expr(a.get(), f);
    for (const auto& [k, a] : e->args.keyword) scan_expr(a.get(), f);
    scan_expr(e->args.star.get(), f);
    scan_expr(e->args.star_star.get(), f);
  }

  template <typename F>
  void scan_stmt(const Stmt& s, F& f) {
    scan_expr(s.expr.get(), f);
    scan_expr(s.target.get(), f);
    scan_expr(s.cond.get(), f);
    for (const auto& [c, body] : s.branches) {
      scan_expr(c.get(), f);
      for (const auto& child : body) scan_stmt(*child, f);
    }
    for (const auto& child : s.body) scan_stmt(*child, f);
    for (const auto& child : s.else_body) scan_stmt(*child, f);
    for (const auto& p : s.params) scan_expr(p.default_value.get(), f);
    for (const auto& [t, v] : s.assignments) scan_expr(v.get(), f);
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  const std::string& name_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Program parse(std::vector<Token> tokens, const std::string& template_name) {
  return Parser(std::move(tokens), template_name).parse_program();
}

}  // namespace fl::jinja
