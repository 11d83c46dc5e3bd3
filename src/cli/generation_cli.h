#pragma once
// What `run` and `chat` share: the generation flags, loading a model for generation, printing
// a streamed answer, the stats line, and Ctrl-C handling.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/model.h"
#include "runtime/generator.h"

namespace fl::cli {

struct GenerationFlags {
  std::optional<float> temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  int64_t max_tokens = 0;
  std::string think;                   // empty: the template's default
  std::optional<int64_t> think_tokens;  // explicit thinking cap
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool json_object = false;  // --json-object: the answer is one JSON object
  std::string json_schema;   // --json-schema FILE: one that this JSON Schema accepts
  std::string system;
  std::string backend;  // empty: cuda when available, else cpu
  std::string kv;       // empty: q8 on cuda, f32 on cpu
  int64_t ctx = 0;      // 0: min(model's max_position_embeddings, 4096)
  int64_t prefill_chunk = 0;  // --prefill-chunk: most prompt tokens per forward (0: 512)
  std::string precision;  // --precision: the GPU's tensor-core activations; empty: bf16
  int tp = 1;           // --tp: ranks of a tensor-parallel split (GPUs over NCCL, or CPU threads)
  bool ep = false;      // --ep: deal the experts out over those ranks
};

void add_generation_flags(CLI::App* cmd, GenerationFlags& flags);

// Adds --precision (bf16 or f32) to `cmd`, into `value`; the help says the default is bf16 (run,
// chat, serve, bench) unless `help` says otherwise.
void add_precision_option(CLI::App* cmd, std::string& value, const char* help = nullptr);
// Adds --prefill-chunk N (1 .. kMaxPrefillChunk) to `cmd`, into `value`.
inline constexpr int64_t kMaxPrefillChunk = 65536;
void add_prefill_chunk_option(CLI::App* cmd, int64_t& value);
// The backend options of a --precision value (empty: bf16, the command line's default).
BackendOptions backend_options_from_flags(const std::string& precision);

struct LoadedModel {
  std::string path;
  std::unique_ptr<ModelSource> source;
  std::unique_ptr<Backend> backend;  // with --tp, rank 0's kind (the model holds every rank's own)
  std::string backend_name;          // for messages: "cuda", "cpu x 2 (--tp 2)"
  std::unique_ptr<Model> model;
  std::shared_ptr<const ModelText> text;
  std::unique_ptr<Generator> generator;
  std::string kv_name;
  DType kv_dtype = DType::f32;
  int64_t prefill_chunk = 512;
  int64_t context = 0;
  double load_s = 0;
};

// Opens, checks and loads the model at `path` for generation with the flags' backend, KV type
// and context, with room for `sequences` sequences (serve --parallel); no Generator yet. Throws
// fl::Error with what to change (no tokenizer, does not fit, ...).
LoadedModel load_model_for_text(const std::string& path, const GenerationFlags& flags, int sequences = 1);
// The same with one sequence and its Generator (run, chat).
LoadedModel load_for_generation(const std::string& path, const GenerationFlags& flags);

// The request the flags describe (sampling defaults from the model's generation_config.json;
// a random seed when --seed is not given, reported in the result).
GenerateRequest request_from_flags(const GenerationFlags& flags, const ModelText& text);

// Streams events to the terminal: content to stdout as it arrives; reasoning dimmed on stdout
// when it is a terminal, else to stderr (so that a pipe gets only the answer); tool calls as a
// line of JSON. Ends the answer with a newline.
class StreamPrinter {
 public:
  StreamPrinter();
  void operator()(const GenerationEvent& event);

 private:
  bool stdout_tty_;
  bool in_reasoning_ = false;
  bool wrote_ = false;
  char last_ = '\n';
};

// One line on stderr: prompt and generated tokens with their speeds, ttft, finish reason.
std::string stats_line(const GenerationResult& result);

// The result as one JSON object (text, reasoning, tool_calls, finish_reason, usage, timings, seed).
std::string result_json(const GenerationResult& result, const std::string& model, uint64_t seed);

// Ctrl-C while alive: the first SIGINT sets the flag (the generator stops between steps), a
// second one exits at once with status 130. The previous handler is restored on destruction.
class SigintCancel {
 public:
  SigintCancel();
  ~SigintCancel();
  SigintCancel(const SigintCancel&) = delete;
  SigintCancel& operator=(const SigintCancel&) = delete;
  const std::atomic<bool>* flag() const;
  void reset();  // a new generation: the next SIGINT cancels again
};

// The interactive loop of `chat` (and of `run` without a prompt on a terminal).
void run_chat_loop(LoadedModel& loaded, const GenerationFlags& flags);

}  // namespace fl::cli
