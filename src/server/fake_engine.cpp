#include "server/fake_engine.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "server/api_error.h"
#include "text/tokenizer/utf8.h"

namespace fl::server {
namespace {

constexpr std::string_view kUserTag = "<|user|>\n";

// The text the fake model answers: the last user block of a chat prompt, or the whole prompt.
std::string answer_subject(const GenerationTask& task) {
  if (task.kind == TaskKind::completion) return task.prompt_text;
  const std::string& p = task.prompt_text;
  const size_t tag = p.rfind(kUserTag);
  if (tag == std::string::npos) return {};
  const size_t begin = tag + kUserTag.size();
  const size_t end = p.find("\n<|", begin);
  return p.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Splits text into tokens: each word keeps the whitespace before it.
std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && (text[j] == ' ' || text[j] == '\n')) ++j;
    while (j < text.size() && text[j] != ' ' && text[j] != '\n') ++j;
    out.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

bool has(std::string_view text, std::string_view directive) { return text.find(directive) != std::string_view::npos; }

std::chrono::milliseconds delay_directive(std::string_view text) {
  const size_t at = text.find("[[delay=");
  if (at == std::string_view::npos) return std::chrono::milliseconds(0);
  int64_t ms = 0;
  for (size_t i = at + 8; i < text.size() && text[i] >= '0' && text[i] <= '9' && ms < 600000; ++i)
    ms = ms * 10 + (text[i] - '0');
  return std::chrono::milliseconds(ms);
}

}  // namespace

FakeEngine::FakeEngine(FakeEngineConfig config) : config_(std::move(config)) {
  if (config_.parallel < 1) fail("fake engine: parallel must be at least 1, got {}", config_.parallel);
  if (config_.context_length < 16) fail("fake engine: context length {} is too small", config_.context_length);
}

EngineInfo FakeEngine::info() const { return {config_.model_id, config_.context_length, config_.parallel, 256}; }

namespace {

// The fake tokens' log-probabilities: the piece itself at -0.25 (n % 4), then `top` - 1 made-up
// alternatives ("<alt1>", ...) each 0.5 less likely than the one before.
TokenLogprobOutput fake_logprobs(const std::string& piece, size_t n, int top) {
  TokenLogprobOutput out;
  out.chosen = {piece, piece, n % 4 == 0 ? 0.0f : -0.25f * static_cast<float>(n % 4)};
  for (int i = 0; i < top; ++i) {
    if (i == 0) {
      out.top.push_back(out.chosen);
      continue;
    }
    const std::string alt = fmt::format("<alt{}>", i);
    out.top.push_back({alt, alt, out.chosen.logprob - 0.5f * static_cast<float>(i)});
  }
  return out;
}

}  // namespace

int FakeEngine::free_slots() const { return std::max(0, config_.parallel - static_cast<int>(tasks_.size())); }

void FakeEngine::start(TaskId id, GenerationTask task) {
  const std::string subject = utf8::sanitize(answer_subject(task));
  if (has(subject, "[[fail]]")) fail("fake engine: the request asked it to fail ([[fail]])");
  FL_ASSERT(task.max_tokens > 0 || (task.echo && task.max_tokens == 0));

  Task t;
  t.id = id;
  t.prompt_tokens = task.prompt_token_count;
  t.logprobs = task.logprobs;
  t.delay = delay_directive(subject);
  t.started_at = std::chrono::steady_clock::now();

  // Reasoning, capped by the thinking budget.
  std::vector<Piece> script;
  if (task.kind == TaskKind::chat && task.thinking.enabled.value_or(false)) {
    const auto n_words = words(subject).size();
    auto thoughts = words(fmt::format("The user wrote {} words. I will repeat them back.", n_words));
    if (task.thinking.budget_tokens > 0 && static_cast<int64_t>(thoughts.size()) > task.thinking.budget_tokens)
      thoughts.resize(task.thinking.budget_tokens);
    for (auto& w : thoughts) script.push_back({EngineEvent::Kind::reasoning, std::move(w), {}});
  }
  const auto reasoning_count = static_cast<int64_t>(script.size());

  // The answer: a tool call, or text.
  const bool tools = !task.tools.empty() && task.tool_choice.mode != ToolChoice::Mode::none;
  const bool call = tools && (has(subject, "[[tool]]") || task.tool_choice.mode == ToolChoice::Mode::required ||
                              task.tool_choice.mode == ToolChoice::Mode::named);
  FinishReason reason = FinishReason::stop;
  if (call) {
    std::string name = task.tool_choice.mode == ToolChoice::Mode::named ? task.tool_choice.name : task.tools[0].name;
    nlohmann::json args = {{"text", subject}};
    script.push_back({EngineEvent::Kind::tool_call, {}, {fmt::format("call_fake{}", id), name, args.dump()}});
    reason = FinishReason::tool_calls;
  } else {
    std::string answer;
    bool endless = false;
    if (has(subject, "[[empty]]")) {
      answer.clear();
    } else if (task.response_format != ResponseFormat::text) {  // (a json_schema's schema is not followed)
      answer = nlohmann::json{{"echo", subject}}.dump();
    } else if (has(subject, "[[repeat]]")) {
      for (int i = 0; i < 30; ++i) answer += i ? " again and again" : "again and again";
    } else {
      answer = "You said: " + subject;
      endless = has(subject, "[[long]]");
    }
    for (const auto& stop : task.stop) {
      const size_t at = answer.find(stop);
      if (!stop.empty() && at != std::string::npos) {
        answer.resize(at);
        endless = false;
      }
    }
    for (auto& w : words(answer)) script.push_back({EngineEvent::Kind::content, std::move(w), {}});
    if (endless) {  // one more than fits, so the cut below reports length
      while (static_cast<int64_t>(script.size()) <= task.max_tokens)
        script.push_back({EngineEvent::Kind::content, " more", {}});
    }
  }
  if (static_cast<int64_t>(script.size()) > task.max_tokens) {
    script.resize(task.max_tokens);
    reason = FinishReason::length;
  }
  if (task.echo) {  // the prompt first, not counted as generated (its one logprob entry has no value)
    script.insert(script.begin(), Piece{EngineEvent::Kind::content, task.prompt_text, {}});
    t.echoed = 1;
  }
  t.reasoning_tokens = std::min<int64_t>(reasoning_count, static_cast<int64_t>(script.size()) - t.echoed);
  t.script = std::move(script);
  t.reason = reason;
  tasks_.push_back(std::move(t));
  counters_->started.fetch_add(1);
  const int running = static_cast<int>(tasks_.size());
  int seen = counters_->max_running.load();
  while (running > seen && !counters_->max_running.compare_exchange_weak(seen, running)) {
  }
}

int64_t FakeEngine::step(const EmitFn& emit) {
  auto delay = config_.token_delay;
  for (const auto& t : tasks_) {
    delay = std::max(delay, t.delay);
    if (t.next == 0) delay = std::max(delay, config_.token_delay + config_.prefill_delay);
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);

  const auto now = std::chrono::steady_clock::now();
  int64_t generated = 0;
  std::vector<Task> still_running;
  for (auto& t : tasks_) {
    if (t.next == 0) t.first_token_at = now;
    if (t.next < t.script.size()) {
      Piece& piece = t.script[t.next++];
      ++generated;
      if (t.logprobs >= 0 && piece.kind != EngineEvent::Kind::tool_call) {
        TokenLogprobOutput lp = fake_logprobs(piece.text, t.next - 1 - t.echoed, t.logprobs);
        if (t.next - 1 < t.echoed) lp.has_logprob = false, lp.top.clear();
        emit(t.id, EngineEvent::token_logprob(std::move(lp)));
      }
      switch (piece.kind) {
        case EngineEvent::Kind::reasoning:
          emit(t.id, EngineEvent::reasoning(std::move(piece.text)));
          break;
        case EngineEvent::Kind::content:
          emit(t.id, EngineEvent::content(std::move(piece.text)));
          break;
        case EngineEvent::Kind::tool_call:
          emit(t.id, EngineEvent::tool(std::move(piece.call)));
          break;
        case EngineEvent::Kind::logprob:
        case EngineEvent::Kind::finish:
          break;
      }
    }
    if (t.next < t.script.size()) {
      still_running.push_back(std::move(t));
      continue;
    }
    Usage usage;
    usage.prompt_tokens = t.prompt_tokens;
    usage.completion_tokens = static_cast<int64_t>(t.script.size()) - t.echoed;
    usage.reasoning_tokens = t.reasoning_tokens;
    Timings timings;
    timings.prompt_ms = std::chrono::duration<double, std::milli>(t.first_token_at - t.started_at).count();
    timings.generation_ms = std::chrono::duration<double, std::milli>(now - t.first_token_at).count();
    counters_->finished.fetch_add(1);
    emit(t.id, EngineEvent::finish(t.reason, usage, timings));
  }
  tasks_ = std::move(still_running);
  return generated;
}

void FakeEngine::cancel(TaskId id) {
  auto it = std::find_if(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.id == id; });
  if (it == tasks_.end()) return;
  tasks_.erase(it);
  counters_->cancelled.fetch_add(1);
}

