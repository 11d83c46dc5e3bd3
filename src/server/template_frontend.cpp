#include "server/template_frontend.h"

#include "server/api_error.h"

namespace fl::server {
namespace {

using nlohmann::ordered_json;

// JSON text the request parser already checked (depth and width); a string that is not JSON
// stays a string, as transformers leaves it.
ordered_json json_or_string(const std::string& text) {
  ordered_json parsed = ordered_json::parse(text, nullptr, false);
  return parsed.is_discarded() ? ordered_json(text) : parsed;
}

}  // namespace

TemplatePromptFrontend::TemplatePromptFrontend(chat::ChatTemplate chat_template, Tokenizer tokenizer,
                                               jinja::Limits limits)
    : template_(std::move(chat_template)), tokenizer_(std::move(tokenizer)) {
  render_options_.limits = limits;
}

PreparedPrompt TemplatePromptFrontend::render_chat(const ChatPrompt& chat) const {
  chat::ChatInputs inputs;
  for (const auto& m : chat.messages) {
    ordered_json msg = {{"role", m.role}};
    // A null content (an assistant turn that only called tools) becomes "": templates such as
    // Qwen3's test `'</think>' in message.content`, which fails on None (vLLM does the same).
    msg["content"] = m.content.value_or("");
    if (m.reasoning_content) msg["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& c : m.tool_calls) {
        ordered_json call = {{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}};
        if (!c.id.empty()) call["id"] = c.id;
        calls.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) msg["name"] = m.name;
    inputs.messages.push_back(std::move(msg));
  }
  inputs.messages = chat::parse_tool_call_arguments(inputs.messages);
  if (!chat.tools.empty()) {
    inputs.tools = ordered_json::array();
    for (const auto& t : chat.tools) {
      ordered_json fn = {{"name", t.name}};
      if (!t.description.empty()) fn["description"] = t.description;
      fn["parameters"] = json_or_string(t.parameters_json);
      inputs.tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
  }
  inputs.add_generation_prompt = true;
  inputs.enable_thinking = chat.enable_thinking;
  inputs.extra = chat.template_kwargs;

  PreparedPrompt p;
  p.text = template_.apply(std::move(inputs), render_options_);  // TemplateError is an fl::Error: 400
  p.tokens = tokenizer_.encode(p.text, /*add_special_tokens=*/false);
  p.token_count = static_cast<int64_t>(p.tokens.size());
  return p;
}

PreparedPrompt TemplatePromptFrontend::prepare_text(std::string_view text) const {
  PreparedPrompt p;
  p.text = std::string(text);
  p.tokens = tokenizer_.encode(text, /*add_special_tokens=*/true);
  p.token_count = static_cast<int64_t>(p.tokens.size());
  return p;
}

PreparedPrompt TemplatePromptFrontend::prepare_tokens(std::span<const int32_t> ids) const {
  const int32_t vocab = tokenizer_.vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      invalid_param("prompt", "prompt[{}] = {} is not a token id of this model (its vocabulary is 0..{})", i, ids[i],
                    vocab - 1);
  PreparedPrompt p;
  p.tokens.assign(ids.begin(), ids.end());
  p.text = tokenizer_.decode(ids);
  p.token_count = static_cast<int64_t>(ids.size());
  return p;
}

}  // namespace fl::server
