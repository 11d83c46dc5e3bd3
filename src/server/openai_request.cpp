#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "text/tokenizer/utf8.h"

namespace fl::server {
namespace {

using nlohmann::json;

// "a string", "an object", ... for messages.
std::string a_type(const json& j) {
  switch (j.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::number_float:
      return "a number with a fraction";
    default:
      return "a number";
  }
}

// Typed access to one JSON object's fields, naming each field by its path ("messages[2].role").
class Fields {
 public:
  Fields(const json& object, std::string path) : j_(object), path_(std::move(path)) {}

  std::string name(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  // Present and not null.
  const json* get(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool present(std::string_view key) const { return get(key) != nullptr; }

  std::optional<std::string> string(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) invalid_param(name(key), "{} must be a string, got {}", name(key), a_type(*v));
    return v->get<std::string>();
  }
  std::optional<bool> boolean(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) invalid_param(name(key), "{} must be true or false, got {}", name(key), a_type(*v));
    return v->get<bool>();
  }
  std::optional<double> number(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) invalid_param(name(key), "{} must be a number, got {}", name(key), a_type(*v));
    return v->get<double>();
  }
  std::optional<int64_t> integer(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return as_integer(*v, name(key));
  }
  const json* object(std::string_view key) const {
    const json* v = get(key);
    if (v && !v->is_object()) invalid_param(name(key), "{} must be an object, got {}", name(key), a_type(*v));
    return v;
  }
  const json* array(std::string_view key) const {
    const json* v = get(key);
    if (v && !v->is_array()) invalid_param(name(key), "{} must be an array, got {}", name(key), a_type(*v));
    return v;
  }

  static int64_t as_integer(const json& v, const std::string& name) {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        invalid_param(name, "{} = {} is too large", name, v.get<uint64_t>());
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::trunc(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
      invalid_param(name, "{} must be an integer, got {}", name, d);
    }
    invalid_param(name, "{} must be an integer, got {}", name, a_type(v));
  }

 private:
  const json& j_;
  std::string path_;
};

void check_range(const std::string& name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi)) invalid_param(name, "{} = {} is outside [{}, {}]", name, v, lo, hi);
}

void parse_stop(const Fields& f, const RequestLimits& limits, std::vector<std::string>& out) {
  const json* v = f.get("stop");
  if (!v) return;
  auto add = [&](const json& s, const std::string& name) {
    if (!s.is_string()) invalid_param(name, "{} must be a string, got {}", name, a_type(s));
    std::string text = s.get<std::string>();
    if (text.empty()) invalid_param(name, "{} is an empty string, which would stop at once", name);
    if (text.size() > limits.max_stop_bytes)
      invalid_param(name, "{} is {} bytes long; the limit is {}", name, text.size(), limits.max_stop_bytes);
    out.push_back(std::move(text));
  };
  if (v->is_string()) {
    add(*v, "stop");
  } else if (v->is_array()) {
    if (static_cast<int>(v->size()) > limits.max_stop_strings)
      invalid_param("stop", "stop has {} strings; at most {} are allowed", v->size(), limits.max_stop_strings);
    for (size_t i = 0; i < v->size(); ++i) add((*v)[i], fmt::format("stop[{}]", i));
  } else {
    invalid_param("stop", "stop must be a string or an array of strings, got {}", a_type(*v));
  }
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 gen{std::random_device{}()};
  return gen();
}

