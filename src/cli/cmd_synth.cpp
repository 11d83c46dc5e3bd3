// fireline synth --like NAME -o OUT.fire: writes a random-weight model with the exact tensor
// names, shapes and weight formats of a published one, so that speed can be measured (and files
// exercised) without downloading the real weights.
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "io/import_source.h"
#include "io/quantize_model.h"
#include "model/synthetic.h"

namespace fl::cli {
namespace {

struct SynthOptions {
  std::string like;
  std::string output;
  std::string format = "hf4";
  uint64_t seed = 1;
};

void run_synth(const SynthOptions& opt) {
  auto source = make_synthetic_source({opt.like, opt.format, opt.seed});
  auto imported = import_model_source(*source);
  QuantizeOptions q;
  q.policy.preset = *parse_quant_preset(opt.format);  // the bytes are already in this policy: copied
  QuantizeReport report = quantize_model(*imported, opt.output, q);
  std::puts(fmt::format("{}: {} tensors, {:.2f} GB, like {} ({}), sha256 {}", report.output_path, report.tensor_count,
                        report.file_bytes / 1e9, opt.like, opt.format, report.tensor_sha256)
                .c_str());
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto opt = std::make_shared<SynthOptions>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a random-weight model with the shapes of a published one");
  std::string names;
  for (const auto& n : synthetic_model_names()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--like", opt->like, "The model whose shapes to copy: " + names)->required();
  cmd->add_option("-o,--output", opt->output, "Output .fire file")->required();
  cmd->add_option("--format", opt->format, "Weight policy: hf4 (default), hf6, q8, bf16, f16, f32");
  cmd->add_option("--seed", opt->seed, "Seed of the random weights (default 1)");
  cmd->callback([opt] { run_synth(*opt); });
}

}  // namespace fl::cli
