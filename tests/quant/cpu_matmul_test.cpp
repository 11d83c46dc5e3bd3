// The CPU matmul fast paths (src/backend/cpu/cpu_matmul.h) against its reference loop
// (dequantize a row with the registry, then a sequential f32 dot), for every weight format,
// GEMV and small-batch GEMM, odd K (tail groups), strided operands and several thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl {
namespace {

const DType kFormats[] = {DType::f32,       DType::f16,       DType::bf16,     DType::q8_0,
                          DType::hfq4_g256, DType::hfq4_g128, DType::hfq6_g256};

// Fast paths sum in a different order from the reference. Their error is measured relative to
// sum_k |w_k x_k| (the scale of the rounding errors), not to the result, which may cancel to ~0.
constexpr double kRelTol = 1e-5;

std::vector<MatmulPath> fast_paths() {
  std::vector<MatmulPath> paths = {MatmulPath::scalar};
  for (MatmulPath simd : {MatmulPath::avx2, MatmulPath::avx512})
    if (matmul_path_available(simd)) paths.push_back(simd);
  return paths;
}

// A weight matrix packed row by row with a row stride wider than a row (garbage in between),
// x and out with padded strides: x's padding is NaN (a read past K would poison the result),
// out's padding holds a guard value that must survive.
struct Problem {
  DType dtype;
  int64_t M, K, T;
  int64_t w_stride, x_floats, out_floats;  // strides
  std::vector<uint8_t> w;
  std::vector<float> x, out;
  std::vector<float> dequantized;  // [M, K]
  static constexpr float kGuard = -1234.5f;

  Problem(DType t, int64_t m, int64_t k, int64_t tokens, uint32_t seed) : dtype(t), M(m), K(k), T(tokens) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const QuantFormat& f = quant_format(t);
    w_stride = row_bytes(t, K) + 24;
    x_floats = K + 5;
    out_floats = M + 3;
    w.assign(static_cast<size_t>(M * w_stride), 0xff);
    dequantized.resize(static_cast<size_t>(M * K));
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t m = 0; m < M; ++m) {
      const float row_scale = std::exp2(static_cast<float>(m % 7) - 3.0f);
      for (float& v : row) v = normal(rng) * row_scale;
      f.quantize_row(row.data(), w.data() + m * w_stride, K);
      f.dequantize_row(w.data() + m * w_stride, dequantized.data() + m * K, K);
    }
    x.assign(static_cast<size_t>(T * x_floats), NAN);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) x[t * x_floats + k] = normal(rng);
    out.assign(static_cast<size_t>(T * out_floats), kGuard);
  }

  MatmulOperands operands() {
    MatmulOperands op;
    op.w_type = dtype;
    op.w = w.data();
    op.w_stride = w_stride;
    op.M = M;
    op.K = K;
    op.x = x.data();
    op.x_stride = x_floats * 4;
    op.T = T;
    op.out = out.data();
    op.out_stride = out_floats * 4;
    return op;
  }

  std::vector<float> run(MatmulPath path, ThreadPool& pool) {
    std::fill(out.begin(), out.end(), kGuard);
    matmul_rows(operands(), path, pool);
    std::vector<float> result(static_cast<size_t>(T * M));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < out_floats; ++i) {
        const float v = out[t * out_floats + i];
        if (i < M)
          result[t * M + i] = v;
        else
          EXPECT_EQ(v, kGuard) << "wrote past M in token row " << t;
      }
    return result;
  }

  // sum_k |w[m, k] x[t, k]|: the scale of the accumulated rounding error.
  double magnitude(int64_t t, int64_t m) const {
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += std::fabs(static_cast<double>(dequantized[m * K + k]) * x[t * x_floats + k]);
    return s;
  }
};

std::string where(DType t, int64_t M, int64_t K, int64_t T) {
  return fmt::format("{} M={} K={} T={}", dtype_name(t), M, K, T);
}

