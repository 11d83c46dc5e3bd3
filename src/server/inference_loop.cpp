#include "server/inference_loop.h"

#include <algorithm>
#include <exception>

#include "core/error.h"
#include "core/log.h"

namespace fl::server {
namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::tool_calls:
      return "tool_calls";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::error:
      return "error";
  }
  return "stop";
}

EngineEvent EngineEvent::reasoning(std::string text) {
  EngineEvent e;
  e.kind = Kind::reasoning;
  e.text = std::move(text);
  return e;
}
EngineEvent EngineEvent::content(std::string text) {
  EngineEvent e;
  e.kind = Kind::content;
  e.text = std::move(text);
  return e;
}
EngineEvent EngineEvent::tool(ToolCallOutput call) {
  EngineEvent e;
  e.kind = Kind::tool_call;
  e.tool_call = std::move(call);
  return e;
}
EngineEvent EngineEvent::token_logprob(TokenLogprobOutput logprob) {
  EngineEvent e;
  e.kind = Kind::logprob;
  e.logprob = std::move(logprob);
  return e;
}

EngineEvent EngineEvent::finish(FinishReason reason, Usage usage, Timings timings, std::string error) {
  EngineEvent e;
  e.kind = Kind::finish;
  e.finish_reason = reason;
  e.usage = usage;
  e.timings = timings;
  e.error = std::move(error);
  return e;
}

// ---- TaskStream ----

bool TaskStream::wait(std::vector<EngineEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (events_.empty() && !ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

bool TaskStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

void TaskStream::push(EngineEvent event) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;  // one finish per task, nothing after it
    if (event.kind == EngineEvent::Kind::finish) finished_ = true;
    events_.push_back(std::move(event));
    // Bumped under the stream's lock: a reader who takes this event has the bump counted already,
    // so a count read after draining the stream never lags behind what was drained (bumping after
    // the unlock let a reader drain the event first and then see a stray bump for it). A waiter
    // woken by the bump finds the event: it reads under this lock, which is released next.
    // Lock order: stream, then signal; the signal never takes a stream's lock.
    if (also_) also_->bump();
  }
  ready_.notify_all();
}

void TaskStream::notify_also(std::shared_ptr<ArrivalSignal> signal) {
  std::lock_guard lock(mutex_);
  also_ = std::move(signal);
}

uint64_t ArrivalSignal::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

bool ArrivalSignal::wait_past(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return count_ != seen; });
}

void ArrivalSignal::bump() {
  {
    std::lock_guard lock(mutex_);
    ++count_;
  }
  changed_.notify_all();
}

void TaskStream::cancel() {
  if (cancel_requested_.exchange(true)) return;
  if (finished()) return;
  loop_->request_cancel(id_);
}

// ---- InferenceLoop ----

InferenceLoop::InferenceLoop(std::unique_ptr<Engine> engine, LoopLimits limits)
    : engine_(std::move(engine)),
      info_(engine_->info()),
      max_waiting_(limits.max_waiting > 0 ? limits.max_waiting : 4 * std::max(1, info_.parallel)) {
  thread_ = std::thread([this] { run(); });
}

InferenceLoop::~InferenceLoop() {
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
    cancel_all_ = true;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

InferenceLoop::Submitted InferenceLoop::submit(GenerationTask task) {
  std::shared_ptr<TaskStream> stream;
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) return {Admission::shutting_down, nullptr};
    if (static_cast<int>(waiting_.size()) >= max_waiting_) {
      refused_.fetch_add(1);
      return {Admission::queue_full, nullptr};
    }
    stream.reset(new TaskStream(next_id_++, this));
    waiting_.push_back({stream, std::move(task), std::chrono::steady_clock::now()});
    submitted_.fetch_add(1);
  }
  wake_.notify_all();
  return {Admission::accepted, stream};
}

void InferenceLoop::request_cancel(TaskId id) {
  {
    std::lock_guard lock(mutex_);
    cancel_requests_.push_back(id);
  }
  wake_.notify_all();
}

void InferenceLoop::stop_accepting() {
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

void InferenceLoop::cancel_all() {
  {
    std::lock_guard lock(mutex_);
    cancel_all_ = true;
  }
  wake_.notify_all();
}

bool InferenceLoop::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return idle_.wait_until(lock, deadline, [&] { return waiting_.empty() && running_count_ == 0; });
}

LoopStats InferenceLoop::stats() const {
  LoopStats s;
  {
    std::lock_guard lock(mutex_);
    s.waiting = static_cast<int>(waiting_.size());
    s.running = running_count_;
  }
  s.submitted = submitted_.load();
  s.refused = refused_.load();
  s.cancelled = cancelled_.load();
  s.failed = failed_.load();
  s.finished = finished_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generated_tokens = generated_tokens_.load();
  s.tokens_per_second = generation_rate_.per_second();
  return s;
}

