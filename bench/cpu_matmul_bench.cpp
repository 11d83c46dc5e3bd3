// The CPU matmul kernels alone (src/backend/cpu/cpu_matmul.h) at the shapes of Gemma 4 26B-A4B:
// per weight format, path and number of input rows, the time per call and the rate at which the
// weight bytes stream, against this host's measured read bandwidth (the CPU backend's roofline).
// Calls cycle through copies of the matrix that together exceed 256 MiB, so each call reads its
// weights from memory, as a decode step does, not from cache. `--json` adds one JSON object per
// line.
//   cpu_matmul_bench [--quick] [--path avx512|avx2|scalar|reference] [--threads N] [--json]
//   (--quick: 1 and 8 input rows only, no LM head)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "backend/cpu/cpu_matmul.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/host_bandwidth.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace {

using namespace fl;

struct Shape {
  const char* name;
  int64_t M, K;
  std::vector<DType> formats;
};

// Gemma 4 26B-A4B: hidden 2816, 16 query heads of 256 in sliding layers, experts of 704, a
// Q8_0 tied LM head over 262144 tokens. K = 704 is not a whole number of 256-value groups, so
// the expert down projection also runs in the 128-value group.
const Shape kShapes[] = {
    {"q_proj 4096x2816", 4096, 2816, {DType::hfq4_g256, DType::hfq6_g256, DType::q8_0, DType::bf16}},
    {"expert gate_up 1408x2816", 1408, 2816, {DType::hfq4_g256}},
    {"expert down 2816x704", 2816, 704, {DType::hfq4_g256, DType::hfq4_g128}},
    {"lm_head 262144x2816", 262144, 2816, {DType::q8_0}},
};

struct Result {
  double us_per_call;
  double weight_gbs;
};

// One quantized copy of random N(0, 1) weights, repeated until the copies exceed 256 MiB; made
// once per shape and format, for every number of input rows.
struct Weights {
  std::vector<uint8_t> bytes;
  int64_t copies = 0, matrix_bytes = 0;
};

Weights make_weights(DType type, int64_t M, int64_t K) {
  const QuantFormat& f = quant_format(type);
  const int64_t row = row_bytes(type, K);
  Weights w;
  w.matrix_bytes = row * M;
  w.copies = std::max<int64_t>(1, ((int64_t{256} << 20) + w.matrix_bytes - 1) / w.matrix_bytes);
  w.bytes.resize(static_cast<size_t>(w.copies * w.matrix_bytes));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    for (float& v : values) v = normal(rng);
    f.quantize_row(values.data(), w.bytes.data() + m * row, K);
  }
  for (int64_t c = 1; c < w.copies; ++c)
    std::memcpy(w.bytes.data() + c * w.matrix_bytes, w.bytes.data(), static_cast<size_t>(w.matrix_bytes));
  return w;
}

Result time_matmul(const Shape& s, DType type, const Weights& w, int64_t T, MatmulPath path, ThreadPool& pool) {
  const int64_t copies = w.copies, matrix_bytes = w.matrix_bytes;
  std::vector<float> x(static_cast<size_t>(T * s.K)), out(static_cast<size_t>(T * s.M));
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  MatmulOperands op;
  op.w_type = type;
  op.w_stride = row_bytes(type, s.K);
  op.M = s.M;
  op.K = s.K;
  op.x = x.data();
  op.x_stride = s.K * 4;
  op.T = T;
  op.out = out.data();
  op.out_stride = s.M * 4;
  auto call = [&](int64_t c) {
    op.w = w.bytes.data() + (c % copies) * matrix_bytes;
    matmul_rows(op, path, pool);
  };
  for (int64_t c = 0; c < copies; ++c) call(c);  // warm-up: pages touched, code paged in
  // At least one pass over the copies and 0.3 s.
  int64_t calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double s_elapsed = 0.0;
  while (calls < copies || s_elapsed < 0.3) {
    call(calls++);
    s_elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double us = 1e6 * s_elapsed / static_cast<double>(calls);
  return {us, static_cast<double>(matrix_bytes) / (us * 1e-6) / 1e9};
}

int run(int argc, char** argv) {
  bool quick = false, json = false;
  int threads = 0;
  MatmulPath path = best_matmul_path();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--path" && i + 1 < argc) {
      const std::string name = argv[++i];
      if (name == "avx512")
        path = MatmulPath::avx512;
      else if (name == "avx2")
        path = MatmulPath::avx2;
      else if (name == "scalar")
        path = MatmulPath::scalar;
      else if (name == "reference")
        path = MatmulPath::reference;
      else
        fail("--path {}: expected avx512, avx2, scalar or reference", name);
    } else {
      fmt::print(stderr,
                 "usage: cpu_matmul_bench [--quick] [--path avx512|avx2|scalar|reference] [--threads N] [--json]\n");
      return 2;
    }
  }
  if (!matmul_path_available(path)) fail("the {} path is not available on this machine", matmul_path_name(path));
  ThreadPool pool(threads);
  const double read_gbs = measure_host_read_gbs(pool);
  fmt::print("cpu_matmul_bench: path {}, {} threads, measured read bandwidth {:.1f} GB/s\n", matmul_path_name(path),
             pool.size(), read_gbs);
  fmt::print("{:<26} {:<10} {:>5} {:>11} {:>11} {:>9} {:>9}\n", "shape", "format", "rows", "us/call", "GB/s", "of read",
             "GMAC/s");
  const std::vector<int64_t> token_counts = quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 4, 8, 64};
  for (const Shape& s : kShapes) {
    if (quick && s.M > 100000) continue;
    for (DType type : s.formats) {
      const Weights w = make_weights(type, s.M, s.K);
      for (int64_t T : token_counts) {
        if (s.M > 100000 && T > 8) continue;  // the LM head at 64 rows takes seconds a call
        const Result r = time_matmul(s, type, w, T, path, pool);
        const double gmacs = static_cast<double>(s.M) * s.K * T / (r.us_per_call * 1e-6) / 1e9;
        fmt::print("{:<26} {:<10} {:>5} {:>11.1f} {:>11.1f} {:>8.1f}% {:>9.1f}\n", s.name, dtype_name(type), T,
                   r.us_per_call, r.weight_gbs, 100.0 * r.weight_gbs / read_gbs, gmacs);
        if (json)
          fmt::print(
              "{{\"shape\": \"{}\", \"format\": \"{}\", \"rows\": {}, \"path\": \"{}\", \"threads\": {}, \"us\": "
              "{:.2f}, "
              "\"weight_gb_s\": {:.2f}, \"read_gb_s\": {:.2f}, \"gmac_s\": {:.2f}}}\n",
              s.name, dtype_name(type), T, matmul_path_name(path), pool.size(), r.us_per_call, r.weight_gbs, read_gbs,
              gmacs);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cpu_matmul_bench: {}\n", e.what());
    return 1;
  }
}
