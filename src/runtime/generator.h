#pragma once
// One request from messages to text, streamed as typed events:
//
//   request --PromptBuilder--> ids --TokenEngine (prefill, decode) + Sampler + TokenStopChecker-->
//   generated ids --TextStream (detokenizer, stop strings, reasoning parser, tool calls)--> events
//
// The three stages are separate classes with small interfaces (prompt_builder.h, token_engine.h,
// text_stream.h) so that a server can run the first and last on worker threads and drive the
// token engines of many sequences from one thread; the Generator is the single-sequence loop that
// ties them together for the CLI.
//
// Thinking cap: while the model is inside a thought, each generated token counts; when the cap
// is reached the close marker (Gemma 4: <channel|>) is tokenized and fed to the model as forced
// tokens (they count as generated tokens but are not shown), and the answer continues.
//
// Cancellation: `cancel` is read between prefill chunks and between decode steps; a cancelled
// request ends with finish_reason cancelled, its text so far and its timings.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/json_schema.h"
#include "runtime/prompt_builder.h"
#include "runtime/sampler.h"
#include "runtime/stop_conditions.h"
#include "runtime/text_stream.h"
#include "runtime/token_engine.h"

namespace fl {

struct GenerateRequest {
  PromptRequest prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;                       // generated tokens; 0: until EOS or the context is full
  std::vector<std::string> stop;                // stop strings
  std::optional<int64_t> max_reasoning_tokens;  // overrides think_token_cap(prompt.think); 0: no cap
  bool ignore_eos = false;                      // keep going past end-of-sequence ids
  // JSON mode: outside a thought the answer is one JSON object (json_prefix.h), one the schema
  // accepts when one is given (json_schema.h); it ends when the object is complete.
  bool json = false;
  std::shared_ptr<const JsonSchema> json_schema;  // implies json
};

struct GenerationUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens already in the sequence (not run again)
  int64_t completion_tokens = 0;  // sampled and forced tokens, a final EOS included
  int64_t reasoning_tokens = 0;   // of which inside a thought
};

struct GenerationTimings {
  double ttft_s = 0;     // from the request (template and tokenizer included) to the first token
  double prefill_s = 0;  // running the prompt's uncached tokens
  double decode_s = 0;   // from the first token to the end
  double total_s = 0;
  int64_t prefill_tokens = 0;  // tokens run by the prefill
  int64_t decode_steps = 0;    // forward steps after the prefill (one per token fed)
  double prefill_tok_s() const { return prefill_s > 0 ? static_cast<double>(prefill_tokens) / prefill_s : 0.0; }
  double decode_tok_s() const { return decode_s > 0 ? static_cast<double>(decode_steps) / decode_s : 0.0; }
};

struct GenerationResult {
  std::string content;    // the answer, stop strings and markers removed
  std::string reasoning;  // the thought
  std::vector<chat::ToolCall> tool_calls;
  std::vector<std::string> tool_call_errors;  // malformed calls (their text stays in content)
  std::vector<int32_t> tokens;                // generated ids in order (forced ones and a final EOS included)
  FinishReason finish_reason = FinishReason::stop;
  StopCause stop_cause = StopCause::none;
  std::string stop_string;  // the stop string that ended it (stop_cause stop_string)
  bool reasoning_capped = false;
  GenerationUsage usage;
  GenerationTimings timings;
};

// Views into the generator's state: valid during the callback only (copy what must outlive it).
struct GenerationEvent {
  enum class Kind { reasoning, content, tool_call, done };
  Kind kind;
  std::string_view text;                       // reasoning / content delta
  const chat::ToolCall* tool_call = nullptr;   // tool_call
  const GenerationResult* result = nullptr;    // done
};
using GenerationCallback = std::function<void(const GenerationEvent&)>;

const char* event_kind_name(GenerationEvent::Kind kind);

class Generator {
 public:
  Generator(Model& model, std::shared_ptr<const ModelText> text, EngineOptions options);

  // Builds the prompt and generates. Events arrive in order, the done event last; the same text
  // is in the returned result. Throws fl::Error for bad requests (e.g. a prompt longer than the
  // context, with both numbers) and model failures.
  GenerationResult generate(const GenerateRequest& request, const GenerationCallback& on_event = {},
                            const std::atomic<bool>* cancel = nullptr);
  // The same for a prompt built beforehand (request.prompt then only says whether it was raw).
  GenerationResult generate(const Prompt& prompt, const GenerateRequest& request, const GenerationCallback& on_event = {},
                            const std::atomic<bool>* cancel = nullptr);

  const PromptBuilder& prompts() const { return prompts_; }
  const ModelText& text() const { return *text_; }
  TokenEngine& engine() { return engine_; }

 private:
  // `start`: when the request arrived (ttft counts from it).
  GenerationResult run(const Prompt& prompt, const GenerateRequest& request, const GenerationCallback& on_event,
                       const std::atomic<bool>* cancel, std::chrono::steady_clock::time_point start);

  std::shared_ptr<const ModelText> text_;
  PromptBuilder prompts_;
  TokenEngine engine_;
  std::vector<std::string> token_texts_;  // filled on the first JSON-mode request
};

}  // namespace fl
