// The thread communicator (backend/communicator.h): N ranks as N threads all-reducing their
// tensors. The sum must be the rank-order sequential sum, bit for bit, on every rank; mistakes
// must make every rank throw the same error rather than leave some waiting.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "core/tensor.h"
#include "util/test_util.h"

namespace fl {
namespace {

// Runs body(rank, communicator) on one thread per rank; returns each rank's error message
// ("" when it returned normally).
template <typename Body>
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms, Body body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(static_cast<int>(r), *comms[r]);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Rank r's values for a call of `n` elements: different per rank and call, with magnitudes far
// apart so that the summation order shows in the low bits.
std::vector<float> rank_values(int rank, int64_t n, int call) {
  std::mt19937 rng(static_cast<unsigned>(1000 * call + rank));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  const float scale = rank % 2 ? 1e-3f : 1e3f;
  for (float& x : v) x = dist(rng) * scale;
  return v;
}

TEST(ThreadCommunicator, SumsInRankOrderIdenticallyOnEveryRank) {
  for (int ranks : {1, 2, 3, 4, 8}) {
    auto comms = make_thread_communicators(ranks);
    ASSERT_EQ(comms.size(), static_cast<size_t>(ranks));
    const int64_t sizes[] = {1000, 7, 0, 4096, 3};  // calls of different sizes reuse the group
    std::vector<std::vector<std::vector<float>>> results(static_cast<size_t>(ranks));
    const auto errors = run_ranks(comms, [&](int rank, Communicator& c) {
      EXPECT_EQ(c.rank(), rank);
      EXPECT_EQ(c.size(), ranks);
      for (int call = 0; call < 5; ++call) {
        std::vector<float> v = rank_values(rank, sizes[call], call);
        Tensor t = make_tensor(v.data(), DType::f32, {sizes[call]});
        c.all_reduce_sum(t);
        results[static_cast<size_t>(rank)].push_back(v);
      }
    });
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << ranks << " ranks, rank " << r;
    for (int call = 0; call < 5; ++call) {
      std::vector<float> want = rank_values(0, sizes[call], call);
      for (int r = 1; r < ranks; ++r) {
        const std::vector<float> part = rank_values(r, sizes[call], call);
        for (size_t i = 0; i < want.size(); ++i) want[i] += part[i];
      }
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float>& got = results[static_cast<size_t>(r)][static_cast<size_t>(call)];
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << ranks << " ranks, call " << call << ", rank " << r;
      }
    }
  }
}

TEST(ThreadCommunicator, MistakesThrowOnEveryRankAndTheGroupStaysUsable) {
  auto comms = make_thread_communicators(3);
  // Rank 1 brings a different size; then rank 2 a bf16 tensor; then a good call.
  std::vector<std::string> messages[3];
  const auto errors = run_ranks(comms, [&](int rank, Communicator& c) {
    auto attempt = [&](Tensor t) {
      try {
        c.all_reduce_sum(t);
        messages[rank].push_back("");
      } catch (const Error& e) {
        messages[rank].push_back(e.what());
      }
    };
    std::vector<float> a(rank == 1 ? 9 : 8, 1.0f);
    attempt(make_tensor(a.data(), DType::f32, {static_cast<int64_t>(a.size())}));
    std::vector<uint16_t> half(8, 0);
    std::vector<float> b(8, 1.0f);
    attempt(rank == 2 ? make_tensor(half.data(), DType::bf16, {8}) : make_tensor(b.data(), DType::f32, {8}));
    std::vector<float> ok(5, static_cast<float>(rank + 1));
    Tensor t = make_tensor(ok.data(), DType::f32, {5});
    c.all_reduce_sum(t);
    for (float x : ok) EXPECT_EQ(x, 6.0f);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(errors[r], "");
    ASSERT_EQ(messages[r].size(), 2u);
    EXPECT_NE(messages[r][0].find("rank 1 has 9 values where rank 0 has 8"), std::string::npos) << messages[r][0];
    EXPECT_NE(messages[r][1].find("rank 2's tensor is bf16, not f32"), std::string::npos) << messages[r][1];
  }
}

// A rank that fails outside a collective aborts the group: the ranks already waiting in an
// all-reduce, and every later call, throw its reason instead of waiting forever.
TEST(ThreadCommunicator, AbortFreesTheRanksWaitingForAFailedOne) {
  auto comms = make_thread_communicators(3);
  const auto errors = run_ranks(comms, [&](int rank, Communicator& c) {
    std::vector<float> v(4, 1.0f);
    Tensor t = make_tensor(v.data(), DType::f32, {4});
    c.all_reduce_sum(t);  // one good call first
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the others block in the next call
      c.abort("rank 2 ran out of memory");
      fail("rank 2 gave up");
    }
    c.all_reduce_sum(t);
  });
  EXPECT_NE(errors[0].find("rank 2 ran out of memory"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 2 ran out of memory"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2], "rank 2 gave up");
  std::vector<float> v(4, 1.0f);
  Tensor t = make_tensor(v.data(), DType::f32, {4});
  EXPECT_ERROR_HAS(comms[0]->all_reduce_sum(t), "rank 2 ran out of memory");  // the group stays broken
}

TEST(ThreadCommunicator, RefusesAbsurdRankCounts) {
  EXPECT_THROW(make_thread_communicators(0), Error);
  EXPECT_THROW(make_thread_communicators(-3), Error);
  EXPECT_THROW(make_thread_communicators(100000), Error);
}

}  // namespace
}  // namespace fl
