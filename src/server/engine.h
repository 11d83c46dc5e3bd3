#pragma once
// The engine interface: the typed boundary between the HTTP side of `fireline serve` and the one
// inference thread that owns the model.
//
// HTTP workers parse and validate requests, render the chat template, tokenize, and turn the
// result into a GenerationTask. The inference thread (InferenceLoop) is the only caller of an
// Engine: it starts tasks while the engine has free slots, calls step() to advance every running
// task, and cancels tasks whose client went away. The engine reports what each task produced as
// EngineEvents (reasoning text, answer text, tool calls, the sampled tokens' log-probabilities
// when asked for, then exactly one finish), already split into channels: the engine side owns
// detokenization, stop strings, the reasoning parser and the tool-call parser, because they act
// on the token stream (a stop string ends generation; the thinking budget injects a closing
// marker).
//
// Nothing here is JSON: requests arrive as typed fields, tool schemas as their JSON text only
// because the tool-call parser types XML parameters with them.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/json_schema.h"
#include "runtime/sampler.h"

namespace fl::server {

using TaskId = uint64_t;

enum class TaskKind {
  chat,        // a rendered chat prompt: output is split into reasoning / answer / tool calls
  completion,  // raw text completion: all output is answer text
};

struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json;  // the function's JSON schema, compact ("{}" when absent)
};

struct ToolChoice {
  enum class Mode { automatic, none, required, named };
  Mode mode = Mode::automatic;
  std::string name;  // Mode::named: the function the model must call
};

// json_object: the answer is one JSON object; json_schema: one that GenerationTask::json_schema accepts.
enum class ResponseFormat { text, json_object, json_schema };

struct ThinkingOptions {
  // The chat template's enable_thinking: unset leaves the template's default. Rendering already
  // used it; the engine needs it to know whether output may start with reasoning.
  std::optional<bool> enabled;
  // At most this many reasoning tokens, then the engine closes the reasoning block and the model
  // answers. 0: no budget. Always < max_tokens (validated on the HTTP side).
  int64_t budget_tokens = 0;
};

struct GenerationTask {
  TaskKind kind = TaskKind::chat;
  std::string request_id;              // for logs and error messages
  std::string prompt_text;             // the rendered prompt
  std::vector<int32_t> prompt_tokens;  // its token ids (empty when the frontend does not tokenize)
  int64_t prompt_token_count = 0;      // what the prompt counts for in usage and context checks
  SamplingParams sampling;
  int64_t max_tokens = 1;         // > 0 (>= 0 with echo); prompt + max_tokens <= the engine's context
  std::vector<std::string> stop;  // generation ends before the first of these; not emitted
  ThinkingOptions thinking;
  std::vector<ToolDefinition> tools;  // empty: no tool-call parsing
  ToolChoice tool_choice;
  ResponseFormat response_format = ResponseFormat::text;
  std::shared_ptr<const JsonSchema> json_schema;  // json_schema: compiled on the HTTP side
  // Log-probabilities of each sampled token: -1 none; else that many most likely alternatives
  // with each (0 .. 20).
  int logprobs = -1;
  // Completions: the prompt's text comes first in the answer, and with logprobs its tokens' entries
  // (the first token's has no value: nothing precedes it). max_tokens may then be 0: scoring only.
  bool echo = false;
};

enum class FinishReason {
  stop,        // end of sequence or a stop string
  length,      // max_tokens reached (or the context filled up)
  tool_calls,  // the answer ended with tool calls
  cancelled,   // the client went away or the server is shutting down
  error,       // the engine failed; FinishEvent::error says why
};
const char* finish_reason_name(FinishReason reason);  // the OpenAI spelling ("stop", "length", ...)

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens whose KV was reused (prefix cache)
  int64_t completion_tokens = 0;     // every generated token, reasoning included
  int64_t reasoning_tokens = 0;
};

struct Timings {
  double queue_ms = 0;       // admitted -> started (filled in by the InferenceLoop)
  double prompt_ms = 0;      // prefill
  double generation_ms = 0;  // first generated token -> finish
};

struct ToolCallOutput {
  std::string id;  // e.g. "call_abc123"; unique within the response
  std::string name;
  std::string arguments_json;  // a JSON object, compact, as OpenAI's `arguments` string
};

// One sampled token's log-probability (runtime/logprobs.h: the model's own distribution), with
// the most likely alternatives when asked for. Forced tokens (a thought's close marker, a
// required call's opening) have none; an end-of-sequence token that ends the answer has one.
struct LogprobEntry {
  std::string token;  // its text (valid UTF-8: U+FFFD where the token is part of a character)
  std::string bytes;  // its raw bytes
  float logprob = 0.0f;
  bool special = false;  // a special token (BOS, EOS, ...): not part of the answer's text
};
struct TokenLogprobOutput {
  LogprobEntry chosen;
  std::vector<LogprobEntry> top;
  bool has_logprob = true;  // false: an echoed prompt's first token (chosen.logprob and top unused)
};

struct EngineEvent {
  enum class Kind { reasoning, content, tool_call, logprob, finish };
  Kind kind = Kind::content;
  std::string text;          // reasoning, content: the next piece (valid UTF-8)
  ToolCallOutput tool_call;  // tool_call
  TokenLogprobOutput logprob;  // logprob: a sampled token's, sent before the text it adds
  // finish:
  FinishReason finish_reason = FinishReason::stop;
  Usage usage;
  Timings timings;
  std::string error;  // finish_reason == error: one line saying what failed

  static EngineEvent reasoning(std::string text);
  static EngineEvent content(std::string text);
  static EngineEvent tool(ToolCallOutput call);
  static EngineEvent token_logprob(TokenLogprobOutput logprob);
  static EngineEvent finish(FinishReason reason, Usage usage, Timings timings, std::string error = {});
};

using EmitFn = std::function<void(TaskId, EngineEvent)>;

struct EngineInfo {
  std::string model_id;        // what /v1/models lists and responses name
  int64_t context_length = 0;  // tokens per sequence, prompt + generated (--max-seq)
  int parallel = 1;            // sequences decoded together at most (--parallel)
  int32_t vocab_size = 0;      // token ids are 0..vocab_size-1 (0: unknown, not checked)
};

// Implementations are used from one thread only (the InferenceLoop's), so they need no locking.
class Engine {
 public:
  virtual ~Engine() = default;

  virtual EngineInfo info() const = 0;

  // Called once, first, on the thread that then makes every other call (the inference loop's):
  // a model engine makes it drive the model's GPU.
  virtual void bind_to_this_thread() {}

  // The admission hook: how many more tasks start() accepts now (0 while the batch is full or
  // memory is short). The loop keeps everything else waiting in its bounded queue.
  virtual int free_slots() const = 0;

  // Takes a task into the running batch. A task that cannot run throws fl::Error; the loop then
  // finishes it with FinishReason::error and that message.
  virtual void start(TaskId id, GenerationTask task) = 0;

  // True while some started task has not finished.
  virtual bool busy() const = 0;

  // Advances every running task by one step (a decode step, or a chunk of prefill) and reports
  // what each produced through `emit`. A task's last event is its finish; after it the id is
  // forgotten. Returns the number of tokens generated in this step (for the tok/s metric).
  virtual int64_t step(const EmitFn& emit) = 0;

  // Stops a running task now and frees its sequence; emits nothing more for it. Unknown ids
  // (already finished) are ignored.
  virtual void cancel(TaskId id) = 0;
};

}  // namespace fl::server
