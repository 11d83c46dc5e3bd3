// fireline template TEMPLATE_OR_MODEL --messages FILE.json [...]: renders a conversation with a
// model's chat template and prints the prompt exactly (no newline added), so it can be diffed
// against transformers' apply_chat_template or any other implementation.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "text/chat/chat_template.h"

namespace fl::cli {
namespace {

struct TemplateOptions {
  std::string source;
  std::string messages_file;
  std::string tools_file;
  std::string vars_file;
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;
  std::optional<std::string> bos_token, eos_token;
  bool parse_arguments = false;
};

nlohmann::ordered_json read_json(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {} file {}", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  // The parser takes a NUL byte for the end of the text: the rest of the file would be dropped
  // unread. JSON holds no raw NUL.
  const std::string text = ss.str();
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail("{} file {} holds a NUL byte (at byte {}); JSON text cannot", what, path, nul);
  // The parser itself is iterative, but copying and converting the value recurse: a file nested
  // tens of thousands of levels deep would overflow the stack. The template's own values stop at
  // 512 levels (src/text/jinja/value.cpp); nothing deeper is kept.
  constexpr int kMaxDepth = 512;
  bool too_deep = false;
  auto json = nlohmann::ordered_json::parse(
      text,
      [&](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
        if (depth > kMaxDepth) too_deep = true;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep) fail("{} file {} nests arrays/objects more than {} levels deep", what, path, kMaxDepth);
  if (json.is_discarded()) fail("{} file {} is not valid JSON", what, path);
  return json;
}

void run_template(const TemplateOptions& opt) {
  nlohmann::ordered_json messages = read_json(opt.messages_file, "--messages");
  // Accept either a bare array or an OpenAI request body with "messages" (and "tools").
  nlohmann::ordered_json tools;
  if (messages.is_object()) {
    if (messages.contains("tools")) tools = messages["tools"];
    if (!messages.contains("messages")) fail("--messages file {} has no \"messages\" array", opt.messages_file);
    messages = nlohmann::ordered_json(messages["messages"]);
  }
  if (!messages.is_array()) fail("--messages file {} must hold a JSON array of messages", opt.messages_file);
  if (!opt.tools_file.empty()) tools = read_json(opt.tools_file, "--tools");
  if (!tools.is_null() && !tools.is_array()) fail("--tools must hold a JSON array of tools");

  chat::ChatInputs inputs;
  inputs.messages = opt.parse_arguments ? chat::parse_tool_call_arguments(messages) : messages;
  inputs.tools = tools;
  inputs.add_generation_prompt = opt.add_generation_prompt;
  inputs.enable_thinking = opt.enable_thinking;
  inputs.bos_token = opt.bos_token;
  inputs.eos_token = opt.eos_token;
  if (!opt.vars_file.empty()) {
    inputs.extra = read_json(opt.vars_file, "--vars");
    if (!inputs.extra.is_object()) fail("--vars file {} must hold a JSON object", opt.vars_file);
  }
  chat::ChatTemplate tmpl(chat::load_chat_template(opt.source, !tools.is_null()));
  std::string prompt = tmpl.apply(std::move(inputs));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_template_command(CLI::App& app) {
  auto opt = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand("template", "Render a conversation with a model's chat template and print the prompt");
  cmd->add_option("source", opt->source,
                  "A .jinja file, a tokenizer_config.json, a model directory (chat_template.jinja or "
                  "tokenizer_config.json), or a .fire / GGUF file (tokenizer.chat_template)")
      ->required();
  cmd->add_option("--messages", opt->messages_file, "JSON file: an array of messages (or an object with \"messages\")")
      ->required();
  cmd->add_option("--tools", opt->tools_file, "JSON file: an array of tool definitions (OpenAI format)");
  cmd->add_option("--vars", opt->vars_file, "JSON file: an object of extra template variables");
  cmd->add_flag("--add-generation-prompt", opt->add_generation_prompt, "End with the prompt for the assistant's turn");
  cmd->add_flag_function(
      "--enable-thinking,!--disable-thinking",
      [opt](int64_t count) { opt->enable_thinking = count > 0; },
      "Set enable_thinking to true (or false); left out, the template's own default applies");
  cmd->add_option_function<std::string>(
      "--bos-token", [opt](const std::string& s) { opt->bos_token = s; },
      "bos_token value (default: from tokenizer_config.json or the model file)");
  cmd->add_option_function<std::string>(
      "--eos-token", [opt](const std::string& s) { opt->eos_token = s; },
      "eos_token value (default: from tokenizer_config.json or the model file)");
  cmd->add_flag("--parse-arguments", opt->parse_arguments,
                "Turn tool_calls[].function.arguments JSON strings into objects before rendering");
  cmd->callback([opt] { run_template(*opt); });
}

}  // namespace fl::cli
