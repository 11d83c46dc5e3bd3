#include "backend/cpu/cpu_matmul.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "backend/cpu/cpu_matmul_simd.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl {
namespace {

#ifdef FIRELINE_CPU_AVX2
constexpr bool kAvx2CompiledIn = true;  // cpu_matmul_avx2.cpp is part of this build
#else
constexpr bool kAvx2CompiledIn = false;
#endif
#ifdef FIRELINE_CPU_AVX512
constexpr bool kAvx512CompiledIn = true;  // cpu_matmul_avx512.cpp too
#else
constexpr bool kAvx512CompiledIn = false;
#endif

constexpr int kTokenTile = 8;    // tokens that share one decoded group
constexpr int kPlainChunk = 256;  // "group" size for plain types, which have no groups

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS saves the YMM registers. F16C is read from
  // CPUID leaf 1 (ECX bit 29) because clang's builtin does not know "f16c".
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  // As for AVX2, the builtin also checks that the OS saves the ZMM registers.
  static const bool has = cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

const QuantFormat& check_operands(const MatmulOperands& op) {
  const QuantFormat& f = quant_format(op.w_type);  // throws for unknown types and types without codecs
  if (op.K <= 0) fail("matmul: reduction length K must be positive (got {})", op.K);
  if (op.M < 0 || op.T < 0) fail("matmul: negative size (M = {}, T = {})", op.M, op.T);
  if (op.M == 0 || op.T == 0) return f;
  if (!op.w || !op.x || !op.out) fail("matmul: null operand");
  if (op.M > 1 && op.w_stride < row_bytes(op.w_type, op.K))
    fail("matmul: weight row stride {} B is shorter than a {} row of {} values ({} B)", op.w_stride,
         dtype_name(op.w_type), op.K, row_bytes(op.w_type, op.K));
  if (op.x_stride % 4 || op.out_stride % 4) fail("matmul: activation strides must be whole floats");
  if (op.T > 1 && op.x_stride < op.K * 4) fail("matmul: x row stride {} B is shorter than K = {} floats", op.x_stride, op.K);
  if (op.T > 1 && op.out_stride < op.M * 4)
    fail("matmul: out row stride {} B is shorter than M = {} floats", op.out_stride, op.M);
  return f;
}

const uint8_t* weight_row(const MatmulOperands& op, int64_t m) { return static_cast<const uint8_t*>(op.w) + m * op.w_stride; }
const float* x_row(const MatmulOperands& op, int64_t t) {
  return reinterpret_cast<const float*>(reinterpret_cast<const char*>(op.x) + t * op.x_stride);
}
float* out_row(const MatmulOperands& op, int64_t t) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(op.out) + t * op.out_stride);
}

// The oracle: dequantize the row, then one sequential dot per token.
void reference_rows(const MatmulOperands& op, const QuantFormat& f, int64_t m0, int64_t m1) {
  std::vector<float> row(static_cast<size_t>(op.K));
  for (int64_t m = m0; m < m1; ++m) {
    f.dequantize_row(weight_row(op, m), row.data(), op.K);
    for (int64_t t = 0; t < op.T; ++t) {
      const float* x = x_row(op, t);
      float sum = 0.0f;
      for (int64_t k = 0; k < op.K; ++k) sum += row[k] * x[k];
      out_row(op, t)[m] = sum;
    }
  }
}

// One group at a time through the registry decoder (a prefix of a row is a valid row, so
// dequantize_row on a group's bytes decodes that group), accumulating in index order exactly
// like the reference.
void scalar_rows(const MatmulOperands& op, const QuantFormat& f, int64_t m0, int64_t m1) {
  const bool plain = f.kind == QuantKind::plain;
  const int group = plain ? kPlainChunk : f.block_elems;
  const int64_t group_bytes = plain ? static_cast<int64_t>(kPlainChunk) * f.block_bytes : f.block_bytes;
  std::vector<float> values(static_cast<size_t>(group));
  float acc[kTokenTile];
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* row = weight_row(op, m);
    for (int64_t t0 = 0; t0 < op.T; t0 += kTokenTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokenTile, op.T - t0));
      std::fill(acc, acc + nt, 0.0f);
      for (int64_t k0 = 0, g = 0; k0 < op.K; k0 += group, ++g) {
        const int n = static_cast<int>(std::min<int64_t>(group, op.K - k0));
        f.dequantize_row(row + g * group_bytes, values.data(), n);
        for (int j = 0; j < nt; ++j) {
          const float* x = x_row(op, t0 + j) + k0;
          float sum = acc[j];
          for (int i = 0; i < n; ++i) sum += values[i] * x[i];
          acc[j] = sum;
        }
      }
      for (int j = 0; j < nt; ++j) out_row(op, t0 + j)[m] = acc[j];
    }
  }
}