TEST(CpuMatmul, FastPathsMatchTheReferenceOnEveryFormatAndShape) {
  ThreadPool pool(3);
  uint32_t seed = 10;
  for (DType t : kFormats)
    for (int64_t M : {1, 3, 17, 128})
      for (int64_t K : {32, 127, 704, 2112, 2816})
        for (int64_t T : {1, 3, 8}) {
          SCOPED_TRACE(where(t, M, K, T));
          Problem p(t, M, K, T, seed++);
          std::vector<float> reference = p.run(MatmulPath::reference, pool);

          // The reference path is what it claims: dequantize the row, then a sequential f32 dot.
          for (int64_t tok = 0; tok < T; ++tok)
            for (int64_t m = 0; m < M; ++m) {
              float sum = 0.0f;
              for (int64_t k = 0; k < K; ++k) sum += p.dequantized[m * K + k] * p.x[tok * p.x_floats + k];
              ASSERT_EQ(reference[tok * M + m], sum) << "t=" << tok << " m=" << m;
            }

          for (MatmulPath path : fast_paths()) {
            SCOPED_TRACE(matmul_path_name(path));
            std::vector<float> fast = p.run(path, pool);
            for (int64_t tok = 0; tok < T; ++tok)
              for (int64_t m = 0; m < M; ++m) {
                const float a = fast[tok * M + m], b = reference[tok * M + m];
                if (path == MatmulPath::scalar)
                  ASSERT_EQ(a, b) << "t=" << tok << " m=" << m;  // same order of operations
                else
                  ASSERT_LE(std::fabs(static_cast<double>(a) - b), kRelTol * p.magnitude(tok, m))
                      << "t=" << tok << " m=" << m << " fast " << a << " reference " << b;
              }
          }
        }
}

TEST(CpuMatmul, LargerTokenBatchesUseSeveralTiles) {
  ThreadPool pool(2);
  for (DType t : {DType::hfq4_g128, DType::q8_0, DType::bf16}) {
    SCOPED_TRACE(where(t, 40, 704, 21));
    Problem p(t, 40, 704, 21, 77);
    std::vector<float> reference = p.run(MatmulPath::reference, pool);
    for (MatmulPath path : fast_paths()) {
      std::vector<float> fast = p.run(path, pool);
      for (int64_t i = 0; i < 21 * 40; ++i)
        ASSERT_LE(std::fabs(static_cast<double>(fast[i]) - reference[i]), kRelTol * p.magnitude(i / 40, i % 40)) << i;
    }
  }
}

TEST(CpuMatmul, ResultDoesNotDependOnTheThreadCount) {
  for (DType t : {DType::hfq6_g256, DType::hfq4_g256, DType::q8_0, DType::f16}) {
    Problem p(t, 67, 2816, 3, 5);
    ThreadPool one(1), three(3), four(4);
    for (MatmulPath path : fast_paths()) {
      std::vector<float> a = p.run(path, one);
      EXPECT_EQ(a, p.run(path, three)) << dtype_name(t) << " " << matmul_path_name(path);
      EXPECT_EQ(a, p.run(path, four)) << dtype_name(t) << " " << matmul_path_name(path);
    }
  }
}

// A token's outputs are computed the same way whatever other tokens share the call, so that a
// sequence decoded in a batch gets the logits it gets alone, bit for bit: every token of a
// 5-token call equals that token multiplied alone. K = 2816 crosses the 1024-value chunks that a
// call of more than two tokens is cut into (and where Q8_0's running chains fold at 16 lanes).
TEST(CpuMatmul, ATokensResultDoesNotDependOnTheOtherTokens) {
  ThreadPool pool(2);
  for (DType t : kFormats)
    for (int64_t K : {704, 2816}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K));
      Problem p(t, 19, K, 5, 21);
      for (MatmulPath path : fast_paths()) {
        std::vector<float> together = p.run(path, pool);
        for (int64_t tok = 0; tok < 5; ++tok) {
          MatmulOperands op = p.operands();
          op.x = p.x.data() + tok * p.x_floats;
          op.out = p.out.data();
          op.T = 1;
          std::fill(p.out.begin(), p.out.end(), Problem::kGuard);
          matmul_rows(op, path, pool);
          for (int64_t m = 0; m < 19; ++m)
            ASSERT_EQ(p.out[m], together[tok * 19 + m]) << matmul_path_name(path) << " token " << tok << " m " << m;
        }
      }
    }
}

TEST(CpuMatmul, WeightsMayStartAtAnyByteAddress) {
  // A safetensors tensor need not be aligned: weights one byte off any alignment give the
  // same results (and, under UBSan, no misaligned access).
  ThreadPool pool(2);
  for (DType t : kFormats) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Problem p(t, 5, 127, 3, 8);
    std::vector<uint8_t> shifted(p.w.size() + 1);
    std::memcpy(shifted.data() + 1, p.w.data(), p.w.size());
    for (MatmulPath path : {MatmulPath::reference, MatmulPath::scalar, MatmulPath::avx2, MatmulPath::avx512}) {
      if (!matmul_path_available(path)) continue;
      std::vector<float> aligned = p.run(path, pool);
      std::vector<uint8_t> original = p.w;
      p.w.assign(shifted.begin(), shifted.end());
      MatmulOperands op = p.operands();
      op.w = p.w.data() + 1;
      std::fill(p.out.begin(), p.out.end(), Problem::kGuard);
      matmul_rows(op, path, pool);
      for (int64_t tok = 0; tok < 3; ++tok)
        for (int64_t m = 0; m < 5; ++m) EXPECT_EQ(p.out[tok * p.out_floats + m], aligned[tok * 5 + m]) << matmul_path_name(path);
      p.w = original;
    }
  }
}

