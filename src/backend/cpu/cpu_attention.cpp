#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_rows.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace fl::cpu {
namespace {

// The validated operands: q, the step's new K/V rows and the cache as rows of head_dim values.
struct Operands {
  Rows out, q, k_new, v_new, k_cache, v_cache;
  const QuantFormat* k_format = nullptr;
  const QuantFormat* v_format = nullptr;
  int64_t T = 0, D = 0, n_rows = 0, p0 = 0;
  int group = 1;  // query heads per KV head

  // Key or value row j (an absolute position) of KV head g, as D floats in dst: positions from
  // p0 on are this call's new rows (f32, not yet rounded through the cache), earlier ones come
  // from the cache (ring row j % n_rows).
  void load(int64_t j, int64_t g, int64_t n_kv, bool value, float* dst) const {
    if (j >= p0) {
      const Rows& src = value ? v_new : k_new;
      std::memcpy(dst, src.row((j - p0) * n_kv + g), D * sizeof(float));
    } else {
      const Rows& src = value ? v_cache : k_cache;
      (value ? v_format : k_format)->dequantize_row(src.row<void>((j % n_rows) * n_kv + g), dst, D);
    }
  }
};

Operands check_operands(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                        const Tensor& positions, const AttentionParams& p) {
  Operands a;
  a.T = q.dim(0);
  a.D = p.head_dim;
  if (q.ndim != 3 || q.dim(1) != p.n_heads || q.dim(2) != a.D)
    fail("attention: q {} does not match the params", q.describe());
  if (k_new.ndim != 3 || k_new.dim(0) != a.T || k_new.dim(1) != p.n_kv_heads || k_new.dim(2) != a.D)
    fail("attention: k {} does not match the params", k_new.describe());
  if (positions.dtype != DType::i32 || positions.numel() != a.T) fail("attention: positions must be i32[{}]", a.T);
  if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    fail("attention: {} heads over {} KV heads", p.n_heads, p.n_kv_heads);
  a.out = f32_rows(out, "attention");
  a.q = f32_rows(q, "attention");
  a.k_new = f32_rows(k_new, "attention");
  a.v_new = f32_rows(v_new, "attention");
  a.k_cache = as_rows(cache.k, "attention");
  a.v_cache = as_rows(cache.v, "attention");
  a.k_format = &quant_format(cache.k.dtype);
  a.v_format = &quant_format(cache.v.dtype);
  a.n_rows = cache.n_rows();
  if (a.T == 0) return a;
  const int32_t* pos = positions.ptr<int32_t>();
  a.p0 = pos[0];
  for (int64_t t = 1; t < a.T; ++t)
    if (pos[t] != a.p0 + t) fail("attention: positions must be consecutive");
  a.group = p.n_heads / p.n_kv_heads;
  if (p.window > 0 && a.n_rows < std::min<int64_t>(p.window - 1, a.p0))
    fail("attention: a cache of {} rows cannot hold a window of {}", a.n_rows, p.window);
  if (p.window == 0 && a.p0 > a.n_rows) fail("attention: position {} is past the {}-row cache", a.p0, a.n_rows);
  return a;
}

// The first key position a query at `query_pos` reads.
int64_t first_key(int64_t query_pos, const AttentionParams& p) {
  return p.window > 0 ? std::max<int64_t>(0, query_pos - p.window + 1) : 0;
}

// The oracle: one (token, head) at a time, every row decoded for it, sequential f32 sums.
void reference_attention(const Operands& a, const AttentionParams& p, ThreadPool& pool) {
  const int64_t D = a.D;
  pool.parallel_for(a.T * p.n_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, key(D), value(D), acc(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.n_heads, h = item % p.n_heads, g = h / a.group;
      const int64_t query_pos = a.p0 + t, first = first_key(query_pos, p);
      const float* qv = a.q.row(t * p.n_heads + h);
      scores.resize(static_cast<size_t>(query_pos - first + 1));
      float max_score = -INFINITY;
      for (int64_t j = first; j <= query_pos; ++j) {
        a.load(j, g, p.n_kv_heads, false, key.data());
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qv[d] * key[d];
        float s = dot * p.scale;
        scores[j - first] = s;
        max_score = std::max(max_score, s);
      }
      float denom = 0.0f;
      for (float& s : scores) {
        s = std::exp(s - max_score);
        denom += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = first; j <= query_pos; ++j) {
        a.load(j, g, p.n_kv_heads, true, value.data());
        float w = scores[j - first] / denom;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * value[d];
      }
      std::memcpy(a.out.row(t * p.n_heads + h), acc.data(), D * sizeof(float));
    }
  });
}

