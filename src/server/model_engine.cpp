#include "server/model_engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "runtime/logprobs.h"
#include "text/chat/reasoning_parser.h"
#include "text/tokenizer/utf8.h"

namespace fl::server {
namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The request's tools as the OpenAI function objects the tool-call parser types parameters with.
nlohmann::ordered_json tools_json(const std::vector<ToolDefinition>& tools) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& t : tools) {
    nlohmann::ordered_json fn = {{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    nlohmann::ordered_json params = nlohmann::ordered_json::parse(t.parameters_json, nullptr, false);
    fn["parameters"] = params.is_discarded() ? nlohmann::ordered_json::object() : params;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// An echoed prompt with log-probabilities: every prompt row's logits are needed, so the prompt
// runs whole (no reuse, no copy) with LogitsMode::all.
bool wants_prompt_logprobs(const GenerationTask& task) { return task.echo && task.logprobs >= 0; }

// How many leading tokens of `prompt` the slot already holds, when it holds nothing else: the
// sequence can then continue from there. At least one prompt token must stay to run (its logits
// start the generation), so a prompt equal to what the slot holds is not a reuse.
size_t reusable_prefix(const std::vector<int32_t>& held, const std::vector<int32_t>& prompt) {
  if (held.empty() || held.size() >= prompt.size()) return 0;
  return std::equal(held.begin(), held.end(), prompt.begin()) ? held.size() : 0;
}

}  // namespace

ModelEngine::ModelEngine(Model& model, std::shared_ptr<const ModelText> text, ModelEngineConfig config)
    : model_(model), text_(std::move(text)), config_(std::move(config)) {
  if (config_.parallel < 1) fail("the engine needs at least one sequence, not {}", config_.parallel);
  if (config_.context_length < 2) fail("the context must hold at least 2 tokens, not {}", config_.context_length);
  if (config_.prefill_chunk < 1) fail("the prefill chunk must be at least 1 token, not {}", config_.prefill_chunk);
  slots_.resize(static_cast<size_t>(config_.parallel));
  for (Slot& s : slots_) s.seq = model_.new_sequence({config_.context_length, config_.kv_dtype, /*sliding_ring=*/true});
}

ModelEngine::~ModelEngine() = default;

void ModelEngine::bind_to_this_thread() { model_.bind_to_this_thread(); }

EngineInfo ModelEngine::info() const {
  return {config_.model_id, config_.context_length, config_.parallel, model_.vocab_size()};
}

int ModelEngine::free_slots() const {
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.run; }));
}

bool ModelEngine::busy() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.run.has_value(); });
}

