#include "core/host_bandwidth.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace fl {

double measure_host_read_gbs(ThreadPool& pool) {
  constexpr size_t kWords = (size_t{256} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(kWords);
  pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::atomic<uint64_t> total{0};  // an atomic add per share: the sums cannot be optimised away
  double best_s = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // four chains: the loop waits on memory, not on adds
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        s0 += buffer[static_cast<size_t>(i)];
        s1 += buffer[static_cast<size_t>(i + 1)];
        s2 += buffer[static_cast<size_t>(i + 2)];
        s3 += buffer[static_cast<size_t>(i + 3)];
      }
      for (; i < end; ++i) s0 += buffer[static_cast<size_t>(i)];
      total.fetch_add(s0 + s1 + s2 + s3, std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass == 0 || s < best_s) best_s = s;
  }
  return static_cast<double>(kWords * sizeof(uint64_t)) / best_s / 1e9;
}

}  // namespace fl