TEST(CpuMatmul, RejectsImpossibleOperands) {
  ThreadPool pool(1);
  Problem p(DType::q8_0, 4, 64, 2, 1);
  auto expect_error = [&](MatmulOperands op, const char* what) {
    EXPECT_THROW(matmul_rows(op, MatmulPath::scalar, pool), Error) << what;
    EXPECT_THROW(matmul_rows(op, MatmulPath::reference, pool), Error) << what;
  };
  MatmulOperands op = p.operands();
  op.K = 0;
  expect_error(op, "K = 0");
  op = p.operands();
  op.K = -3;
  expect_error(op, "K < 0");
  op = p.operands();
  op.M = -1;
  expect_error(op, "M < 0");
  op = p.operands();
  op.w_type = DType::i32;
  expect_error(op, "i32 weights");
  op = p.operands();
  op.w_type = static_cast<DType>(99);
  expect_error(op, "unknown dtype");
  op = p.operands();
  op.w_stride = row_bytes(DType::q8_0, 64) - 1;
  expect_error(op, "short weight stride");
  op = p.operands();
  op.x_stride = 63 * 4;
  expect_error(op, "short x stride");
  op = p.operands();
  op.x_stride = 65 * 4 + 2;
  expect_error(op, "fractional x stride");
  op = p.operands();
  op.w = nullptr;
  expect_error(op, "null weights");
  // Empty products are fine and write nothing.
  op = p.operands();
  op.T = 0;
  EXPECT_NO_THROW(matmul_rows(op, MatmulPath::scalar, pool));
}

// Model code reaches the fast path only through Backend::matmul, with any weight dtype.
TEST(CpuMatmul, BackendMatmulTakesEveryFormatAndStridedActivations) {
  auto backend = make_cpu_backend();
  ThreadPool pool(1);
  for (DType t : kFormats) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t M = 9, K = 704, T = 3;
    Problem p(t, M, K, T, 3);
    std::vector<float> reference = p.run(MatmulPath::reference, pool);
    // A weight view with a row stride wider than the row, x as a narrow() slice of a wider
    // activation, out as a narrow() slice too.
    Tensor w = make_tensor(p.w.data(), t, {M, K});
    w.stride[0] = p.w_stride;
    Tensor x_wide = make_tensor(p.x.data(), DType::f32, {T, p.x_floats});
    std::vector<float> out_storage(static_cast<size_t>(T * (M + 4)), Problem::kGuard);
    Tensor out_wide = make_tensor(out_storage.data(), DType::f32, {T, M + 4});
    backend->matmul(out_wide.narrow(1, 2, M), x_wide.narrow(1, 0, K), w);
    for (int64_t tok = 0; tok < T; ++tok) {
      EXPECT_EQ(out_storage[tok * (M + 4)], Problem::kGuard);
      EXPECT_EQ(out_storage[tok * (M + 4) + M + 3], Problem::kGuard);
      for (int64_t m = 0; m < M; ++m)
        EXPECT_LE(std::fabs(static_cast<double>(out_storage[tok * (M + 4) + 2 + m]) - reference[tok * M + m]),
                  kRelTol * p.magnitude(tok, m));
    }
  }
}

