#pragma once
// The inference thread: it owns the Engine and is the only thread that calls it.
//
// HTTP workers submit() a GenerationTask and get a TaskStream back, from which they read the
// task's events. Tasks wait in a bounded queue until the engine has a free slot; a full queue
// refuses the task at once (the HTTP side answers 503 with Retry-After). Between engine steps the
// loop starts waiting tasks (new requests join the running batch between decode steps) and
// applies cancellations: a worker whose client disconnected calls TaskStream::cancel(), and the
// engine is told with Engine::cancel().
//
// Every submitted task gets exactly one finish event, whatever happens (cancelled while waiting,
// engine failure, shutdown).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/engine.h"
#include "server/metrics.h"

namespace fl::server {

class InferenceLoop;

// Wakes a waiter when an event arrives on any of several streams (a request's n choices, read by
// one handler thread): each stream that notifies it bumps its count while it stores an event,
// under the stream's lock, so an event that a reader can take has always been counted.
class ArrivalSignal {
 public:
  uint64_t count() const;
  // Waits until count() is no longer `seen`, or `timeout` passes. True when it changed.
  bool wait_past(uint64_t seen, std::chrono::milliseconds timeout);

 private:
  friend class TaskStream;
  void bump();
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t count_ = 0;
};

// One task's events, handed from the inference thread to the HTTP worker that serves it.
class TaskStream {
 public:
  TaskId id() const { return id_; }
  // From now on every event pushed to this stream also bumps `signal` (events already queued do
  // not: read them first, with the count taken before).
  void notify_also(std::shared_ptr<ArrivalSignal> signal);

  // Moves the events that arrived into `out` (appending). Waits up to `timeout` when there are
  // none. Returns false when nothing arrived in time.
  bool wait(std::vector<EngineEvent>& out, std::chrono::milliseconds timeout);
  // True once the finish event has been pushed (it may still be unread).
  bool finished() const;

  // The client is gone: stop generating. Safe to call more than once, and after the finish.
  void cancel();

 private:
  friend class InferenceLoop;
  TaskStream(TaskId id, InferenceLoop* loop) : id_(id), loop_(loop) {}
  void push(EngineEvent event);

  const TaskId id_;
  InferenceLoop* const loop_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<EngineEvent> events_;
  std::shared_ptr<ArrivalSignal> also_;  // notify_also
  bool finished_ = false;
  std::atomic<bool> cancel_requested_{false};
};

struct LoopLimits {
  // Tasks waiting for a slot; one more is refused (queue full). 0: 4 x the engine's parallel.
  int max_waiting = 0;
};

struct LoopStats {
  int waiting = 0;  // queue depth
  int running = 0;  // tasks inside the engine
  uint64_t submitted = 0, refused = 0, cancelled = 0, failed = 0, finished = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  double tokens_per_second = 0;  // generated, over the last RateWindow
};

class InferenceLoop {
 public:
  InferenceLoop(std::unique_ptr<Engine> engine, LoopLimits limits);
  ~InferenceLoop();  // cancels everything still running, then joins the thread
  InferenceLoop(const InferenceLoop&) = delete;
  InferenceLoop& operator=(const InferenceLoop&) = delete;

  // Engine facts, read once at construction (safe from any thread).
  const EngineInfo& info() const { return info_; }
  int max_waiting() const { return max_waiting_; }

  enum class Admission { accepted, queue_full, shutting_down };
  struct Submitted {
    Admission admission;
    std::shared_ptr<TaskStream> stream;  // set when accepted
  };
  Submitted submit(GenerationTask task);

  // Refuses new tasks from now on (Admission::shutting_down); running and waiting tasks go on.
  void stop_accepting();
  // Cancels every waiting and running task (each gets its finish event).
  void cancel_all();
  // Waits until no task is waiting or running, or until `deadline`. True when idle.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);

  LoopStats stats() const;

 private:
  friend class TaskStream;
  struct Waiting {
    std::shared_ptr<TaskStream> stream;
    GenerationTask task;
    std::chrono::steady_clock::time_point submitted_at;
  };
  struct Running {
    std::shared_ptr<TaskStream> stream;
    std::chrono::steady_clock::time_point submitted_at, started_at;
  };

  void request_cancel(TaskId id);
  void run();
  void deliver(TaskId id, EngineEvent event);  // inference thread only
  void fail_running(const std::string& message);

  std::unique_ptr<Engine> engine_;
  const EngineInfo info_;
  const int max_waiting_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // new task, cancellation, or stop
  std::condition_variable idle_;  // a task finished
  std::deque<Waiting> waiting_;
  std::vector<TaskId> cancel_requests_;
  bool cancel_all_ = false;
  bool accepting_ = true;
  bool stopping_ = false;
  TaskId next_id_ = 1;
  int running_count_ = 0;  // mirrors running_.size() for stats()

  std::unordered_map<TaskId, Running> running_;  // inference thread only

  std::atomic<uint64_t> submitted_{0}, refused_{0}, cancelled_{0}, failed_{0}, finished_{0};
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0};
  RateWindow generation_rate_;

  std::thread thread_;
};

}  // namespace fl::server
