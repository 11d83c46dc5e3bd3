// Shared by `run` and `chat`: flags, model loading, streamed printing, stats and Ctrl-C.
#include "cli/generation_cli.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "model/tensor_parallel.h"
#include "runtime/json_schema.h"

namespace fl::cli {
namespace {

DType kv_type(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "q8") return DType::q8_0;
  fail("--kv {} is not a KV cache type (f32, bf16, q8)", name);
}

void write_out(FILE* f, std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

std::atomic<bool> g_cancel{false};
std::atomic<int> g_sigint_guards{0};
struct sigaction g_previous_action;

extern "C" void on_sigint(int) {
  if (g_cancel.exchange(true)) {
    // The second Ctrl-C: the user wants out now. Only async-signal-safe calls here.
    static const char kMsg[] = "\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    ::_exit(130);
  }
}

}  // namespace

void add_generation_flags(CLI::App* cmd, GenerationFlags& f) {
  cmd->add_option("--system", f.system, "System prompt");
  cmd->add_option("--temperature", f.temperature, "Sampling temperature; 0 is greedy (default: the model's generation_config.json, else 1)")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", f.top_k, "Keep the K most likely tokens (0: off)")->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--top-p", f.top_p, "Keep the most likely tokens up to this probability (1: off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--min-p", f.min_p, "Drop tokens below this fraction of the best one's probability (0: off)")
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--repeat-penalty", f.repeat_penalty, "Repetition penalty over the last 64 tokens (1: off)");
  cmd->add_option("--presence-penalty", f.presence_penalty, "OpenAI presence penalty, -2 to 2 (0: off)");
  cmd->add_option("--frequency-penalty", f.frequency_penalty, "OpenAI frequency penalty, -2 to 2 (0: off)");
  cmd->add_option("--seed", f.seed, "Seed of the sampler: the same seed gives the same text (default: random)");
  cmd->add_option("--max-tokens", f.max_tokens, "Stop after N generated tokens (0: until the model stops or the context is full)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--think", f.think, "Thinking: off, low, med, high, max (default: the chat template's own default)");
  cmd->add_option("--think-tokens", f.think_tokens, "Cap a thought at N tokens (overrides the --think level's cap; 0: no cap)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--stop", f.stop, "Stop before this text (repeatable); it is not printed")->allow_extra_args(false);
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Keep generating past the model's end-of-sequence tokens");
  cmd->add_flag("--json-object", f.json_object, "The answer is one JSON object (sampling keeps it so)");
  cmd->add_option(
      "--json-schema", f.json_schema,
      "The answer is one JSON object that this JSON Schema file accepts (the subset docs/http-api.md lists)");
  cmd->add_option("--backend", f.backend, "cpu, cuda or cuda:N (default: cuda when available, else cpu)");
  cmd->add_option("--kv", f.kv, "KV cache type: f32, bf16, q8 (default: q8 on cuda, f32 on cpu)");
  cmd->add_option("--ctx,--max-seq", f.ctx, "Context size in tokens (default: the model's, at most 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  add_precision_option(cmd, f.precision);
  add_prefill_chunk_option(cmd, f.prefill_chunk);
  cmd->add_option("--tp", f.tp,
                  "Split the model over this many ranks (tensor parallel; GPUs 0..N-1 over NCCL, or CPU threads)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--ep", f.ep, "With --tp: deal a mixture-of-experts model's experts out over the ranks");
}

void add_precision_option(CLI::App* cmd, std::string& value, const char* help) {
  cmd->add_option("--precision", value,
                  help ? help
                       : "Activations in the GPU's tensor-core products of prompts and batches: bf16 (default; "
                         "fastest) or f32 (exact, as the CPU); one sequence's decode is f32 either way")
      ->check(CLI::IsMember({"bf16", "f32"}));
}

void add_prefill_chunk_option(CLI::App* cmd, int64_t& value) {
  cmd->add_option("--prefill-chunk", value,
                  "Most prompt tokens per forward pass (default 512; more prefills long prompts faster on a GPU, "
                  "for more scratch memory)")
      ->check(CLI::Range(int64_t{1}, kMaxPrefillChunk));
}

BackendOptions backend_options_from_flags(const std::string& precision) {
  BackendOptions options;
  options.tensor_core_precision = parse_tensor_core_precision(precision.empty() ? "bf16" : precision);
  return options;
}

LoadedModel load_model_for_text(const std::string& path, const GenerationFlags& flags, int sequences) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.path = path;
  const std::string ranks_backend = check_tensor_parallel_flags(flags.tp, flags.ep, flags.backend);
  const BackendOptions backend_options = backend_options_from_flags(flags.precision);
  if (flags.tp > 1) {
    m.backend = make_backend(rank_backend_name(ranks_backend, 0));  // rank 0's device: picks the KV type
  } else if (flags.backend.empty()) {
    try {
      m.backend = make_backend("cuda", backend_options);
    } catch (const Error& e) {
      log_debug("no CUDA backend ({}); using the CPU", e.what());
      m.backend = make_backend("cpu");
    }
  } else {
    m.backend = make_backend(flags.backend, backend_options);
  }
  const bool on_cpu = m.backend->device() == Device::cpu;
  if (on_cpu && flags.precision == "bf16") log_warn("--precision bf16 applies to GPUs; the CPU computes in f32");
  m.kv_name = flags.kv.empty() ? (on_cpu ? "f32" : "q8") : flags.kv;
  const DType kv = kv_type(m.kv_name);