// Fields shared by chat and completions.
GenerationRequest parse_generation(const Fields& f, const RequestLimits& limits, bool chat,
                                   const SamplingParams& defaults) {
  GenerationRequest g;
  g.sampling = defaults;
  SamplingParams& s = g.sampling;
  if (auto v = f.number("temperature")) check_range("temperature", *v, 0, 2), s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p")) {
    if (!(*v > 0 && *v <= 1)) invalid_param("top_p", "top_p = {} is outside (0, 1]", *v);
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k")) {
    if (*v < 0 || *v > std::numeric_limits<int>::max())
      invalid_param("top_k", "top_k = {} must be 0 (off) or positive", *v);
    s.top_k = static_cast<int>(*v);
  }
  if (auto v = f.number("min_p")) check_range("min_p", *v, 0, 1), s.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty"))
    check_range("presence_penalty", *v, -2, 2), s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty"))
    check_range("frequency_penalty", *v, -2, 2), s.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty")) {
    if (!(*v > 0 && *v <= 100)) invalid_param("repetition_penalty", "repetition_penalty = {} is outside (0, 100]", *v);
    s.repetition_penalty = static_cast<float>(*v);
  }
  s.seed = random_seed();
  if (auto v = f.integer("seed")) s.seed = static_cast<uint64_t>(*v);
  if (const json* bias = f.object("logit_bias")) {
    for (const auto& [key, value] : bias->items()) {
      const std::string name = "logit_bias." + key;
      int64_t id = -1;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id > std::numeric_limits<int32_t>::max())
        invalid_param(name, "logit_bias keys must be token ids (non-negative integers), got \"{}\"", key);
      if (!value.is_number()) invalid_param(name, "{} must be a number, got {}", name, a_type(value));
      check_range(name, value.get<double>(), -100, 100);
      s.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    }
  }
  try {
    s.validate();
  } catch (const Error& e) {
    invalid_param("", "{}", e.what());
  }

  // max_completion_tokens is the current OpenAI name; max_tokens the older one (and the only one
  // /v1/completions has). When both are given, max_completion_tokens wins.
  std::optional<int64_t> max_tokens = f.integer("max_tokens");
  std::string max_name = "max_tokens";
  if (chat) {
    if (auto v = f.integer("max_completion_tokens")) max_tokens = v, max_name = "max_completion_tokens";
  }
  // (0: an echoed completion that only scores its prompt)
  const bool echo = !chat && f.boolean("echo").value_or(false);
  if (max_tokens && *max_tokens < (echo ? 0 : 1))
    invalid_param(max_name, "{} = {} must be at least {}{}", max_name, *max_tokens, echo ? 0 : 1,
                  !chat && *max_tokens == 0 ? " (0 only with echo: true)" : "");
  g.max_tokens = max_tokens;

  parse_stop(f, limits, g.stop);

  g.stream = f.boolean("stream").value_or(false);
  if (const json* opts = f.object("stream_options")) {
    if (!g.stream) invalid_param("stream_options", "stream_options is only allowed when stream is true");
    g.include_usage = Fields(*opts, "stream_options").boolean("include_usage").value_or(false);
  }

  if (auto n = f.integer("n")) {
    if (*n < 1 || *n > static_cast<int64_t>(kMaxChoices))
      invalid_param("n", "n = {} is outside [1, {}]", *n, kMaxChoices);
    g.n = static_cast<int>(*n);
  }
  // Log-probabilities: chat `logprobs: true` with `top_logprobs` alternatives (0 .. 20); the
  // legacy completions `logprobs: N` (0 .. 5: N alternatives, the sampled token's always given).
  if (chat) {
    const bool wanted = f.boolean("logprobs").value_or(false);
    const std::optional<int64_t> top = f.integer("top_logprobs");
    if (top && (*top < 0 || *top > 20)) invalid_param("top_logprobs", "top_logprobs = {} is outside [0, 20]", *top);
    if (top && *top > 0 && !wanted)
      invalid_param("top_logprobs", "top_logprobs needs logprobs: true (it says how many alternatives to list)");
    if (wanted) g.logprobs = static_cast<int>(top.value_or(0));
  } else if (const json* lp = f.get("logprobs"); lp && lp->is_boolean()) {
    if (lp->get<bool>()) g.logprobs = 0;  // (chat's spelling: the sampled tokens', no alternatives)
  } else if (auto n = f.integer("logprobs")) {
    if (*n < 0 || *n > 5) invalid_param("logprobs", "logprobs = {} is outside [0, 5]", *n);
    g.logprobs = static_cast<int>(*n);
  }
  if (const json* model = f.get("model"); model && !model->is_string())
    invalid_param("model", "model must be a string, got {}", a_type(*model));
  return g;
}