void ModelEngine::start(TaskId id, GenerationTask task) {
  const auto n_prompt = static_cast<int64_t>(task.prompt_tokens.size());
  if (n_prompt == 0) fail("the prompt has no tokens");
  if (n_prompt >= config_.context_length)
    fail("the prompt is {} tokens but the context holds {} (no room for an answer)", n_prompt, config_.context_length);
  for (int32_t t : task.prompt_tokens)
    if (t < 0 || t >= model_.vocab_size()) fail("token id {} is outside the vocabulary [0, {})", t, model_.vocab_size());
  for (const auto& [t, bias] : task.sampling.logit_bias)
    if (t >= model_.vocab_size())
      fail("logit_bias names token {}, outside the vocabulary [0, {})", t, model_.vocab_size());
  if (task.max_tokens < (task.echo ? 0 : 1))
    fail("max_tokens must be at least {}, not {}", task.echo ? 0 : 1, task.max_tokens);

  // The free slot that already holds the longest prefix of this prompt; else the emptiest one. (An
  // echoed prompt's log-probabilities need the logits of every prompt token: it runs whole.)
  const bool prompt_logprobs = wants_prompt_logprobs(task);
  Slot* best = nullptr;
  size_t best_reuse = 0;
  for (Slot& s : slots_) {
    if (s.run) continue;
    const size_t reuse = prompt_logprobs ? 0 : reusable_prefix(s.tokens, task.prompt_tokens);
    if (!best || reuse > best_reuse || (reuse == best_reuse && best_reuse == 0 && s.tokens.size() < best->tokens.size())) {
      best = &s;
      best_reuse = reuse;
    }
  }
  if (!best) fail("no free sequence (the server admitted more tasks than --parallel)");
  Slot& slot = *best;

  Running r;
  r.id = id;
  r.started_at = Clock::now();
  r.sampler.emplace(task.sampling);  // validates the parameters
  TokenStopPolicy policy;
  policy.eos_ids = text_->defaults.eos_ids;
  policy.max_tokens = task.max_tokens;
  policy.context = config_.context_length;
  r.stopper.emplace(std::move(policy));

  TextStreamOptions options;
  options.stop = task.stop;
  if (task.kind == TaskKind::chat) {
    options.reasoning = text_->format.reasoning;
    if (options.reasoning) options.start_in_reasoning = chat::starts_in_reasoning(task.prompt_text, *options.reasoning);
    options.max_reasoning_tokens = task.thinking.budget_tokens;
    if (!task.tools.empty()) {
      options.tool_calls = text_->format.tool_calls;
      options.tools = tools_json(task.tools);
    }
  }
  const bool must_call = task.tool_choice.mode == ToolChoice::Mode::required ||
                         task.tool_choice.mode == ToolChoice::Mode::named;
  if (must_call && options.tool_calls) {
    const bool named = task.tool_choice.mode == ToolChoice::Mode::named;
    if (*options.tool_calls == chat::ToolCallFormat::gemma4)
      r.forced_call = "<|tool_call>call:" + (named ? task.tool_choice.name + "{" : std::string());
    else
      r.forced_call = "<tool_call>\n{\"name\": \"" + (named ? task.tool_choice.name + "\", \"arguments\": " : std::string());
  }
  r.text.emplace(text_->tokenizer, std::move(options));
  // A required tool call takes precedence over JSON mode (the call is the answer).
  if (task.response_format != ResponseFormat::text && r.forced_call.empty()) {
    if (task.response_format == ResponseFormat::json_schema && !task.json_schema) fail("json_schema without a schema");
    r.json.emplace(task.json_schema.get());  // (the task keeps the schema alive: it lives in r.task)
  }

  // Repetition penalties see the end of the prompt, as in `fireline run`.
  const size_t window = static_cast<size_t>(std::max(0, task.sampling.penalty_last_n));
  const auto& p = task.prompt_tokens;
  for (size_t i = p.size() - std::min(p.size(), window); i < p.size(); ++i) r.sampler->accept(p[i]);

  if (best_reuse == 0 && !slot.tokens.empty()) {
    model_.reset_sequence(*slot.seq);
    slot.tokens.clear();
  }
  r.cached = static_cast<int64_t>(best_reuse);
  r.prefilled = r.cached;
  // The same prompt already being read by a running task (the other choices of an n > 1
  // request): wait for it and copy its sequence, unless this slot holds half the prompt or more.
  if (!prompt_logprobs && 2 * best_reuse < task.prompt_tokens.size()) {
    for (const Slot& s : slots_) {
      if (&s == &slot || !s.run || s.run->leader) continue;
      const Running& other = *s.run;
      if (!wants_prompt_logprobs(other.task) &&
          other.prefilled < static_cast<int64_t>(other.task.prompt_tokens.size()) &&
          other.task.prompt_tokens == task.prompt_tokens) {
        r.leader = other.id;
        break;
      }
    }
  }
  r.task = std::move(task);
  slot.run = std::move(r);
}

void ModelEngine::cancel(TaskId id) {
  for (Slot& s : slots_)
    if (s.run && s.run->id == id) s.run.reset();  // the sequence stays valid: `tokens` says what it holds
}

void ModelEngine::forget(Slot& slot) {
  try {
    model_.reset_sequence(*slot.seq);
  } catch (const Error& e) {
    log_warn("serve: could not reset a sequence after a failure: {}", e.what());
  }
  slot.tokens.clear();
}

