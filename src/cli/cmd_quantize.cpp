// fireline quantize SRC -o OUT.fire: converts a checkpoint (HF directory, GGUF, hipfire HFQM) into
// a .fire file under the quantizer policy (io/quantize_model.h), with a progress bar on stderr
// and a summary table on stdout.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/format_table.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/quantize_model.h"

namespace fl::cli {
namespace {

struct QuantizeCommandOptions {
  std::string input;
  std::string output;
  std::string format = "hf4";
  int threads = 0;
  std::vector<std::string> overrides;
  std::string hf_config;
};

void run_quantize(const QuantizeCommandOptions& opt) {
  QuantizeOptions options;
  auto preset = parse_quant_preset(opt.format);
  if (!preset) fail("--format {} is not a preset (hf4, hf6, q8, bf16, f16, f32)", opt.format);
  options.policy.preset = *preset;
  for (const std::string& spec : opt.overrides) options.policy.overrides.push_back(parse_quant_override(spec));
  options.hf_config_dir = opt.hf_config;
  std::unique_ptr<ThreadPool> pool;
  if (opt.threads > 0) {
    pool = std::make_unique<ThreadPool>(opt.threads);
    options.pool = pool.get();
  }
  ProgressBar bar("quantize");
  options.progress = [&](const QuantizeProgress& p) {
    bar.update(p.bytes_done, p.bytes_total, fmt::format("[{}/{}] {}", p.tensor_index + 1, p.tensor_count, p.tensor_name));
  };
  QuantizeReport report = quantize_model(opt.input, opt.output, options);
  bar.finish();
  for (const std::string& w : report.warnings) log_warn("{}", w);

  std::string out = format_table(report.formats);
  out += fmt::format("wrote {} ({}, {} tensors from {} input)\ntensor sha256 {}\n", report.output_path,
                     human_bytes(report.file_bytes), report.tensor_count, report.source_kind, report.tensor_sha256);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto opt = std::make_shared<QuantizeCommandOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Convert a checkpoint (HF directory, GGUF, hipfire HFQM) to a .fire file");
  cmd->add_option("input", opt->input, "Hugging Face directory, GGUF/.fire file, or hipfire .hf4/.hf6/.hfq file")
      ->required();
  cmd->add_option("-o,--output", opt->output, "Output .fire file")->required();
  cmd->add_option("--format", opt->format, "Preset: hf4 (default), hf6, q8, bf16, f16, f32");
  cmd->add_option("--threads", opt->threads, "Threads quantizing rows (default: the global --threads)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--override", opt->overrides,
                  "PATTERN=FORMAT: tensors whose name matches the glob get FORMAT (repeatable; the last match wins)")
      ->take_all();
  cmd->add_option("--hf-config", opt->hf_config,
                  "GGUF input without embedded config: a directory with config.json (and tokenizer files)");
  cmd->callback([opt] { run_quantize(*opt); });
}

}  // namespace fl::cli
