// fireline show MODEL [--json] [--tp N [--ep]]: what a model is — architecture, key config values,
// bytes and tensor counts per storage format, where it came from (.fire: quantizer, checksum), its
// chat template, and with --tp how its weights would split over N GPUs.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/format_table.h"
#include "core/error.h"
#include "io/fire_file.h"
#include "io/model_source.h"
#include "cli/model_arg.h"
#include "cli/progress.h"
#include "model/parallel_plan.h"
#include "model/weight_loader.h"

namespace fl::cli {
namespace {

struct ShowOptions {
  std::string model;
  bool json = false;
  int tensor_parallel = 0;  // 0: no plan shown
  bool expert_parallel = false;
};

// The tensor/expert-parallel plan over `tp` GPUs, with each weight's format as stored.
nlohmann::ordered_json parallel_summary(const ModelSource& source, int tp, bool ep) {
  const ParallelPlan plan = plan_model_parallel(source.config(), {tp, ep}, source_weight_formats(source));
  nlohmann::ordered_json j;
  j["gpus"] = tp;
  j["expert_parallel"] = ep;
  j["all_reduces_per_layer"] = plan.all_reduces_per_layer;
  j["rank_bytes"] = plan.rank_bytes;
  int split = 0;
  for (const TensorShard& t : plan.tensors) split += t.split != ShardSplit::replicated;
  j["tensors_split"] = split;
  j["tensors_replicated"] = static_cast<int>(plan.tensors.size()) - split;
  return j;
}

std::vector<FormatTotals> tally_formats(const ModelSource& source) {
  std::map<DType, FormatTotals> totals;
  for (const std::string& name : source.tensor_names()) {
    Tensor t = *source.find(name);
    FormatTotals& f = totals.try_emplace(t.dtype, FormatTotals{t.dtype}).first->second;
    f.tensors += 1;
    f.bytes += static_cast<uint64_t>(t.nbytes());
    f.elements += static_cast<uint64_t>(t.numel());
  }
  std::vector<FormatTotals> out;
  for (auto& [dtype, f] : totals) out.push_back(f);
  return out;
}

void run_show(const ShowOptions& opt) {
  std::unique_ptr<ModelSource> source = open_model_source(resolve_model_arg(opt.model));
  const auto* fire = dynamic_cast<const FireFile*>(source.get());
  const std::vector<FormatTotals> formats = tally_formats(*source);
  const nlohmann::ordered_json config = model_config_summary(source->config());
  const std::string chat_template = source->chat_template();
  // Where the tokenizer comes from: tokenizer.json, else (a .fire) GGUF tokenizer.ggml.* metadata.
  std::string tokenizer_kind;
  if (!source->tokenizer_json().empty()) {
    tokenizer_kind = fire ? "tokenizer.json (embedded)" : "tokenizer.json";
  } else if (const GgufValue* model = fire ? fire->gguf().find_metadata("tokenizer.ggml.model") : nullptr) {
    tokenizer_kind = fmt::format("GGUF tokenizer metadata (tokenizer.ggml.model {})", model->describe());
  }

  nlohmann::ordered_json quantizer;  // null unless the .fire records one
  if (fire && !fire->quantizer_json().empty()) {
    quantizer = nlohmann::ordered_json::parse(fire->quantizer_json(), nullptr, false);
    if (quantizer.is_discarded()) quantizer = fire->quantizer_json();  // not JSON: show the text
  }

  nlohmann::ordered_json parallel;  // null without --tp
  if (opt.tensor_parallel > 0) parallel = parallel_summary(*source, opt.tensor_parallel, opt.expert_parallel);

  if (opt.json) {
    nlohmann::ordered_json j;
    j["path"] = source->path();
    j["kind"] = fire ? "fire" : "hf_directory";
    if (fire) j["gguf_version"] = fire->gguf().version();
    j["architecture"] = source->config().architecture;
    j["config"] = config;
    j["formats"] = nlohmann::ordered_json::array();
    uint64_t tensors = 0, bytes = 0;
    for (const FormatTotals& f : formats) {
      j["formats"].push_back({{"format", dtype_name(f.dtype)},
                              {"tensors", f.tensors},
                              {"weights", f.elements},
                              {"bytes", f.bytes},
                              {"bits_per_weight", f.elements ? 8.0 * f.bytes / f.elements : 0.0}});
      tensors += f.tensors;
      bytes += f.bytes;
    }
    j["tensor_count"] = tensors;
    j["tensor_bytes"] = bytes;
    j["quantizer"] = quantizer;
    j["tensor_sha256"] = fire && !fire->recorded_sha256().empty() ? nlohmann::ordered_json(fire->recorded_sha256())
                                                                   : nlohmann::ordered_json();
    j["has_tokenizer"] = !tokenizer_kind.empty();
    j["tokenizer"] = tokenizer_kind.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(tokenizer_kind);
    j["chat_template"] = chat_template.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(chat_template);
    if (!parallel.is_null()) j["parallel"] = parallel;
    std::string out = j.dump(2) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
  }

  std::string out = fmt::format("model         {}\n", source->path());
  out += fmt::format("kind          {}\n", fire ? fmt::format(".fire (GGUF v{})", fire->gguf().version())
                                                 : std::string("Hugging Face directory"));
  out += fmt::format("architecture  {}\n", source->config().architecture);
  out += "config\n";
  for (auto& [key, value] : config.items())
    if (key != "architecture") out += fmt::format("  {:<26}{}\n", key, value.dump());
  if (!quantizer.is_null()) out += fmt::format("quantizer     {}\n", quantizer.is_string() ? quantizer.get<std::string>() : quantizer.dump());
  if (fire) out += fmt::format("tensor sha256 {}\n", fire->recorded_sha256().empty() ? "none" : fire->recorded_sha256());
  out += fmt::format("tokenizer     {}\n", tokenizer_kind.empty() ? "none" : tokenizer_kind);
  out += "tensors\n" + format_table(formats);
  if (!parallel.is_null()) {
    out += fmt::format("parallel      {} GPUs{}, {} tensors split, {} replicated, {} all-reduces per layer\n",
                       opt.tensor_parallel, opt.expert_parallel ? " (experts dealt out)" : "",
                       parallel["tensors_split"].get<int>(), parallel["tensors_replicated"].get<int>(),
                       parallel["all_reduces_per_layer"].get<int>());
    for (size_t r = 0; r < parallel["rank_bytes"].size(); ++r)
      out += fmt::format("  GPU {:<3} {} of weights\n", r, human_bytes(parallel["rank_bytes"][r].get<uint64_t>()));
  }
  if (chat_template.empty()) {
    out += "chat template: none\n";
  } else {
    out += "chat template:\n" + chat_template;
    if (chat_template.back() != '\n') out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_show_command(CLI::App& app) {
  auto opt = std::make_shared<ShowOptions>();
  CLI::App* cmd = app.add_subcommand("show", "Describe a model: architecture, config, formats, chat template");
  cmd->add_option("model", opt->model, "Model: a name in the store (see `fireline list`), a .fire file or a Hugging Face directory")->required();
  cmd->add_flag("--json", opt->json, "Print JSON instead of text");
  cmd->add_option("--tp", opt->tensor_parallel,
                  "Also show how the weights would split over N GPUs (tensor parallel; Gemma 4) and each GPU's bytes")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--ep", opt->expert_parallel, "With --tp: deal the MoE experts out over the GPUs (expert parallel)");
  cmd->callback([opt] { run_show(*opt); });
}

}  // namespace fl::cli
