// The GPUs' communicator (NCCL, loaded at run time; issue 10). With one GPU a group has one rank,
// so these check the plumbing that every rank count shares: loading the library, setting up the
// communicator on a backend's device, the in-place all-reduce on the backend's stream (inside a
// captured decode graph too), its refusals, abort, and the split model running its rank on a GPU
// thread. Several ranks need a machine with several GPUs (bench --tp N there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "model/tensor_parallel.h"
#include "util/test_util.h"

namespace fl {
namespace {

// Needs no GPU: the library is looked for first.
TEST(Nccl, AMissingLibraryIsAClearError) {
  auto cpu = make_cpu_backend();
  Backend* ranks[] = {cpu.get()};
  NcclOptions options;
  options.library = "/nonexistent/libnccl.so.2";
  EXPECT_ERROR_HAS(make_nccl_communicators(ranks, options), "needs /nonexistent/libnccl.so.2 (NCCL");
  EXPECT_ERROR_HAS(make_nccl_communicators({}, options), "no ranks");
}

class NcclCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_backend("cuda:0");
    Backend* ranks[] = {gpu_.get()};
    try {
      comms_ = make_nccl_communicators(ranks);
    } catch (const Error& e) {
      GTEST_SKIP() << "NCCL is not installed here: " << e.what();
    }
  }
  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

TEST_F(NcclCuda, OneRankAllReducesInPlaceAndRefusesWhatItCannotSend) {
  ASSERT_EQ(comms_.size(), 1u);
  Communicator& comm = *comms_[0];
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i) - 7.0f;
  auto buffer = gpu_->allocate(host.size() * sizeof(float));
  Tensor t = make_tensor(buffer->data(), DType::f32, {static_cast<int64_t>(host.size())}, Device::cuda);
  gpu_->copy_to_device(t, host.data());
  comm.all_reduce_sum(t);  // one rank: the sum is its own tensor, bit for bit
  std::vector<float> back(host.size());
  gpu_->copy_to_host(back.data(), t);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)), 0);

  Tensor on_host = make_tensor(host.data(), DType::f32, {static_cast<int64_t>(host.size())});
  EXPECT_ERROR_HAS(comm.all_reduce_sum(on_host), "must be contiguous f32 in GPU memory");
  Tensor halves = make_tensor(buffer->data(), DType::bf16, {2}, Device::cuda);
  EXPECT_ERROR_HAS(comm.all_reduce_sum(halves), "must be contiguous f32 in GPU memory");

  comm.abort("rank 0 failed: a test");
  EXPECT_ERROR_HAS(comm.all_reduce_sum(t), "rank 0 failed: a test");
}

// The split model with its one rank on GPU 0 behind NCCL (what --tp N --backend cuda builds, at
// N = 1): the rank runs on its own thread with the GPU bound there, and its tokens and logits are
// the plain model's on the same GPU, through forward and through the captured decode graph. With
// --ep the rank holds every expert and filters the routed pairs on the device each step
// (moe_keep_experts' kernel, captured too).
// Gemma 4 and Qwen3.5 (whose rank also carries its DeltaNet state through the captured graph).
class NcclSplit : public NcclCuda, public ::testing::WithParamInterface<std::tuple<const char*, bool>> {};

TEST_P(NcclSplit, TheSplitModelOnAGpuRankGivesTheOneDeviceTokens) {
  const auto [like, expert_parallel] = GetParam();
  auto whole = make_synthetic_source({like, "q8", 7, {}});
  std::unique_ptr<Model> single = load_model(*whole, *gpu_);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_backend("cuda:0"));
  Backend* ranks[] = {backends[0].get()};
  std::unique_ptr<Model> split = make_tensor_parallel_model(*whole, {1, expert_parallel}, LoadOptions{},
                                                            std::move(backends), make_rank_communicators(ranks));

  SequenceOptions options;
  options.max_seq = 64;
  std::vector<int32_t> prompt(24);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((37 * i + 11) % single->vocab_size());
  SampleSpec greedy;
  greedy.temperature = 0.0f;
  auto decode = [&](Model& m) {
    auto seq = m.new_sequence(options);
    const std::vector<float> logits = m.forward(*seq, prompt, LogitsMode::last);
    int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int32_t> tokens = {token};
    auto graph = m.make_decode_graph(*seq);
    for (int step = 0; step < 6; ++step) tokens.push_back(token = graph->step_sample(token, greedy));
    return std::make_pair(logits, tokens);
  };
  const auto [one_logits, one_tokens] = decode(*single);
  const auto [split_logits, split_tokens] = decode(*split);
  EXPECT_EQ(split_tokens, one_tokens);
  ASSERT_EQ(split_logits.size(), one_logits.size());
  float worst = 0.0f, scale = 0.0f;
  for (size_t i = 0; i < one_logits.size(); ++i) {
    worst = std::max(worst, std::abs(split_logits[i] - one_logits[i]));
    scale = std::max(scale, std::abs(one_logits[i]));
  }
  EXPECT_LE(worst, 1e-5f * std::max(1.0f, scale)) << "one rank's all-reduce changes nothing";
}
INSTANTIATE_TEST_SUITE_P(TensorAndExpertParallel, NcclSplit,
                         ::testing::Combine(::testing::Values("tiny-gemma4-moe", "tiny-qwen35-moe"), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, bool>>& info) {
                           std::string name =
                               std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_ep" : "_tp");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace fl