// response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: the schema,
// compiled (runtime/json_schema.h says what it may use; anything else is a 400 naming it).
std::shared_ptr<const JsonSchema> parse_json_schema(const Fields& rf) {
  const json* spec = rf.object("json_schema");
  if (!spec) invalid_param("response_format.json_schema", "response_format json_schema needs a json_schema object");
  Fields f(*spec, "response_format.json_schema");
  if (auto name = f.string("name"); name && name->size() > 64)
    invalid_param("response_format.json_schema.name", "the schema's name is longer than 64 characters");
  f.boolean("strict");  // (checked for type; fireline always enforces the schema)
  const json* schema = f.object("schema");
  if (!schema) invalid_param("response_format.json_schema.schema", "response_format.json_schema needs a schema object");
  try {
    return std::make_shared<const JsonSchema>(JsonSchema::compile(*schema));
  } catch (const Error& e) {
    invalid_param("response_format.json_schema.schema", "{}", e.what());
  }
}

// A message's content: a string, or an array of text parts, joined.
std::optional<std::string> parse_content(const json* content, const std::string& name) {
  if (!content) return std::nullopt;
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    invalid_param(name, "{} must be a string or an array of content parts, got {}", name, a_type(*content));
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const json& part = (*content)[i];
    const std::string part_name = fmt::format("{}[{}]", name, i);
    if (!part.is_object()) invalid_param(part_name, "{} must be an object, got {}", part_name, a_type(part));
    Fields pf(part, part_name);
    const std::string type = pf.string("type").value_or("");
    if (type != "text")
      invalid_param(part_name + ".type", "{}.type \"{}\" is not supported: this model reads text parts only", part_name,
                    type);
    auto t = pf.string("text");
    if (!t) invalid_param(part_name + ".text", "{}.text is missing", part_name);
    text += *t;
  }
  return text;
}

ChatMessage parse_message(const json& m, size_t index, const RequestLimits& limits) {
  const std::string path = fmt::format("messages[{}]", index);
  if (!m.is_object()) invalid_param(path, "{} must be an object, got {}", path, a_type(m));
  Fields f(m, path);
  ChatMessage msg;
  auto role = f.string("role");
  if (!role) invalid_param(path + ".role", "{}.role is missing", path);
  msg.role = *role;
  if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" &&
      msg.role != "tool")
    invalid_param(path + ".role", "{}.role \"{}\" is not a known role (system, developer, user, assistant, tool)", path,
                  msg.role);
  msg.content = parse_content(f.get("content"), path + ".content");
  msg.name = f.string("name").value_or("");
  if (msg.role == "assistant") {
    msg.reasoning_content = f.string("reasoning_content");
    if (const json* calls = f.array("tool_calls")) {
      for (size_t i = 0; i < calls->size(); ++i) {
        const std::string cpath = fmt::format("{}.tool_calls[{}]", path, i);
        const json& c = (*calls)[i];
        if (!c.is_object()) invalid_param(cpath, "{} must be an object, got {}", cpath, a_type(c));
        Fields cf(c, cpath);
        if (auto type = cf.string("type"); type && *type != "function")
          invalid_param(cpath + ".type", "{}.type \"{}\" is not supported (only \"function\")", cpath, *type);
        const json* fn = cf.object("function");
        if (!fn) invalid_param(cpath + ".function", "{}.function is missing", cpath);
        Fields ff(*fn, cpath + ".function");
        ChatToolCall call;
        call.id = cf.string("id").value_or("");
        auto name = ff.string("name");
        if (!name || name->empty()) invalid_param(cpath + ".function.name", "{}.function.name is missing", cpath);
        call.name = *name;
        if (const json* args = ff.get("arguments")) {
          if (args->is_string()) {
            call.arguments_json = args->get<std::string>();
            check_json_shape(call.arguments_json, limits, cpath + ".function.arguments");
          } else if (args->is_object())
            call.arguments_json = args->dump();
          else
            invalid_param(cpath + ".function.arguments",
                          "{}.function.arguments must be a JSON string or an object, got {}", cpath, a_type(*args));
        } else {
          call.arguments_json = "{}";
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    if (!msg.content && msg.tool_calls.empty() && !msg.reasoning_content)
      invalid_param(path + ".content", "{} (assistant) has neither content nor tool_calls", path);
  } else if (!msg.content) {
    invalid_param(path + ".content", "{}.content is missing ({} messages need text)", path, msg.role);
  }
  if (msg.role == "tool") msg.tool_call_id = f.string("tool_call_id").value_or("");
  return msg;
}

std::vector<ToolDefinition> parse_tools(const Fields& f) {
  std::vector<ToolDefinition> tools;
  const json* arr = f.array("tools");
  if (!arr) return tools;
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string path = fmt::format("tools[{}]", i);
    const json& t = (*arr)[i];
    if (!t.is_object()) invalid_param(path, "{} must be an object, got {}", path, a_type(t));
    Fields tf(t, path);
    if (auto type = tf.string("type"); type != "function")
      invalid_param(path + ".type", "{}.type must be \"function\"", path);
    const json* fn = tf.object("function");
    if (!fn) invalid_param(path + ".function", "{}.function is missing", path);
    Fields ff(*fn, path + ".function");
    ToolDefinition def;
    auto name = ff.string("name");
    if (!name || name->empty()) invalid_param(path + ".function.name", "{}.function.name is missing", path);
    for (const auto& other : tools)
      if (other.name == *name) invalid_param(path + ".function.name", "two tools are named \"{}\"", *name);
    def.name = *name;
    def.description = ff.string("description").value_or("");
    const json* params = ff.object("parameters");
    def.parameters_json = params ? params->dump() : "{}";
    tools.push_back(std::move(def));
  }
  return tools;
}

ToolChoice parse_tool_choice(const Fields& f, const std::vector<ToolDefinition>& tools) {
  ToolChoice choice;
  const json* v = f.get("tool_choice");
  if (!v) return choice;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "auto")
      choice.mode = ToolChoice::Mode::automatic;
    else if (s == "none")
      choice.mode = ToolChoice::Mode::none;
    else if (s == "required")
      choice.mode = ToolChoice::Mode::required;
    else
      invalid_param("tool_choice", "tool_choice \"{}\" is not one of \"auto\", \"none\", \"required\"", s);
  } else if (v->is_object()) {
    Fields cf(*v, "tool_choice");
    if (cf.string("type") != "function") invalid_param("tool_choice.type", "tool_choice.type must be \"function\"");
    const json* fn = cf.object("function");
    auto name = fn ? Fields(*fn, "tool_choice.function").string("name") : std::nullopt;
    if (!name) invalid_param("tool_choice.function.name", "tool_choice.function.name is missing");
    choice.mode = ToolChoice::Mode::named;
    choice.name = *name;
    bool known = false;
    for (const auto& t : tools) known = known || t.name == choice.name;
    if (!known) invalid_param("tool_choice", "tool_choice names \"{}\", which is not in tools", choice.name);
  } else {
    invalid_param("tool_choice", "tool_choice must be a string or an object, got {}", a_type(*v));
  }
  if (tools.empty() && (choice.mode == ToolChoice::Mode::required || choice.mode == ToolChoice::Mode::named))
    invalid_param("tool_choice", "tool_choice requires a tool call but the request has no tools");
  return choice;
}

}  // namespace

