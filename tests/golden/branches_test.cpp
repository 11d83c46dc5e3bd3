// Concurrent branches (Backend::branch_begin) on the GPU: a MoE layer's dense MLP (Gemma 4) or
// shared expert (Qwen3.5) on a second stream beside the routed experts, a decode step's KV write
// beside its attention, Qwen3.5's delta-rule gates beside its convolution, give byte-identical
// results to the same ops in order on one stream (BackendOptions::concurrent_branches off):
// logits and every byte of the sequence state, through prefill on the one-row kernels and on the
// GEMMs (a 24-token chunk), eager decode, graph-replayed decode and batched decode, for bf16
// checkpoints and HFQ4 .fire files. And a branch cut short by an exception leaves the backend
// usable. The other switches of BackendOptions (gated matvec, weight prefetch, the Hopper expert
// GEMM) likewise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden_util.h"
#include "graph_replay_check.h"
#include "io/quantize_model.h"
#include "model/model.h"
#include "quant/quant_policy.h"
#include "util/test_util.h"

namespace fl {
namespace {

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One model on two CUDA backends: by default branches side by side (0) and in order (1).
struct TwoWays {
  std::unique_ptr<ModelSource> source;
  std::unique_ptr<Backend> backends[2];
  std::unique_ptr<Model> models[2];
};

BackendOptions branches_option(bool side_by_side) {
  BackendOptions options;
  options.concurrent_branches = side_by_side;
  return options;
}

TwoWays load_two_ways(const std::string& path, const BackendOptions& first = branches_option(true),
                      const BackendOptions& second = branches_option(false)) {
  TwoWays w;
  w.source = open_model_source(path);
  for (int i = 0; i < 2; ++i) {
    w.backends[i] = make_backend("cuda", i == 0 ? first : second);
    w.models[i] = load_model(*w.source, *w.backends[i]);
  }
  return w;
}

std::vector<int32_t> fixture_ids(const std::string& fixture) {
  SafetensorsFile f(test::fixtures_dir() + "/" + fixture + "/golden.safetensors");
  return test::read_golden<int32_t>(f, "input_ids");
}

// Prefill (a 24-token chunk on the GEMMs, then 2 one-row steps), 4 eager decode steps, then the
// rest replayed from a captured graph: every step's logits and the final states byte-identical.
void expect_identical_paths(TwoWays& w, std::span<const int32_t> ids) {
  ASSERT_GE(ids.size(), 40u);
  std::unique_ptr<Sequence> seqs[2];
  std::unique_ptr<DecodeGraph> graphs[2];
  for (int i = 0; i < 2; ++i)
    seqs[i] = w.models[i]->new_sequence({static_cast<int64_t>(ids.size()) + 8, DType::q8_0, true});
  size_t at = 0;
  auto step = [&](size_t n, LogitsMode mode, const char* what) {
    std::vector<float> logits[2];
    for (int i = 0; i < 2; ++i) logits[i] = w.models[i]->forward(*seqs[i], ids.subspan(at, n), mode);
    EXPECT_TRUE(same_bytes(logits[0], logits[1])) << what << " at position " << at;
    at += n;
  };
  step(24, LogitsMode::all, "GEMM prefill");
  step(1, LogitsMode::all, "one-row prefill");
  step(1, LogitsMode::all, "one-row prefill");
  for (int k = 0; k < 4; ++k) step(1, LogitsMode::last, "eager decode");
  for (int i = 0; i < 2; ++i) graphs[i] = w.models[i]->make_decode_graph(*seqs[i]);
  for (; at < ids.size(); ++at) {
    const std::vector<float> a = graphs[0]->step(ids[at]), b = graphs[1]->step(ids[at]);
    EXPECT_TRUE(same_bytes(a, b)) << "replayed decode at position " << at;
  }
  EXPECT_TRUE(graphs[0]->captured());
  EXPECT_TRUE(graphs[1]->captured());
  EXPECT_EQ(test::sequence_state_bytes(*w.backends[0], *seqs[0]), test::sequence_state_bytes(*w.backends[1], *seqs[1]));
}

// Three sequences at different positions decoding together.
void expect_identical_batches(TwoWays& w, std::span<const int32_t> ids) {
  std::vector<std::unique_ptr<Sequence>> seqs[2];
  std::vector<Sequence*> ptrs[2];
  for (int i = 0; i < 2; ++i)
    for (size_t s = 0; s < 3; ++s) {
      seqs[i].push_back(w.models[i]->new_sequence({static_cast<int64_t>(ids.size()) + 8, DType::q8_0, true}));
      w.models[i]->forward(*seqs[i].back(), ids.first(5 + 7 * s), LogitsMode::last);
      ptrs[i].push_back(seqs[i].back().get());
    }
  for (size_t t = 0; t < 4; ++t) {
    const int32_t step_ids[3] = {ids[20 + t], ids[25 + t], ids[30 + t]};
    const std::vector<float> a = w.models[0]->forward_batch(ptrs[0], step_ids);
    const std::vector<float> b = w.models[1]->forward_batch(ptrs[1], step_ids);
    EXPECT_TRUE(same_bytes(a, b)) << "batched step " << t;
  }
  for (size_t s = 0; s < 3; ++s)
    EXPECT_EQ(test::sequence_state_bytes(*w.backends[0], *seqs[0][s]),
              test::sequence_state_bytes(*w.backends[1], *seqs[1][s]))
        << "sequence " << s;
}

class ConcurrentBranches : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ConcurrentBranches, GiveTheSameBytesAsOneStream) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const auto& [fixture, format] = GetParam();
  std::string path = test::fixtures_dir() + "/" + fixture;
  test::TempDir dir;
  if (format != "bf16") {
    const std::string fire = dir.file(fixture + ".fire");
    QuantizeOptions q;
    q.policy.preset = *parse_quant_preset(format);
    quantize_model(path, fire, q);
    path = fire;
  }
  TwoWays w = load_two_ways(path);
  const std::vector<int32_t> ids = fixture_ids(fixture);
  expect_identical_paths(w, ids);
  // the first backend really forked its side stream; the second ran everything in order
  EXPECT_GT(cuda_branch_forks(*w.backends[0]), 0);
  EXPECT_EQ(cuda_branch_forks(*w.backends[1]), 0);
  expect_identical_batches(w, ids);
}