void ModelEngine::start_followers(Slot& leader, const EmitFn& emit) {
  const Running& l = *leader.run;
  for (Slot& slot : slots_) {
    if (!slot.run || slot.run->leader != l.id) continue;
    Running& r = *slot.run;
    r.leader.reset();
    // Whatever goes wrong here is this follower's failure, not the leader's.
    try {
      model_.copy_sequence(*leader.seq, *slot.seq);
      slot.tokens = leader.tokens;
      r.prefilled = static_cast<int64_t>(r.task.prompt_tokens.size());
      r.cached = r.prefilled;  // read once, for the leader
      r.logits = l.logits;
      r.prompt_done_at = Clock::now();
      if (r.task.echo) emit(r.id, EngineEvent::content(r.task.prompt_text));
      if (r.task.max_tokens == 0) {  // scoring only
        r.logits.clear();
        finish(slot, StopCause::max_tokens, emit);
      }
    } catch (const std::exception& e) {
      fail_task(slot, fmt::format("starting from the prompt's sequence failed: {}", e.what()), emit);
    }
  }
}

void ModelEngine::fail_task(Slot& slot, const std::string& message, const EmitFn& emit) {
  const TaskId id = slot.run->id;
  Usage usage;
  usage.prompt_tokens = static_cast<int64_t>(slot.run->task.prompt_tokens.size());
  usage.completion_tokens = slot.run->generated;
  slot.run.reset();
  forget(slot);
  emit(id, EngineEvent::finish(FinishReason::error, usage, {}, message));
}

void ModelEngine::emit_text(Running& r, std::vector<TextEvent>& events, const EmitFn& emit) {
  for (TextEvent& e : events) {
    switch (e.kind) {
      case TextEvent::Kind::reasoning: emit(r.id, EngineEvent::reasoning(std::move(e.text))); break;
      case TextEvent::Kind::content: emit(r.id, EngineEvent::content(std::move(e.text))); break;
      case TextEvent::Kind::tool_call: {
        ToolCallOutput call;
        call.id = fmt::format("call_{:x}_{}", r.id, r.tool_calls++);
        call.name = e.call.name;
        call.arguments_json = e.call.arguments.dump();
        emit(r.id, EngineEvent::tool(std::move(call)));
        break;
      }
    }
  }
  events.clear();
}

void ModelEngine::finish(Slot& slot, StopCause cause, const EmitFn& emit) {
  Running& r = *slot.run;
  std::vector<TextEvent> events;
  r.text->finish(events);
  emit_text(r, events, emit);
  const auto now = Clock::now();

  Usage usage;
  usage.prompt_tokens = static_cast<int64_t>(r.task.prompt_tokens.size());
  usage.cached_prompt_tokens = r.cached;
  usage.completion_tokens = r.generated;
  usage.reasoning_tokens = r.text->reasoning_tokens();
  Timings timings;
  timings.prompt_ms = ms_between(r.started_at, r.prompt_done_at);
  if (r.generated > 0) timings.generation_ms = ms_between(r.first_token_at, now);

  FinishReason reason = FinishReason::stop;
  switch (cause) {
    case StopCause::max_tokens:
    case StopCause::context_full: reason = FinishReason::length; break;
    case StopCause::cancelled: reason = FinishReason::cancelled; break;
    default: reason = r.tool_calls > 0 ? FinishReason::tool_calls : FinishReason::stop; break;
  }
  const TaskId id = r.id;
  slot.run.reset();  // the slot keeps its tokens for the next prompt that extends them
  emit(id, EngineEvent::finish(reason, usage, timings));
}

const std::vector<std::string>& ModelEngine::token_texts() {
  if (token_texts_.empty()) token_texts_ = token_bytes_table(text_->tokenizer, model_.vocab_size());
  return token_texts_;
}

