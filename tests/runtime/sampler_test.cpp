// Each sampler step on crafted distributions, and the chain's reproducibility.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "core/error.h"
#include "runtime/sampler.h"

namespace fl {
namespace {

// Logits whose softmax is exactly `probs` (up to a constant).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return l;
}

std::map<int32_t, int> draw_counts(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler s(params);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits)];
  return counts;
}

TEST(Sampler, GreedyTakesTheHighestLogitAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-INFINITY, -5.0f}), 1);
}

TEST(Sampler, TemperatureDrawsFollowTheSoftmax) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  SamplingParams p;
  p.seed = 7;
  const int n = 40000;
  auto counts = draw_counts(p, logits_of(probs), n);
  for (int i = 0; i < 4; ++i) {
    const double expected = probs[i] * n, sd = std::sqrt(n * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(counts[i], expected, 5 * sd) << "token " << i;
  }
  // temperature 2 flattens: token 3's share grows from 5 % towards sqrt-weights
  p.temperature = 2.0f;
  auto flat = draw_counts(p, logits_of(probs), n);
  double z = 0;
  for (double q : probs) z += std::sqrt(q);
  EXPECT_NEAR(flat[3], std::sqrt(0.05) / z * n, 5 * std::sqrt(n * 0.15));
}

TEST(Sampler, TopKTopPMinPKeepOnlyTheirSets) {
  const auto logits = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_k = 2;
  for (auto [id, _] : draw_counts(p, logits, 2000)) EXPECT_LT(id, 2);
  p = {};
  p.top_p = 0.5f;  // 0.4 < 0.5, 0.4 + 0.3 >= 0.5: keep {0, 1}
  auto c = draw_counts(p, logits, 4000);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0] / 4000.0, 0.4 / 0.7, 0.04);
  p.top_p = 0.3f;  // the top token alone reaches 0.3
  EXPECT_EQ(draw_counts(p, logits, 500).size(), 1u);
  p = {};
  p.min_p = 0.6f;  // keep p >= 0.24: {0.4, 0.3}
  c = draw_counts(p, logits, 3000);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_TRUE(c.count(0) && c.count(1));
}

// A large vocabulary, where only a prefix of it is sorted: the cuts keep exactly the sets a full
// sort gives, and the draws follow the kept probabilities.
TEST(Sampler, CutsOnALargeVocabularyMatchAFullSort) {
  const int V = 5000;
  std::vector<double> probs(V);
  double z = 0;
  for (int i = 0; i < V; ++i) z += (probs[i] = 1.0 / (1.0 + ((i * 7919) % V)));  // a long tail, shuffled ids
  for (double& q : probs) q /= z;
  const auto logits = logits_of(probs);
  std::vector<int32_t> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });

  for (float top_p : {0.3f, 0.6f, 0.95f}) {  // 0.95 needs a sorted prefix of ~3000
    std::set<int32_t> nucleus;
    double mass = 0;
    for (int32_t id : order) {
      if (mass >= top_p) break;
      mass += probs[id];
      nucleus.insert(id);
    }
    SamplingParams p;
    p.top_p = top_p;
    p.seed = 11;
    const auto counts = draw_counts(p, logits, 800);
    for (auto [id, n] : counts) EXPECT_TRUE(nucleus.count(id)) << "top_p " << top_p << ": token " << id;
    if (top_p > 0.9f) {
      EXPECT_GT(counts.size(), 256u) << "the draws must reach past the first sorted prefix";
    }
    // The most likely token's share is its probability within the nucleus.
    const double share = probs[order[0]] / mass;
    EXPECT_NEAR(counts.count(order[0]) ? counts.at(order[0]) / 800.0 : 0.0, share, 5 * std::sqrt(share / 800) + 0.01)
        << top_p;
  }
  SamplingParams p;
  p.min_p = 0.002f;  // a floor below hundreds of tokens
  std::set<int32_t> above;
  for (int32_t id : order)
    if (probs[id] >= 0.002 * probs[order[0]]) above.insert(id);
  ASSERT_GT(above.size(), 256u);
  for (auto [id, n] : draw_counts(p, logits, 800)) EXPECT_TRUE(above.count(id)) << "min_p: token " << id;
  // No cut: every token can come out, at its probability.
  SamplingParams plain;
  plain.seed = 5;
  const auto counts = draw_counts(plain, logits, 20000);
  const double p0 = probs[order[0]];
  EXPECT_NEAR(counts.count(order[0]) ? counts.at(order[0]) / 20000.0 : 0.0, p0, 5 * std::sqrt(p0 / 20000) + 0.002);
  EXPECT_GT(counts.size(), 1000u);
}

