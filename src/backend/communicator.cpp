#include "backend/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "core/error.h"

namespace fl {
namespace {

// A reusable barrier for `n` threads that abort() breaks: every thread waiting in it, and every
// later arrival, then throws the reason instead of waiting for a rank that will not come.
class BreakableBarrier {
 public:
  explicit BreakableBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (!broken_.empty()) fail("{}", broken_);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [&] { return generation_ != generation || !broken_.empty(); });
    if (generation_ == generation) fail("{}", broken_);
  }
  void abort(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (broken_.empty()) broken_ = why.empty() ? "the rank group was aborted" : why;
    all_arrived_.notify_all();
  }

 private:
  const int n_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string broken_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
};

// What the ranks of one thread group share: each rank's published buffer, the sum being built
// and a barrier. One all-reduce is three phases: publish (and check), reduce a slice each, copy
// the result back; the third barrier keeps a fast rank's next call from overwriting what a slow
// rank is still copying.
struct ThreadGroup {
  explicit ThreadGroup(int ranks) : size(ranks), published(static_cast<size_t>(ranks)), sync(ranks) {}

  struct Published {
    float* data = nullptr;
    int64_t count = 0;
    std::string problem;  // non-empty: this rank's tensor cannot take part
  };
  const int size;
  std::vector<Published> published;
  std::vector<float> sum;
  BreakableBarrier sync;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  void all_reduce_sum(Tensor& t) override {
    ThreadGroup& g = *group_;
    ThreadGroup::Published& mine = g.published[static_cast<size_t>(rank_)];
    mine.problem.clear();
    if (t.dtype != DType::f32)
      mine.problem = fmt::format("is {}, not f32", dtype_name(t.dtype));
    else if (t.device != Device::cpu)
      mine.problem = "is not in CPU memory";
    else if (!t.is_contiguous())
      mine.problem = "is not contiguous";
    mine.data = t.ptr<float>();
    mine.count = t.numel();
    if (rank_ == 0 && mine.problem.empty()) g.sum.resize(static_cast<size_t>(mine.count));
    g.sync.arrive_and_wait();

    // Every rank reads the same published entries, so every rank reaches the same verdict.
    for (int r = 0; r < g.size; ++r) {
      const ThreadGroup::Published& p = g.published[static_cast<size_t>(r)];
      // Copy what the message needs before the barrier: past it, a rank's next call may
      // rewrite its entry.
      if (!p.problem.empty()) {
        const std::string problem = p.problem;
        g.sync.arrive_and_wait();
        fail("all_reduce_sum: rank {}'s tensor {}", r, problem);
      }
      if (p.count != g.published[0].count) {
        const int64_t count = p.count, first = g.published[0].count;
        g.sync.arrive_and_wait();
        fail("all_reduce_sum: rank {} has {} values where rank 0 has {}", r, count, first);
      }
    }
    const int64_t n = mine.count;
    const int64_t begin = n * rank_ / g.size, end = n * (rank_ + 1) / g.size;
    for (int64_t i = begin; i < end; ++i) {
      float s = g.published[0].data[i];
      for (int r = 1; r < g.size; ++r) s += g.published[static_cast<size_t>(r)].data[i];
      g.sum[static_cast<size_t>(i)] = s;
    }
    g.sync.arrive_and_wait();
    if (n > 0) std::memcpy(mine.data, g.sum.data(), static_cast<size_t>(n) * sizeof(float));
    g.sync.arrive_and_wait();
  }

  void abort(const std::string& why) override { group_->sync.abort(why); }

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int ranks) {
  if (ranks < 1 || ranks > 1024) fail("thread communicators: {} ranks (1 to 1024)", ranks);
  auto group = std::make_shared<ThreadGroup>(ranks);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace fl