int32_t ModelEngine::sample_json(Running& r) {
  return fl::sample_json(
      *r.sampler, r.logits, *r.json, [&](int32_t t) { return r.stopper->is_eos(t); }, token_texts());
}

int64_t ModelEngine::force_call_opening(Slot& slot, const EmitFn& emit) {
  Running& r = *slot.run;
  r.logits.clear();  // the model's own choice is overridden
  r.sampled.reset();
  const std::vector<int32_t> ids = text_->tokenizer.encode(r.forced_call, /*add_special_tokens=*/false);
  r.forced_call.clear();
  const auto n_past = static_cast<int64_t>(slot.tokens.size());
  int64_t forced = 0;
  std::vector<TextEvent> events;
  for (int32_t t : ids) {
    if (n_past + static_cast<int64_t>(r.to_feed.size()) >= config_.context_length) {
      finish(slot, StopCause::context_full, emit);
      return forced;
    }
    if (++r.generated == 1) r.first_token_at = Clock::now();
    ++forced;
    r.sampler->accept(t);
    r.text->push(t, events);
    emit_text(r, events, emit);
    if (r.text->stop_matched()) {
      finish(slot, StopCause::stop_string, emit);
      return forced;
    }
    r.to_feed.push_back(t);
    if (r.generated >= r.task.max_tokens) {
      finish(slot, StopCause::max_tokens, emit);
      return forced;
    }
  }
  return forced;
}

LogprobEntry ModelEngine::logprob_entry(const TokenLogprob& p) const {
  LogprobEntry e;
  e.bytes = text_->tokenizer.token_bytes(p.id);
  e.token = utf8::sanitize(e.bytes);
  e.special = text_->tokenizer.is_special(p.id);
  e.logprob = p.logprob;
  return e;
}

TokenLogprobOutput ModelEngine::logprob_output(const TokenLogprobs& lp) const {
  TokenLogprobOutput out;
  out.chosen = logprob_entry(lp.chosen);
  for (const TokenLogprob& p : lp.top) out.top.push_back(logprob_entry(p));
  return out;
}

void ModelEngine::emit_prompt_logprobs(const Running& r, std::span<const float> logits, int64_t rows,
                                       const EmitFn& emit) {
  const auto V = static_cast<size_t>(model_.vocab_size());
  const auto& prompt = r.task.prompt_tokens;
  if (r.prefilled == 0) {  // the first token: nothing before it predicts it
    TokenLogprobOutput first;
    first.chosen = logprob_entry({prompt[0], 0.0f});
    first.has_logprob = false;
    emit(r.id, EngineEvent::token_logprob(std::move(first)));
  }
  // Row i holds the logits after prompt token prefilled + i: they predict the token after it.
  for (int64_t i = 0; i < rows; ++i) {
    const auto next = static_cast<size_t>(r.prefilled + i + 1);
    if (next >= prompt.size()) break;
    const TokenLogprobs lp =
        token_logprobs(logits.subspan(static_cast<size_t>(i) * V, V), prompt[next], r.task.logprobs);
    emit(r.id, EngineEvent::token_logprob(logprob_output(lp)));
  }
}