void check_json_shape(std::string_view text, const RequestLimits& limits, const std::string& what) {
  // One pass without recursion: the JSON parser is iterative, but much that later walks values
  // (serialising, the chat template) is not, and ordered objects insert in linear time, so depth
  // and object width are bounded before anything walks them. Strings are skipped (but for NUL).
  const std::string param = what == "request body" ? "" : what;
  std::vector<int> keys;  // members so far of each open object (-1 for arrays)
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    // The parser stops at a NUL byte as at the end of the text, so what followed one was dropped
    // unread. JSON holds no raw NUL (a string spells it \u0000).
    if (c == '\0')
      throw ApiError(
          400, "invalid_request_error",
          fmt::format("{} holds a NUL byte (at byte {}); JSON text cannot (write \\u0000 in a string)", what, i),
          param);
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      keys.push_back(c == '{' ? 0 : -1);
      if (static_cast<int>(keys.size()) > limits.max_json_depth)
        throw ApiError(
            400, "invalid_request_error",
            fmt::format("{} nests arrays/objects deeper than {} levels (at byte {})", what, limits.max_json_depth, i),
            param);
    } else if (c == ']' || c == '}') {
      if (!keys.empty()) keys.pop_back();
    } else if (c == ':' && !keys.empty() && keys.back() >= 0) {
      if (++keys.back() > limits.max_object_members)
        throw ApiError(
            400, "invalid_request_error",
            fmt::format("{} has an object with more than {} members (at byte {})", what, limits.max_object_members, i),
            param);
    }
  }
}

