// The Jinja interpreter feature by feature: snippets.json (statements, loops, macros, whitespace
// control, expressions, tests, methods, filters, Markup, globals, syntax and runtime errors) is
// rendered by Python Jinja2 (set up as transformers does) at test time and fireline must give the
// same bytes, or raise where Jinja2 raises. Then the things no oracle shows: limits, error
// locations, raise_exception's message, strftime_now, and that rendering never mutates its input.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/jinja/template.h"
#include "util/test_util.h"

using json = nlohmann::ordered_json;
using fl::jinja::RenderOptions;
using fl::jinja::Template;
using fl::jinja::TemplateError;

namespace {

const std::string kDir = std::string(FIRELINE_SOURCE_DIR) + "/tests/text/jinja";

std::tm fixed_now() {
  std::tm now{};
  now.tm_year = 2026 - 1900, now.tm_mon = 2, now.tm_mday = 9, now.tm_hour = 14, now.tm_min = 5;
  std::mktime(&now);
  return now;
}

std::string render(const std::string& source, const json& ctx = json::object(), RenderOptions options = {}) {
  if (!options.now) options.now = fixed_now();
  return Template(source).render(ctx, options);
}

std::string quoted(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

TEST(JinjaSnippets, MatchJinja2) {
  std::ifstream in(kDir + "/snippets.json");
  ASSERT_TRUE(in) << "missing snippets.json";
  const json snippets = json::parse(in);
  json input = {{"now", {2026, 3, 9, 14, 5, 0}}, {"templates", json::object()}, {"jobs", json::array()}};
  for (size_t k = 0; k < snippets.size(); ++k) {
    const std::string id = std::to_string(k);
    input["templates"][id] = snippets[k]["template"];
    input["jobs"].push_back({{"id", id}, {"template", id}, {"context", snippets[k]["context"]}});
  }
  fl::test::TempDir dir;
  fl::test::write_file(dir.file("jobs.json"), input.dump());
  const std::string cmd = "python3 '" + kDir + "/render_jinja2.py' '" + dir.file("jobs.json") + "' '" + dir.file("out.json") + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "Jinja2 oracle failed (python3 with jinja2 needed): " << cmd;
  std::ifstream out_in(dir.file("out.json"));
  const json results = json::parse(out_in);

  int rendered = 0, raised = 0;
  for (size_t k = 0; k < snippets.size(); ++k) {
    const std::string source = snippets[k]["template"];
    const json& want = results.at(std::to_string(k));
    std::string ours;
    bool ok = true;
    try {
      ours = render(source, snippets[k]["context"]);
    } catch (const TemplateError& e) {
      ok = false;
      ours = e.what();
    }
    if (!want["ok"].get<bool>()) {
      ++raised;
      EXPECT_FALSE(ok) << "snippet " << k << " " << quoted(source) << ": Jinja2 raises (" << want["error"].get<std::string>()
                       << ") but fireline rendered " << quoted(ours);
      continue;
    }
    ++rendered;
    EXPECT_TRUE(ok) << "snippet " << k << " " << quoted(source) << ": fireline raised " << ours;
    if (ok) {
      EXPECT_EQ(ours, want["text"].get<std::string>()) << "snippet " << k << " " << quoted(source);
    }
  }
  std::printf("[ snippets ] %d rendered, %d raised, all compared with Jinja2\n", rendered, raised);
}

// ---- errors name the place ----

TEST(JinjaErrors, SyntaxErrorNamesLineAndColumn) {
  try {
    Template("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}", {.name = "t.jinja"});
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 10);  // the '}}' where an operand was expected
    EXPECT_EQ(std::string(e.what()).rfind("t.jinja:3:10: ", 0), 0u) << e.what();
  }
}

TEST(JinjaErrors, RuntimeErrorNamesTheLineOfTheFailingExpression) {
  Template t("{% macro m() %}\nok\n{% endmacro %}\n{{ m() }}\n{{ m() + 1 }}", {.name = "t"});
  try {
    t.render(json::object());
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 5) << e.what();  // the + on line 5, not the macro body it called
    EXPECT_FALSE(e.raised_by_template());
  }
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplateMessage) {
  Template t("a\n{{ raise_exception('Conversation roles must alternate') }}");
  try {
    t.render(json::object());
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_TRUE(e.raised_by_template());
    EXPECT_EQ(e.detail(), "Conversation roles must alternate");
    EXPECT_EQ(e.line(), 2);
  }
}

TEST(JinjaErrors, UndefinedMessagesSayWhat) {
  try {
    render("{{ messages[0]['role'] }}", {{"messages", json::array()}});
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("no element 0"), std::string::npos) << e.what();
  }
  try {
    render("{{ nope.x }}");
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("'nope' is undefined"), std::string::npos) << e.what();
  }
}

