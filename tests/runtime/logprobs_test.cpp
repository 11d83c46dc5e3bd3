// token_logprobs: log_softmax of a distribution known in closed form, its alternatives' order,
// and the edge cases a model's logits can hold (masked -inf entries, NaN, a +inf spike).
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/logprobs.h"

namespace fl {
namespace {

TEST(TokenLogprobs, AreLogSoftmaxWithTheLikeliestFirst) {
  // Probabilities 0.5, 0.25, 0.125, 0.125, shifted by a constant: log_softmax ignores the shift.
  const std::vector<float> logits = {std::log(0.125f) + 7, std::log(0.5f) + 7, std::log(0.125f) + 7,
                                     std::log(0.25f) + 7};
  const TokenLogprobs lp = token_logprobs(logits, 3, 4);
  EXPECT_EQ(lp.chosen.id, 3);
  EXPECT_NEAR(lp.chosen.logprob, std::log(0.25), 1e-6);
  ASSERT_EQ(lp.top.size(), 4u);
  // 1 (0.5), 3 (0.25), then the tie at 0.125: the lower id first.
  EXPECT_EQ(lp.top[0].id, 1);
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[2].id, 0);
  EXPECT_EQ(lp.top[3].id, 2);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_NEAR(lp.top[2].logprob, std::log(0.125), 1e-6);
  // No alternatives asked for; more than the vocabulary gives the whole of it.
  EXPECT_TRUE(token_logprobs(logits, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 0, 20).top.size(), 4u);
}

TEST(TokenLogprobs, MaskedAndBrokenLogitsStayFinite) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // -inf (a masked token) and NaN are impossible: the floor, and last among the alternatives.
  const std::vector<float> logits = {0.0f, -inf, nan, 0.0f};
  const TokenLogprobs lp = token_logprobs(logits, 1, 4);
  EXPECT_EQ(lp.chosen.logprob, kMinLogprob);
  EXPECT_NEAR(token_logprobs(logits, 0, 0).chosen.logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(token_logprobs(logits, 2, 0).chosen.logprob, kMinLogprob);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].id, 0);
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[2].id, 1);
  EXPECT_EQ(lp.top[3].id, 2);  // NaN sorts last
  // A logit far below the rest underflows to the floor rather than -inf (JSON has no infinity).
  EXPECT_EQ(token_logprobs(std::vector<float>{0.0f, -1e30f}, 1, 0).chosen.logprob, kMinLogprob);
  // A +inf spike: it takes all the mass.
  const std::vector<float> spiked = {1.0f, inf, 2.0f};
  EXPECT_EQ(token_logprobs(spiked, 1, 0).chosen.logprob, 0.0f);
  EXPECT_EQ(token_logprobs(spiked, 2, 0).chosen.logprob, kMinLogprob);
  for (const TokenLogprob& t : token_logprobs(spiked, 0, 3).top) EXPECT_TRUE(std::isfinite(t.logprob));
}

TEST(TokenLogprobs, RefusesIdsOutsideTheVocabulary) {
  const std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_THROW(token_logprobs(logits, 2, 0), Error);
  EXPECT_THROW(token_logprobs(logits, -1, 0), Error);
  EXPECT_THROW(token_logprobs(logits, 0, -1), Error);
}

}  // namespace
}  // namespace fl