// MoE experts stored quantized ([E, rows, K] with packed rows) give what the same experts
// dequantized to f32 give.
TEST(CpuMatmul, MoeExpertsOnQuantizedWeights) {
  auto backend = make_cpu_backend();
  const int64_t E = 4, H = 256, I = 704 / 2, T = 2, top_k = 2;  // down_proj K = I = 352: a tail group of 96
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> gate_up(static_cast<size_t>(E * 2 * I * H)), down(static_cast<size_t>(E * H * I));
  for (float& v : gate_up) v = normal(rng);
  for (float& v : down) v = normal(rng);
  std::vector<float> x(static_cast<size_t>(T * H));
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> ids = {2, 0, 1, 3};
  std::vector<float> weights = {0.7f, 0.3f, 0.4f, 0.6f};
  for (DType t : {DType::hfq4_g128, DType::q8_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const QuantFormat& f = quant_format(t);
    auto pack = [&](std::vector<float>& values, int64_t rows, int64_t k, std::vector<uint8_t>& bytes) {
      bytes.resize(static_cast<size_t>(rows * row_bytes(t, k)));
      for (int64_t r = 0; r < rows; ++r) {
        f.quantize_row(values.data() + r * k, bytes.data() + r * row_bytes(t, k), k);
        f.dequantize_row(bytes.data() + r * row_bytes(t, k), values.data() + r * k, k);  // values := what the format holds
      }
    };
    std::vector<float> gu = gate_up, dn = down;
    std::vector<uint8_t> gu_q, dn_q;
    pack(gu, E * 2 * I, H, gu_q);
    pack(dn, E * H, I, dn_q);
    Tensor xt = make_tensor(x.data(), DType::f32, {T, H});
    Tensor id_t = make_tensor(ids.data(), DType::i32, {T, top_k});
    Tensor w_t = make_tensor(weights.data(), DType::f32, {T, top_k});
    std::vector<float> out_q(static_cast<size_t>(T * H)), out_f(static_cast<size_t>(T * H));
    backend->moe_experts(make_tensor(out_q.data(), DType::f32, {T, H}), xt, make_tensor(gu_q.data(), t, {E, 2 * I, H}),
                         make_tensor(dn_q.data(), t, {E, H, I}), id_t, w_t, Activation::gelu_tanh);
    backend->moe_experts(make_tensor(out_f.data(), DType::f32, {T, H}), xt, make_tensor(gu.data(), DType::f32, {E, 2 * I, H}),
                         make_tensor(dn.data(), DType::f32, {E, H, I}), id_t, w_t, Activation::gelu_tanh);
    double max_abs = 0.0, max_diff = 0.0;
    for (int64_t i = 0; i < T * H; ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(out_f[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(out_q[i]) - out_f[i]));
    }
    EXPECT_GT(max_abs, 1.0);
    EXPECT_LE(max_diff, 1e-4 * max_abs);  // same weights, only the summation order differs
  }
}

// moe_experts runs each expert's tokens together: with 5 tokens sharing experts (every expert
// chosen by several), each token's output equals that token's experts run alone, bit for bit,
// and a token whose pairs are all another rank's (-1) gets zeros.
TEST(CpuMatmul, MoeExpertsGroupedByExpertEqualOneTokenAtATime) {
  auto backend = make_cpu_backend();
  const int64_t E = 3, H = 256, I = 128, T = 6, top_k = 2;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> x(static_cast<size_t>(T * H));
  for (float& v : x) v = normal(rng);
  const std::vector<int32_t> ids = {0, 1, 1, 2, 2, 0, 0, 1, 1, 2, -1, -1};
  const std::vector<float> weights = {0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f, 0.3f, 0.7f, 0.2f, 0.8f, 0.0f, 0.0f};
  for (DType t : {DType::hfq4_g256, DType::q8_0, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const QuantFormat& f = quant_format(t);
    auto packed = [&](int64_t rows, int64_t k) {
      std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes(t, k)));
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = normal(rng);
        f.quantize_row(row.data(), bytes.data() + r * row_bytes(t, k), k);
      }
      return bytes;
    };
    std::vector<uint8_t> gu = packed(E * 2 * I, H), dn = packed(E * H, I);
    const Tensor gate_up = make_tensor(gu.data(), t, {E, 2 * I, H}), down = make_tensor(dn.data(), t, {E, H, I});
    auto run = [&](int64_t t0, int64_t n) {
      std::vector<float> out(static_cast<size_t>(n * H), NAN);
      std::vector<int32_t> id(ids.begin() + t0 * top_k, ids.begin() + (t0 + n) * top_k);
      std::vector<float> w(weights.begin() + t0 * top_k, weights.begin() + (t0 + n) * top_k);
      backend->moe_experts(make_tensor(out.data(), DType::f32, {n, H}),
                           make_tensor(x.data() + t0 * H, DType::f32, {n, H}), gate_up, down,
                           make_tensor(id.data(), DType::i32, {n, top_k}),
                           make_tensor(w.data(), DType::f32, {n, top_k}), Activation::gelu_tanh);
      return out;
    };
    const std::vector<float> together = run(0, T);
    for (int64_t tok = 0; tok < T; ++tok) {
      const std::vector<float> alone = run(tok, 1);
      for (int64_t i = 0; i < H; ++i) ASSERT_EQ(together[tok * H + i], alone[i]) << "token " << tok << " value " << i;
    }
    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(together[(T - 1) * H + i], 0.0f);
    EXPECT_NE(together[0], together[H]);  // tokens do differ
  }
}

}  // namespace
}  // namespace fl