auto branch_case_name = [](const auto& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
};
INSTANTIATE_TEST_SUITE_P(MoeFixtures, ConcurrentBranches,
                         ::testing::Combine(::testing::Values("gemma4-moe", "qwen35-moe"),
                                            ::testing::Values("bf16", "hf4")),
                         branch_case_name);
// Dense models take branches too: the decode step's KV write, Qwen3.5's gates beside the convolution.
INSTANTIATE_TEST_SUITE_P(DenseFixtures, ConcurrentBranches,
                         ::testing::Combine(::testing::Values("gemma4-dense", "gemma4-e2b", "qwen35-dense"),
                                            ::testing::Values("hf4")),
                         branch_case_name);

// The GPU's switches for A/B timing (BackendOptions::gated_matvec on, weight_prefetch on,
// hopper_expert_gemm on, fused_experts on, experts_down_sum on; each the other way from its default; imma_ready_pieces
// against the integer matvec's own pieces) move no numbers in the whole model either: the same bytes as the defaults on
// every path above, at both tensor-core precisions (the Hopper expert GEMM takes one-piece products only: bf16). HFQ4
// is the format the gated matvec takes; the dense fixtures reach matmul_gated, the MoE ones also the experts' gated
// product and, in a 36-token chunk, the grouped expert GEMM's 64-pair items. group_gemm (one launch for q/k/v, one for
// gate/up) changes the order of K-split sums, so it is held to a tolerance instead.
class GpuSwitches : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuSwitches, GiveTheSameBytesAsTheDefaults) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const std::string fixture = GetParam();
  test::TempDir dir;
  const std::string fire = dir.file(fixture + ".fire");
  QuantizeOptions q;
  q.policy.preset = *parse_quant_preset("hf4");
  quantize_model(test::fixtures_dir() + "/" + fixture, fire, q);
  const std::vector<int32_t> ids = fixture_ids(fixture);
  for (TensorCorePrecision precision : {TensorCorePrecision::f32, TensorCorePrecision::bf16}) {
    SCOPED_TRACE(precision == TensorCorePrecision::bf16 ? "bf16 tensor cores" : "f32 tensor cores");
    BackendOptions defaults;
    defaults.tensor_core_precision = precision;
    defaults.imma_matvec = false;  // (the gated matvec's products are f32 ones: compare with those)
    BackendOptions switched = defaults;
    switched.gated_matvec = true;
    switched.weight_prefetch = true;
    switched.hopper_expert_gemm = true;
    switched.fused_experts = true;  // (decode's 1-4 tokens: one launch, which takes precedence over the gated form)
    switched.experts_down_sum = true;  // (where fused_experts declines: the down products and their combine in one)
    TwoWays w = load_two_ways(fire, switched, defaults);
    const int64_t fused_before = cuda_moe_experts_decode_launches();
    expect_identical_paths(w, ids);
    expect_identical_batches(w, ids);
    if (fixture.find("moe") != std::string::npos) {
      EXPECT_GT(cuda_moe_experts_decode_launches(), fused_before) << "the fused experts did not run";
    }
    // A 36-token chunk: 72 routed pairs over the MoE fixtures' 4 experts (top 2) make 64-pair
    // items, the ones the Hopper expert GEMM takes (the 24-token chunk above makes 16-pair ones).
    const int64_t launches = cuda_hopper_expert_gemm_launches();
    std::vector<float> logits[2];
    for (int i = 0; i < 2; ++i) {
      auto seq = w.models[i]->new_sequence({static_cast<int64_t>(ids.size()) + 8, DType::q8_0, true});
      logits[i] = w.models[i]->forward(*seq, std::span<const int32_t>(ids).first(36), LogitsMode::all);
    }
    EXPECT_TRUE(same_bytes(logits[0], logits[1])) << "a 36-token chunk";
    if (precision == TensorCorePrecision::bf16 && fixture.find("moe") != std::string::npos &&
        cuda_hopper_gemm_active(*w.backends[0])) {
      EXPECT_GT(cuda_hopper_expert_gemm_launches(), launches) << "the Hopper expert GEMM did not run";
    }
  }
  // imma_ready_pieces (the integer matvec on): pieces cut by the residual update and the gated
  // activation give the same bytes as each product cutting its own, on every path above; and a
  // one-row step with them launches fewer pieces kernels than without (the producers served).
  {
    BackendOptions apart;
    apart.imma_matvec = true;
    apart.imma_ready_pieces = false;
    BackendOptions ready = apart;
    ready.imma_ready_pieces = true;
    TwoWays w = load_two_ways(fire, ready, apart);
    if (cuda_imma_matvec_available(*w.backends[0])) {
      SCOPED_TRACE("imma_ready_pieces");
      expect_identical_paths(w, ids);
      expect_identical_batches(w, ids);
      int64_t pieces[2], products[2];
      for (int i = 0; i < 2; ++i) {
        auto seq = w.models[i]->new_sequence({8, DType::q8_0, true});
        const int64_t pieces_before = cuda_imma_pieces_launches(), products_before = cuda_imma_matvec_launches();
        w.models[i]->forward(*seq, std::span<const int32_t>(ids).first(1), LogitsMode::last);
        w.backends[i]->synchronize();
        pieces[i] = cuda_imma_pieces_launches() - pieces_before;
        products[i] = cuda_imma_matvec_launches() - products_before;
      }
      EXPECT_GT(products[0], 0) << "no integer product ran";
      EXPECT_EQ(products[0], products[1]);
      EXPECT_EQ(pieces[1], products[1]) << "without ready pieces, each product cuts its own";
      EXPECT_LT(pieces[0], pieces[1]) << "no product took pieces cut beside its input";
    }
  }
  // group_gemm (q/k/v and gate/up of a chunk in one GEMM launch each, bf16 tensor cores) moves
  // results by the order of K-split sums only: the chunk's logits within 1e-4 of the largest.
  BackendOptions defaults;
  defaults.tensor_core_precision = TensorCorePrecision::bf16;
  defaults.group_gemm = false;  // (the default is on: compare against one product after another)
  BackendOptions grouped = defaults;
  grouped.group_gemm = true;
  TwoWays w = load_two_ways(fire, grouped, defaults);
  const int64_t launches = cuda_group_gemm_launches();
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    auto seq = w.models[i]->new_sequence({static_cast<int64_t>(ids.size()) + 8, DType::q8_0, true});
    logits[i] = w.models[i]->forward(*seq, std::span<const int32_t>(ids).first(36), LogitsMode::all);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  float largest = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    largest = std::max(largest, std::fabs(logits[1][i]));
    diff = std::max(diff, std::fabs(logits[0][i] - logits[1][i]));
  }
  EXPECT_LE(diff, 1e-4f * largest) << "group_gemm moved a 36-token chunk's logits";
  if (cuda_hopper_gemm_active(*w.backends[0])) {
    EXPECT_GT(cuda_group_gemm_launches(), launches) << "no product of the chunk ran as one launch";
  }
  // Fewer inputs than the GEMM takes (prompts of 5, 9 and 13 tokens, then three sequences
  // decoding together) keep each product's matvec: the same bytes as the default, no launch.
  const int64_t before_small = cuda_group_gemm_launches();
  std::vector<std::unique_ptr<Sequence>> seqs[2];
  std::vector<Sequence*> ptrs[2];
  for (int i = 0; i < 2; ++i)
    for (size_t n : {5, 9, 13}) {
      seqs[i].push_back(w.models[i]->new_sequence({static_cast<int64_t>(ids.size()) + 8, DType::q8_0, true}));
      w.models[i]->forward(*seqs[i].back(), std::span<const int32_t>(ids).first(n), LogitsMode::last);
      ptrs[i].push_back(seqs[i].back().get());
    }
  for (size_t t = 0; t < 3; ++t) {
    const int32_t step_ids[3] = {ids[20 + t], ids[25 + t], ids[30 + t]};
    EXPECT_TRUE(
        same_bytes(w.models[0]->forward_batch(ptrs[0], step_ids), w.models[1]->forward_batch(ptrs[1], step_ids)))
        << "a batched step of three sequences, " << t;
  }
  EXPECT_EQ(cuda_group_gemm_launches(), before_small) << "fewer than 16 inputs took the grouped GEMM";
}

