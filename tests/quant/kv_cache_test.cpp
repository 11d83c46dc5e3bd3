// KV-cache element formats (f32, bf16, q8_0) on the CPU backend, through Backend::kv_write and
// Backend::attention: a sliding ring (n_rows = window) gives the same outputs, bit for bit, as
// linear addressing (n_rows = every position) past several rollovers, and a quantized cache
// stays within the error its format allows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention.h"
#include "core/thread_pool.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "quant/quant.h"

namespace fl {
namespace {

struct Cache {
  std::unique_ptr<DeviceBuffer> k_buf, v_buf;
  KvView view;
  Cache(Backend& b, DType dtype, int64_t n_rows, int64_t n_kv, int64_t head_dim) {
    Tensor probe = make_tensor(nullptr, dtype, {n_rows, n_kv, head_dim});
    k_buf = b.allocate(static_cast<size_t>(probe.nbytes()));
    v_buf = b.allocate(static_cast<size_t>(probe.nbytes()));
    view.k = make_tensor(k_buf->data(), dtype, {n_rows, n_kv, head_dim});
    view.v = make_tensor(v_buf->data(), dtype, {n_rows, n_kv, head_dim});
  }
  const uint8_t* k_row(int64_t r) const { return static_cast<const uint8_t*>(view.k.data) + r * view.k.stride[0]; }
  const uint8_t* v_row(int64_t r) const { return static_cast<const uint8_t*>(view.v.data) + r * view.v.stride[0]; }
  int64_t row_stride() const { return view.k.stride[0]; }
};

// One decode sequence: per position, random q [T, n_heads, D] and k, v [T, n_kv, D].
struct Sequence {
  int n_heads, n_kv, D;
  int64_t n_pos;
  std::vector<float> q, k, v;  // [n_pos, heads, D]
  Sequence(int heads, int kv_heads, int head_dim, int64_t positions, uint32_t seed)
      : n_heads(heads), n_kv(kv_heads), D(head_dim), n_pos(positions) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q.resize(static_cast<size_t>(n_pos * n_heads * D));
    k.resize(static_cast<size_t>(n_pos * n_kv * D));
    v.resize(static_cast<size_t>(n_pos * n_kv * D));
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) v[i] = normal(rng) * (1.0f + static_cast<float>(i % 5));
  }
};

// Runs attention then kv_write for positions [p0, p0 + T) (the model's order), returns out.
std::vector<float> step(Backend& b, Sequence& s, Cache& cache, int64_t p0, int64_t T, const AttentionParams& params) {
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(p0 + t);
  std::vector<float> out(static_cast<size_t>(T * s.n_heads * s.D));
  Tensor positions = make_tensor(pos.data(), DType::i32, {T});
  Tensor q = make_tensor(s.q.data() + p0 * s.n_heads * s.D, DType::f32, {T, s.n_heads, s.D});
  Tensor k = make_tensor(s.k.data() + p0 * s.n_kv * s.D, DType::f32, {T, s.n_kv, s.D});
  Tensor v = make_tensor(s.v.data() + p0 * s.n_kv * s.D, DType::f32, {T, s.n_kv, s.D});
  b.attention(make_tensor(out.data(), DType::f32, {T, s.n_heads, s.D}), q, k, v, cache.view, positions, params);
  b.kv_write(cache.view, k, v, positions);
  return out;
}

AttentionParams params_for(const Sequence& s, int window) {
  AttentionParams p;
  p.n_heads = s.n_heads;
  p.n_kv_heads = s.n_kv;
  p.head_dim = s.D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  p.window = window;
  return p;
}

std::string label(DType t, int D) { return std::string(dtype_name(t)) + " head_dim=" + std::to_string(D); }

TEST(KvCache, SlidingRingEqualsLinearAddressingPastRollover) {
  auto backend = make_cpu_backend();
  const int window = 8;
  const int64_t n_pos = 40;  // five rollovers of the ring
  // head_dim 40 gives a Q8_0 tail block of 8 values.
  for (DType dtype : {DType::q8_0, DType::bf16, DType::f32})
    for (int D : {64, 40}) {
      // Chunked: decode one token at a time, or a 3-token prefill first (T <= window).
      for (int64_t first_chunk : {int64_t{1}, int64_t{3}}) {
        SCOPED_TRACE(label(dtype, D) + " first chunk " + std::to_string(first_chunk));
        Sequence s(4, 2, D, n_pos, 11);
        Cache ring(*backend, dtype, window, 2, D), linear(*backend, dtype, n_pos, 2, D);
        const AttentionParams params = params_for(s, window);
        for (int64_t p = 0; p < n_pos;) {
          const int64_t T = p == 0 ? first_chunk : 1;
          std::vector<float> a = step(*backend, s, ring, p, T, params);
          std::vector<float> b = step(*backend, s, linear, p, T, params);
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "outputs differ at position " << p;
          p += T;
          // Every live ring row holds exactly the bytes of the linear row of its position.
          for (int64_t j = std::max<int64_t>(0, p - window); j < p; ++j) {
            ASSERT_EQ(0, std::memcmp(ring.k_row(j % window), linear.k_row(j), ring.row_stride())) << "K row of position " << j;
            ASSERT_EQ(0, std::memcmp(ring.v_row(j % window), linear.v_row(j), ring.row_stride())) << "V row of position " << j;
          }
        }
      }
    }
}

