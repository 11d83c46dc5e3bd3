#pragma once
// EngineEvents -> OpenAI responses: whole chat.completion / text_completion objects, and the SSE
// chunks of a stream (`data: {...}\n\n`, ending with `data: [DONE]\n\n`).
//
// Beyond OpenAI's schema, fireline adds (as llama.cpp and vLLM do) `reasoning_content` for the
// thinking channel, and a `timings` object next to `usage`.
//
// Log-probabilities: chat's `logprobs.content` lists every sampled token in order (the thought's
// too) as {token, logprob, bytes, top_logprobs}; completions' legacy object has parallel lists
// `tokens`, `token_logprobs`, `top_logprobs` ({token: logprob}) and `text_offset`. A stream sends
// a token's entry with the next chunk that carries text (a stop string can hold text back), and
// whatever is left with the finish chunk.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/engine.h"

namespace fl::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  bool logprobs = false;  // the request asked for log-probabilities: `logprobs` is an object, not null
};

// A task's events gathered for a non-streaming response.
struct CollectedOutput {
  std::string content, reasoning;
  std::vector<ToolCallOutput> tool_calls;
  std::vector<TokenLogprobOutput> logprobs;  // one per sampled token, in order
  bool finished = false;
  FinishReason finish_reason = FinishReason::stop;
  Usage usage;
  Timings timings;
  std::string error;

  void add(const EngineEvent& event);
};

std::string error_body(const ApiError& error);  // {"error": {...}}
nlohmann::ordered_json usage_json(const Usage& usage);
nlohmann::ordered_json timings_json(const Timings& timings, const Usage& usage);

// Usage and timings of several outputs: each `per_prompt` consecutive outputs (a request's n)
// answer one prompt, whose tokens count once; completion tokens and times add up.
std::pair<Usage, Timings> summed_usage(std::span<const CollectedOutput> outs, size_t per_prompt);

// Whole responses: choice i is outs[i]. Each `per_prompt` consecutive outputs (a request's n)
// answer one prompt, whose tokens `usage` counts once; completion tokens and timings are summed.
std::string chat_completion_body(const ResponseMeta& meta, std::span<const CollectedOutput> outs,
                                 size_t per_prompt = 1);
std::string text_completion_body(const ResponseMeta& meta, std::span<const CollectedOutput> outs,
                                 size_t per_prompt = 1);

// One SSE event carrying `payload`.
std::string sse_data(const nlohmann::ordered_json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// The chunks of one streamed response, in order.
// A response streaming several choices (n, or several prompts) has a formatter per choice, each
// writing its `index`, and ends once: end() after every choice's finish_choice().
class StreamFormatter {
 public:
  StreamFormatter(ResponseMeta meta, bool chat, bool include_usage, int index)
      : meta_(std::move(meta)), chat_(chat), include_usage_(include_usage), index_(index) {}

  std::string begin();                      // chat: the role chunk; completion: nothing
  std::string event(const EngineEvent& e);  // a delta (empty for finish events)
  // The choice's finish chunk (with the task's `timings` unless a usage chunk will carry them).
  std::string finish_choice(const EngineEvent& e);
  // The usage chunk when asked for (the whole request's usage and timings), and [DONE].
  std::string end(const Usage& usage, const Timings& timings) const;

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;

  // The entries gathered since the last chunk, as the chunk's `logprobs` (null when not asked for).
  nlohmann::ordered_json take_logprobs();

  ResponseMeta meta_;
  bool chat_;
  bool include_usage_;
  int index_;
  int tool_calls_ = 0;
  std::vector<TokenLogprobOutput> pending_logprobs_;
  int64_t text_offset_ = 0;  // completions: bytes of token text before the pending entries
};

}  // namespace fl::server
