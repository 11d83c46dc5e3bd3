#pragma once
// The text half of a model and the first stage of a request: messages -> chat template -> token
// ids. ModelText gathers what a ModelSource says about text (tokenizer, chat template, special
// ids, sampling defaults, which reasoning and tool-call syntax the model writes); PromptBuilder
// turns a request into the prompt's ids. Both are immutable after construction, so a server can
// share one between worker threads.
//
// BOS: chat templates write the BOS themselves (Gemma's `{{ bos_token }}`), so the rendered
// text is tokenized without the tokenizer's post-processor; a BOS is prepended only when the
// tokenizer would have added one and the text did not start with it. A prompt never holds two.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/model_source.h"
#include "runtime/generation_config.h"
#include "text/chat/chat_template.h"
#include "text/chat/reasoning_parser.h"
#include "text/chat/tool_calls.h"
#include "text/tokenizer/tokenizer.h"

namespace fl {

// How much the model may think. off renders the template's no-thinking form (enable_thinking =
// false); the others turn thinking on and cap the thought at think_token_cap() tokens, after
// which the generator closes the channel and the answer follows. template_default leaves
// enable_thinking undefined (the template's own default) with the med cap.
enum class ThinkMode { template_default, off, low, med, high, max };

ThinkMode parse_think_mode(std::string_view name);  // off|low|med|high|max; throws fl::Error
const char* think_mode_name(ThinkMode mode);
int64_t think_token_cap(ThinkMode mode);  // low 512, med 2048, high 8192, max 32768; off 0

// The chat conventions a model's output follows, detected from its vocabulary.
struct ChatFormat {
  std::optional<chat::ReasoningSyntax> reasoning;  // Gemma 4 channel or <think> tags
  std::optional<chat::ToolCallFormat> tool_calls;
};
ChatFormat detect_chat_format(const Tokenizer& tokenizer);

struct ModelText {
  explicit ModelText(Tokenizer t) : tokenizer(std::move(t)) {}

  std::string name;  // the model path, for messages
  Tokenizer tokenizer;
  std::shared_ptr<const chat::ChatTemplate> chat_template;  // null when the model has none
  std::string chat_template_error;  // why it could not be parsed (reported when a chat needs it)
  std::optional<int32_t> bos_id;
  bool tokenizer_adds_bos = false;  // the tokenizer's post-processor prepends bos_id
  GenerationDefaults defaults;      // eos ids and sampling defaults
  ChatFormat format;
  int64_t max_context = 0;          // the model's max_position_embeddings (0: unknown)
};

// Reads the tokenizer, template and generation config of `source`. Throws fl::Error when the
// model has no tokenizer.json (generation needs one) or its side files are malformed.
ModelText load_model_text(const ModelSource& source);

struct PromptRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI chat messages
  nlohmann::ordered_json tools;     // null, or OpenAI tool definitions
  std::optional<std::string> raw;   // plain completion of this text: no chat template
  ThinkMode think = ThinkMode::template_default;
};

struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool starts_in_reasoning = false;  // the prompt leaves the model inside an open thought
};

class PromptBuilder {
 public:
  explicit PromptBuilder(std::shared_ptr<const ModelText> text);
  // Throws fl::Error for an empty prompt, a model without a chat template (unless raw), and
  // template errors (e.g. "Conversation roles must alternate").
  Prompt build(const PromptRequest& request) const;
  const ModelText& text() const { return *text_; }

 private:
  std::shared_ptr<const ModelText> text_;
};

}  // namespace fl