// The SIMD paths: x prepared once for every row (padded, block sums, de-interleaved for HFQ4),
// then the rows split over the pool. The buffer is kept per calling thread (ranks of a split model
// call from threads of their own) up to kKeptPreparedFloats: a long prompt's (47 MB at 4096
// tokens of K = 2816) is freed after its call rather than held for the thread's life.
void simd_rows(const MatmulOperands& op, MatmulPath path, ThreadPool& pool) {
#ifdef FIRELINE_CPU_AVX2
  struct Kernels {
    bool (*supports)(int);
    int64_t (*prepared_floats)(const simd::MatmulArgs&);
    void (*prepare_x)(const simd::MatmulArgs&, float*);
    void (*rows)(const simd::MatmulArgs&, const float*, int64_t, int64_t);
  };
  Kernels k{avx2::supports, avx2::prepared_floats, avx2::prepare_x, avx2::matmul_rows};
#ifdef FIRELINE_CPU_AVX512
  if (path == MatmulPath::avx512)
    k = {avx512::supports, avx512::prepared_floats, avx512::prepare_x, avx512::matmul_rows};
#endif
  if (!k.supports(static_cast<int>(op.w_type)))
    fail("matmul: the {} path has no kernel for {}", matmul_path_name(path), dtype_name(op.w_type));
  const simd::MatmulArgs args{static_cast<int>(op.w_type),
                              static_cast<const uint8_t*>(op.w),
                              op.w_stride,
                              op.K,
                              op.x,
                              op.x_stride,
                              op.T,
                              op.out,
                              op.out_stride};
  constexpr int64_t kKeptPreparedFloats = int64_t{1} << 20;  // 4 MiB
  thread_local std::vector<float> prepared_buffer;
  const int64_t floats = k.prepared_floats(args);
  prepared_buffer.resize(static_cast<size_t>(floats) + 16);
  float* prepared = prepared_buffer.data();
  while (reinterpret_cast<uintptr_t>(prepared) % 64) ++prepared;  // whole cache lines for the loads
  k.prepare_x(args, prepared);
  pool.parallel_for(op.M, [&](int64_t m0, int64_t m1) { k.rows(args, prepared, m0, m1); });
  if (floats > kKeptPreparedFloats) std::vector<float>().swap(prepared_buffer);
#else
  (void)op, (void)path, (void)pool;
  fail("matmul: no SIMD kernels in this build");
#endif
}

}  // namespace

bool matmul_path_available(MatmulPath path) {
  if (path == MatmulPath::avx2) return kAvx2CompiledIn && cpu_has_avx2();
  if (path == MatmulPath::avx512) return kAvx2CompiledIn && kAvx512CompiledIn && cpu_has_avx512();
  return path == MatmulPath::reference || path == MatmulPath::scalar;
}

MatmulPath best_matmul_path() {
  static const MatmulPath best = matmul_path_available(MatmulPath::avx512) ? MatmulPath::avx512
                                 : matmul_path_available(MatmulPath::avx2) ? MatmulPath::avx2
                                                                           : MatmulPath::scalar;
  return best;
}

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::reference: return "reference";
    case MatmulPath::scalar: return "scalar";
    case MatmulPath::avx2: return "avx2";
    case MatmulPath::avx512: return "avx512";
  }
  return "?";
}

void matmul_rows(const MatmulOperands& op, MatmulPath path, ThreadPool& pool) {
  const QuantFormat& f = check_operands(op);
  if (!matmul_path_available(path)) fail("matmul: the {} path is not available on this machine", matmul_path_name(path));
  if (op.M == 0 || op.T == 0) return;
  switch (path) {
    case MatmulPath::reference:
      pool.parallel_for(op.M, [&](int64_t m0, int64_t m1) { reference_rows(op, f, m0, m1); });
      return;
    case MatmulPath::scalar:
      pool.parallel_for(op.M, [&](int64_t m0, int64_t m1) { scalar_rows(op, f, m0, m1); });
      return;
    case MatmulPath::avx2:
    case MatmulPath::avx512: simd_rows(op, path, pool); return;
  }
}

void matmul_rows(const MatmulOperands& op) { matmul_rows(op, best_matmul_path(), ThreadPool::global()); }

}  // namespace fl