// ---- FakePromptFrontend ----

namespace {

PreparedPrompt byte_tokens(std::string text) {
  PreparedPrompt p;
  p.tokens.reserve(text.size());
  for (unsigned char c : text) p.tokens.push_back(c);
  p.token_count = static_cast<int64_t>(text.size());
  p.text = std::move(text);
  return p;
}

}  // namespace

PreparedPrompt FakePromptFrontend::render_chat(const ChatPrompt& chat) const {
  std::string text;
  if (!chat.tools.empty()) {
    text += "<|tools|>\n";
    for (size_t i = 0; i < chat.tools.size(); ++i) text += (i ? " " : "") + chat.tools[i].name;
    text += "\n";
  }
  for (const auto& m : chat.messages) {
    text += "<|" + m.role + "|>\n";
    if (m.content) text += *m.content;
    for (const auto& call : m.tool_calls) text += fmt::format("[call {} {}]", call.name, call.arguments_json);
    text += "\n";
  }
  text += "<|assistant|>\n";
  return byte_tokens(std::move(text));
}

PreparedPrompt FakePromptFrontend::prepare_text(std::string_view text) const { return byte_tokens(std::string(text)); }

PreparedPrompt FakePromptFrontend::prepare_tokens(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255)
      invalid_param("prompt", "prompt[{}] = {} is not a token id of this model (its vocabulary is 0..255)", i, ids[i]);
    text += static_cast<char>(ids[i]);
  }
  return byte_tokens(std::move(text));
}

}  // namespace fl::server
