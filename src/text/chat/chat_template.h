#pragma once
// Turning a conversation into a prompt with the model's own chat template: finding the template
// (a .jinja file, a tokenizer_config.json, or a Hugging Face model directory), and building the
// variables the template sees exactly as transformers' apply_chat_template does
// (messages, tools, documents, add_generation_prompt, the special tokens, extra kwargs such as
// enable_thinking).
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/template.h"

namespace fl::chat {

struct ChatTemplateSource {
  std::string source;  // the Jinja text
  std::string name;    // for error messages: the file it came from
  std::optional<std::string> bos_token, eos_token;  // from tokenizer_config.json when present
};

// PATH may be: a .jinja (or any text) file; a tokenizer_config.json (its chat_template, and
// bos_token/eos_token); a directory with chat_template.jinja, chat_template.json or
// tokenizer_config.json; a .fire or other GGUF file (tokenizer.chat_template, with bos/eos from
// fireline.tokenizer_config or else the tokens tokenizer.ggml.bos/eos_token_id name). When a config
// holds several named templates, `want_tools` picks "tool_use" if it exists (as transformers
// does), else "default"; in a GGUF file that is tokenizer.chat_template.tool_use.
ChatTemplateSource load_chat_template(const std::string& path, bool want_tools = false);

// Reads bos_token / eos_token from a parsed tokenizer_config.json (a string, or an AddedToken
// object with "content"; null or absent gives nullopt).
std::optional<std::string> special_token(const nlohmann::ordered_json& config, const char* key);

struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;   // null when the request has none (passed as none, like transformers)
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // unset: the template's own default
  std::optional<std::string> bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template kwargs
};

// The template variables for `inputs`. Keys, in order: messages, tools, documents,
// add_generation_prompt, bos_token, eos_token (when known), enable_thinking (when set), extra.
nlohmann::ordered_json build_template_context(const ChatInputs& inputs);

// OpenAI clients send tool_calls[].function.arguments as a JSON string, but templates (Gemma 4's
// raises on it) expect an object: returns messages with every such string that parses as a JSON
// object replaced by the object. Other values are left alone.
nlohmann::ordered_json parse_tool_call_arguments(const nlohmann::ordered_json& messages);

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatTemplateSource source);
  // Renders `inputs`, filling bos/eos from the template's config when the inputs leave them unset.
  std::string apply(ChatInputs inputs, const jinja::RenderOptions& options = {}) const;
  const ChatTemplateSource& source() const { return source_; }

 private:
  ChatTemplateSource source_;
  jinja::Template template_;
};

}  // namespace fl::chat
