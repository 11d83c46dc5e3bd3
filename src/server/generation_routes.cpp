// POST /v1/chat/completions and /v1/completions: request -> GenerationTask -> response.
#include <algorithm>
#include <ctime>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "server/openai_format.h"
#include "server/server.h"

namespace fl::server {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);  // how often a waiting handler checks its client

ApiError shutting_down_error() {
  return ApiError(503, "server_busy", "the server is shutting down", {}, "shutting_down");
}

// n choices of one task: the same request, each with its own seed (seed + i), so that they differ
// and a given seed still repeats them.
std::vector<GenerationTask> choices(GenerationTask task, int n) {
  std::vector<GenerationTask> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(task);
    out.back().sampling.seed = task.sampling.seed + static_cast<uint64_t>(i);
  }
  return out;
}

// A request's tasks (prompts x n choices) that the admission queue did not take.
ApiError queue_full_error(int max_waiting, int retry_after_s, size_t tasks) {
  return ApiError(
      503, "server_busy",
      fmt::format("the server is busy: {} requests are already waiting; retry in {} s{}", max_waiting, retry_after_s,
                  tasks > 1 ? fmt::format(" (this one is {} tasks, prompts x n: ask for fewer at once)", tasks)
                            : std::string()),
      {}, "queue_full");
}

ApiError failure_error(const CollectedOutput& out) {
  if (out.finish_reason == FinishReason::cancelled) return shutting_down_error();
  return ApiError(500, "server_error", "generation failed: " + out.error, {}, "engine_error");
}

// The state a streaming response carries between calls of its content provider: a task and a
// formatter per choice (several for n > 1 or several prompts, chunks interleaved as tokens come).
struct StreamState {
  struct Choice {
    std::shared_ptr<TaskStream> task;
    StreamFormatter formatter;
    CollectedOutput finish;  // the finish event's usage and timings, for the usage chunk
  };
  std::vector<Choice> choices;
  // Bumped by every choice's events: the handler sleeps on it until any unfinished choice has
  // something (rather than on one choice, polling the others).
  std::shared_ptr<ArrivalSignal> arrivals = std::make_shared<ArrivalSignal>();
  size_t per_prompt = 1;
  bool begun = false;
  bool done = false;

  void cancel_all() {
    for (Choice& c : choices) c.task->cancel();
  }
};

// Checks that only the model can make, done here so that they are 400s naming the field rather
// than engine failures (500) after the task was queued (or a 200 stream that ends in an error).
void check_for_engine(const PreparedPrompt& prompt, const SamplingParams& sampling, const EngineInfo& info,
                      const char* prompt_param) {
  // A chat template given other variables by chat_template_kwargs (`messages`, `bos_token`,
  // `add_generation_prompt`) can render nothing at all.
  if (prompt.token_count == 0)
    invalid_param(prompt_param, "the prompt is empty after rendering and tokenizing; there is nothing to continue");
  if (info.vocab_size > 0) {
    for (const auto& [id, bias] : sampling.logit_bias)
      if (id >= info.vocab_size)
        invalid_param(fmt::format("logit_bias.{}", id),
                      "logit_bias names token {}, which is not a token id of this model (its vocabulary is 0..{})", id,
                      info.vocab_size - 1);
  }
}

}  // namespace