// ---- limits ----

TEST(JinjaLimits, RunawayRecursionIsAnError) {
  EXPECT_THROW(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), TemplateError);
}

TEST(JinjaLimits, DeepButBoundedRecursionWorks) {
  // 60 nested macro calls is far beyond any chat template and must still render.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(60) }}"),
            "done");
}

TEST(JinjaLimits, LoopIterationsAreCounted) {
  RenderOptions options;
  options.limits.max_iterations = 1000;
  EXPECT_EQ(render("{% for i in range(10) %}{% for j in range(10) %}.{% endfor %}{% endfor %}", json::object(), options).size(),
            100u);
  EXPECT_THROW(render("{% for i in range(100) %}{% for j in range(100) %}.{% endfor %}{% endfor %}", json::object(), options),
               TemplateError);
}

TEST(JinjaLimits, OutputSizeIsBounded) {
  RenderOptions options;
  options.limits.max_output_bytes = 1 << 16;
  EXPECT_THROW(render("{% for i in range(100000) %}xxxxxxxx{% endfor %}", json::object(), options), TemplateError);
  EXPECT_THROW(render("{{ 'x' * 100000000000 }}", json::object(), options), TemplateError);
  EXPECT_THROW(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                      json::object(), options),
               TemplateError);
}

TEST(JinjaLimits, HugeRangeIsRefusedLikeTheSandbox) { EXPECT_THROW(render("{{ range(10**9) | length }}"), TemplateError); }

TEST(JinjaLimits, IntegerOverflowIsAnError) { EXPECT_THROW(render("{{ 2 ** 64 }}"), TemplateError); }

TEST(JinjaLimits, DeeplyNestedSourceIsASyntaxErrorNotAStackOverflow) {
  std::string deep(100000, '(');
  EXPECT_THROW(Template("{{ " + deep + " }}"), TemplateError);
  std::string chain = "{{ 1";
  for (int k = 0; k < 100000; ++k) chain += " + 1";
  EXPECT_THROW(Template(chain + " }}"), TemplateError);
  std::string nested;
  for (int k = 0; k < 5000; ++k) nested += "{% if true %}";
  EXPECT_THROW(Template{nested}, TemplateError);
}

TEST(JinjaLimits, SelfContainingListCannotHangPrinting) {
  EXPECT_THROW(render("{% set x = [] %}{% do x.append(x) %}{{ x }}"), TemplateError);
  EXPECT_THROW(render("{% set x = [] %}{% do x.append(x) %}{{ x | tojson }}"), TemplateError);
}

TEST(JinjaLimits, SharedStructuresCannotBlowUpPrintingOrComparing) {
  // 2^40 leaves when printed, a few dozen objects in memory.
  const std::string build = "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
  EXPECT_THROW(render(build + "{{ ns.a }}"), TemplateError);
  EXPECT_THROW(render(build + "{{ ns.a | tojson }}"), TemplateError);
  EXPECT_THROW(render(build + "{{ ns.a == [ns.a[0], ns.a[1]] }}"), TemplateError);
}

// ---- values ----

TEST(JinjaValues, RenderDoesNotMutateTheCallersData) {
  const json ctx = {{"xs", {1, 2}}};
  fl::jinja::Value v = fl::jinja::Value::from_json(ctx);
  EXPECT_EQ(Template("{% do xs.append(3) %}{{ xs }}").render(v), "[1, 2, 3]");
  EXPECT_EQ(v.to_json(), ctx);
}

TEST(JinjaValues, StrftimeNowUsesTheGivenClock) {
  EXPECT_EQ(render("{{ strftime_now('%d %B %Y, %a %H:%M') }}"), "09 March 2026, Mon 14:05");
}

TEST(JinjaValues, JsonRoundTripKeepsOrderAndTypes) {
  const json j = json::parse(R"({"b": 1, "a": [1.5, true, null, "x"], "c": {"z": 1, "y": 2}})");
  EXPECT_EQ(fl::jinja::Value::from_json(j).to_json(), j);
  EXPECT_EQ(render("{{ v | tojson }}", {{"v", j}}), R"({"b": 1, "a": [1.5, true, null, "x"], "c": {"z": 1, "y": 2}})");
}

TEST(JinjaValues, TemplatesAreReusableAndMovable) {
  Template a("{{ x }}");
  Template b = std::move(a);
  EXPECT_EQ(b.render(json{{"x", 1}}), "1");
  EXPECT_EQ(b.render(json{{"x", "y"}}), "y");
}

}  // namespace