  m.source = open_model_source(path);
  auto text = std::make_shared<ModelText>(load_model_text(*m.source));
  const int64_t model_ctx = text->max_context;
  m.context = flags.ctx > 0 ? flags.ctx : (model_ctx > 0 ? std::min<int64_t>(model_ctx, 4096) : 4096);
  if (model_ctx > 0 && m.context > model_ctx)
    log_warn("--ctx {} is beyond the {} positions {} was trained for; output may degrade", m.context, model_ctx, path);
  m.text = std::move(text);

  LoadOptions load;
  load.max_seq = m.context;
  load.kv_dtype = kv;
  load.max_tokens = std::min<int64_t>(flags.prefill_chunk > 0 ? flags.prefill_chunk : 512, m.context);
  load.sequences = sequences;
  m.backend_name = m.backend->name();
  if (flags.tp > 1) {  // one backend and thread per rank (model/tensor_parallel.h)
    m.model = make_command_line_split_model(*m.source, {flags.tp, flags.ep}, load, ranks_backend, backend_options);
    m.backend_name = command_line_split_name({flags.tp, flags.ep}, ranks_backend);
  } else {
    m.model = load_model(*m.source, *m.backend, load);
  }
  m.kv_dtype = kv;
  m.prefill_chunk = load.max_tokens;
  m.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_debug("loaded {} on {} (KV {}, context {}) in {:.2f} s", path, m.backend_name, m.kv_name, m.context, m.load_s);
  return m;
}

LoadedModel load_for_generation(const std::string& path, const GenerationFlags& flags) {
  LoadedModel m = load_model_for_text(path, flags);
  EngineOptions engine;
  engine.context = m.context;
  engine.kv_dtype = m.kv_dtype;
  engine.prefill_chunk = m.prefill_chunk;
  m.generator = std::make_unique<Generator>(*m.model, m.text, engine);
  return m;
}

GenerateRequest request_from_flags(const GenerationFlags& f, const ModelText& text) {
  GenerateRequest r;
  r.sampling = text.defaults.sampling;
  if (f.temperature) r.sampling.temperature = *f.temperature;
  if (f.top_k) r.sampling.top_k = *f.top_k;
  if (f.top_p) r.sampling.top_p = *f.top_p;
  if (f.min_p) r.sampling.min_p = *f.min_p;
  if (f.repeat_penalty) r.sampling.repetition_penalty = *f.repeat_penalty;
  if (f.presence_penalty) r.sampling.presence_penalty = *f.presence_penalty;
  if (f.frequency_penalty) r.sampling.frequency_penalty = *f.frequency_penalty;
  // A random seed is 32 bits, so that the JSON output reports it exactly to any reader.
  r.sampling.seed = f.seed ? *f.seed : std::random_device{}();
  r.sampling.validate();
  r.max_tokens = f.max_tokens;
  r.stop = f.stop;
  r.ignore_eos = f.ignore_eos;
  r.json = f.json_object;
  if (!f.json_schema.empty()) {
    std::ifstream in(f.json_schema);
    if (!in) fail("--json-schema: cannot read {}", f.json_schema);
    const nlohmann::json schema = nlohmann::json::parse(in, nullptr, false);
    if (schema.is_discarded()) fail("--json-schema: {} is not JSON", f.json_schema);
    try {
      r.json_schema = std::make_shared<const JsonSchema>(JsonSchema::compile(schema));
    } catch (const Error& e) {
      fail("--json-schema {}: {}", f.json_schema, e.what());
    }
  }
  if (!f.think.empty()) r.prompt.think = parse_think_mode(f.think);
  r.max_reasoning_tokens = f.think_tokens;
  return r;
}

