#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "runtime/json_prefix.h"

namespace fl {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool cancelled(const std::atomic<bool>* cancel) { return cancel && cancel->load(std::memory_order_relaxed); }

}  // namespace

const char* event_kind_name(GenerationEvent::Kind kind) {
  switch (kind) {
    case GenerationEvent::Kind::reasoning: return "reasoning";
    case GenerationEvent::Kind::content: return "content";
    case GenerationEvent::Kind::tool_call: return "tool_call";
    case GenerationEvent::Kind::done: return "done";
  }
  return "done";
}

Generator::Generator(Model& model, std::shared_ptr<const ModelText> text, EngineOptions options)
    : text_(std::move(text)), prompts_(text_), engine_(model, options) {}

GenerationResult Generator::generate(const GenerateRequest& request, const GenerationCallback& on_event,
                                     const std::atomic<bool>* cancel) {
  const auto start = Clock::now();
  Prompt prompt = prompts_.build(request.prompt);
  return run(prompt, request, on_event, cancel, start);
}

GenerationResult Generator::generate(const Prompt& prompt, const GenerateRequest& request,
                                     const GenerationCallback& on_event, const std::atomic<bool>* cancel) {
  return run(prompt, request, on_event, cancel, Clock::now());
}

GenerationResult Generator::run(const Prompt& prompt, const GenerateRequest& request,
                                const GenerationCallback& on_event, const std::atomic<bool>* cancel, Clock::time_point t0) {
  const ModelText& m = *text_;
  const bool raw = request.prompt.raw.has_value();
  if (request.max_tokens < 0) fail("max_tokens must be 0 (no limit) or more, not {}", request.max_tokens);
  Sampler sampler(request.sampling);  // validates the parameters

  TokenStopPolicy policy;
  if (!request.ignore_eos) policy.eos_ids = m.defaults.eos_ids;
  policy.max_tokens = request.max_tokens;
  policy.context = engine_.context();
  TokenStopChecker stopper(std::move(policy));

  TextStreamOptions text_options;
  text_options.stop = request.stop;
  if (!raw) {
    text_options.reasoning = m.format.reasoning;
    text_options.start_in_reasoning = prompt.starts_in_reasoning;
    text_options.max_reasoning_tokens = request.max_reasoning_tokens.value_or(think_token_cap(request.prompt.think));
    // Tool calls are parsed only when the request offers tools (as the server does): otherwise
    // the markers are special tokens like any other and are dropped.
    if (request.prompt.tools.is_array() && !request.prompt.tools.empty()) {
      text_options.tool_calls = m.format.tool_calls;
      text_options.tools = request.prompt.tools;
    }
  }
  TextStream text(m.tokenizer, std::move(text_options));

  GenerationResult result;
  result.usage.prompt_tokens = static_cast<int64_t>(prompt.ids.size());
  std::vector<TextEvent> events;
  auto deliver = [&] {
    for (auto& e : events) {
      GenerationEvent ev{};
      switch (e.kind) {
        case TextEvent::Kind::reasoning:
          result.reasoning += e.text;
          ev = {GenerationEvent::Kind::reasoning, e.text};
          break;
        case TextEvent::Kind::content:
          result.content += e.text;
          ev = {GenerationEvent::Kind::content, e.text};
          break;
        case TextEvent::Kind::tool_call:
          result.tool_calls.push_back(e.call);
          ev = {GenerationEvent::Kind::tool_call, {}, &result.tool_calls.back()};
          break;
      }
      if (on_event) on_event(ev);
    }
    events.clear();
  };

  // ---- prefill ----
  const auto t_prefill = Clock::now();
  StopCause cause = StopCause::none;
  if (!engine_.prefill(prompt.ids, cancel)) cause = StopCause::cancelled;
  result.usage.cached_tokens = engine_.reused_tokens();
  result.timings.prefill_tokens = cause == StopCause::cancelled ? 0 : result.usage.prompt_tokens - result.usage.cached_tokens;
  result.timings.prefill_s = seconds(Clock::now() - t_prefill);
  const size_t penalty_window = static_cast<size_t>(request.sampling.penalty_last_n);
  for (size_t i = prompt.ids.size() - std::min(prompt.ids.size(), penalty_window); i < prompt.ids.size(); ++i)
    sampler.accept(prompt.ids[i]);

  // ---- decode ----
  Clock::time_point t_first{};
  int64_t n_generated = 0;
  // After a decode step the next token is already chosen where the logits are (on a GPU: only
  // its id crossed); after the prompt and after forced tokens, the host samples the logits. JSON
  // mode samples on the host always: a token is taken only if its text continues the object.
  std::optional<int32_t> sampled;
  std::optional<JsonPrefix> json;
  if (request.json || request.json_schema) json.emplace(request.json_schema.get());
  while (cause == StopCause::none) {
    if (cancelled(cancel)) {
      cause = StopCause::cancelled;
      break;
    }
    const bool constrained = json && !text.in_reasoning();
    int32_t token = -1;
    if (constrained) {
      if (token_texts_.empty())
        token_texts_ = token_bytes_table(m.tokenizer, static_cast<int32_t>(engine_.logits().size()));
      token = sample_json(
          sampler, engine_.logits(), *json, [&](int32_t t) { return stopper.is_eos(t); }, token_texts_);
      if (token < 0) fail("JSON mode: no token of the vocabulary can continue the JSON object");
      if (!stopper.is_eos(token)) json->feed(token_texts_[static_cast<size_t>(token)]);
    } else {
      token = sampled ? *sampled : sampler.sample(engine_.logits());
    }
    sampled.reset();
    sampler.accept(token);
    result.tokens.push_back(token);
    ++n_generated;
    if (n_generated == 1) {
      t_first = Clock::now();
      result.timings.ttft_s = seconds(t_first - t0);
    }
    cause = stopper.check(token, n_generated, engine_.n_past());
    if (cause == StopCause::eos_token) break;
    text.push(token, events);
    deliver();
    if (text.stop_matched()) {
      cause = StopCause::stop_string;
      break;
    }
    if (cause == StopCause::none && json && json->complete()) cause = StopCause::eos_token;  // the object is whole
    if (cause != StopCause::none) break;
    if (text.reasoning_cap_reached() || json)
      engine_.append(token);  // forced tokens follow, or JSON mode samples on the host
    else
      sampled = engine_.append_and_sample(token, sampler.next_spec());
    ++result.timings.decode_steps;

    if (text.reasoning_cap_reached()) {
      // Close the thought by feeding the close marker's tokens; the answer follows.
      result.reasoning_capped = true;
      const std::string inject = text.close_reasoning(events);
      deliver();
      for (int32_t forced : m.tokenizer.encode(inject, /*add_special_tokens=*/false)) {
        if (engine_.full()) {
          cause = StopCause::context_full;
          break;
        }
        sampler.accept(forced);
        result.tokens.push_back(forced);
        ++n_generated;
        engine_.append(forced);
        ++result.timings.decode_steps;
      }
      if (cause == StopCause::none && request.max_tokens > 0 && n_generated >= request.max_tokens)
        cause = StopCause::max_tokens;
    }
  }

  text.finish(events);
  deliver();
  const auto t_end = Clock::now();
  if (n_generated > 0) result.timings.decode_s = seconds(t_end - t_first);
  result.timings.total_s = seconds(t_end - t0);
  result.stop_cause = cause;
  if (cause == StopCause::stop_string) result.stop_string = text.matched_stop();
  result.finish_reason = finish_reason_of(cause, !result.tool_calls.empty());
  result.tool_call_errors = text.tool_call_errors();
  result.usage.completion_tokens = n_generated;
  result.usage.reasoning_tokens = text.reasoning_tokens();
  if (on_event) on_event({GenerationEvent::Kind::done, {}, nullptr, &result});
  return result;
}

}  // namespace fl
