#include "text/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/fire_file.h"
#include "io/gguf.h"

namespace fl::chat {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::ordered_json parse_json_file(const fs::path& path) {
  std::string text = read_file(path);
  auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) fail("{} is not valid JSON", path.string());
  return json;
}

// chat_template is a string, or a list of {"name": ..., "template": ...} (several named templates).
std::string pick_template(const nlohmann::ordered_json& value, const fs::path& from, bool want_tools) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    const nlohmann::ordered_json* fallback = nullptr;
    for (const auto& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template")) continue;
      if (want_tools && entry["name"] == "tool_use" && entry["template"].is_string()) return entry["template"];
      if (entry["name"] == "default") fallback = &entry;
    }
    if (fallback && (*fallback)["template"].is_string()) return (*fallback)["template"];
    fail("{}: chat_template has no template named 'default'", from.string());
  }
  fail("{}: chat_template is neither a string nor a list of named templates", from.string());
}

ChatTemplateSource from_config(const fs::path& path, bool want_tools) {
  auto config = parse_json_file(path);
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null())
    fail("{} has no chat_template", path.string());
  ChatTemplateSource out;
  out.source = pick_template(config["chat_template"], path, want_tools);
  out.name = path.string();
  out.bos_token = special_token(config, "bos_token");
  out.eos_token = special_token(config, "eos_token");
  return out;
}

bool is_gguf_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

// The text of the token whose id metadata `id_key` holds (tokenizer.ggml.bos_token_id, ...), or
// nullopt when the file does not say.
std::optional<std::string> gguf_token_text(const GgufFile& file, std::string_view id_key) {
  const GgufValue* id = file.find_metadata(id_key);
  if (!id) return std::nullopt;
  const GgufValue* tokens = file.find_metadata("tokenizer.ggml.tokens");
  if (!id->is_integer()) fail("{}: {} is not an integer", file.path(), id_key);
  if (!tokens || tokens->type != GgufValueType::array || tokens->element_type != GgufValueType::string)
    fail("{}: {} is set but tokenizer.ggml.tokens is missing or not an array of strings", file.path(), id_key);
  if (id->integer < 0 || static_cast<uint64_t>(id->integer) >= tokens->items.size())
    fail("{}: {} {} is out of range (the vocabulary has {} tokens)", file.path(), id_key, id->integer,
         tokens->items.size());
  return tokens->items[static_cast<size_t>(id->integer)].text;
}

ChatTemplateSource from_gguf(const fs::path& path, bool want_tools) {
  const GgufFile file(path.string());
  ChatTemplateSource out;
  std::string key(fire_key::kChatTemplate);
  if (want_tools && file.find_metadata(key + ".tool_use")) key += ".tool_use";
  auto text = file.metadata_string(key);
  if (!text) fail("{}: no {} in this GGUF file", path.string(), fire_key::kChatTemplate);
  out.source = std::move(*text);
  out.name = fmt::format("{} ({})", path.string(), key);
  if (auto config_text = file.metadata_string(fire_key::kTokenizerConfig)) {
    auto config = nlohmann::ordered_json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) fail("{}: {} is not valid JSON", path.string(), fire_key::kTokenizerConfig);
    out.bos_token = special_token(config, "bos_token");
    out.eos_token = special_token(config, "eos_token");
  } else {
    out.bos_token = gguf_token_text(file, "tokenizer.ggml.bos_token_id");
    out.eos_token = gguf_token_text(file, "tokenizer.ggml.eos_token_id");
  }
  return out;
}

}  // namespace

std::optional<std::string> special_token(const nlohmann::ordered_json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

ChatTemplateSource load_chat_template(const std::string& path_text, bool want_tools) {
  const fs::path path(path_text);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    ChatTemplateSource out;
    const fs::path config = path / "tokenizer_config.json";
    const bool have_config = fs::exists(config);
    if (fs::exists(path / "chat_template.jinja")) {
      out.source = read_file(path / "chat_template.jinja");
      out.name = (path / "chat_template.jinja").string();
    } else if (fs::exists(path / "chat_template.json")) {
      auto json = parse_json_file(path / "chat_template.json");
      if (!json.is_object() || !json.contains("chat_template"))
        fail("{} has no chat_template", (path / "chat_template.json").string());
      out.source = pick_template(json["chat_template"], path / "chat_template.json", want_tools);
      out.name = (path / "chat_template.json").string();
    } else if (have_config) {
      return from_config(config, want_tools);
    } else {
      fail("{} has no chat_template.jinja, chat_template.json or tokenizer_config.json", path.string());
    }
    if (have_config) {
      auto json = parse_json_file(config);
      out.bos_token = special_token(json, "bos_token");
      out.eos_token = special_token(json, "eos_token");
    }
    return out;
  }
  if (!fs::exists(path, ec)) fail("{} does not exist", path.string());
  if (path.extension() == ".json") return from_config(path, want_tools);
  if (is_gguf_file(path)) return from_gguf(path, want_tools);
  ChatTemplateSource out;
  out.source = read_file(path);
  out.name = path.string();
  return out;
}

nlohmann::ordered_json build_template_context(const ChatInputs& inputs) {
  if (!inputs.messages.is_array()) fail("messages must be a JSON array");
  if (!inputs.tools.is_null() && !inputs.tools.is_array()) fail("tools must be a JSON array");
  if (!inputs.extra.is_object()) fail("extra template variables must be a JSON object");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = inputs.messages;
  ctx["tools"] = inputs.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = inputs.add_generation_prompt;
  if (inputs.bos_token) ctx["bos_token"] = *inputs.bos_token;
  if (inputs.eos_token) ctx["eos_token"] = *inputs.eos_token;
  if (inputs.enable_thinking) ctx["enable_thinking"] = *inputs.enable_thinking;
  for (const auto& [key, value] : inputs.extra.items()) ctx[key] = value;
  return ctx;
}

nlohmann::ordered_json parse_tool_call_arguments(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  if (!out.is_array()) return out;
  for (auto& message : out) {
    if (!message.is_object() || !message.contains("tool_calls") || !message["tool_calls"].is_array()) continue;
    for (auto& call : message["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      auto parsed = nlohmann::ordered_json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
  }
  return out;
}

ChatTemplate::ChatTemplate(ChatTemplateSource source)
    : source_(std::move(source)), template_(source_.source, jinja::TemplateOptions{.name = source_.name}) {}

std::string ChatTemplate::apply(ChatInputs inputs, const jinja::RenderOptions& options) const {
  if (!inputs.bos_token) inputs.bos_token = source_.bos_token;
  if (!inputs.eos_token) inputs.eos_token = source_.eos_token;
  return template_.render(build_template_context(inputs), options);
}

}  // namespace fl::chat