int64_t ModelEngine::advance(Slot& slot, const EmitFn& emit) {
  Running& r = *slot.run;
  if (!r.forced_call.empty() && !r.text->in_reasoning()) return force_call_opening(slot, emit);
  const bool constrained = r.json && !r.text->in_reasoning();
  int32_t token = -1;
  if (r.sampled) {  // sampled on the device from logits that never left it
    token = *r.sampled;
    if (token < 0) fail("sampler: every token is banned");
    // (step() keeps the logits of a task that wants log-probabilities on the host)
    if (r.task.logprobs >= 0) fail("internal: log-probabilities asked for, but the token was sampled on the device");
  } else {
    token = constrained ? sample_json(r) : r.sampler->sample(r.logits);
    if (token < 0) fail("JSON mode: no token of the vocabulary can continue the JSON object");
  }
  std::optional<TokenLogprobs> logprobs;
  if (r.task.logprobs >= 0) logprobs = token_logprobs(r.logits, token, r.task.logprobs);
  if (constrained && !r.stopper->is_eos(token)) r.json->feed(token_texts()[static_cast<size_t>(token)]);
  r.logits.clear();
  r.sampled.reset();
  r.sampler->accept(token);
  if (++r.generated == 1) r.first_token_at = Clock::now();

  // Positions in use once the tokens already queued are fed: the sampled token needs one more.
  const auto n_past = static_cast<int64_t>(slot.tokens.size());
  StopCause cause = r.stopper->check(token, r.generated, n_past);
  // Before the text this token adds (which a stop string may yet hold back), and for an EOS that
  // ends the answer too: scorers read the last entry as the sampled token's.
  if (logprobs) emit(r.id, EngineEvent::token_logprob(logprob_output(*logprobs)));
  if (cause == StopCause::eos_token) {
    finish(slot, cause, emit);
    return 1;
  }
  std::vector<TextEvent> events;
  r.text->push(token, events);
  emit_text(r, events, emit);
  if (r.text->stop_matched()) cause = StopCause::stop_string;
  if (cause == StopCause::none && r.json && r.json->complete()) cause = StopCause::eos_token;  // the object is whole
  if (cause != StopCause::none) {
    finish(slot, cause, emit);
    return 1;
  }
  r.to_feed.push_back(token);

  if (r.text->reasoning_cap_reached()) {
    // Close the thought by feeding the close marker's tokens; the answer follows.
    const std::string inject = r.text->close_reasoning(events);
    emit_text(r, events, emit);
    int64_t forced = 0;
    for (int32_t t : text_->tokenizer.encode(inject, /*add_special_tokens=*/false)) {
      if (n_past + static_cast<int64_t>(r.to_feed.size()) >= config_.context_length) {
        finish(slot, StopCause::context_full, emit);
        return 1 + forced;
      }
      r.sampler->accept(t);
      r.to_feed.push_back(t);
      ++r.generated;
      ++forced;
    }
    if (r.generated >= r.task.max_tokens) {
      finish(slot, StopCause::max_tokens, emit);
      return 1 + forced;
    }
    return 1 + forced;
  }
  return 1;
}

