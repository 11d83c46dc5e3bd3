// fireline run [MODEL] [PROMPT]: one answer, streamed to stdout (or one JSON object with --json).
// Without a prompt it reads one from stdin, or, on a terminal, starts a chat.
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/generation_cli.h"
#include "cli/model_arg.h"
#include "core/error.h"
#include "core/log.h"

namespace fl::cli {
namespace {

struct RunOptions {
  std::vector<std::string> args;  // [MODEL] [PROMPT]
  bool json = false;
  bool raw = false;
  GenerationFlags gen;
};

bool has_space(const std::string& s) {
  for (unsigned char c : s)
    if (std::isspace(c)) return true;
  return false;
}

std::string read_stdin() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

void run_run(const RunOptions& opt) {
  // MODEL and PROMPT are both optional: one argument is the MODEL when it names one, and the
  // PROMPT for the default model when it is a sentence (contains a space).
  std::string model_path;
  std::optional<std::string> prompt;
  if (opt.args.size() == 2) {
    model_path = resolve_model_arg(opt.args[0]);
    prompt = opt.args[1];
  } else if (opt.args.size() == 1) {
    try {
      model_path = resolve_model_arg(opt.args[0]);
    } catch (const Error&) {
      if (!has_space(opt.args[0])) throw;
      prompt = opt.args[0];
    }
  }
  if (model_path.empty()) model_path = default_model_path();
  if (opt.raw && !opt.gen.system.empty()) fail("--system needs the chat template; it cannot be used with --raw");

  const bool interactive = !prompt && ::isatty(STDIN_FILENO) == 1;
  if (interactive && (opt.json || opt.raw)) fail("no prompt: give one as an argument or on stdin");
  if (!prompt && !interactive) prompt = read_stdin();
  if (prompt && prompt->empty()) fail("the prompt is empty");

  LoadedModel loaded = load_for_generation(model_path, opt.gen);
  if (interactive) {
    run_chat_loop(loaded, opt.gen);
    return;
  }

  GenerateRequest request = request_from_flags(opt.gen, *loaded.text);
  if (opt.raw) {
    request.prompt.raw = *prompt;
  } else {
    if (!opt.gen.system.empty()) request.prompt.messages.push_back({{"role", "system"}, {"content", opt.gen.system}});
    request.prompt.messages.push_back({{"role", "user"}, {"content", *prompt}});
  }

  SigintCancel sigint;
  GenerationResult result;
  if (opt.json) {
    result = loaded.generator->generate(request, {}, sigint.flag());
    const std::string out = result_json(result, model_path, request.sampling.seed);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  } else {
    StreamPrinter printer;
    result = loaded.generator->generate(request, std::ref(printer), sigint.flag());
    if (log_level() <= LogLevel::info) std::fprintf(stderr, "%s\n", stats_line(result).c_str());
  }
  // Interrupted: the output above is complete and valid, but the status says so (128 + SIGINT).
  if (result.finish_reason == FinishReason::cancelled) throw CLI::RuntimeError(130);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate an answer to one prompt (or chat, on a terminal without a prompt)");
  cmd->add_option("args", opt->args, "[MODEL] [PROMPT]: a Hugging Face directory or .fire file, and the prompt (default: stdin)")
      ->expected(0, 2)
      ->type_name("");
  cmd->add_flag("--json", opt->json, "Print one JSON object: text, reasoning, finish_reason, usage, timings");
  cmd->add_flag("--raw", opt->raw, "Plain completion of the prompt: no chat template");
  add_generation_flags(cmd, opt->gen);
  cmd->callback([opt] { run_run(*opt); });
}

}  // namespace fl::cli
