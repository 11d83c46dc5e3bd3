#pragma once
// The real engine behind `fireline serve`: GenerationTasks run on a loaded Model, up to
// `parallel` of them at once (continuous batching).
//
// Each of the `parallel` slots owns one Sequence, allocated once at construction (so the KV
// memory is claimed when the server starts, never during a request). A step does, in order:
//
//   1. one prefill chunk (at most `prefill_chunk` tokens) for one slot that is still reading its
//      prompt, taking turns between such slots, so that a long prompt delays the others' next
//      token by one chunk at most;
//   2. one decode token for every slot that has a token to feed, all in one Model::forward_batch
//      (each weight is read once per step for the whole batch);
//   3. for every slot with fresh logits: sample, check EOS / max_tokens / context, run the text
//      stage (TextStream: detokenizer, stop strings, reasoning and tool-call parsers) and emit
//      what it produced; a thought that reaches its budget is closed by feeding the close
//      marker's tokens (they count as generated tokens and are not shown).
//
// Prefix reuse: a finished slot keeps its tokens. A new task goes to the free slot whose tokens
// are the longest prefix of its prompt (a chat's next turn finds its conversation) and runs only
// the rest (usage.cached_prompt_tokens); otherwise the slot starts over (Model::reset_sequence).
//
// Log-probabilities (GenerationTask::logprobs): each sampled token's, from the model's logits,
// emitted before the text it adds; a step with such a task keeps every row's logits on the host
// (as JSON mode does) instead of sampling on the device. Echo (completions): the prompt's text is
// emitted when its prefill ends; with logprobs the prompt runs whole (no prefix reuse) in chunks
// whose every row's logits come back (~64 MiB a chunk at most), one entry per prompt token.
//
// JSON mode (response_format json_object, or json_schema with the schema's checks added):
// outside a thought, each sampled token must keep the answer a prefix of one JSON object
// (runtime/json_prefix.h); special tokens are refused, EOS is allowed only once the object is
// complete, and the answer ends as soon as it is.
//
// tool_choice "required" or a named function (with tools, on a model whose tool-call syntax is
// known): once the answer starts (after a thought the prompt opened), the opening of a call is
// fed as forced tokens — Gemma 4 `<|tool_call>call:` (+ `NAME{`), Qwen `<tool_call>\n{"name": "`
// (+ `NAME", "arguments": `) — and the model writes the rest.
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/json_prefix.h"
#include "runtime/logprobs.h"
#include "runtime/prompt_builder.h"
#include "runtime/sampler.h"
#include "runtime/stop_conditions.h"
#include "runtime/text_stream.h"
#include "server/engine.h"

namespace fl::server {

struct ModelEngineConfig {
  std::string model_id;          // what /v1/models lists
  int64_t context_length = 4096;  // positions per sequence (prompt + generated)
  int parallel = 4;               // slots (sequences) decoded together
  DType kv_dtype = DType::f32;
  int64_t prefill_chunk = 512;    // most prompt tokens per forward (LoadOptions::max_tokens)
};

class ModelEngine final : public Engine {
 public:
  // `model` must outlive the engine; `text` gives the tokenizer, EOS ids and chat conventions.
  // Allocates the slots' sequences; throws fl::Error when they do not fit.
  ModelEngine(Model& model, std::shared_ptr<const ModelText> text, ModelEngineConfig config);
  ~ModelEngine() override;

  EngineInfo info() const override;
  void bind_to_this_thread() override;
  int free_slots() const override;
  void start(TaskId id, GenerationTask task) override;
  bool busy() const override;
  int64_t step(const EmitFn& emit) override;
  void cancel(TaskId id) override;

 private:
  using Clock = std::chrono::steady_clock;

  struct Running {  // one task inside a slot
    TaskId id = 0;
    GenerationTask task;
    std::optional<Sampler> sampler;
    std::optional<TokenStopChecker> stopper;
    std::optional<TextStream> text;
    std::optional<JsonPrefix> json;  // JSON mode: the answer so far
    std::string forced_call;         // tool_choice required / named: the call opening still to feed
    int64_t prefilled = 0;         // prompt tokens in the sequence
    std::deque<int32_t> to_feed;   // decode tokens to append, in order (sampled, then forced)
    std::vector<float> logits;     // [vocab] after the last token fed; empty when none is fresh
    std::optional<int32_t> sampled;  // or the token already sampled from them on the device
    int64_t generated = 0;         // sampled and forced tokens
    int64_t cached = 0;            // prompt tokens found in the slot (or copied from a leader)
    // A task whose prompt another running task is already reading waits for that one (its
    // leader) and then copies its sequence and last logits instead of reading the prompt again
    // (n choices of one prompt). Empty: it reads its own prompt.
    std::optional<TaskId> leader;
    int tool_calls = 0;
    Clock::time_point started_at, prompt_done_at, first_token_at;
  };

  struct Slot {
    std::unique_ptr<Sequence> seq;
    std::vector<int32_t> tokens;  // exactly what the sequence holds, in order
    std::optional<Running> run;   // empty: free
  };

  // Samples from the slot's fresh logits (or takes its device-sampled token) and acts on the
  // token; may finish the task.
  int64_t advance(Slot& slot, const EmitFn& emit);
  void emit_text(Running& r, std::vector<TextEvent>& events, const EmitFn& emit);
  void finish(Slot& slot, StopCause cause, const EmitFn& emit);
  void fail_task(Slot& slot, const std::string& message, const EmitFn& emit);
  void forget(Slot& slot);  // the sequence's contents are unknown: start over next time
  // The leader's prompt is read: every task waiting on it copies its sequence and logits.
  void start_followers(Slot& leader, const EmitFn& emit);
  // JSON mode: the next token, or -1 when none can continue the object.
  int32_t sample_json(Running& r);
  // Feeds r.forced_call as generated tokens (shown, as the model's own would be); may finish.
  int64_t force_call_opening(Slot& slot, const EmitFn& emit);
  // Every id's raw bytes (token_bytes_table; "" for special tokens), built on first use.
  const std::vector<std::string>& token_texts();
  LogprobEntry logprob_entry(const TokenLogprob& p) const;  // with its text and bytes
  TokenLogprobOutput logprob_output(const TokenLogprobs& lp) const;  // the chosen token's and alternatives'
  // An echoed prompt's entries from a prefill chunk's `rows` rows of logits ([rows, vocab]).
  void emit_prompt_logprobs(const Running& r, std::span<const float> logits, int64_t rows, const EmitFn& emit);

  Model& model_;
  std::shared_ptr<const ModelText> text_;
  ModelEngineConfig config_;
  std::vector<Slot> slots_;
  size_t next_prefill_ = 0;  // round robin between prefilling slots
  std::vector<std::string> token_texts_;  // filled on the first JSON-mode task
};

}  // namespace fl::server