void InferenceLoop::deliver(TaskId id, EngineEvent event) {
  auto it = running_.find(id);
  if (it == running_.end()) return;  // cancelled meanwhile: the engine was told, drop the rest
  if (event.kind != EngineEvent::Kind::finish) {
    it->second.stream->push(std::move(event));
    return;
  }
  event.timings.queue_ms = ms_between(it->second.submitted_at, it->second.started_at);
  switch (event.finish_reason) {
    case FinishReason::cancelled:
      cancelled_.fetch_add(1);
      break;
    case FinishReason::error:
      failed_.fetch_add(1);
      break;
    default:
      finished_.fetch_add(1);
      break;
  }
  prompt_tokens_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, event.usage.prompt_tokens)));
  // The task leaves the counts before its client can see the finish: stats() read after a
  // client's last chunk must not still count it running (ServeLoad saw running == 1 there).
  auto stream = std::move(it->second.stream);
  running_.erase(it);
  {
    std::lock_guard lock(mutex_);
    running_count_ = static_cast<int>(running_.size());
  }
  stream->push(std::move(event));
  idle_.notify_all();
}

void InferenceLoop::fail_running(const std::string& message) {
  std::vector<TaskId> ids;
  for (const auto& [id, _] : running_) ids.push_back(id);
  for (TaskId id : ids) {
    try {
      engine_->cancel(id);
    } catch (const std::exception& e) {
      log_error("engine: cancelling task {} after a failure failed too: {}", id, e.what());
    }
    deliver(id, EngineEvent::finish(FinishReason::error, {}, {}, message));
  }
}

void InferenceLoop::run() {
  using Clock = std::chrono::steady_clock;
  try {
    engine_->bind_to_this_thread();
  } catch (const std::exception& e) {  // the steps will fail with the device's error and say so
    log_error("engine: cannot bind the inference thread to the model's device: {}", e.what());
  }
  std::unique_lock lock(mutex_);
  for (;;) {
    // 1. Cancellations: waiting tasks leave the queue, running ones are stopped in the engine.
    std::vector<TaskId> cancel_ids;
    std::vector<std::shared_ptr<TaskStream>> cancelled_waiting;
    if (cancel_all_) {
      cancel_all_ = false;
      for (auto& w : waiting_) cancelled_waiting.push_back(w.stream);
      waiting_.clear();
      for (const auto& [id, _] : running_) cancel_ids.push_back(id);
      cancel_requests_.clear();
    } else if (!cancel_requests_.empty()) {
      for (TaskId id : cancel_requests_) {
        auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& x) { return x.stream->id() == id; });
        if (w != waiting_.end()) {
          cancelled_waiting.push_back(w->stream);
          waiting_.erase(w);
        } else if (running_.count(id)) {
          cancel_ids.push_back(id);
        }
      }
      cancel_requests_.clear();
    }
    // 2. Admission: start waiting tasks while the engine has room.
    std::vector<Waiting> to_start;
    if (!stopping_) {
      int free = 0;
      try {
        free = engine_->free_slots();
      } catch (const std::exception& e) {
        log_error("engine: free_slots failed: {}", e.what());
      }
      while (free-- > 0 && !waiting_.empty()) {
        to_start.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    const bool queue_changed = !cancelled_waiting.empty() || !to_start.empty();
    lock.unlock();
    if (queue_changed) idle_.notify_all();

    for (auto& stream : cancelled_waiting) {
      cancelled_.fetch_add(1);
      stream->push(EngineEvent::finish(FinishReason::cancelled, {}, {}));
    }
    for (TaskId id : cancel_ids) {
      try {
        engine_->cancel(id);
      } catch (const std::exception& e) {
        log_error("engine: cancel of task {} failed: {}", id, e.what());
      }
      deliver(id, EngineEvent::finish(FinishReason::cancelled, {}, {}));
    }
    for (auto& w : to_start) {
      const TaskId id = w.stream->id();
      const auto started = Clock::now();
      running_[id] = {w.stream, w.submitted_at, started};
      {
        std::lock_guard count_lock(mutex_);
        running_count_ = static_cast<int>(running_.size());
      }
      try {
        engine_->start(id, std::move(w.task));
      } catch (const std::exception& e) {
        deliver(id, EngineEvent::finish(FinishReason::error, {}, {}, e.what()));
      }
    }

    // 3. One engine step, or sleep until there is something to do.
    bool busy = false;
    try {
      busy = engine_->busy();
    } catch (const std::exception& e) {
      log_error("engine: busy() failed: {}", e.what());
    }
    if (busy) {
      try {
        const int64_t generated = engine_->step([this](TaskId id, EngineEvent e) { deliver(id, std::move(e)); });
        if (generated > 0) {
          generated_tokens_.fetch_add(static_cast<uint64_t>(generated));
          generation_rate_.add(generated);
        }
      } catch (const std::exception& e) {
        log_error("engine: step failed, failing {} running task(s): {}", running_.size(), e.what());
        fail_running(std::string("the engine failed: ") + e.what());
      }
    }
    if (!busy && !running_.empty()) {
      // A started task must keep the engine busy until its finish event: this one was dropped.
      log_error("engine: {} started task(s) ended without a finish event", running_.size());
      fail_running("the engine dropped the task without finishing it");
    }
    lock.lock();
    if (busy) continue;
    if (stopping_ && waiting_.empty() && running_.empty() && cancel_requests_.empty() && !cancel_all_) break;
    if (cancel_all_ || !cancel_requests_.empty()) continue;
    if (!waiting_.empty() && !stopping_) {
      // Waiting tasks but no free slot and nothing running: the engine refuses new work for now.
      wake_.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    wake_.wait(lock, [&] { return stopping_ || cancel_all_ || !cancel_requests_.empty() || !waiting_.empty(); });
  }
}

}  // namespace fl::server