INSTANTIATE_TEST_SUITE_P(Hf4Fixtures, GpuSwitches,
                         ::testing::Values("gemma4-dense", "gemma4-moe", "qwen35-dense", "qwen35-moe"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// An exception inside either line, eagerly or inside a graph capture: the branch is abandoned, the
// error passes on, and the backend then captures and computes what the in-order backend does.
// Memory operations and a second branch_begin inside an open branch are refused.
TEST(ConcurrentBranchesErrors, AnExceptionMidBranchLeavesTheBackendUsable) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  TwoWays w = load_two_ways(test::fixtures_dir() + "/gemma4-moe");
  const std::vector<int32_t> ids = fixture_ids("gemma4-moe");
  Backend& b = *w.backends[0];
  auto buffer = b.allocate(2 * 256 * sizeof(float));
  auto* base = static_cast<float*>(buffer->data());
  Tensor side_row = make_tensor(base, DType::f32, {1, 256}, b.device());  // one tensor per line
  Tensor main_row = make_tensor(base + 256, DType::f32, {1, 256}, b.device());
  EXPECT_THROW(run_side_by_side(
                   b,
                   [&] {
                     b.scale(side_row, 2.0f);
                     fail("side line fails");
                   },
                   [&] { b.scale(main_row, 3.0f); }),
               Error);
  EXPECT_THROW(run_side_by_side(
                   b, [&] { b.scale(side_row, 2.0f); },
                   [&] {
                     b.scale(main_row, 3.0f);
                     fail("main line fails");
                   }),
               Error);
  EXPECT_THROW(b.capture([&] {
    run_side_by_side(
        b, [&] { b.scale(side_row, 2.0f); }, [&] { fail("main line fails inside a capture"); });
  }),
               Error);
  b.branch_begin();
  EXPECT_THROW(b.branch_begin(), Error);
  EXPECT_THROW(b.allocate(64), Error);
  EXPECT_THROW(b.synchronize(), Error);
  b.branch_abandon();
  EXPECT_THROW(b.branch_join(), Error);  // nothing open
  b.synchronize();
  // A captured branch replays: side_row *= 2 beside main_row *= 3, twice, from ones.
  const std::vector<float> ones(512, 1.0f);
  b.copy_to_device(make_tensor(base, DType::f32, {512}, b.device()), ones.data());
  auto graph = b.capture([&] {
    run_side_by_side(
        b, [&] { b.scale(side_row, 2.0f); }, [&] { b.scale(main_row, 3.0f); });
  });
  graph->replay();
  graph->replay();
  std::vector<float> got(512);
  b.copy_to_host(got.data(), make_tensor(base, DType::f32, {512}, b.device()));
  EXPECT_EQ(got[0], 4.0f);
  EXPECT_EQ(got[255], 4.0f);
  EXPECT_EQ(got[256], 9.0f);
  EXPECT_EQ(got[511], 9.0f);
  // and the model on it still equals the in-order backend
  std::unique_ptr<Sequence> seqs[2];
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    seqs[i] = w.models[i]->new_sequence({64, DType::q8_0, true});
    logits[i] = w.models[i]->forward(*seqs[i], std::span<const int32_t>(ids).first(12), LogitsMode::all);
  }
  EXPECT_TRUE(same_bytes(logits[0], logits[1]));
}

}  // namespace
}  // namespace fl
