#pragma once
// The real prompt side: a model's own chat template (text/chat) and tokenizer (text/tokenizer),
// run on the HTTP workers. Rendering follows transformers' apply_chat_template: messages with
// tool-call arguments as objects, tools as OpenAI function objects, add_generation_prompt, the
// template's bos/eos tokens, enable_thinking and the other chat_template_kwargs; the text is then
// tokenized without adding special tokens (the template already wrote them), as
// apply_chat_template(tokenize=True) does. Completions get the tokenizer's special tokens (e.g.
// Gemma's <bos>), as the OpenAI completions servers do. A null message content is rendered as "".
#include "server/prompt_frontend.h"
#include "text/chat/chat_template.h"
#include "text/jinja/template.h"
#include "text/tokenizer/tokenizer.h"

namespace fl::server {

class TemplatePromptFrontend final : public PromptFrontend {
 public:
  TemplatePromptFrontend(chat::ChatTemplate chat_template, Tokenizer tokenizer, jinja::Limits limits = {});

  PreparedPrompt render_chat(const ChatPrompt& chat) const override;
  PreparedPrompt prepare_text(std::string_view text) const override;
  PreparedPrompt prepare_tokens(std::span<const int32_t> ids) const override;

 private:
  chat::ChatTemplate template_;
  Tokenizer tokenizer_;
  jinja::RenderOptions render_options_;
};

}  // namespace fl::server
