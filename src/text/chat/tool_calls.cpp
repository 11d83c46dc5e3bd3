#include "text/chat/tool_calls.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <random>

#include "core/error.h"

namespace fl::chat {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kQuote = "<|\"|>";
constexpr int kMaxNesting = 64;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Gemma 4's argument syntax (see the header), by recursive descent.
class GemmaArgs {
 public:
  explicit GemmaArgs(std::string_view s) : s_(s) {}

  json parse_object(int depth) {
    if (depth > kMaxNesting) fail("tool call arguments nested more than {} levels deep", kMaxNesting);
    expect('{');
    json obj = json::object();
    skip_space();
    if (peek('}')) {
      ++p_;
      return obj;
    }
    while (true) {
      skip_space();
      std::string key = parse_key();
      skip_space();
      expect(':');
      skip_space();
      obj[key] = parse_value(depth + 1);
      skip_space();
      if (peek(',')) {
        ++p_;
        continue;
      }
      expect('}');
      return obj;
    }
  }

  size_t pos() const { return p_; }

 private:
  bool peek(char c) const { return p_ < s_.size() && s_[p_] == c; }
  void skip_space() {
    while (p_ < s_.size() && is_space(s_[p_])) ++p_;
  }
  void expect(char c) {
    if (!peek(c)) {
      if (p_ >= s_.size()) fail("tool call arguments end early: expected '{}'", c);
      fail("tool call arguments: expected '{}' at offset {}, found '{}'", c, p_, s_[p_]);
    }
    ++p_;
  }

  std::string parse_quoted() {
    p_ += kQuote.size();
    size_t end = s_.find(kQuote, p_);
    if (end == std::string_view::npos) fail("tool call arguments: unterminated <|\"|> string");
    std::string out(s_.substr(p_, end - p_));
    p_ = end + kQuote.size();
    return out;
  }

  std::string parse_key() {
    if (s_.compare(p_, kQuote.size(), kQuote) == 0) return parse_quoted();
    size_t end = p_;
    while (end < s_.size() && s_[end] != ':' && s_[end] != ',' && s_[end] != '{' && s_[end] != '}' &&
           s_[end] != '[' && s_[end] != ']')
      ++end;
    std::string_view key = trim(s_.substr(p_, end - p_));
    if (key.empty()) fail("tool call arguments: missing key at offset {}", p_);
    p_ = end;
    return std::string(key);
  }

  json parse_value(int depth) {
    if (depth > kMaxNesting) fail("tool call arguments nested more than {} levels deep", kMaxNesting);
    if (s_.compare(p_, kQuote.size(), kQuote) == 0) return parse_quoted();
    if (peek('{')) return parse_object(depth);
    if (peek('[')) {
      ++p_;
      json arr = json::array();
      skip_space();
      if (peek(']')) {
        ++p_;
        return arr;
      }
      while (true) {
        skip_space();
        arr.push_back(parse_value(depth + 1));
        skip_space();
        if (peek(',')) {
          ++p_;
          continue;
        }
        expect(']');
        return arr;
      }
    }
    size_t end = p_;
    while (end < s_.size() && s_[end] != ',' && s_[end] != '}' && s_[end] != ']') ++end;
    std::string word(trim(s_.substr(p_, end - p_)));
    p_ = end;
    if (word == "true" || word == "True") return true;
    if (word == "false" || word == "False") return false;
    if (word == "null" || word == "None" || word == "none") return nullptr;
    if (!word.empty()) {
      const char* b = word.c_str();
      char* e = nullptr;
      errno = 0;
      if (word.find_first_of(".eE") == std::string::npos) {
        long long v = std::strtoll(b, &e, 10);
        if (e == b + word.size() && errno == 0) return static_cast<int64_t>(v);
      }
      errno = 0;
      double d = std::strtod(b, &e);
      if (e == b + word.size() && errno == 0 && std::isfinite(d) && word.find_first_of("xXnN") == std::string::npos)
        return d;
    }
    fail("tool call arguments: cannot read value '{}'", word);
  }

