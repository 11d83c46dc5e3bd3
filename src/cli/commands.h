#pragma once
// One function per subcommand, each in its own cmd_*.cpp; main.cpp calls them all. A command
// adds its CLI11 subcommand and sets a callback that does the work. Errors are thrown as
// fl::Error and printed by main.
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace fl::cli {

// A list of token ids as a flag gives it (`tokenize --decode`, `logits --ids`): comma-separated
// whole numbers 0..2^31-1, spaces allowed, optionally in [ ] (the output of `tokenize` pastes
// back in). An empty list is empty; an empty or malformed item is an error naming `option`.
std::vector<int32_t> parse_token_ids(const std::string& list, const char* option);

void add_logits_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_show_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_template_command(CLI::App& app);
void add_pull_command(CLI::App& app);
void add_list_command(CLI::App& app);
void add_rm_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_stop_command(CLI::App& app);
void add_battery_command(CLI::App& app);

}  // namespace fl::cli
