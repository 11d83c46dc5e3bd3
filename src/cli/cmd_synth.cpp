// fireline synth --like NAME -o OUT.fire: writes a random-weight model with the exact tensor
// names, shapes and weight formats of a published one, so that speed can be measured (and files
// exercised) without downloading the real weights.
#include <cstdio>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_arg.h"
#include "io/import_source.h"
#include "io/quantize_model.h"
#include "model/synthetic.h"
#include "text/tokenizer/tokenizer.h"

namespace fl::cli {
namespace {

struct SynthOptions {
  std::string like;
  std::string output;
  std::string format = "hf4";
  uint64_t seed = 1;
  std::string tokenizer_dir;
};

// The tokenizer of a synthetic model must only produce ids the model has rows for; the model may
// have more (its own ids past the tokenizer's vocabulary decode to nothing, as padding ids do).
TokenizerFiles read_synth_tokenizer(const std::string& dir, const ModelConfig& config) {
  TokenizerFiles files = read_tokenizer_files(dir);
  if (files.tokenizer_json.empty()) fail("{}: no tokenizer.json", dir);
  const Tokenizer tokenizer = Tokenizer::from_json(files.tokenizer_json, {}, dir + "/tokenizer.json");
  const int model_vocab = std::visit([](const auto& arch) { return arch.vocab_size; }, config.arch);
  if (tokenizer.vocab_size() > model_vocab)
    fail("{}: the tokenizer has {} tokens, more than the {} rows of the model's embedding", dir, tokenizer.vocab_size(),
         model_vocab);
  return files;
}

void run_synth(const SynthOptions& opt) {
  SyntheticOptions synth{opt.like, opt.format, opt.seed, {}};
  if (!opt.tokenizer_dir.empty())
    synth.tokenizer = read_synth_tokenizer(opt.tokenizer_dir, make_synthetic_source(synth)->config());
  auto source = make_synthetic_source(synth);
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
  cmd->add_option("--like", opt->like, "The model whose shapes to copy: " + synthetic_model_list())->required();
  cmd->add_option("-o,--output", opt->output, "Output .fire file")->required();
  cmd->add_option("--format", opt->format, "Weight policy: hf4 (default), hf6, q8, bf16, f16, f32");
  cmd->add_option("--seed", opt->seed, "Seed of the random weights (default 1)");
  cmd->add_option("--tokenizer", opt->tokenizer_dir,
                  "Embed the tokenizer, chat template and generation config of this Hugging Face directory, so "
                  "that the model can be served and chatted with (random text, real serving)");
  cmd->callback([opt] { run_synth(*opt); });
}

}  // namespace fl::cli