void Server::handle_chat(const httplib::Request& req, httplib::Response& res) {
  try {
    const auto body = parse_json_body(req.body, config_.requests);
    ChatRequest request = parse_chat_request(body, config_.requests, config_.sampling_defaults);
    if (config_.default_seed && !body.contains("seed")) request.generation.sampling.seed = *config_.default_seed;
    PreparedPrompt prompt;
    try {
      prompt = frontend_->render_chat(request.prompt);
    } catch (const Error& e) {
      throw ApiError(400, "invalid_request_error",
                     std::string("the chat template could not render these messages: ") + e.what(), "messages",
                     "template_error");
    }
    check_for_engine(prompt, request.generation.sampling, loop_.info(), "messages");
    GenerationTask task;
    task.kind = TaskKind::chat;
    task.max_tokens =
        resolve_max_tokens(request.generation.max_tokens, prompt.token_count, loop_.info().context_length);
    task.thinking = resolve_thinking(request, task.max_tokens);
    task.prompt_text = std::move(prompt.text);
    task.prompt_tokens = std::move(prompt.tokens);
    task.prompt_token_count = prompt.token_count;
    task.sampling = request.generation.sampling;
    task.stop = request.generation.stop;
    task.tools = request.prompt.tools;
    task.tool_choice = request.tool_choice;
    task.response_format = request.response_format;
    task.json_schema = request.json_schema;
    task.logprobs = request.generation.logprobs;
    respond(choices(std::move(task), request.generation.n), request.generation, /*chat=*/true, res);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void Server::handle_completion(const httplib::Request& req, httplib::Response& res) {
  try {
    const auto body = parse_json_body(req.body, config_.requests);
    CompletionRequest request = parse_completion_request(body, config_.requests, config_.sampling_defaults);
    if (config_.default_seed && !body.contains("seed")) request.generation.sampling.seed = *config_.default_seed;
    // Every prompt is checked before any is queued: a bad one fails the request whole.
    std::vector<GenerationTask> tasks;
    for (size_t i = 0; i < request.prompts.size(); ++i) {
      const CompletionPrompt& p = request.prompts[i];
      const std::string param = request.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
      PreparedPrompt prompt;
      try {
        prompt = p.tokens ? frontend_->prepare_tokens(*p.tokens) : frontend_->prepare_text(p.text);
      } catch (const ApiError& e) {  // (the frontend names "prompt"; with several, say which)
        if (request.prompts.size() == 1) throw;
        throw ApiError(e.status(), e.type(), param + ": " + e.message(), param, e.code());
      } catch (const Error& e) {
        throw ApiError(400, "invalid_request_error", std::string("the prompt could not be tokenized: ") + e.what(),
                       param);
      }
      check_for_engine(prompt, request.generation.sampling, loop_.info(), param.c_str());
      GenerationTask task;
      task.kind = TaskKind::completion;
      task.max_tokens =
          resolve_max_tokens(request.generation.max_tokens, prompt.token_count, loop_.info().context_length, param);
      task.prompt_text = std::move(prompt.text);
      task.prompt_tokens = std::move(prompt.tokens);
      task.prompt_token_count = prompt.token_count;
      task.sampling = request.generation.sampling;
      task.stop = request.generation.stop;
      task.thinking.enabled = false;
      task.logprobs = request.generation.logprobs;
      task.echo = request.echo;
      for (GenerationTask& choice : choices(std::move(task), request.generation.n)) tasks.push_back(std::move(choice));
    }
    respond(std::move(tasks), request.generation, /*chat=*/false, res);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

std::vector<std::shared_ptr<TaskStream>> Server::submit_all(std::vector<GenerationTask> tasks, const std::string& id) {
  std::vector<std::shared_ptr<TaskStream>> streams;
  const size_t n = tasks.size();
  for (GenerationTask& task : tasks) {
    task.request_id = id;
    auto submitted = loop_.submit(std::move(task));
    if (submitted.admission != InferenceLoop::Admission::accepted) {
      for (const auto& s : streams) s->cancel();  // all or none: the tasks queued so far are dropped
      if (submitted.admission == InferenceLoop::Admission::shutting_down) throw shutting_down_error();
      throw queue_full_error(loop_.max_waiting(), config_.retry_after_s, n);
    }
    streams.push_back(submitted.stream);
  }
  return streams;
}

void Server::respond_many(std::vector<GenerationTask> tasks, bool chat, int per_prompt, httplib::Response& res) {
  const ResponseMeta meta{next_id(chat ? "chatcmpl" : "cmpl"), static_cast<int64_t>(std::time(nullptr)),
                          loop_.info().model_id, tasks[0].logprobs >= 0};
  const std::vector<std::shared_ptr<TaskStream>> streams = submit_all(std::move(tasks), meta.id);
  auto cancel_all = [&] {
    for (const auto& s : streams) s->cancel();
  };
  // The tasks run together; their outputs are gathered one after the other. A client gone away
  // cancels them all (499: nginx's "client closed request", seen only by /metrics and logs).
  std::vector<CollectedOutput> outs(streams.size());
  std::vector<EngineEvent> events;
  auto next_check = std::chrono::steady_clock::now() + kPollInterval;
  for (size_t i = 0; i < streams.size(); ++i) {
    while (!outs[i].finished) {
      events.clear();
      if (streams[i]->wait(events, kPollInterval))
        for (const auto& e : events) outs[i].add(e);
      if (!outs[i].finished && std::chrono::steady_clock::now() >= next_check) {
        next_check = std::chrono::steady_clock::now() + kPollInterval;
        if (!HttpServer::client_connected()) cancel_all();  // nobody will read them; finishes follow
      }
    }
    if (outs[i].finish_reason == FinishReason::error || outs[i].finish_reason == FinishReason::cancelled) {
      cancel_all();
      if (outs[i].finish_reason == FinishReason::cancelled && !HttpServer::client_connected()) {
        res.status = 499;
        return;
      }
      if (outs[i].finish_reason == FinishReason::error) log_warn("serve: {} failed: {}", meta.id, outs[i].error);
      throw failure_error(outs[i]);
    }
  }
  res.set_content(chat ? chat_completion_body(meta, outs, static_cast<size_t>(per_prompt))
                       : text_completion_body(meta, outs, static_cast<size_t>(per_prompt)),
                  "application/json");
}

void Server::respond(std::vector<GenerationTask> tasks, const GenerationRequest& generation, bool chat,
                     httplib::Response& res) {
  if (!generation.stream) {
    respond_many(std::move(tasks), chat, generation.n, res);
    return;
  }
  const ResponseMeta meta{next_id(chat ? "chatcmpl" : "cmpl"), static_cast<int64_t>(std::time(nullptr)),
                          loop_.info().model_id, tasks[0].logprobs >= 0};
  const std::vector<std::shared_ptr<TaskStream>> streams = submit_all(std::move(tasks), meta.id);
  auto state = std::make_shared<StreamState>();
  for (size_t i = 0; i < streams.size(); ++i) {
    streams[i]->notify_also(state->arrivals);
    state->choices.push_back(
        {streams[i], StreamFormatter(meta, chat, generation.include_usage, static_cast<int>(i)), CollectedOutput{}});
  }
  state->per_prompt = static_cast<size_t>(generation.n);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) -> bool {
        // Runs on this request's worker thread until done; nothing may escape into the library.
        try {
          std::string out;
          if (!state->begun) {
            state->begun = true;
            for (auto& c : state->choices) out += c.formatter.begin();
          }
          // A choice's events that came within `timeout`, formatted; false when none came.
          std::vector<EngineEvent> events;
          auto drain = [&](StreamState::Choice& c, std::chrono::milliseconds timeout) {
            events.clear();
            if (!c.task->wait(events, timeout)) return false;
            for (const auto& e : events) {
              if (e.kind != EngineEvent::Kind::finish) {
                out += c.formatter.event(e);
              } else if (e.finish_reason == FinishReason::error || e.finish_reason == FinishReason::cancelled) {
                CollectedOutput failed;
                failed.add(e);
                if (e.finish_reason == FinishReason::error) log_warn("serve: stream failed: {}", e.error);
                out += "data: " + error_body(failure_error(failed)) + "\n\n";
                state->cancel_all();  // the other choices of a failed request are not wanted
                state->done = true;
                break;
              } else {
                out += c.formatter.finish_choice(e);
                c.finish.add(e);
              }
            }
            return true;
          };
          // Every unfinished choice's events so far; with none, wait for the next arrival on any of
          // them (the count taken before reading, so that an event that came during the reads
          // ends the wait at once).
          auto drain_all = [&] {
            bool got = false;
            for (auto& c : state->choices)
              if (!c.finish.finished && !state->done) got = drain(c, std::chrono::milliseconds(0)) || got;
            return got;
          };
          const uint64_t seen = state->arrivals->count();
          bool any = drain_all();
          const bool unfinished = std::any_of(state->choices.begin(), state->choices.end(),
                                              [](const StreamState::Choice& c) { return !c.finish.finished; });
          if (!any && !state->done && unfinished && state->arrivals->wait_past(seen, kPollInterval)) any = drain_all();
          if (!state->done) {
            bool all_finished = true;
            for (const auto& c : state->choices) all_finished = all_finished && c.finish.finished;
            if (all_finished) {
              std::vector<CollectedOutput> finishes;
              for (const auto& c : state->choices) finishes.push_back(c.finish);
              const auto [usage, timings] = summed_usage(finishes, state->per_prompt);
              out += state->choices[0].formatter.end(usage, timings);
              state->done = true;
            }
          }
          if (!any && out.empty()) {
            if (sink.is_writable()) return true;
            state->cancel_all();  // the client is gone
            return false;
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            state->cancel_all();
            return false;
          }
          if (state->done) sink.done();
          return true;
        } catch (const std::exception& e) {
          log_error("serve: streaming failed: {}", e.what());
          state->cancel_all();
          return false;
        }
      },
      [state](bool) {
        if (!state->done) state->cancel_all();
      });
}

}  // namespace fl::server
