#pragma once
// A fixed pool of worker threads for data-parallel loops on the CPU backend.
// parallel_for splits [0, n) into contiguous chunks, one per thread; each index is handled by
// exactly one thread, so results do not depend on the thread count (every output element is
// computed by the same sequence of operations whichever thread runs it).
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fl {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: one per hardware thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // workers + the caller

  // Calls fn(begin, end) over disjoint chunks covering [0, n); returns when all are done.
  // The calling thread takes a chunk too. An exception from any chunk is rethrown here.
  // Calls from several threads are serialised; a call from inside fn deadlocks (never do it).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  static ThreadPool& global();  // sized by set_global_threads (default: hardware threads)
  static void set_global_threads(int n_threads);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time; calls from a job are not allowed
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace fl