StreamPrinter::StreamPrinter() : stdout_tty_(::isatty(STDOUT_FILENO) == 1) {}

void StreamPrinter::operator()(const GenerationEvent& e) {
  using Kind = GenerationEvent::Kind;
  auto leave_reasoning = [&] {
    if (in_reasoning_ && stdout_tty_) write_out(stdout, "\x1b[0m\n");
    if (in_reasoning_ && !stdout_tty_) write_out(stderr, "\n");
    in_reasoning_ = false;
  };
  switch (e.kind) {
    case Kind::reasoning:
      if (stdout_tty_) {
        write_out(stdout, in_reasoning_ ? std::string(e.text) : "\x1b[2m" + std::string(e.text));
      } else {
        write_out(stderr, e.text);
      }
      in_reasoning_ = true;
      break;
    case Kind::content:
      leave_reasoning();
      if (e.text.empty()) break;
      write_out(stdout, e.text);
      wrote_ = true;
      last_ = e.text.back();
      break;
    case Kind::tool_call: {
      leave_reasoning();
      nlohmann::json call = {{"tool_call", {{"name", e.tool_call->name}, {"arguments", e.tool_call->arguments}}}};
      write_out(stdout, (wrote_ && last_ != '\n' ? "\n" : "") + call.dump() + "\n");
      wrote_ = true;
      last_ = '\n';
      break;
    }
    case Kind::done:
      leave_reasoning();
      if (wrote_ && last_ != '\n') write_out(stdout, "\n");
      wrote_ = false;
      last_ = '\n';
      break;
  }
}

std::string stats_line(const GenerationResult& r) {
  const GenerationTimings& t = r.timings;
  std::string reason = finish_reason_name(r.finish_reason);
  if (r.stop_cause == StopCause::context_full) reason += " (context full)";
  std::string line = fmt::format("prompt {} tokens", r.usage.prompt_tokens);
  if (r.usage.cached_tokens > 0) line += fmt::format(" ({} cached)", r.usage.cached_tokens);
  if (t.prefill_tokens > 0) line += fmt::format(", {:.1f} tok/s", t.prefill_tok_s());
  line += fmt::format(" | generated {} tokens", r.usage.completion_tokens);
  if (r.usage.reasoning_tokens > 0) line += fmt::format(" ({} thinking)", r.usage.reasoning_tokens);
  if (t.decode_steps > 0) line += fmt::format(", {:.1f} tok/s", t.decode_tok_s());
  if (r.usage.completion_tokens > 0) line += fmt::format(" | ttft {:.0f} ms", t.ttft_s * 1000.0);
  line += " | " + reason;
  return line;
}

std::string result_json(const GenerationResult& r, const std::string& model, uint64_t seed) {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const auto& c : r.tool_calls) calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
  const GenerationTimings& t = r.timings;
  nlohmann::ordered_json j = {
      {"model", model},
      {"text", r.content},
      {"reasoning", r.reasoning},
      {"tool_calls", calls},
      {"finish_reason", finish_reason_name(r.finish_reason)},
      {"stop_cause", stop_cause_name(r.stop_cause)},
      {"usage",
       {{"prompt_tokens", r.usage.prompt_tokens},
        {"completion_tokens", r.usage.completion_tokens},
        {"total_tokens", r.usage.prompt_tokens + r.usage.completion_tokens},
        {"reasoning_tokens", r.usage.reasoning_tokens},
        {"cached_tokens", r.usage.cached_tokens}}},
      {"timings",
       {{"ttft_ms", t.ttft_s * 1000.0},
        {"prefill_ms", t.prefill_s * 1000.0},
        {"prefill_tok_s", t.prefill_tok_s()},
        {"decode_ms", t.decode_s * 1000.0},
        {"decode_tok_s", t.decode_tok_s()},
        {"total_ms", t.total_s * 1000.0}}},
      {"seed", seed},
  };
  if (!r.stop_string.empty()) j["stop"] = r.stop_string;
  // Invalid UTF-8 (a model can emit any byte sequence) is replaced rather than refused.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

SigintCancel::SigintCancel() {
  g_cancel = false;
  if (g_sigint_guards.fetch_add(1) == 0) {
    struct sigaction action{};
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &g_previous_action);
  }
}

SigintCancel::~SigintCancel() {
  if (g_sigint_guards.fetch_sub(1) == 1) sigaction(SIGINT, &g_previous_action, nullptr);
}

const std::atomic<bool>* SigintCancel::flag() const { return &g_cancel; }

void SigintCancel::reset() { g_cancel = false; }

}  // namespace fl::cli
