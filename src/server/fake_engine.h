#pragma once
// A deterministic stand-in for the model, for testing the server without weights
// (`fireline serve --fake-engine`). FakePromptFrontend and FakeEngine are a pair:
//
// The frontend renders a chat with a small built-in format, one block per message,
//     <|system|>\n...\n<|user|>\n...\n<|assistant|>\n
// (tools listed first as <|tools|>\nNAME NAME\n), and tokenizes it as UTF-8 bytes (token id =
// byte value, vocabulary 256), so a prompt of N bytes counts N tokens.
//
// The engine answers the last user message (chat) or the whole prompt (completion):
//     "You said: <that text>"
// one token per word (a word with its leading space), one token per task per step. With thinking
// enabled (chat only) it first reasons "The user wrote N words. I will repeat them back." (capped by
// the thinking budget). Directives anywhere in the text change the script:
//     [[long]]      the answer never ends: "more more more ..." until max_tokens (finish: length)
//     [[empty]]     no answer text
//     [[repeat]]    "again and again" thirty times (a repetition attractor), then stop
//     [[tool]]      with tools: call the first tool with {"text": <the text>} (finish: tool_calls)
//     [[delay=N]]   sleep N ms per step while this task runs
//     [[fail]]      start() throws, as an engine that cannot run the task would
// tool_choice "required" or a named function always calls; "none" never does. response_format
// json_object (and json_schema, whose schema it ignores) answers {"echo": "<the text>"}. Stop strings cut the answer
// before their first occurrence (finish: stop); max_tokens counts reasoning and answer tokens (finish: length). Asked
// for log-probabilities, it sends one before each reasoning or answer piece: the piece at -0.25 (i % 4) for the i-th
// piece, and alternatives "<alt1>", "<alt2>", ... each 0.5 below. Echo (completions) sends the prompt text first, as
// one piece whose entry has no value.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/prompt_frontend.h"

namespace fl::server {

struct FakeEngineConfig {
  std::string model_id = "fireline-fake";
  int64_t context_length = 4096;
  int parallel = 4;
  std::chrono::milliseconds token_delay{0};    // sleep per step (all running tasks advance together)
  std::chrono::milliseconds prefill_delay{0};  // extra sleep in a task's first step
};

// What the engine saw, readable from any thread while it runs inside an InferenceLoop.
struct FakeEngineCounters {
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};  // cancel() calls for tasks that were running
  std::atomic<int> finished{0};
  std::atomic<int> max_running{0};
};

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(FakeEngineConfig config = {});

  EngineInfo info() const override;
  int free_slots() const override;
  void start(TaskId id, GenerationTask task) override;
  bool busy() const override { return !tasks_.empty(); }
  int64_t step(const EmitFn& emit) override;
  void cancel(TaskId id) override;

  std::shared_ptr<FakeEngineCounters> counters() const { return counters_; }

 private:
  struct Piece {
    EngineEvent::Kind kind;
    std::string text;
    ToolCallOutput call;
  };
  struct Task {
    TaskId id;
    std::vector<Piece> script;
    size_t next = 0;
    FinishReason reason = FinishReason::stop;
    int64_t prompt_tokens = 0;
    int64_t reasoning_tokens = 0;
    int logprobs = -1;  // GenerationTask::logprobs
    size_t echoed = 0;  // 1: the script starts with the echoed prompt (not a generated token)
    std::chrono::milliseconds delay{0};
    std::chrono::steady_clock::time_point started_at, first_token_at;
  };

  FakeEngineConfig config_;
  std::vector<Task> tasks_;
  std::shared_ptr<FakeEngineCounters> counters_ = std::make_shared<FakeEngineCounters>();
};

class FakePromptFrontend final : public PromptFrontend {
 public:
  PreparedPrompt render_chat(const ChatPrompt& chat) const override;
  PreparedPrompt prepare_text(std::string_view text) const override;
  PreparedPrompt prepare_tokens(std::span<const int32_t> ids) const override;
};

}  // namespace fl::server