TEST(Sampler, PenaltiesAndBias) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  s.accept(0);
  // token 0 (3.0 -> 1.5) loses to token 1 (2.0); a negative logit is pushed further down
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 2.0f, -1.0f}), 1);

  p = {};
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler f(p);
  for (int i = 0; i < 3; ++i) f.accept(0);  // 3.0 - 0.25 - 3 * 0.5 = 1.25 < 1.5
  EXPECT_EQ(f.sample(std::vector<float>{3.0f, 1.5f}), 1);
  f.reset();
  EXPECT_EQ(f.sample(std::vector<float>{3.0f, 1.5f}), 0);

  p = {};
  p.temperature = 0;
  p.penalty_last_n = 2;
  p.repetition_penalty = 10.0f;
  Sampler w(p);
  w.accept(0);
  w.accept(5);
  w.accept(6);  // token 0 left the 2-token window
  EXPECT_EQ(w.sample(std::vector<float>{3.0f, 2.0f}), 0);

  p = {};
  p.temperature = 0;
  p.logit_bias = {{0, -INFINITY}, {2, 5.0f}};
  Sampler b(p);
  EXPECT_EQ(b.sample(std::vector<float>{9.0f, 1.0f, 0.0f}), 2);
  p.logit_bias = {{0, -INFINITY}, {1, -INFINITY}};
  Sampler banned(p);
  EXPECT_THROW(banned.sample(std::vector<float>{1.0f, 2.0f}), Error);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3;
  SamplingParams p;
  p.seed = 42;
  p.top_k = 200;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  std::set<int32_t> distinct;
  for (int32_t t : run(42)) distinct.insert(t);
  EXPECT_GT(distinct.size(), 10u);  // it really samples
}

// exp_exact (sampling_math.h) replaces expf so that host and GPU agree bit for bit: it must
// still be exp, to float accuracy, over the whole range a weight can take.
TEST(Sampler, ExpExactIsExpToFloatAccuracy) {
  double worst = 0;
  for (float x = -86.9f; x < 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_exact(x) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(exp_exact(0.0f), 1.0f);  // the top token's weight, exactly
  EXPECT_EQ(exp_exact(-100.0f), 0.0f);
  EXPECT_EQ(exp_exact(-INFINITY), 0.0f);
  EXPECT_EQ(exp_exact(NAN), 0.0f);
}

// The device path: Sampler::next_spec() through a backend's sample op (here the CPU backend's
// host route) chooses what Sampler::sample chooses, token after token, penalties included.
TEST(Sampler, NextSpecThroughABackendEqualsSample) {
  auto cpu = make_backend("cpu");
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int V = 3000;
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 200;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.2f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  p.logit_bias = {{11, 4.0f}, {12, -INFINITY}};
  p.seed = 9;
  for (int variant = 0; variant < 4; ++variant) {
    if (variant == 1) p.top_k = 0;    // top-p alone: a grown sorted prefix on the host
    if (variant == 2) p.top_p = 1.0f;  // min-p alone
    if (variant == 3) p.temperature = 0.0f;
    Sampler host(p), device(p);
    auto buffer = cpu->allocate(V * sizeof(float) + 64);
    Tensor logits = make_tensor(buffer->data(), DType::f32, {V}, Device::cpu);
    Tensor chosen = make_tensor(static_cast<char*>(buffer->data()) + V * sizeof(float), DType::i32, {1}, Device::cpu);
    for (int step = 0; step < 60; ++step) {
      std::vector<float> l(V);
      for (float& x : l) x = normal(rng);
      const int32_t want = host.sample(l);
      cpu->copy_to_device(logits, l.data());
      const int32_t got = sample_token(*cpu, chosen, logits, device.next_spec());
      ASSERT_EQ(got, want) << "variant " << variant << " step " << step;
      EXPECT_NE(got, 12);
      host.accept(want);
      device.accept(got);
    }
  }
}

// Logits that overflow to +inf (a tiny temperature, an infinite bias) stand at the largest float:
// the top token keeps weight 1 and wins, instead of every weight becoming exp(NaN) = 0.
TEST(Sampler, InfiniteLogitsStillSample) {
  std::vector<float> logits = {1.0f, 40.0f, 3.0f, -INFINITY};
  for (float min_p : {0.0f, 0.5f})
    for (float top_p : {1.0f, 0.5f}) {
      SamplingParams p;
      p.temperature = 1e-37f;  // 40 / 1e-37 overflows; 3 / 1e-37 does not
      p.min_p = min_p;
      p.top_p = top_p;
      Sampler s(p);
      EXPECT_EQ(s.sample(logits), 1) << "min_p " << min_p << " top_p " << top_p;
    }
  SamplingParams biased;
  biased.logit_bias = {{2, INFINITY}};
  Sampler s(biased);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 2);
}

TEST(Sampler, InvalidParametersNameThemselves) {
  auto error_of = [](SamplingParams p) {
    try {
      Sampler s(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(error_of(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(error_of(p).find("top_p"), std::string::npos);
  p = {};
  p.min_p = 1.5f;
  EXPECT_NE(error_of(p).find("min_p"), std::string::npos);
  p = {};
  p.top_k = -3;
  EXPECT_NE(error_of(p).find("top_k"), std::string::npos);
  p = {};
  p.presence_penalty = 3;
  EXPECT_NE(error_of(p).find("presence_penalty"), std::string::npos);
  p = {};
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(error_of(p).find("logit_bias"), std::string::npos);
  p = {};
  p.temperature = NAN;
  EXPECT_NE(error_of(p).find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace fl
