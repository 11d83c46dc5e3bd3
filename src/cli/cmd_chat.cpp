// fireline chat MODEL: a conversation on stdin. Each line is a user turn; /clear forgets the
// conversation, /exit (or end of input) quits. The history is kept within the context: when the
// next prompt would not leave room for an answer, the oldest turns are dropped.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_cli.h"
#include "cli/model_arg.h"
#include "core/error.h"
#include "core/log.h"

namespace fl::cli {
namespace {

using nlohmann::ordered_json;

struct ChatOptions {
  std::string model;
  GenerationFlags gen;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

void note(const std::string& text) {
  if (log_level() <= LogLevel::info) std::fprintf(stderr, "%s\n", text.c_str());
}

ordered_json conversation(const std::string& system, const ordered_json& history, const std::string& user) {
  ordered_json messages = ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  for (const auto& m : history) messages.push_back(m);
  messages.push_back({{"role", "user"}, {"content", user}});
  return messages;
}

}  // namespace

void run_chat_loop(LoadedModel& loaded, const GenerationFlags& flags) {
  const bool tty = ::isatty(STDIN_FILENO) == 1;
  Generator& generator = *loaded.generator;
  const GenerateRequest base = request_from_flags(flags, *loaded.text);
  const int64_t ctx = loaded.context;
  // Room the prompt must leave for the answer: --max-tokens, else a quarter of the context.
  const int64_t reserve = flags.max_tokens > 0 ? std::min(flags.max_tokens, ctx - 1) : ctx / 4;
  if (tty)
    note(fmt::format("chatting with {} ({} tokens of context). /clear forgets the conversation, /exit or Ctrl-D quits.",
                     loaded.path, ctx));

  ordered_json history = ordered_json::array();  // user and assistant messages, oldest first
  std::string line;
  while (true) {
    if (tty) {
      std::fputs(">>> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/bye" || text == "/quit") break;
    if (text == "/clear") {
      history = ordered_json::array();
      note("(conversation cleared)");
      continue;
    }
    if (text[0] == '/') {
      note(fmt::format("unknown command {} (commands: /clear, /exit)", text));
      continue;
    }

    try {
      GenerateRequest request = base;
      request.prompt.messages = conversation(flags.system, history, text);
      Prompt prompt = generator.prompts().build(request.prompt);
      int dropped = 0;
      while (static_cast<int64_t>(prompt.ids.size()) + reserve > ctx && history.size() >= 2) {
        history.erase(history.begin(), history.begin() + 2);  // the oldest user turn and its answer
        ++dropped;
        request.prompt.messages = conversation(flags.system, history, text);
        prompt = generator.prompts().build(request.prompt);
      }
      if (dropped > 0)
        note(fmt::format("(dropped the {} oldest turn{} to stay within the context of {} tokens)", dropped,
                         dropped == 1 ? "" : "s", ctx));

      SigintCancel sigint;
      StreamPrinter printer;
      GenerationResult result = generator.generate(prompt, request, std::ref(printer), sigint.flag());
      note(stats_line(result));
      history.push_back({{"role", "user"}, {"content", text}});
      history.push_back({{"role", "assistant"}, {"content", result.content}});
    } catch (const Error& e) {
      // One failed turn (a message longer than the context, a template error) does not end the chat.
      std::fprintf(stderr, "fireline: error: %s\n", e.what());
    }
  }
}

namespace {

void run_chat(const ChatOptions& opt) {
  LoadedModel loaded =
      load_for_generation(opt.model.empty() ? default_model_path() : resolve_model_arg(opt.model), opt.gen);
  run_chat_loop(loaded, opt.gen);
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto opt = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with a model on stdin (/clear, /exit)");
  cmd->add_option("model", opt->model,
                  "Model: a Hugging Face directory, a .fire file or a name from `fireline list` (default: the "
                  "built-in model)");
  add_generation_flags(cmd, opt->gen);
  cmd->callback([opt] { run_chat(*opt); });
}

}  // namespace fl::cli