  std::string_view s_;
  size_t p_ = 0;
};

// The JSON schema type of a parameter, if the tools say it.
std::string schema_type(const json& tools, const std::string& function, const std::string& param) {
  if (!tools.is_array()) return {};
  for (const auto& tool : tools) {
    const json* fn = tool.is_object() && tool.contains("function") ? &tool["function"] : &tool;
    if (!fn->is_object() || !fn->contains("name") || (*fn)["name"] != function) continue;
    if (!fn->contains("parameters") || !(*fn)["parameters"].is_object()) return {};
    const json& params = (*fn)["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object()) return {};
    const json& props = params["properties"];
    if (!props.contains(param) || !props[param].is_object()) return {};
    const json& type = props[param].contains("type") ? props[param]["type"] : json();
    if (type.is_string()) return type.get<std::string>();
    return {};
  }
  return {};
}

json xml_parameter_value(std::string_view raw, const std::string& type) {
  // The template writes "<parameter=K>\n" VALUE "\n</parameter>".
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  if (type == "string") return std::string(raw);
  std::string_view t = trim(raw);
  if (t == "True") return true;
  if (t == "False") return false;
  if (t == "None") return nullptr;
  json parsed = json::parse(t, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded()) return parsed;
  return std::string(raw);
}

ToolCall parse_qwen_xml(std::string_view body, const json& tools) {
  ToolCall call;
  size_t p = body.find("<function=");
  if (p == std::string_view::npos) fail("tool call has no <function=NAME>");
  size_t name_end = body.find('>', p);
  if (name_end == std::string_view::npos) fail("tool call: unterminated <function=");
  call.name = std::string(trim(body.substr(p + 10, name_end - p - 10)));
  if (call.name.empty()) fail("tool call has an empty function name");
  size_t fn_end = body.find("</function>", name_end);
  if (fn_end == std::string_view::npos) fail("tool call: missing </function>");
  size_t q = name_end + 1;
  while (true) {
    size_t param = body.find("<parameter=", q);
    if (param == std::string_view::npos || param > fn_end) break;
    size_t key_end = body.find('>', param);
    if (key_end == std::string_view::npos) fail("tool call: unterminated <parameter=");
    std::string key(trim(body.substr(param + 11, key_end - param - 11)));
    if (key.empty()) fail("tool call has a parameter without a name");
    size_t value_end = body.find("</parameter>", key_end);
    if (value_end == std::string_view::npos) fail("tool call: parameter '{}' has no </parameter>", key);
    call.arguments[key] = xml_parameter_value(body.substr(key_end + 1, value_end - key_end - 1),
                                              schema_type(tools, call.name, key));
    q = value_end + 12;
  }
  if (!trim(body.substr(fn_end + 11)).empty()) fail("tool call has text after </function>");
  return call;
}

}  // namespace

ToolCall parse_gemma4_tool_call(std::string_view body) {
  std::string_view s = trim(body);
  if (s.substr(0, 5) != "call:") fail("Gemma tool call does not start with 'call:'");
  s.remove_prefix(5);
  size_t brace = s.find('{');
  if (brace == std::string_view::npos) fail("Gemma tool call has no '{{' after the function name");
  ToolCall call;
  call.name = std::string(trim(s.substr(0, brace)));
  if (call.name.empty()) fail("Gemma tool call has an empty function name");
  GemmaArgs args(s.substr(brace));
  call.arguments = args.parse_object(0);
  if (!trim(s.substr(brace + args.pos())).empty()) fail("Gemma tool call has text after its arguments");
  return call;
}

ToolCall parse_qwen_tool_call(std::string_view body, const json& tools) {
  std::string_view s = trim(body);
  if (s.substr(0, 10) == "<function=") return parse_qwen_xml(s, tools);
  json j = json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail("tool call is neither a JSON object nor <function=...>");
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    fail("tool call JSON has no \"name\" string");
  ToolCall call;
  call.name = j["name"].get<std::string>();
  const char* key = j.contains("arguments") ? "arguments" : (j.contains("parameters") ? "parameters" : nullptr);
  if (key) {
    json args = j[key];
    if (args.is_string()) {
      args = json::parse(args.get<std::string>(), nullptr, false);
      if (args.is_discarded()) fail("tool call \"{}\" is a string that is not JSON", key);
    }
    if (!args.is_object()) fail("tool call \"{}\" must be a JSON object", key);
    call.arguments = std::move(args);
  }
  return call;
}

// ---- streaming extraction ----

namespace {
std::vector<std::string> extractor_markers(ToolCallFormat f) {
  if (f == ToolCallFormat::gemma4) return {"<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>"};
  return {"<tool_call>", "</tool_call>"};
}
}  // namespace

ToolCallExtractor::ToolCallExtractor(ToolCallFormat format, json tools)
    : format_(format), tools_(std::move(tools)), scanner_(extractor_markers(format)) {}

void ToolCallExtractor::text(std::vector<ToolCallEvent>& out, std::string_view t) {
  if (t.empty()) return;
  if (inside_) {
    body_.append(t);
    return;
  }
  if (!out.empty() && out.back().kind == ToolCallEvent::Kind::text) {
    out.back().text.append(t);
  } else {
    out.push_back({ToolCallEvent::Kind::text, std::string(t), {}});
  }
}

void ToolCallExtractor::marker(std::vector<ToolCallEvent>& out, size_t index) {
  const auto& markers = scanner_.markers();
  if (index == 0) {  // open
    if (inside_) {
      body_ += markers[0];  // a nested opener is part of the (malformed) body
    } else {
      inside_ = true;
      body_.clear();
    }
    return;
  }
  if (index == 1) {  // close
    if (!inside_) return;  // an orphan closer never reaches the content
    inside_ = false;
    try {
      ToolCall call = format_ == ToolCallFormat::gemma4 ? parse_gemma4_tool_call(body_) : parse_qwen_tool_call(body_, tools_);
      out.push_back({ToolCallEvent::Kind::call, {}, std::move(call)});
    } catch (const fl::Error& e) {
      errors_.push_back(e.what());
      text(out, markers[0] + body_ + markers[1]);
    }
    body_.clear();
    return;
  }
  // Gemma's <|tool_response> ends generation after a call; it is control text, not content.
  if (inside_) body_ += markers[index];
}

void ToolCallExtractor::feed(std::string_view t, std::vector<ToolCallEvent>& out) {
  scanner_.feed(
      t, [&](std::string_view s) { text(out, s); }, [&](size_t i) { marker(out, i); });
}

void ToolCallExtractor::finish(std::vector<ToolCallEvent>& out) {
  scanner_.finish([&](std::string_view s) { text(out, s); }, [&](size_t i) { marker(out, i); });
  if (inside_) {
    inside_ = false;
    errors_.push_back("tool call not terminated before the end of the output");
    text(out, scanner_.markers()[0] + body_);
    body_.clear();
  }
}

std::string make_tool_call_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, static_cast<int>(sizeof(kAlphabet)) - 2);
  std::string id(9, 'x');
  for (char& c : id) c = kAlphabet[pick(rng)];
  return id;
}

json to_openai_tool_call(const ToolCall& call, const std::string& id) {
  return json{{"id", id},
              {"type", "function"},
              {"function", {{"name", call.name}, {"arguments", call.arguments.dump()}}}};
}

ParsedToolCalls extract_tool_calls(std::string_view text, ToolCallFormat format, const json& tools,
                                   const std::function<std::string()>& make_id) {
  ToolCallExtractor extractor(format, tools);
  std::vector<ToolCallEvent> events;
  extractor.feed(text, events);
  extractor.finish(events);
  ParsedToolCalls out;
  out.tool_calls = json::array();
  for (const auto& e : events) {
    if (e.kind == ToolCallEvent::Kind::text) {
      out.content += e.text;
    } else {
      out.tool_calls.push_back(to_openai_tool_call(e.call, make_id ? make_id() : make_tool_call_id()));
    }
  }
  out.errors = extractor.errors();
  return out;
}

}  // namespace fl::chat