int64_t ModelEngine::step(const EmitFn& emit) {
  int64_t generated = 0;

  // 1. One prefill chunk, for the next slot (round robin) still reading its prompt.
  for (size_t k = 0; k < slots_.size(); ++k) {
    const size_t i = (next_prefill_ + k) % slots_.size();
    Slot& slot = slots_[i];
    if (!slot.run) continue;
    Running& r = *slot.run;
    const auto n_prompt = static_cast<int64_t>(r.task.prompt_tokens.size());
    if (r.prefilled >= n_prompt) continue;
    if (r.leader) {
      auto reading = [&](const Slot& s) {
        return s.run && !s.run->leader && s.run->prefilled < static_cast<int64_t>(s.run->task.prompt_tokens.size());
      };
      const bool leader_reading = std::any_of(slots_.begin(), slots_.end(),
                                              [&](const Slot& s) { return reading(s) && s.run->id == *r.leader; });
      if (leader_reading) continue;
      // The leader was cancelled or failed: follow another task reading the same prompt, or read it here.
      r.leader.reset();
      for (const Slot& s : slots_)
        if (&s != &slot && reading(s) && s.run->task.prompt_tokens == r.task.prompt_tokens) r.leader = s.run->id;
      if (r.leader) continue;
    }
    next_prefill_ = i + 1;
    // An echoed prompt's log-probabilities: every row's logits, in chunks of at most ~64 MiB of them.
    const bool all_rows = wants_prompt_logprobs(r.task);
    const auto V = static_cast<int64_t>(model_.vocab_size());
    const int64_t max_len = all_rows ? std::max<int64_t>(1, (int64_t{64} << 20) / (4 * V)) : config_.prefill_chunk;
    const int64_t len = std::min({config_.prefill_chunk, max_len, n_prompt - r.prefilled});
    std::span<const int32_t> chunk(r.task.prompt_tokens.data() + r.prefilled, static_cast<size_t>(len));
    try {
      std::vector<float> logits = model_.forward(*slot.seq, chunk, all_rows ? LogitsMode::all : LogitsMode::last);
      slot.tokens.insert(slot.tokens.end(), chunk.begin(), chunk.end());
      if (all_rows) emit_prompt_logprobs(r, logits, len, emit);
      r.prefilled += len;
      if (r.prefilled == n_prompt) {
        if (all_rows) logits = std::vector<float>(logits.end() - V, logits.end());  // the last row (and its size only)
        r.logits = std::move(logits);
        r.prompt_done_at = Clock::now();
        start_followers(slot, emit);
        if (r.task.echo) emit(r.id, EngineEvent::content(r.task.prompt_text));
        if (r.task.max_tokens == 0) {  // scoring only
          r.logits.clear();
          finish(slot, StopCause::max_tokens, emit);
        }
      }
    } catch (const Error& e) {
      fail_task(slot, fmt::format("prefill failed: {}", e.what()), emit);
    }
    break;
  }

  // 2. One decode token for every slot that has one to feed, in one batch.
  std::vector<Slot*> batch;
  std::vector<Sequence*> seqs;
  std::vector<int32_t> ids;
  for (Slot& slot : slots_)
    if (slot.run && !slot.run->to_feed.empty()) {
      batch.push_back(&slot);
      seqs.push_back(slot.seq.get());
      ids.push_back(slot.run->to_feed.front());
    }
  if (!batch.empty()) {
    // A row whose sequence has fed its last queued token needs the next one. When none of them
    // needs its logits on the host (JSON mode constrains the choice there), every row is sampled
    // on the device and only the ids come back; the rest get a greedy spec whose id is dropped
    // (greedy draws nothing from a sampler's generator).
    std::vector<SampleSpec> specs(batch.size());
    std::vector<bool> wants(batch.size(), false);
    bool on_device = true;
    for (size_t b = 0; b < batch.size(); ++b) {
      const Running& r = *batch[b]->run;
      if (r.to_feed.size() != 1 || (!r.forced_call.empty() && !r.text->in_reasoning())) continue;
      wants[b] = true;
      if ((r.json && !r.text->in_reasoning()) || r.task.logprobs >= 0) on_device = false;
    }
    for (SampleSpec& spec : specs) spec.temperature = 0.0f;
    try {
      std::vector<int32_t> sampled;
      std::vector<float> logits;
      if (on_device) {
        for (size_t b = 0; b < batch.size(); ++b)
          if (wants[b]) specs[b] = batch[b]->run->sampler->next_spec();
        sampled = model_.forward_batch_sample(seqs, ids, specs);
      } else {
        logits = model_.forward_batch(seqs, ids);
      }
      const auto V = static_cast<size_t>(model_.vocab_size());
      for (size_t b = 0; b < batch.size(); ++b) {
        Running& r = *batch[b]->run;
        batch[b]->tokens.push_back(ids[b]);
        r.to_feed.pop_front();
        if (!r.to_feed.empty()) continue;
        if (on_device) {
          r.logits.clear();
          r.sampled = sampled[b];
        } else {
          r.logits.assign(logits.begin() + b * V, logits.begin() + (b + 1) * V);
        }
      }
    } catch (const Error& e) {
      // Which sequence failed is unknown: every one in the batch may hold a partial step.
      for (Slot* slot : batch) fail_task(*slot, fmt::format("decode failed: {}", e.what()), emit);
    }
  }

  // 3. Sample where logits are fresh.
  for (Slot& slot : slots_)
    if (slot.run && (!slot.run->logits.empty() || slot.run->sampled)) {
      try {
        generated += advance(slot, emit);
      } catch (const Error& e) {
        fail_task(slot, e.what(), emit);
      }
    }
  return generated;
}

}  // namespace fl::server
