// fireline: the command-line entry point. Parses the subcommand, runs it, and turns any error
// into one line on stderr and a non-zero exit status.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/embedded_model.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace {

// CLI11 2.1 reads integers with C's base prefixes: `--max-tokens 010` was 8 and `0x10` 16. Every
// integer option of every command takes plain decimal: an optional sign, then digits without a
// leading zero.
void require_decimal_integers(CLI::App& app) {
  static const CLI::Validator decimal(
      [](std::string& value) -> std::string {
        size_t i = value.size() > 0 && (value[0] == '-' || value[0] == '+') ? 1 : 0;
        const size_t digits = value.size() - i;
        bool ok = digits > 0 && (digits == 1 || value[i] != '0');
        for (; ok && i < value.size(); ++i) ok = value[i] >= '0' && value[i] <= '9';
        return ok ? std::string() : "'" + value + "' is not a decimal integer";
      },
      "");
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) option->check(decimal);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_decimal_integers(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  fl::cli::register_builtin_models();
  CLI::App app{"fireline: run open-weight LLMs fast (Gemma 4, Qwen3.5) on NVIDIA GPUs or the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fireline 0.1.0");
  bool verbose = false, quiet = false;
  int threads = 0;
  app.add_flag("-v,--verbose", verbose, "Print debug messages");
  app.add_flag("-q,--quiet", quiet, "Print only errors");
  app.add_option("--threads", threads, "CPU threads (default: one per hardware thread)")->check(CLI::Range(0, 4096));
  app.parse_complete_callback([&] {
    fl::set_log_level(verbose ? fl::LogLevel::debug : quiet ? fl::LogLevel::error : fl::LogLevel::info);
    fl::ThreadPool::set_global_threads(threads);
  });

  fl::cli::add_logits_command(app);
  fl::cli::add_bench_command(app);
  fl::cli::add_synth_command(app);
  fl::cli::add_tokenize_command(app);
  fl::cli::add_quantize_command(app);
  fl::cli::add_show_command(app);
  fl::cli::add_verify_command(app);
  fl::cli::add_template_command(app);
  fl::cli::add_pull_command(app);
  fl::cli::add_list_command(app);
  fl::cli::add_rm_command(app);
  fl::cli::add_run_command(app);
  fl::cli::add_chat_command(app);
  fl::cli::add_serve_command(app);
  fl::cli::add_stop_command(app);
  fl::cli::add_battery_command(app);
  require_decimal_integers(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fl::Error& e) {
    std::fprintf(stderr, "fireline: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fireline: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fireline: error: %s\n", e.what());
    return 1;
  }
  // The output is the command's result: when it could not all be written (a full disk, a closed
  // stdout), the command failed, whatever it printed on stderr before.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "fireline: error: cannot write the output to stdout: %s\n",
                 errno != 0 ? std::strerror(errno) : "write error");
    return 1;
  }
  return 0;
}
