// The tensor-parallel forward (issue 10) on the CPU: N ranks as N threads, each with its own CPU
// backend, its shards (model/rank_source.h) and a thread communicator, against the whole model on
// one backend (Gemma 4 here; Qwen3.5 in the Qwen tests below). The tiny MoE Gemma 4 in Q8_0 (32-weight blocks, so its
// 64-wide heads split) has every layer kind: sliding layers whose 2 KV heads split over 2 ranks and repeat over 4,
// global layers with K = V and 1 KV head on every rank, an MLP width of 11 blocks dealt 6 + 5 or 3 + 3 + 3 + 2, and the
// expert block, replicated (--tp) or its 8 experts dealt out (--ep, a third all-reduce). A prompt longer than the
// sliding window, then greedy decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/error.h"
#include "io/model_source.h"
#include "model/gemma4.h"
#include "model/parallel_plan.h"
#include "model/rank_source.h"
#include "model/synthetic.h"
#include "model/tensor_parallel.h"
#include "util/test_util.h"

namespace fl {
namespace {

constexpr int kPromptTokens = 24, kDecodeSteps = 6;

// Each forward's logits and the greedy tokens, from a prompt then kDecodeSteps single tokens.
struct Generated {
  std::vector<std::vector<float>> logits;  // [1 + kDecodeSteps]: the prompt's [T, vocab], then [vocab] per step
  std::vector<int32_t> tokens;
};

int32_t greedy(const float* logits, int vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

Generated generate(Model& model, int prompt_tokens = kPromptTokens) {
  const int vocab = model.vocab_size();
  SequenceOptions options;
  options.max_seq = 128;
  auto seq = model.new_sequence(options);
  std::vector<int32_t> prompt(prompt_tokens);
  for (int i = 0; i < prompt_tokens; ++i) prompt[i] = (37 * i + 11) % vocab;
  Generated run;
  run.logits.push_back(model.forward(*seq, prompt, LogitsMode::all));
  for (int step = 0; step < kDecodeSteps; ++step) {
    const std::vector<float>& last = run.logits.back();
    const int32_t token = greedy(last.data() + last.size() - vocab, vocab);
    run.tokens.push_back(token);
    run.logits.push_back(model.forward(*seq, std::span<const int32_t>(&token, 1), LogitsMode::last));
  }
  return run;
}

ParallelPlan plan_for(const ModelSource& source, int ranks, bool expert_parallel = false) {
  return plan_model_parallel(source.config(), {ranks, expert_parallel}, source_weight_formats(source));
}

// Every rank's run, the ranks on threads of their own.
std::vector<Generated> generate_split(const ModelSource& whole, int ranks, bool expert_parallel,
                                      int prompt_tokens = kPromptTokens) {
  const ParallelPlan plan = plan_for(whole, ranks, expert_parallel);
  std::vector<std::unique_ptr<ModelSource>> sources;
  for (int r = 0; r < ranks; ++r) sources.push_back(make_rank_source(whole, plan, r));  // cut on this thread
  std::vector<std::unique_ptr<Communicator>> comms = make_thread_communicators(ranks);
  std::vector<Generated> runs(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Backend> cpu = make_backend("cpu");
        std::unique_ptr<Model> model = make_rank_model(std::move(sources[r]), *cpu, *comms[r]);
        runs[r] = generate(*model, prompt_tokens);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

// Every rank's run against one device's, at 2 and 4 ranks, with and without --ep.
void expect_split_runs_match_one_device(const ModelSource& whole, int prompt_tokens, bool has_experts) {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  const Generated one = generate(*load_model(whole, *cpu), prompt_tokens);
  for (int ranks : {2, 4})
    for (bool ep : {false, true}) {
      if (ep && !has_experts) continue;
      SCOPED_TRACE("--tp " + std::to_string(ranks) + (ep ? " --ep" : ""));
      const std::vector<Generated> runs = generate_split(whole, ranks, ep, prompt_tokens);
      if (::testing::Test::HasFailure()) return;
      // The all-reduce hands every rank the same sum, and everything after it is replicated.
      for (int r = 1; r < ranks; ++r) {
        EXPECT_EQ(runs[r].tokens, runs[0].tokens) << "rank " << r;
        for (size_t i = 0; i < runs[0].logits.size(); ++i)
          EXPECT_EQ(std::memcmp(runs[r].logits[i].data(), runs[0].logits[i].data(), runs[0].logits[i].size() * 4), 0)
              << "rank " << r << " forward " << i;
      }
      // Against one device: the same tokens, and logits within the reassociation of o_proj's and
      // down_proj's sums (a rank's partial sums added in rank order instead of one running sum
      // over K) carried through the layers: measured at most 2.1e-5 of max |logit| (Gemma 4: 4
      // ranks, the prompt's forward, --ep the same; Qwen3.5's tiny MoE 1.8e-5, the fixtures
      // 3.6e-6), budget 1e-4. Without the MLP's all-reduce, or the expert block's with --ep, the
      // logits are off by more than their size.
      EXPECT_EQ(runs[0].tokens, one.tokens);
      for (size_t i = 0; i < one.logits.size(); ++i) {
        ASSERT_EQ(runs[0].logits[i].size(), one.logits[i].size());
        float max_ref = 0.0f, max_diff = 0.0f;
        for (size_t j = 0; j < one.logits[i].size(); ++j) {
          max_ref = std::max(max_ref, std::fabs(one.logits[i][j]));
          max_diff = std::max(max_diff, std::fabs(runs[0].logits[i][j] - one.logits[i][j]));
        }
        EXPECT_LE(max_diff, 1e-4f * max_ref) << "forward " << i << ": max |logit| " << max_ref;
        EXPECT_GT(max_ref, 0.0f);
      }
    }
}

TEST(TensorParallel, RanksOnThreadsGiveTheOneDeviceTokensAndLogits) {
  auto whole = make_synthetic_source({"tiny-gemma4-moe", "q8", 7, {}});
  expect_split_runs_match_one_device(*whole, kPromptTokens, true);
}

// Qwen3.5 (tiny MoE, Q8_0): DeltaNet layers split by value head, 2 value heads of 64 per rank at
// --tp 2 (their one key head each), 1 at --tp 4 with the 2 key heads each repeated over 2 ranks;
// full-attention layers' 2 KV heads likewise; the routed experts whole on every rank, or dealt out
// with --ep; the shared expert whole. A 70-token prompt crosses the delta rule's 64-token chunk,
// then recurrent decode steps.
TEST(TensorParallel, QwenRanksOnThreadsGiveTheOneDeviceTokensAndLogits) {
  auto whole = make_synthetic_source({"tiny-qwen35-moe", "q8", 7, {}});
  expect_split_runs_match_one_device(*whole, 70, true);
}

// The transformers-made fixtures (f32/bf16), whose logits the golden tests hold to transformers':
// Gemma 4 dense, MoE (one global KV head on every rank) and E2B (per-layer inputs, KV-shared
// layers, one KV head), the dense Qwen3.5 (its MLP split in 160 / N columns), and the Qwen3.5 MoE
// stored per expert (text-only layout: a rank keeps its own experts' tensors under --ep), whose
// single key head every rank holds.
TEST(TensorParallel, FixturesSplitLikeOneDevice) {
  for (const char* name : {"gemma4-dense", "gemma4-moe", "gemma4-e2b", "qwen35-dense", "qwen35-moe-split"}) {
    SCOPED_TRACE(name);
    const std::string dir = test::fixtures_dir() + "/" + name;
    if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << name << " has not been generated";
    auto whole = open_model_source(dir);
    expect_split_runs_match_one_device(*whole, 70, has_routed_experts(whole->config()));
  }
}

// The split model as an ordinary Model (one thread per rank, model/tensor_parallel.h).
std::unique_ptr<Model> split_model(const ModelSource& whole, int ranks,
                                   std::vector<std::unique_ptr<Communicator>> comms = {}, bool ep = false) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < ranks; ++r) backends.push_back(make_backend("cpu"));
  if (comms.empty()) comms = make_thread_communicators(ranks);
  return make_tensor_parallel_model(whole, {ranks, ep}, LoadOptions{}, std::move(backends), std::move(comms));
}

void expect_close_logits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float max_ref = 0.0f, max_diff = 0.0f;
  for (size_t j = 0; j < want.size(); ++j) {
    max_ref = std::max(max_ref, std::fabs(want[j]));
    max_diff = std::max(max_diff, std::fabs(got[j] - want[j]));
  }
  EXPECT_LE(max_diff, 1e-4f * max_ref) << what;
}

TEST(TensorParallel, TheSplitModelServesForwardGraphsAndBatches) {
  auto whole = make_synthetic_source({"tiny-gemma4-moe", "q8", 7, {}});
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::unique_ptr<Model> single = make_gemma4_model(*whole, *cpu);
  const Generated one = generate(*single);
  std::unique_ptr<Model> split = split_model(*whole, 2);
  EXPECT_EQ(split->vocab_size(), single->vocab_size());
  EXPECT_EQ(std::get<Gemma4Config>(split->config().arch).num_heads,
            std::get<Gemma4Config>(single->config().arch).num_heads);  // the whole model's config

  // forward: the one-device tokens and logits.
  const Generated two = generate(*split);
  EXPECT_EQ(two.tokens, one.tokens);
  for (size_t i = 0; i < one.logits.size(); ++i)
    expect_close_logits(two.logits[i], one.logits[i], "forward " + std::to_string(i));

  // The decode graph: each rank's graph stepped together, the next token sampled on every rank.
  SequenceOptions options;
  options.max_seq = 64;
  auto seq = split->new_sequence(options);
  std::vector<int32_t> prompt(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) prompt[i] = (37 * i + 11) % split->vocab_size();
  const std::vector<float> prompt_logits = split->forward(*seq, prompt, LogitsMode::last);
  auto graph = split->make_decode_graph(*seq);
  SampleSpec greedy_spec;
  greedy_spec.temperature = 0.0f;
  int32_t next = greedy(prompt_logits.data(), split->vocab_size());
  std::vector<int32_t> graph_tokens = {next};
  for (int step = 1; step < kDecodeSteps; ++step) graph_tokens.push_back(next = graph->step_sample(next, greedy_spec));
  EXPECT_EQ(graph_tokens, one.tokens);
  EXPECT_EQ(seq->n_past, kPromptTokens + kDecodeSteps - 1);

  // A batch of two sequences at different positions: each gets what it gets alone.
  auto a = split->new_sequence(options), b = split->new_sequence(options);
  split->forward(*a, std::span<const int32_t>(prompt.data(), 20), LogitsMode::last);
  split->forward(*b, std::span<const int32_t>(prompt.data(), 5), LogitsMode::last);
  Sequence* both[] = {a.get(), b.get()};
  const int32_t ids[] = {3, 9};
  const std::vector<float> batched = split->forward_batch(both, ids);
  auto a1 = single->new_sequence(options), b1 = single->new_sequence(options);
  single->forward(*a1, std::span<const int32_t>(prompt.data(), 20), LogitsMode::last);
  single->forward(*b1, std::span<const int32_t>(prompt.data(), 5), LogitsMode::last);
  const int V = single->vocab_size();
  const std::vector<float> alone_a = single->forward(*a1, std::span<const int32_t>(&ids[0], 1), LogitsMode::last);
  const std::vector<float> alone_b = single->forward(*b1, std::span<const int32_t>(&ids[1], 1), LogitsMode::last);
  expect_close_logits(std::vector<float>(batched.begin(), batched.begin() + V), alone_a, "batch row 0");
  expect_close_logits(std::vector<float>(batched.begin() + V, batched.end()), alone_b, "batch row 1");
  EXPECT_EQ(a->n_past, 21);
  EXPECT_EQ(b->n_past, 6);

  // copy_sequence: each rank's part copied; the copy continues exactly as its source does.
  auto c = split->new_sequence(options);
  split->copy_sequence(*a, *c);
  EXPECT_EQ(c->n_past, 21);
  const std::vector<float> from_a = split->forward(*a, std::span<const int32_t>(&ids[1], 1), LogitsMode::last);
  const std::vector<float> from_c = split->forward(*c, std::span<const int32_t>(&ids[1], 1), LogitsMode::last);
  EXPECT_EQ(from_a, from_c);
  auto whole_seq = single->new_sequence(options);
  EXPECT_ERROR_HAS(split->copy_sequence(*a, *whole_seq), "not made by this 2-rank model");
  SequenceOptions shorter = options;
  shorter.max_seq = 32;
  auto short_seq = split->new_sequence(shorter);
  EXPECT_ERROR_HAS(split->copy_sequence(*a, *short_seq), "different options");

  // Bad input is refused before the ranks start, and the model stays usable.
  const int32_t bad = V + 5;
  EXPECT_ERROR_HAS(split->forward(*a, std::span<const int32_t>(&bad, 1), LogitsMode::last), "outside the vocabulary");
  auto foreign = single->new_sequence(options);
  EXPECT_ERROR_HAS(split->forward(*foreign, std::span<const int32_t>(&ids[0], 1), LogitsMode::last),
                   "not made by this 2-rank model");
  EXPECT_ERROR_HAS(split->forward_batch({}, {}), "0 sequences");
  EXPECT_ERROR_HAS(split->new_sequence({0}), "max_seq must be positive");
  EXPECT_ERROR_HAS(split->new_sequence({16, DType::hfq4_g256}), "not supported");
  EXPECT_EQ(split->forward(*a, std::span<const int32_t>(&ids[0], 1), LogitsMode::last).size(), static_cast<size_t>(V));

  // The graph follows the position the caller sets, as one device's graph does: moved back to
  // the prompt's end (the sliding layers' ring rows now hold later positions, so the tokens
  // differ from the first pass), both models continue alike.
  auto moved_back = [&](Model& m) {
    auto s = m.new_sequence(options);
    int32_t t = greedy(m.forward(*s, prompt, LogitsMode::last).data(), m.vocab_size());
    auto g = m.make_decode_graph(*s);
    std::vector<int32_t> out;
    for (int step = 0; step < 2 * kDecodeSteps; ++step) {
      if (step == kDecodeSteps) s->n_past = kPromptTokens;
      out.push_back(t = g->step_sample(t, greedy_spec));
    }
    out.push_back(static_cast<int32_t>(s->n_past));
    return out;
  };
  EXPECT_EQ(moved_back(*split), moved_back(*single));
}

// --ep through the Model interface: batched rows sampled on the ranks equal one device's greedy
// tokens; a dense model has no experts to deal out.
TEST(TensorParallel, ExpertParallelBatchesSampleTheOneDeviceTokens) {
  auto whole = make_synthetic_source({"tiny-gemma4-moe", "q8", 7, {}});
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::unique_ptr<Model> single = make_gemma4_model(*whole, *cpu);
  std::unique_ptr<Model> split = split_model(*whole, 4, {}, true);
  SequenceOptions options;
  options.max_seq = 64;
  std::vector<int32_t> prompt(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) prompt[i] = (37 * i + 11) % split->vocab_size();
  SampleSpec greedy_spec;
  greedy_spec.temperature = 0.0f;
  std::vector<std::vector<int32_t>> tokens;  // per model: every step's two sampled ids
  for (Model* m : {single.get(), split.get()}) {
    auto a = m->new_sequence(options), b = m->new_sequence(options);
    m->forward(*a, std::span<const int32_t>(prompt.data(), 20), LogitsMode::last);
    m->forward(*b, std::span<const int32_t>(prompt.data(), 7), LogitsMode::last);
    Sequence* both[] = {a.get(), b.get()};
    std::vector<int32_t> next = {5, 9};
    const std::vector<SampleSpec> specs(2, greedy_spec);
    std::vector<int32_t> seen;
    for (int step = 0; step < 4; ++step) {
      next = m->forward_batch_sample(both, next, specs);
      seen.insert(seen.end(), next.begin(), next.end());
    }
    tokens.push_back(seen);
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  auto dense = make_synthetic_source({"gemma-4-31b", "q8", 1, {}});
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < 2; ++r) backends.push_back(make_backend("cpu"));
  EXPECT_ERROR_HAS(
      make_tensor_parallel_model(*dense, {2, true}, LoadOptions{}, std::move(backends), make_thread_communicators(2)),
      "no mixture-of-experts block");
}

// A fault inside one rank (here its communicator throws on its third all-reduce) must not leave
// the other ranks waiting in the collective: the call throws that rank's error, and later calls
// throw too instead of hanging.
class FaultyCommunicator final : public Communicator {
 public:
  FaultyCommunicator(std::unique_ptr<Communicator> inner, int fail_at) : inner_(std::move(inner)), fail_at_(fail_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(Tensor& t) override {
    if (++calls_ == fail_at_) fail("injected device fault");
    inner_->all_reduce_sum(t);
  }
  void abort(const std::string& why) override { inner_->abort(why); }

 private:
  std::unique_ptr<Communicator> inner_;
  int fail_at_, calls_ = 0;
};

TEST(TensorParallel, AFaultingRankFailsTheCallInsteadOfHangingIt) {
  auto whole = make_synthetic_source({"tiny-gemma4-moe", "q8", 7, {}});
  std::vector<std::unique_ptr<Communicator>> comms = make_thread_communicators(2);
  comms[1] = std::make_unique<FaultyCommunicator>(std::move(comms[1]), 3);
  std::unique_ptr<Model> split = split_model(*whole, 2, std::move(comms));
  auto seq = split->new_sequence({});
  const int32_t ids[] = {1, 2, 3};
  EXPECT_ERROR_HAS(split->forward(*seq, ids, LogitsMode::last), "rank 1: injected device fault");
  // Refused before any rank runs (a GPU rank's captured graph would replay its collectives on
  // aborted communicators): forward, a new sequence, and a decode graph's steps alike.
  EXPECT_ERROR_HAS(split->forward(*seq, ids, LogitsMode::last),
                   "the split model stopped after a failure (rank 1 failed: injected device fault)");
  EXPECT_ERROR_HAS(split->new_sequence({}), "the split model stopped after a failure");
}

// The expert-parallel remap: a rank's own experts become indices into its stack, the others id -1
// at weight 0, which moe_experts skips (and any other id outside the stack is refused).
TEST(TensorParallel, MoeKeepExpertsRemapsOwnAndZeroesForeignPairs) {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::vector<int32_t> ids = {0, 3, 4, 5, 7, 2};
  std::vector<float> w = {0.5f, 0.25f, 0.125f, 1.0f, 2.0f, 4.0f};
  cpu->moe_keep_experts(make_tensor(ids.data(), DType::i32, {3, 2}), make_tensor(w.data(), DType::f32, {3, 2}), 3, 3);
  EXPECT_EQ(ids, (std::vector<int32_t>{-1, 0, 1, 2, -1, -1}));
  EXPECT_EQ(w, (std::vector<float>{0.0f, 0.25f, 0.125f, 1.0f, 0.0f, 0.0f}));
  // moe_experts over the rank's 3 experts: token 2 (both pairs foreign) gets exact zeros, token 0
  // its one own expert's output alone (as when the foreign pair is dropped), -2 is refused.
  const int64_t H = 4, I = 2;
  std::vector<float> gate_up(3 * 2 * I * H), down(3 * H * I), x(3 * H), out(3 * H, 7.0f);
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (size_t i = 0; i < down.size(); ++i) down[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + 0.25f * static_cast<float>(i);
  const Tensor gu = make_tensor(gate_up.data(), DType::f32, {3, 2 * I, H}), dn = make_tensor(down.data(), DType::f32, {3, H, I});
  cpu->moe_experts(make_tensor(out.data(), DType::f32, {3, H}), make_tensor(x.data(), DType::f32, {3, H}), gu, dn,
                   make_tensor(ids.data(), DType::i32, {3, 2}), make_tensor(w.data(), DType::f32, {3, 2}),
                   Activation::silu);
  for (int64_t c = 0; c < H; ++c) EXPECT_EQ(out[2 * H + c], 0.0f);
  std::vector<int32_t> own_only = {0};
  std::vector<float> own_weight = {0.25f}, alone(H);
  cpu->moe_experts(make_tensor(alone.data(), DType::f32, {1, H}), make_tensor(x.data(), DType::f32, {1, H}), gu, dn,
                   make_tensor(own_only.data(), DType::i32, {1, 1}), make_tensor(own_weight.data(), DType::f32, {1, 1}),
                   Activation::silu);
  for (int64_t c = 0; c < H; ++c) EXPECT_EQ(out[c], alone[c]);
  EXPECT_NE(alone[0], 0.0f);
  ids[0] = -2;
  EXPECT_ERROR_HAS(cpu->moe_experts(make_tensor(out.data(), DType::f32, {3, H}), make_tensor(x.data(), DType::f32, {3, H}),
                                    gu, dn, make_tensor(ids.data(), DType::i32, {3, 2}),
                                    make_tensor(w.data(), DType::f32, {3, 2}), Activation::silu),
                   "expert id -2 out of range");
  ids[0] = -1;
  std::vector<float> f(6);
  EXPECT_ERROR_HAS(
      cpu->moe_keep_experts(make_tensor(f.data(), DType::f32, {3, 2}), make_tensor(w.data(), DType::f32, {3, 2}), 0, 1),
      "expected contiguous ids i32");
  EXPECT_ERROR_HAS(cpu->moe_keep_experts(make_tensor(ids.data(), DType::i32, {3, 2}),
                                         make_tensor(w.data(), DType::f32, {3, 2}), 2, 0),
                   "no range");
}

TEST(TensorParallel, RankSourcesRefuseWhatTheyCannotRun) {
  auto whole = make_synthetic_source({"tiny-gemma4-moe", "q8", 7, {}});
  // --ep: the rank's experts are named in its config, and its stacks hold just those.
  const std::unique_ptr<ModelSource> ep1 = make_rank_source(*whole, plan_for(*whole, 4, true), 1);
  const Gemma4Config& ep1c = std::get<Gemma4Config>(ep1->config().arch);
  EXPECT_EQ(ep1c.expert_first, 2);
  EXPECT_EQ(ep1c.expert_count, 2);
  EXPECT_EQ(ep1->find("model.language_model.layers.0.experts.down_proj")->dim(0), 2);
  // Whole experts (and rows) in one run are views of the whole model's bytes, not copies; column
  // splits are cut into bytes of their own.
  const Tensor whole_down = *whole->find("model.language_model.layers.0.experts.down_proj");
  EXPECT_EQ(ep1->find("model.language_model.layers.0.experts.down_proj")->data,
            static_cast<uint8_t*>(whole_down.data) + 2 * whole_down.stride[0]);
  EXPECT_NE(make_rank_source(*whole, plan_for(*whole, 2), 0)
                ->find("model.language_model.layers.0.self_attn.o_proj.weight")
                ->data,
            whole->find("model.language_model.layers.0.self_attn.o_proj.weight")->data);
  EXPECT_ERROR_HAS(make_rank_source(*whole, plan_for(*whole, 2), 2), "rank 2 of a plan over 2");
  // A plan made for other formats than the weights have: the shards would be cut at the wrong bytes.
  const Gemma4Config& c = std::get<Gemma4Config>(whole->config().arch);
  const ParallelPlan bf16 =
      plan_gemma4_parallel(c, {2, false}, [](const std::string&, const std::vector<int64_t>&) { return DType::bf16; });
  EXPECT_ERROR_HAS(make_rank_source(*whole, bf16, 0), "but the split was planned for bf16");
  // One rank: the whole model.
  auto single = make_rank_source(*whole, plan_for(*whole, 1), 0);
  EXPECT_EQ(std::get<Gemma4Config>(single->config().arch).num_heads, c.num_heads);
  const Tensor q = *single->find("model.language_model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.data, whole->find("model.language_model.layers.0.self_attn.q_proj.weight")->data);
}

}  // namespace
}  // namespace fl
