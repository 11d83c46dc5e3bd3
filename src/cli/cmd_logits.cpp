// fireline logits MODEL --ids 2,105,... : prints the model's logits as JSON, so that anyone can
// compare them with another implementation (transformers, llama.cpp, an earlier fireline) or
// with the same model split over several ranks (--tp N [--ep]; scripts/tp-check compares them).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/generation_cli.h"
#include "cli/model_arg.h"
#include "core/error.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace fl::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string like, format;          // a synthetic model instead (model/synthetic.h); format empty: hf4
  int tp = 1;                        // --tp: ranks of a tensor-parallel split
  bool ep = false;
  std::string ids;  // as given: parse_token_ids reads it (CLI11 read "" as token 0 and clamped overflows)
  bool all_positions = false;
  int generate = 0;
  std::string backend = "cpu";
  std::string kv = "f32";
  std::string precision = "f32";
  int top = 0;
  int64_t max_seq = 0;
};

DType parse_kv_type(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "q8") return DType::q8_0;
  fail("--kv {} is not a KV cache type (f32, bf16, q8)", name);
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// %.9g round-trips every f32 exactly.
void append_row(std::string& out, const float* row, int64_t n) {
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (i) out += ',';
    out += std::isfinite(row[i]) ? fmt::format("{:.9g}", row[i]) : std::string("null");
  }
  out += ']';
}

void append_top(std::string& out, const float* row, int64_t n, int k) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  k = static_cast<int>(std::min<int64_t>(k, n));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  out += '[';
  for (int i = 0; i < k; ++i)
    out += fmt::format("{}{{\"id\":{},\"logit\":{:.9g}}}", i ? "," : "", order[i], row[order[i]]);
  out += ']';
}

void run_logits(const LogitsOptions& opt) {
  const std::vector<int32_t> ids = parse_token_ids(opt.ids, "--ids");
  if (ids.empty()) fail("--ids needs at least one token id");
  const std::string ranks_backend = check_tensor_parallel_flags(opt.tp, opt.ep, opt.backend);
  const BackendOptions backend_options = backend_options_from_flags(opt.precision);
  std::unique_ptr<ModelSource> source = open_model_or_synthetic("logits", opt.model, opt.like, opt.format);
  SequenceOptions seq_opt;
  seq_opt.kv_dtype = parse_kv_type(opt.kv);
  seq_opt.max_seq = opt.max_seq > 0 ? opt.max_seq : static_cast<int64_t>(ids.size()) + opt.generate;
  LoadOptions load;
  load.max_seq = seq_opt.max_seq;
  load.kv_dtype = seq_opt.kv_dtype;
  load.max_tokens = static_cast<int64_t>(ids.size());
  load.logits = opt.all_positions ? LogitsMode::all : LogitsMode::last;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  if (opt.tp > 1) {  // one backend and thread per rank (model/tensor_parallel.h)
    model = make_command_line_split_model(*source, {opt.tp, opt.ep}, load, ranks_backend, backend_options);
  } else {
    backend = make_backend(opt.backend, backend_options);
    model = load_model(*source, *backend, load);
  }
  auto seq = model->new_sequence(seq_opt);
  const int64_t V = model->vocab_size();

  std::vector<float> logits = model->forward(*seq, ids, opt.all_positions ? LogitsMode::all : LogitsMode::last);
  const int64_t rows = static_cast<int64_t>(logits.size()) / V;
  std::vector<int32_t> generated;
  int32_t next = argmax(logits.data() + (rows - 1) * V, V);
  for (int i = 0; i < opt.generate; ++i) {
    generated.push_back(next);
    if (i + 1 == opt.generate) break;
    std::vector<float> step = model->forward(*seq, std::span<const int32_t>(&next, 1), LogitsMode::last);
    next = argmax(step.data(), V);
  }

  std::string out = opt.top > 0 ? "{\"top\":[" : "{\"logits\":[";
  for (int64_t r = 0; r < rows; ++r) {
    if (r) out += ',';
    if (opt.top > 0)
      append_top(out, logits.data() + r * V, V, opt.top);
    else
      append_row(out, logits.data() + r * V, V);
  }
  out += "],\"generated\":[";
  for (size_t i = 0; i < generated.size(); ++i) out += fmt::format("{}{}", i ? "," : "", generated[i]);
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto opt = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Print a model's logits for given token ids as JSON");
  cmd->add_option("model", opt->model,
                  "Model: a Hugging Face directory, a .fire file or a name from `fireline list` (or use --like)");
  cmd->add_option("--like", opt->like,
                  "A synthetic model with these shapes (seed 1, as bench --like): " + synthetic_model_list());
  cmd->add_option("--format", opt->format, "Weight format of the synthetic model: hf4 (default), hf6, q8, bf16, f32");
  cmd->add_option("--ids", opt->ids, "Comma-separated token ids, e.g. 2,105,2364")->required();
  cmd->add_flag("--all-positions", opt->all_positions, "Logits for every position, not just the last");
  cmd->add_option("--generate", opt->generate, "Then generate N tokens greedily (listed in \"generated\")")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--backend", opt->backend, "cpu (default), cuda or cuda:N");
  cmd->add_option("--kv", opt->kv, "KV cache type: f32 (default), bf16, q8");
  add_precision_option(
      cmd, opt->precision,
      "Activations in the GPU's tensor-core products of prompts: f32 (default: exact, as the CPU) or bf16");
  cmd->add_option("--top", opt->top, "Print the K highest logits per position instead of whole rows")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-seq", opt->max_seq, "Context size to allocate (default: prompt + generated)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--tp", opt->tp,
                  "Split the model over this many ranks (as for run: CPU threads with --backend cpu, GPUs 0..N-1 with "
                  "--backend cuda)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--ep", opt->ep, "With --tp: deal a mixture-of-experts model's experts out over the ranks");
  cmd->callback([opt] { run_logits(*opt); });
}

}  // namespace fl::cli