TEST(KvCache, Q8RowsAre34BytesPer32ValuesPerHead) {
  auto backend = make_cpu_backend();
  Cache c(*backend, DType::q8_0, 8, 2, 256);
  EXPECT_EQ(c.row_stride(), 2 * 8 * 34);  // 2 KV heads x 256/32 blocks x 34 B
  EXPECT_EQ(c.view.k.nbytes(), 8 * 2 * 8 * 34);
  Cache odd(*backend, DType::q8_0, 4, 1, 40);  // a head_dim that is not a multiple of 32: padded
  EXPECT_EQ(odd.row_stride(), 2 * 34);
}

// Per-element error bound of a cached value (docs/formats.md), for each of n values of one head.
std::vector<double> element_bounds(DType t, const float* x, int n) {
  std::vector<double> bound(static_cast<size_t>(n));
  for (int g0 = 0; g0 < n; g0 += 32) {
    const int g1 = std::min(n, g0 + 32);
    float amax = 0.0f;
    for (int i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const double d = amax / 127.0f, d16 = f16_to_f32(f32_to_f16(amax / 127.0f));
    for (int i = g0; i < g1; ++i) {
      if (t == DType::q8_0)
        bound[i] = d * (0.5 + 1e-4) + 127.0 * std::fabs(d - d16) + std::ldexp(amax, -23);
      else if (t == DType::bf16)
        bound[i] = std::ldexp(static_cast<double>(std::fabs(x[i])), -8);
      else
        bound[i] = 0.0;
    }
  }
  return bound;
}

// Attention of query head h at position p, in double precision, over what a cache of type t
// should hold: earlier positions' K/V rounded through the format's reference codec (computed
// here from the sequence, not read from the cache, so a misplaced write is caught), the current
// token's K/V in f32.
std::vector<double> naive_attention(const Sequence& s, DType t, int64_t p, int h, int64_t first, float scale) {
  const int D = s.D, g = h / (s.n_heads / s.n_kv);
  const QuantFormat& f = quant_format(t);
  std::vector<uint8_t> packed(static_cast<size_t>(row_bytes(t, D)));
  auto cached = [&](const float* src, std::vector<float>& dst) {
    f.quantize_row(src, packed.data(), D);
    f.dequantize_row(packed.data(), dst.data(), D);
  };
  const float* q = s.q.data() + (p * s.n_heads + h) * D;
  std::vector<std::vector<float>> keys, values;
  for (int64_t j = first; j <= p; ++j) {
    std::vector<float> k(static_cast<size_t>(D)), v(static_cast<size_t>(D));
    const float* k_src = s.k.data() + (j * s.n_kv + g) * D;
    const float* v_src = s.v.data() + (j * s.n_kv + g) * D;
    if (j == p) {
      std::copy_n(k_src, D, k.begin());
      std::copy_n(v_src, D, v.begin());
    } else {
      cached(k_src, k);
      cached(v_src, v);
    }
    keys.push_back(k);
    values.push_back(v);
  }
  std::vector<double> scores;
  double max_score = -INFINITY, denom = 0.0;
  for (const auto& k : keys) {
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
    scores.push_back(dot * scale);
    max_score = std::max(max_score, scores.back());
  }
  for (double& x : scores) denom += (x = std::exp(x - max_score));
  std::vector<double> out(static_cast<size_t>(D), 0.0);
  for (size_t j = 0; j < keys.size(); ++j)
    for (int d = 0; d < D; ++d) out[d] += scores[j] / denom * values[j][d];
  return out;
}

// A compressed cache against an f32 one, same sequence and window. The bound for query head h
// at position p: the value error (a convex combination of values moves by at most the largest
// value error) plus the softmax error: key errors move each score by at most
// delta = scale * max_j sum_d |q_d| kbound_jd, which moves each weight by a factor within
// e^(+-2 delta), so the output by at most (e^(2 delta) - 1) max_j |v_j|.
TEST(KvCache, CompressedCacheStaysWithinItsErrorBound) {
  auto backend = make_cpu_backend();
  const int64_t n_pos = 40;
  for (DType dtype : {DType::q8_0, DType::bf16})
    for (int window : {0, 8}) {
      SCOPED_TRACE(label(dtype, 64) + " window " + std::to_string(window));
      Sequence s(4, 2, 64, n_pos, 21);
      const int D = s.D, group = s.n_heads / s.n_kv;
      Cache compressed(*backend, dtype, window ? window : n_pos, 2, D), exact(*backend, DType::f32, n_pos, 2, D);
      const AttentionParams params = params_for(s, window);
      double worst_ratio = 0.0, max_diff = 0.0;
      for (int64_t p = 0; p < n_pos; ++p) {
        std::vector<float> a = step(*backend, s, compressed, p, 1, params);
        std::vector<float> b = step(*backend, s, exact, p, 1, params);
        const int64_t first = window ? std::max<int64_t>(0, p - window + 1) : 0;
        for (int h = 0; h < s.n_heads; ++h) {
          const int g = h / group;
          const float* q = s.q.data() + (p * s.n_heads + h) * D;
          double delta = 0.0, v_err = 0.0, v_max = 0.0;
          for (int64_t j = first; j <= p; ++j) {
            const float* k = s.k.data() + (j * s.n_kv + g) * D;
            const float* v = s.v.data() + (j * s.n_kv + g) * D;
            for (int d = 0; d < D; ++d) v_max = std::max(v_max, static_cast<double>(std::fabs(v[d])));
            if (j == p) continue;  // the current token's K and V come in f32, not from the cache
            std::vector<double> kb = element_bounds(dtype, k, D), vb = element_bounds(dtype, v, D);
            double score_err = 0.0;
            for (int d = 0; d < D; ++d) {
              score_err += std::fabs(q[d]) * kb[d];
              v_err = std::max(v_err, vb[d]);
            }
            delta = std::max(delta, params.scale * score_err);
          }
          const double bound = v_err + std::expm1(2.0 * delta) * v_max + 1e-5 * v_max;  // + f32 rounding slack
          // The loose bound above holds for any cache contents within the format's error; this
          // one pins that kv_write stores and attention reads exactly the reference codec's
          // rounding of each row: a double-precision attention over those values must match
          // to f32 noise.
          std::vector<double> naive = naive_attention(s, dtype, p, h, first, params.scale);
          for (int d = 0; d < D; ++d) {
            const double diff = std::fabs(static_cast<double>(a[h * D + d]) - b[h * D + d]);
            ASSERT_LE(diff, bound) << "position " << p << " head " << h << " lane " << d;
            ASSERT_LE(std::fabs(a[h * D + d] - naive[d]), 1e-5 * v_max) << "position " << p << " head " << h << " lane " << d;
            max_diff = std::max(max_diff, diff);
            worst_ratio = std::max(worst_ratio, diff / bound);
          }
        }
      }
      EXPECT_GT(max_diff, 0.0) << "the compressed cache changed nothing: is it really compressed?";
      std::printf("  %s window %d: max |out - out_f32| = %.3g, at most %.2f of the bound\n",
                  std::string(dtype_name(dtype)).c_str(), window, max_diff, worst_ratio);
    }
}

// The CPU backend's attention path (cpu_attention.h: a KV head's query heads together, their
// scores one matmul over the cached key rows) against the oracle loop, over every cache format, a head_dim with a tail
// of 8 and Gemma's 256, groups of 1-8 heads, a linear cache and a ring past rollover, 1- and 3-token steps: within 1e-5
// of the largest |value| (only the q.k dots' summation order differs). The grouped path's output does not depend on the
// thread count, which changes how it cuts groups.
TEST(KvCache, GroupedAttentionMatchesTheReferenceLoop) {
  auto backend = make_cpu_backend();
  ThreadPool one(1), three(3), seven(7);
  struct Heads {
    int n_heads, n_kv;
  };
  const int64_t n_pos = 24;
  for (DType dtype : {DType::q8_0, DType::bf16, DType::f32})
    for (int D : {40, 256})
      for (Heads h : {Heads{4, 2}, Heads{8, 1}, Heads{3, 3}})
        for (int window : {0, 8}) {
          SCOPED_TRACE(label(dtype, D) + " heads " + std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv) +
                       " window " + std::to_string(window));
          Sequence s(h.n_heads, h.n_kv, D, n_pos, 31);
          Cache cache(*backend, dtype, window ? window : n_pos, h.n_kv, D);
          const AttentionParams params = params_for(s, window);
          float max_v = 0.0f;
          for (float v : s.v) max_v = std::max(max_v, std::fabs(v));
          for (int64_t p = 0; p < n_pos;) {
            const int64_t T = p % 5 == 0 && p + 3 <= n_pos ? 3 : 1;
            std::vector<int32_t> pos(static_cast<size_t>(T));
            for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(p + t);
            Tensor positions = make_tensor(pos.data(), DType::i32, {T});
            Tensor q = make_tensor(s.q.data() + p * s.n_heads * D, DType::f32, {T, s.n_heads, D});
            Tensor k = make_tensor(s.k.data() + p * s.n_kv * D, DType::f32, {T, s.n_kv, D});
            Tensor v = make_tensor(s.v.data() + p * s.n_kv * D, DType::f32, {T, s.n_kv, D});
            auto run = [&](cpu::AttentionPath path, ThreadPool& pool) {
              std::vector<float> out(static_cast<size_t>(T * s.n_heads * D), NAN);
              cpu::attention(make_tensor(out.data(), DType::f32, {T, s.n_heads, D}), q, k, v, cache.view, positions,
                             params, path, pool);
              return out;
            };
            const std::vector<float> reference = run(cpu::AttentionPath::reference, three);
            const std::vector<float> grouped = run(cpu::AttentionPath::grouped, three);
            for (size_t i = 0; i < reference.size(); ++i)
              ASSERT_LE(std::fabs(grouped[i] - reference[i]), 1e-5f * max_v) << "position " << p << " element " << i;
            ASSERT_EQ(grouped, run(cpu::AttentionPath::grouped, one)) << "position " << p;
            ASSERT_EQ(grouped, run(cpu::AttentionPath::grouped, seven)) << "position " << p;
            backend->kv_write(cache.view, k, v, positions);
            p += T;
          }
        }
}

