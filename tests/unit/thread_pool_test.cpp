#include <atomic>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"

namespace fl {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(30,
                                 [](int64_t begin, int64_t) {
                                   if (begin > 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  // the pool still works afterwards
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 45);
}

}  // namespace
}  // namespace fl