json parse_json_body(std::string_view body, const RequestLimits& limits) {
  if (body.empty()) throw ApiError(400, "invalid_request_error", "request body is empty; expected a JSON object");
  if (!utf8::is_valid(body)) {
    size_t pos = 0;
    while (pos < body.size()) {
      char32_t cp;
      bool valid;
      const size_t n = utf8::decode(body, pos, cp, valid);
      if (!valid) break;
      pos += n;
    }
    throw ApiError(400, "invalid_request_error", fmt::format("request body is not valid UTF-8 (byte {})", pos));
  }
  check_json_shape(body, limits, "request body");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at ..." -> "parse error at ..."
    if (const size_t close = what.find("] "); what.rfind("[json.exception.", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    throw ApiError(400, "invalid_request_error", "request body is not valid JSON: " + what);
  }
  if (!j.is_object())
    throw ApiError(400, "invalid_request_error", "request body must be a JSON object, got " + a_type(j));
  return j;
}

ChatRequest parse_chat_request(const json& body, const RequestLimits& limits, const SamplingParams& defaults) {
  Fields f(body, "");
  ChatRequest r;
  const json* messages = f.get("messages");
  if (!messages) invalid_param("messages", "messages is missing");
  if (!messages->is_array()) invalid_param("messages", "messages must be an array, got {}", a_type(*messages));
  if (messages->empty()) invalid_param("messages", "messages is empty; send at least one message");
  for (size_t i = 0; i < messages->size(); ++i) r.prompt.messages.push_back(parse_message((*messages)[i], i, limits));

  r.generation = parse_generation(f, limits, /*chat=*/true, defaults);
  r.prompt.tools = parse_tools(f);
  r.tool_choice = parse_tool_choice(f, r.prompt.tools);
  if (r.tool_choice.mode == ToolChoice::Mode::none) r.prompt.tools.clear();

  if (const json* rf = f.object("response_format")) {
    const std::string type = Fields(*rf, "response_format").string("type").value_or("");
    if (type == "json_object")
      r.response_format = ResponseFormat::json_object;
    else if (type == "text")
      r.response_format = ResponseFormat::text;
    else if (type == "json_schema") {
      r.json_schema = parse_json_schema(Fields(*rf, "response_format"));
      r.response_format = ResponseFormat::json_schema;
    } else
      invalid_param("response_format.type",
                    "response_format.type \"{}\" is not one of \"text\", \"json_object\", \"json_schema\"", type);
  }

  std::optional<bool> enable_thinking;
  if (const json* kwargs = f.object("chat_template_kwargs")) {
    for (const auto& [key, value] : kwargs->items()) {
      if (key == "enable_thinking") {
        if (!value.is_boolean())
          invalid_param("chat_template_kwargs.enable_thinking",
                        "chat_template_kwargs.enable_thinking must be true or false, got {}", a_type(value));
        enable_thinking = value.get<bool>();
      } else {
        r.prompt.template_kwargs[key] = value;
      }
    }
  }
  r.reasoning_effort = f.string("reasoning_effort");
  if (r.reasoning_effort) {
    const std::string& e = *r.reasoning_effort;
    if (e != "none" && e != "minimal" && e != "low" && e != "medium" && e != "high")
      invalid_param("reasoning_effort", "reasoning_effort \"{}\" is not one of none, minimal, low, medium, high", e);
    const bool wants = e != "none";
    if (enable_thinking && *enable_thinking != wants)
      invalid_param("reasoning_effort", "reasoning_effort \"{}\" contradicts chat_template_kwargs.enable_thinking = {}",
                    e, *enable_thinking);
    enable_thinking = wants;
  }
  if (auto budget = f.integer("thinking_budget")) {
    if (*budget < 0) invalid_param("thinking_budget", "thinking_budget = {} must not be negative", *budget);
    if (*budget > 0 && enable_thinking == false)
      invalid_param("thinking_budget", "thinking_budget is set but thinking is disabled");
    r.thinking_budget = budget;
  }
  r.prompt.enable_thinking = enable_thinking;
  return r;
}

CompletionRequest parse_completion_request(const json& body, const RequestLimits& limits,
                                           const SamplingParams& defaults) {
  Fields f(body, "");
  CompletionRequest r;
  const json* prompt = f.get("prompt");
  if (!prompt) invalid_param("prompt", "prompt is missing");
  auto token_ids = [&](const json& arr, const std::string& name) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string n = fmt::format("{}[{}]", name, i);
      const int64_t id = Fields::as_integer(arr[i], n);
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) invalid_param(n, "{} = {} is not a token id", n, id);
      ids.push_back(static_cast<int32_t>(id));
    }
    if (ids.empty()) invalid_param(name, "{} is an empty list of token ids", name);
    return ids;
  };
  // A string, token ids, or a list of those (several prompts: one choice each, in order).
  if (prompt->is_string()) {
    r.prompts.push_back({prompt->get<std::string>(), std::nullopt});
  } else if (prompt->is_array()) {
    if (prompt->empty()) invalid_param("prompt", "prompt is an empty array");
    const json& first = (*prompt)[0];
    if (first.is_string() || first.is_array()) {
      if (prompt->size() > kMaxCompletionPrompts)
        invalid_param("prompt", "prompt holds {} prompts; at most {} in one request", prompt->size(),
                      kMaxCompletionPrompts);
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        const std::string name = fmt::format("prompt[{}]", i);
        if (p.is_string())
          r.prompts.push_back({p.get<std::string>(), std::nullopt});
        else if (p.is_array())
          r.prompts.push_back({{}, token_ids(p, name)});
        else
          invalid_param(name, "{} must be a string or an array of token ids, got {}", name, a_type(p));
      }
    } else {
      r.prompts.push_back({{}, token_ids(*prompt, "prompt")});
    }
  } else {
    invalid_param("prompt", "prompt must be a string, an array of token ids, or an array of those, got {}",
                  a_type(*prompt));
  }
  for (size_t i = 0; i < r.prompts.size(); ++i)
    if (!r.prompts[i].tokens && r.prompts[i].text.empty())
      invalid_param(r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i), "the prompt is empty");
  r.echo = f.boolean("echo").value_or(false);
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty()) invalid_param("suffix", "suffix is not supported");
  if (auto best = f.integer("best_of"); best && *best != 1)
    invalid_param("best_of", "best_of = {}: only 1 is supported", *best);
  r.generation = parse_generation(f, limits, /*chat=*/false, defaults);
  return r;
}