// q may be a view whose head rows are wider than head_dim (the query half of a fused query/gate
// projection, as Qwen3.5's attention has): the grouped path reads each head at q's stride, not D
// floats after the last. The other half holds NaN, which any misplaced read would spread.
TEST(KvCache, GroupedAttentionReadsQAtItsRowStride) {
  auto backend = make_cpu_backend();
  ThreadPool pool(2);
  const int n_heads = 4, n_kv = 1, D = 64;
  const int64_t n_pos = 12;
  Sequence s(n_heads, n_kv, D, n_pos, 41);
  Cache cache(*backend, DType::q8_0, n_pos, n_kv, D);
  const AttentionParams params = params_for(s, 0);
  for (int64_t p = 0; p < n_pos; ++p) {
    std::vector<float> wide(static_cast<size_t>(n_heads * 2 * D), NAN);  // [1, heads, 2D]
    for (int h = 0; h < n_heads; ++h) std::copy_n(s.q.data() + (p * n_heads + h) * D, D, wide.begin() + h * 2 * D);
    const Tensor q = make_tensor(wide.data(), DType::f32, {1, n_heads, 2 * D}).narrow(2, 0, D);
    int32_t pos = static_cast<int32_t>(p);
    Tensor positions = make_tensor(&pos, DType::i32, {1});
    Tensor k = make_tensor(s.k.data() + p * n_kv * D, DType::f32, {1, n_kv, D});
    Tensor v = make_tensor(s.v.data() + p * n_kv * D, DType::f32, {1, n_kv, D});
    auto run = [&](cpu::AttentionPath path) {
      std::vector<float> out(static_cast<size_t>(n_heads * D), NAN);
      cpu::attention(make_tensor(out.data(), DType::f32, {1, n_heads, D}), q, k, v, cache.view, positions, params, path,
                     pool);
      return out;
    };
    const std::vector<float> reference = run(cpu::AttentionPath::reference), grouped = run(cpu::AttentionPath::grouped);
    for (size_t i = 0; i < reference.size(); ++i) {
      ASSERT_TRUE(std::isfinite(grouped[i])) << "position " << p << " element " << i;
      ASSERT_NEAR(grouped[i], reference[i], 1e-4f) << "position " << p << " element " << i;
    }
    backend->kv_write(cache.view, k, v, positions);
  }
}

// Bad positions are refused with an error, profiling or not (the profiler's byte count for
// attention reads the positions only after the op has checked them).
TEST(KvCache, AttentionRefusesPositionsThatAreNotI32) {
  auto backend = make_cpu_backend();
  Sequence s(2, 1, 32, 1, 5);
  Cache cache(*backend, DType::q8_0, 4, 1, 32);
  uint8_t bad_positions[1] = {0};
  std::vector<float> out(2 * 32);
  for (bool profiling : {false, true}) {
    backend->set_profiling(profiling);
    EXPECT_THROW(backend->attention(
                     make_tensor(out.data(), DType::f32, {1, 2, 32}), make_tensor(s.q.data(), DType::f32, {1, 2, 32}),
                     make_tensor(s.k.data(), DType::f32, {1, 1, 32}), make_tensor(s.v.data(), DType::f32, {1, 1, 32}),
                     cache.view, make_tensor(bad_positions, DType::u8, {1}), params_for(s, 0)),
                 Error);
    EXPECT_TRUE(backend->take_profile().empty()) << "a refused op is not timed";
  }
  backend->set_profiling(false);
}

}  // namespace
}  // namespace fl
