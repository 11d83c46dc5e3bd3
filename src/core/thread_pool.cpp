#include "core/thread_pool.h"

#include <algorithm>
#include <memory>

namespace fl {
namespace {
std::mutex g_global_mutex;
std::unique_ptr<ThreadPool> g_global;
int g_global_threads = 0;

// Chunk `part` of `parts` over [0, n).
std::pair<int64_t, int64_t> chunk_range(int64_t n, int part, int parts) {
  int64_t base = n / parts, extra = n % parts;
  int64_t begin = part * base + std::min<int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    auto [begin, end] = chunk_range(n, index, size());
    std::exception_ptr error;
    if (begin < end) {
      try {
        (*job)(begin, end);
      } catch (...) {
        error = std::current_exception();
      }
    }
    std::lock_guard lock(mutex_);
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard call_lock(call_mutex_);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  auto [begin, end] = chunk_range(n, 0, size());
  std::exception_ptr error;
  try {
    if (begin < end) fn(begin, end);
  } catch (...) {
    error = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  if (!error) error = error_;
  job_ = nullptr;
  if (error) std::rethrow_exception(error);
}

ThreadPool& ThreadPool::global() {
  std::lock_guard lock(g_global_mutex);
  if (!g_global) g_global = std::make_unique<ThreadPool>(g_global_threads);
  return *g_global;
}

void ThreadPool::set_global_threads(int n_threads) {
  std::lock_guard lock(g_global_mutex);
  g_global_threads = n_threads;
  g_global.reset();
}

}  // namespace fl