int64_t resolve_max_tokens(std::optional<int64_t> requested, int64_t prompt_tokens, int64_t context_length,
                           const std::string& prompt_param) {
  if (prompt_tokens >= context_length)
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt is {} tokens, which leaves no room in the context of {} tokens; shorten it",
                               prompt_tokens, context_length),
                   prompt_param, "context_length_exceeded");
  const int64_t room = context_length - prompt_tokens;
  if (!requested) return room;
  if (*requested > context_length)
    throw ApiError(400, "invalid_request_error",
                   fmt::format("max_tokens = {} is larger than the context of {} tokens", *requested, context_length),
                   "max_tokens", "context_length_exceeded");
  if (*requested > room)
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt ({} tokens) plus max_tokens ({}) is {} tokens, past the context of {}; "
                               "lower max_tokens to at most {} or shorten the prompt",
                               prompt_tokens, *requested, prompt_tokens + *requested, context_length, room),
                   "max_tokens", "context_length_exceeded");
  return *requested;
}

ThinkingOptions resolve_thinking(const ChatRequest& request, int64_t max_tokens) {
  ThinkingOptions t;
  t.enabled = request.prompt.enable_thinking;
  if (request.thinking_budget && *request.thinking_budget > 0) {
    if (*request.thinking_budget >= max_tokens)
      invalid_param("thinking_budget",
                    "thinking_budget ({}) must be smaller than max_tokens ({}): reasoning counts toward max_tokens, "
                    "so this budget leaves no room for the answer",
                    *request.thinking_budget, max_tokens);
    t.budget_tokens = *request.thinking_budget;
    return t;
  }
  // reasoning_effort: minimal, low and medium cap reasoning at 256, 1024 and 4096 tokens but never
  // at more than half of max_tokens, so an answer always fits; high has no cap but max_tokens.
  if (request.reasoning_effort) {
    const std::string& e = *request.reasoning_effort;
    const int64_t budget = e == "minimal" ? 256 : e == "low" ? 1024 : e == "medium" ? 4096 : 0;
    if (budget > 0 && max_tokens / 2 >= 1) t.budget_tokens = std::min(budget, max_tokens / 2);
  }
  return t;
}

}  // namespace fl::server
