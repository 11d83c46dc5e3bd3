// Backend::residual_update's default (what the CPU oracle runs, and what the GPU kernel is held
// to) against a double-precision reference written from its contract: each term rms-normed with
// its gain, summed, the sum normed again with the merge gain, added to h, times the layer
// scalar, then each norm of the new h with its gain and scale. And its argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "util/test_util.h"

namespace fl {
namespace {

std::vector<double> rms_normed(const std::vector<double>& x, const std::vector<float>* gain, NormGain kind,
                               double eps) {
  double sq = 0.0;
  for (double v : x) sq += v * v;
  const double inv = 1.0 / std::sqrt(sq / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double g = kind == NormGain::none ? 1.0 : kind == NormGain::weight ? (*gain)[i] : 1.0 + (*gain)[i];
    out[i] = x[i] * inv * g;
  }
  return out;
}

TEST(ResidualUpdate, DefaultFollowsItsContract) {
  const int64_t R = 3, N = 96;
  const float eps = 1e-6f, scalar = 0.75f, router_scale = 0.125f;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  std::vector<float> h = randn(R * N), mlp = randn(R * N), experts = randn(R * N);
  std::vector<float> g1 = randn(N), g2 = randn(N), gm = randn(N), gn0 = randn(N), gn1 = randn(N);
  std::vector<float> out0(R * N), out1(R * N), layer_scalar = {scalar};
  const std::vector<float> h0 = h, mlp0 = mlp, experts0 = experts;

  auto cpu = make_cpu_backend();
  auto t = [](std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return make_tensor(v.data(), DType::f32, shape);
  };
  const Tensor w1 = t(g1, {N}), w2 = t(g2, {N}), wm = t(gm, {N}), wn0 = t(gn0, {N}), wn1 = t(gn1, {N});
  const Tensor s = t(layer_scalar, {1});
  const ResidualTerm terms[] = {{t(mlp, {R, N}), &w1, NormGain::weight, true},
                                {t(experts, {R, N}), &w2, NormGain::one_plus_weight, true}};
  const StreamNorm norms[] = {{t(out0, {R, N}), &wn0, NormGain::weight},
                              {t(out1, {R, N}), &wn1, NormGain::one_plus_weight, router_scale}};
  ResidualUpdate u;
  u.terms = terms;
  u.merge_weight = &wm;
  u.merge_gain = NormGain::weight;
  u.layer_scalar = &s;
  u.norms = norms;
  u.eps = eps;
  cpu->residual_update(t(h, {R, N}), u);

  for (int64_t r = 0; r < R; ++r) {
    auto row = [&](const std::vector<float>& v) {
      return std::vector<double>(v.begin() + r * N, v.begin() + (r + 1) * N);
    };
    const std::vector<double> a = rms_normed(row(mlp0), &g1, NormGain::weight, eps);
    const std::vector<double> b = rms_normed(row(experts0), &g2, NormGain::one_plus_weight, eps);
    std::vector<double> branch(N);
    for (int64_t i = 0; i < N; ++i) branch[i] = a[i] + b[i];
    branch = rms_normed(branch, &gm, NormGain::weight, eps);
    std::vector<double> want_h = row(h0);
    for (int64_t i = 0; i < N; ++i) want_h[i] = (want_h[i] + branch[i]) * scalar;
    const std::vector<double> want0 = rms_normed(want_h, &gn0, NormGain::weight, eps);
    const std::vector<double> want1 = rms_normed(want_h, &gn1, NormGain::one_plus_weight, eps);
    for (int64_t i = 0; i < N; ++i) {
      const size_t k = static_cast<size_t>(r * N + i);
      EXPECT_NEAR(h[k], want_h[i], 1e-5 * (1.0 + std::fabs(want_h[i]))) << "h row " << r << " col " << i;
      EXPECT_NEAR(out0[k], want0[i], 1e-5 * (1.0 + std::fabs(want0[i]))) << "norm 0 row " << r << " col " << i;
      EXPECT_NEAR(out1[k], want1[i] * router_scale, 1e-5 * (1.0 + std::fabs(want1[i]))) << "norm 1 row " << r;
    }
  }
}

TEST(ResidualUpdate, RefusesAliasesAndBadCounts) {
  auto cpu = make_cpu_backend();
  std::vector<float> h(32), x(32), y(32);
  const Tensor ht = make_tensor(h.data(), DType::f32, {2, 16}), xt = make_tensor(x.data(), DType::f32, {2, 16});
  const Tensor yt = make_tensor(y.data(), DType::f32, {2, 16});
  ResidualUpdate u;
  EXPECT_ERROR_HAS(cpu->residual_update(ht, u), "terms");  // no term
  const ResidualTerm h_term[] = {{ht, nullptr, NormGain::none, false}};
  u.terms = h_term;
  EXPECT_ERROR_HAS(cpu->residual_update(ht, u), "h itself");
  const ResidualTerm x_term[] = {{xt, nullptr, NormGain::none, false}};
  u.terms = x_term;
  const StreamNorm onto_h[] = {{ht, nullptr, NormGain::none}};
  u.norms = onto_h;
  EXPECT_ERROR_HAS(cpu->residual_update(ht, u), "overwrite h");
  const StreamNorm onto_term[] = {{xt, nullptr, NormGain::none}};
  u.norms = onto_term;
  EXPECT_ERROR_HAS(cpu->residual_update(ht, u), "overwrite a term");
  const StreamNorm fine[] = {{yt, nullptr, NormGain::none}};
  u.norms = fine;
  cpu->residual_update(ht, u);  // raw x added, y = rms(h): no error
}

}  // namespace
}  // namespace fl
