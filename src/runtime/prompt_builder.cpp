#include "runtime/prompt_builder.h"

#include <variant>

#include "core/error.h"

namespace fl {

ThinkMode parse_think_mode(std::string_view name) {
  if (name == "off") return ThinkMode::off;
  if (name == "low") return ThinkMode::low;
  if (name == "med" || name == "medium") return ThinkMode::med;
  if (name == "high") return ThinkMode::high;
  if (name == "max") return ThinkMode::max;
  fail("thinking mode '{}' is not one of off, low, med, high, max", name);
}

const char* think_mode_name(ThinkMode mode) {
  switch (mode) {
    case ThinkMode::template_default: return "default";
    case ThinkMode::off: return "off";
    case ThinkMode::low: return "low";
    case ThinkMode::med: return "med";
    case ThinkMode::high: return "high";
    case ThinkMode::max: return "max";
  }
  return "default";
}

int64_t think_token_cap(ThinkMode mode) {
  switch (mode) {
    case ThinkMode::off: return 0;
    case ThinkMode::low: return 512;
    case ThinkMode::template_default:
    case ThinkMode::med: return 2048;
    case ThinkMode::high: return 8192;
    case ThinkMode::max: return 32768;
  }
  return 0;
}

ChatFormat detect_chat_format(const Tokenizer& tokenizer) {
  auto has = [&](const char* token) { return tokenizer.token_to_id(token).has_value(); };
  ChatFormat f;
  if (has("<|channel>") && has("<channel|>")) {
    f.reasoning = chat::ReasoningSyntax::gemma4();
  } else if (has("<think>") && has("</think>")) {
    f.reasoning = chat::ReasoningSyntax::think_tags();
  }
  if (has("<|tool_call>") && has("<tool_call|>")) {
    f.tool_calls = chat::ToolCallFormat::gemma4;
  } else if (has("<tool_call>") && has("</tool_call>")) {
    f.tool_calls = chat::ToolCallFormat::qwen;
  }
  return f;
}

ModelText load_model_text(const ModelSource& source) {
  const std::string tokenizer_json = source.tokenizer_json();
  if (tokenizer_json.empty())
    fail("{} has no tokenizer.json, which generation needs (put the model's tokenizer.json next to its config.json, "
         "or quantize from a directory that has one)",
         source.path());
  ModelText t(Tokenizer::from_json(tokenizer_json, {}, source.path() + ": tokenizer.json"));
  t.name = source.path();

  int32_t config_bos = -1;
  std::vector<int32_t> config_eos;
  std::visit(
      [&](const auto& c) {
        // Qwen3.5 names no BOS (its prompts start without one).
        if constexpr (requires { c.bos_token_id; }) config_bos = c.bos_token_id;
        config_eos.assign(c.eos_token_ids.begin(), c.eos_token_ids.end());
        t.max_context = c.max_position_embeddings;
      },
      source.config().arch);
  t.defaults = parse_generation_config(source.generation_config_json(), config_eos, source.path() + ": generation_config.json");
  if (t.defaults.eos_ids.empty() && t.tokenizer.eos_id()) t.defaults.eos_ids.push_back(*t.tokenizer.eos_id());

  // The BOS as generation_config names it, else config.json, else the tokenizer's; kept only when
  // the vocabulary has such a token.
  std::optional<int32_t> bos = t.defaults.bos_id;
  if (!bos && config_bos >= 0) bos = config_bos;
  if (!bos) bos = t.tokenizer.bos_id();
  if (bos && t.tokenizer.id_to_token(*bos)) t.bos_id = bos;
  if (t.bos_id) {
    const std::vector<int32_t> with = t.tokenizer.encode("a", true), without = t.tokenizer.encode("a", false);
    t.tokenizer_adds_bos = !with.empty() && with.front() == *t.bos_id && (without.empty() || without.front() != *t.bos_id);
  }

  const std::string template_text = source.chat_template();
  if (!template_text.empty()) {
    chat::ChatTemplateSource ts;
    ts.source = template_text;
    ts.name = source.path() + ": chat template";
    if (t.bos_id) ts.bos_token = t.tokenizer.id_to_token(*t.bos_id);
    if (!t.defaults.eos_ids.empty()) ts.eos_token = t.tokenizer.id_to_token(t.defaults.eos_ids.front());
    try {
      t.chat_template = std::make_shared<const chat::ChatTemplate>(std::move(ts));
    } catch (const Error& e) {
      t.chat_template_error = e.what();
    }
  }
  t.format = detect_chat_format(t.tokenizer);
  return t;
}

PromptBuilder::PromptBuilder(std::shared_ptr<const ModelText> text) : text_(std::move(text)) { FL_ASSERT(text_); }

Prompt PromptBuilder::build(const PromptRequest& request) const {
  const ModelText& m = *text_;
  Prompt p;
  if (request.raw) {
    if (request.raw->empty()) fail("the prompt is empty");
    p.text = *request.raw;
    p.ids = m.tokenizer.encode(p.text, /*add_special_tokens=*/true);
    return p;
  }
  if (!m.chat_template) {
    if (!m.chat_template_error.empty()) fail("{}", m.chat_template_error);
    fail("{} has no chat template, so it cannot chat; use a plain completion (--raw in the CLI)", m.name);
  }
  if (!request.messages.is_array() || request.messages.empty()) fail("the conversation has no messages");
  chat::ChatInputs in;
  in.messages = chat::parse_tool_call_arguments(request.messages);
  in.tools = request.tools;
  in.add_generation_prompt = true;
  if (request.think != ThinkMode::template_default) in.enable_thinking = request.think != ThinkMode::off;
  p.text = m.chat_template->apply(std::move(in));
  p.ids = m.tokenizer.encode(p.text, /*add_special_tokens=*/false);
  if (m.tokenizer_adds_bos && (p.ids.empty() || p.ids.front() != *m.bos_id)) p.ids.insert(p.ids.begin(), *m.bos_id);
  if (p.ids.empty()) fail("the chat template rendered an empty prompt");
  p.starts_in_reasoning = m.format.reasoning && chat::starts_in_reasoning(p.text, *m.format.reasoning);
  return p;
}

}  // namespace fl