// The scores of `heads` query heads (consecutive rows of q from `q`) against keys [j0, j1) of KV head
// g, into scores[i * n + (j - first)]: q.k as one matmul per contiguous run of key rows (the
// cached rows in the ring's order, then the step's fresh f32 rows), whose packed rows the matmul
// reads directly, block by block (cpu_matmul.h: the factored AVX2 kernels for Q8_0), not decoded
// into floats first. A (token, KV head) item already runs on one pool thread, so the matmul runs
// inline on it (`inline_pool`, no workers).
void key_scores(const Operands& a, int64_t g, int64_t n_kv, const float* q, int64_t heads, int64_t j0, int64_t j1,
                int64_t first, int64_t n, float* scores) {
  static ThreadPool inline_pool(1);
  auto multiply = [&](DType type, const void* rows, int64_t row_stride, int64_t j, int64_t count) {
    MatmulOperands op;
    op.w_type = type;
    op.w = rows;
    op.w_stride = row_stride;
    op.M = count;
    op.K = a.D;
    op.x = q;
    op.x_stride = a.q.stride;  // q may be a view (heads of a wider row): its own stride
    op.T = heads;
    op.out = scores + (j - first);
    op.out_stride = n * 4;
    matmul_rows(op, best_matmul_path(), inline_pool);
  };
  int64_t j = j0;
  while (j < std::min(j1, a.p0)) {  // cached rows: contiguous up to the end of the ring
    const int64_t row = j % a.n_rows, count = std::min({j1, a.p0, j + (a.n_rows - row)}) - j;
    multiply(a.k_cache.dtype, a.k_cache.row<uint8_t>(row * n_kv + g), n_kv * a.k_cache.stride, j, count);
    j += count;
  }
  if (j < j1) multiply(DType::f32, a.k_new.row(((j - a.p0) * n_kv + g)), n_kv * a.k_new.stride, j, j1 - j);
}

// o[d] += w v[d] over eight lanes at a time, written so that compilers vectorise it. Where the
// compiler can clone it per instruction set (GCC/Clang on x86-64 ELF), the loader picks an
// AVX-512 or AVX2 (FMA) copy on CPUs that have them: the value half of a 26B-A4B token at 4k is
// ~270 M of these multiply-adds, which baseline SSE does four at a time.
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void add_scaled(float* __restrict o, const float* __restrict v, float w, int64_t n) {
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int l = 0; l < 8; ++l) o[d + l] += w * v[d + l];
  for (; d < n; ++d) o[d] += w * v[d];
}

// The query heads of one KV head together, in runs of `run` heads (fewer than the group when
// the pool has more threads than (token, KV head) pairs): the scores of a run are one matmul over
// the key rows (key_scores), and each value row is decoded once per run. Per head the softmax is
// the reference's, and the value sums are too, in its order (fused multiply-adds on CPUs with
// FMA); the q.k dots sum differently.
void grouped_attention(const Operands& a, const AttentionParams& p, ThreadPool& pool) {
  const int64_t D = a.D, G = a.group, n_kv = p.n_kv_heads;
  const int64_t pairs = a.T * n_kv;
  const int64_t runs_per_group = std::clamp<int64_t>((pool.size() + pairs - 1) / pairs, 1, G);
  const int64_t run = (G + runs_per_group - 1) / runs_per_group;
  const int64_t runs = (G + run - 1) / run;
  pool.parallel_for(pairs * runs, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, value(D), acc, denom, max_score;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / (n_kv * runs), g = item / runs % n_kv;
      const int64_t h0 = g * G + item % runs * run, h1 = std::min(h0 + run, (g + 1) * G), heads = h1 - h0;
      const int64_t query_pos = a.p0 + t, first = first_key(query_pos, p), n = query_pos - first + 1;
      scores.resize(static_cast<size_t>(heads * n));  // [heads, n]
      key_scores(a, g, n_kv, a.q.row(t * p.n_heads + h0), heads, first, query_pos + 1, first, n, scores.data());
      max_score.assign(static_cast<size_t>(heads), -INFINITY);
      for (int64_t i = 0; i < heads; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float& s = scores[i * n + j];
          s *= p.scale;
          max_score[i] = std::max(max_score[i], s);
        }
      denom.assign(static_cast<size_t>(heads), 0.0f);
      for (int64_t i = 0; i < heads; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float& s = scores[i * n + j];
          s = std::exp(s - max_score[i]);
          denom[i] += s;
        }
      acc.assign(static_cast<size_t>(heads * D), 0.0f);  // [heads, D]
      for (int64_t j = first; j <= query_pos; ++j) {
        a.load(j, g, n_kv, true, value.data());
        for (int64_t i = 0; i < heads; ++i)
          add_scaled(acc.data() + i * D, value.data(), scores[i * n + (j - first)] / denom[i], D);
      }
      for (int64_t i = 0; i < heads; ++i)
        std::memcpy(a.out.row(t * p.n_heads + h0 + i), acc.data() + i * D, D * sizeof(float));
    }
  });
}

}  // namespace

void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
               const Tensor& positions, const AttentionParams& p, AttentionPath path, ThreadPool& pool) {
  const Operands a = check_operands(out, q, k_new, v_new, cache, positions, p);
  if (a.T == 0) return;
  if (path == AttentionPath::reference)
    reference_attention(a, p, pool);
  else
    grouped_attention(a, p, pool);
}

}  // namespace fl::cpu
