// The op harness (ops_harness.h: budgets and fixture) for attention: the KV cache's writes and
// ring, decode from the projections, the L2 prefetch hint, batched rows, and the decode plans
// and prefetch slices (host arithmetic, run without a GPU).
#include <gtest/gtest.h>

#include <array>

#include "backend/cuda/l2_prefetch_slice.h"
#include "model/model.h"
#include "ops_harness.h"

namespace fl {
namespace {

using namespace ops_harness;

// History is written through kv_write on both backends, then attention runs for T new tokens; the
// caches must agree byte for byte and the outputs within the sum budget.
// Steps of >= 16 tokens run the tensor-core kernel (attention_mma.cu), whose f32-exact piece
// products keep the same budget; so do shorter steps of head dims in 64s with >= 4 query heads
// per KV head, a block per query row and KV head, split along the context; one decode row over a
// Q8_0 cache with D = 256 or 512 the kernel by KV head (attention_decode.cu); the rest the SIMT
// kernel (split along the context).
TEST_F(CudaOps, AttentionAndKvWriteAcrossRingRollovers) {
  struct Case {
    int64_t D;
    int n_heads, n_kv, window;
    int64_t past, T;
  };
  const Case cases[] = {
      {16, 4, 2, 8, 0, 5},      {16, 4, 2, 8, 40, 1},     {16, 4, 1, 8, 37, 17},   {256, 16, 8, 64, 300, 1},
      {256, 16, 8, 64, 150, 3}, {512, 16, 2, 0, 700, 1},  {512, 16, 2, 0, 100, 17}, {512, 32, 4, 0, 2500, 1},
      {256, 8, 1, 0, 0, 33},    {256, 16, 8, 1024, 3000, 2},
      // short steps of head dims in 64s with >= 4 query heads per KV head take the tensor-core
      // kernel by query group, split along the context (16 heads per KV head at position 0, one
      // tile; 8 and 4 heads; a window; 7 tokens of one sequence; trailing empty splits at 4000)
      {256, 16, 1, 0, 0, 1},    {128, 8, 2, 0, 300, 1},   {64, 8, 2, 32, 100, 7},   {512, 16, 2, 0, 4000, 1},
      // prefill-sized steps (>= 16 tokens, head dims in 16s) take the tensor-core kernel: the
      // window inside one step, a step continuing a cached prefix across the window, partial
      // query tiles, D = 512 in 16-key tiles; D = 72 is not a multiple of 16 (the SIMT kernel)
      {256, 16, 8, 64, 0, 100}, {256, 16, 8, 1024, 1000, 70}, {512, 16, 2, 0, 0, 130}, {512, 8, 2, 0, 45, 40},
      {128, 8, 2, 0, 5, 64},    {80, 4, 4, 16, 20, 31},   {72, 4, 2, 0, 3, 20},
      // one decode row over a Q8_0 cache takes the kernel by KV head (attention_decode.cu) for head
      // dims 256 and 512: 4 heads per KV head (Qwen3.5-4B), 1 head, 2 heads of 512 in a window
      // whose ring wraps inside a tile, 16 heads at 1, 2 and 33 keys (no tile, a partial one)
      {256, 16, 4, 0, 500, 1},  {256, 8, 8, 0, 100, 1},   {512, 16, 8, 100, 1500, 1}, {256, 16, 1, 0, 1, 1},
      {256, 16, 1, 0, 32, 1},   {512, 8, 8, 0, 300, 1},   {512, 16, 4, 0, 300, 1}};
  for (DType cache_type : {DType::f32, DType::bf16, DType::q8_0}) {
    if (!has_quant_format(cache_type)) continue;
    for (const Case& c : cases) {
      for (bool ring : {true, false}) {
        if (!ring && c.window == 0) continue;
        const int64_t rows = ring && c.window > 0 ? c.window : c.past + c.T;
        SCOPED_TRACE(std::string(dtype_name(cache_type)) + " D=" + std::to_string(c.D) + " window=" +
                     std::to_string(c.window) + " past=" + std::to_string(c.past) + " T=" + std::to_string(c.T) +
                     (ring ? " ring" : " linear"));
        // history in chunks of up to 29 tokens, through both backends' kv_write
        auto [kc, vc] = zeroed_caches(cache_type, rows, c.n_kv, c.D);
        KvView cpu_cache{kc.cpu, vc.cpu}, gpu_cache{kc.gpu, vc.gpu};
        for (int64_t at = 0; at < c.past;) {
          const int64_t n = std::min<int64_t>(29, c.past - at);
          Twin k = twin_random(DType::f32, {n, c.n_kv, c.D}), v = twin_random(DType::f32, {n, c.n_kv, c.D});
          Twin pos = twin_positions(at, n);
          cpu_->kv_write(cpu_cache, k.cpu, v.cpu, pos.cpu);
          gpu_->kv_write(gpu_cache, k.gpu, v.gpu, pos.gpu);
          at += n;
        }
        expect_identical(kc, "K cache after kv_write");
        expect_identical(vc, "V cache after kv_write");
        Twin q = twin_random(DType::f32, {c.T, c.n_heads, c.D});
        Twin k = twin_random(DType::f32, {c.T, c.n_kv, c.D}), v = twin_random(DType::f32, {c.T, c.n_kv, c.D});
        Twin pos = twin_positions(c.past, c.T);
        Twin out = twin_output(DType::f32, {c.T, c.n_heads, c.D});
        AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)), c.window};
        cpu_->attention(out.cpu, q.cpu, k.cpu, v.cpu, cpu_cache, pos.cpu, p);
        gpu_->attention(out.gpu, q.gpu, k.gpu, v.gpu, gpu_cache, pos.gpu, p);
        // Relative to max(1, |out|): an output is a softmax-weighted mean of V rows in [-1, 1],
        // whose rounding scales with |V| while the mean itself may cancel to far less.
        expect_close(out, kSumBudget, "attention", 1.0f);
      }
    }
  }
}

// One sequence's decode step from its projections (Backend::attention_from_projections): with
// BackendOptions::fused_decode_attention on, the decode kernel by KV head norms and rotates q, k
// and v and writes the cache row itself; off, the default's norm kernel, attention and write
// kernel. The two must give the same bytes (output and both caches: the kernels share the norm's
// order of sums, the gain, the rotation and the Q8_0 store), and both the CPU default's numbers.
// Shapes: the 26B-A4B's sliding layer (a ring past its rollover) and global layer (D 512, partial
// RoPE), the 31B's global layer, 1 and 4 query heads per KV head, position 0 (no cached key), a
// ring that wraps inside a tile, a partial tile, one split (the kernel writes out, no merge), D 512
// with 4 and 1 query heads per KV head; then what the kernel declines (16 heads per KV head, a
// RoPE half of 40, an f32 cache): the default runs, the counter stays.
TEST_F(CudaOps, AttentionFromProjectionsMatchesTheThreeOps) {
  BackendOptions on, off;
  on.fused_decode_attention = true;
  off.fused_decode_attention = false;
  BackendOptions on_mma = on;  // the same launch with 4- and 8-head groups on the tensor cores
  on_mma.decode_attention_mma = true;
  auto fused = make_backend("cuda", on), separate = make_backend("cuda", off), fused_mma = make_backend("cuda", on_mma);
  struct Case {
    int64_t D;
    int n_heads, n_kv, window;
    int64_t past, half;
    DType cache = DType::q8_0;
    bool one_launch = true;
  };
  const Case cases[] = {{256, 16, 8, 1024, 3000, 128},
                        {512, 16, 2, 0, 4000, 64},
                        {512, 32, 4, 0, 700, 64},
                        {256, 8, 8, 0, 100, 128},
                        {256, 16, 4, 0, 500, 32},
                        {256, 16, 8, 64, 0, 128},
                        {512, 16, 8, 100, 1500, 64},
                        {256, 16, 2, 0, 33, 128},
                        {256, 16, 8, 0, 20, 128},  // one tile: one split, the kernel writes out itself
                        {512, 16, 2, 0, 20, 64},   // the same with 8 heads per KV head (the mma form)
                        {512, 16, 4, 0, 30, 64},
                        {512, 8, 8, 0, 300, 64},
                        {256, 16, 1, 0, 32, 128, DType::q8_0, false},
                        {256, 16, 8, 0, 50, 40, DType::q8_0, false},
                        {256, 16, 8, 0, 50, 128, DType::f32, false}};
  for (const Case& c : cases) {
    const int64_t rows = c.window > 0 ? c.window : c.past + 1;
    SCOPED_TRACE("D=" + std::to_string(c.D) + " heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                 " window=" + std::to_string(c.window) + " past=" + std::to_string(c.past) +
                 " half=" + std::to_string(c.half) + " cache " + std::string(dtype_name(c.cache)));
    // the history: the CPU's and the fused backend's caches (kc, vc), the separate one's (kc2, vc2)
    auto [kc, vc] = zeroed_caches(c.cache, rows, c.n_kv, c.D);
    auto [kc2, vc2] = zeroed_caches(c.cache, rows, c.n_kv, c.D);
    auto [kc3, vc3] = zeroed_caches(c.cache, rows, c.n_kv, c.D);
    for (int64_t at = 0; at < c.past;) {
      const int64_t n = std::min<int64_t>(29, c.past - at);
      Twin k = twin_random(DType::f32, {n, c.n_kv, c.D}), v = twin_random(DType::f32, {n, c.n_kv, c.D});
      Twin pos = twin_positions(at, n);
      cpu_->kv_write({kc.cpu, vc.cpu}, k.cpu, v.cpu, pos.cpu);
      gpu_->kv_write({kc.gpu, vc.gpu}, k.gpu, v.gpu, pos.gpu);
      gpu_->kv_write({kc2.gpu, vc2.gpu}, k.gpu, v.gpu, pos.gpu);
      gpu_->kv_write({kc3.gpu, vc3.gpu}, k.gpu, v.gpu, pos.gpu);
      at += n;
    }
    gpu_->synchronize();
    // the projections (each backend's copy: the default norms them in place), gains, RoPE
    Twin q = twin_random(DType::f32, {1, c.n_heads, c.D}, 3.0f);
    Twin k = twin_random(DType::f32, {1, c.n_kv, c.D}, 3.0f), v = twin_random(DType::f32, {1, c.n_kv, c.D}, 3.0f);
    Twin q2 = twin_bytes(DType::f32, {1, c.n_heads, c.D}, q.host.data());
    Twin k2 = twin_bytes(DType::f32, {1, c.n_kv, c.D}, k.host.data());
    Twin v2 = twin_bytes(DType::f32, {1, c.n_kv, c.D}, v.host.data());
    Twin q3 = twin_bytes(DType::f32, {1, c.n_heads, c.D}, q.host.data());
    Twin k3 = twin_bytes(DType::f32, {1, c.n_kv, c.D}, k.host.data());
    Twin v3 = twin_bytes(DType::f32, {1, c.n_kv, c.D}, v.host.data());
    Twin qw = twin_random(DType::bf16, {c.D}), kw = twin_random(DType::f32, {c.D});
    std::vector<float> freq(static_cast<size_t>(c.half));
    for (int64_t i = 0; i < c.half; ++i) freq[i] = 1.0f / std::pow(1e4f, static_cast<float>(2 * i) / c.D);
    Twin inv = twin_bytes(DType::f32, {c.half}, freq.data());
    Twin pos = twin_positions(c.past, 1);
    Twin out = twin_output(DType::f32, {1, c.n_heads, c.D}), out2 = twin_output(DType::f32, {1, c.n_heads, c.D}),
         out3 = twin_output(DType::f32, {1, c.n_heads, c.D});
    const AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)),
                            c.window};
    auto norms = [&](const Tensor& qx, const Tensor& kx, const Tensor& vx, bool gpu) {
      return std::array<HeadNorm, 3>{HeadNorm{qx, gpu ? &qw.gpu : &qw.cpu, NormGain::weight, true},
                                     HeadNorm{kx, gpu ? &kw.gpu : &kw.cpu, NormGain::one_plus_weight, true},
                                     HeadNorm{vx, nullptr, NormGain::none, false}};
    };
    const float eps = 1e-6f;
    cpu_->attention_from_projections(out.cpu, norms(q.cpu, k.cpu, v.cpu, false), eps, pos.cpu, inv.cpu,
                                     {kc.cpu, vc.cpu}, p);
    const int64_t before = cuda_attention_from_projections_launches();
    fused->attention_from_projections(out.gpu, norms(q.gpu, k.gpu, v.gpu, true), eps, pos.gpu, inv.gpu,
                                      {kc.gpu, vc.gpu}, p);
    fused->synchronize();
    EXPECT_EQ(cuda_attention_from_projections_launches() - before, c.one_launch ? 1 : 0);
    separate->attention_from_projections(out2.gpu, norms(q2.gpu, k2.gpu, v2.gpu, true), eps, pos.gpu, inv.gpu,
                                         {kc2.gpu, vc2.gpu}, p);
    separate->synchronize();
    EXPECT_EQ(cuda_attention_from_projections_launches() - before, c.one_launch ? 1 : 0) << "off: never fused";
    EXPECT_EQ(gpu_bytes(out), gpu_bytes(out2)) << "output, one launch against the separate kernels";
    EXPECT_EQ(gpu_bytes(kc), gpu_bytes(kc2)) << "K cache, one launch against the separate kernels";
    EXPECT_EQ(gpu_bytes(vc), gpu_bytes(vc2)) << "V cache, one launch against the separate kernels";
    // Relative to max(1, |out|) as in AttentionAndKvWriteAcrossRingRollovers, with the norms'
    // rounding (q and k at ~1e-6 each) carried through the scores.
    expect_close(out, 10 * kSumBudget, "attention from projections against the CPU", 1.0f);
    // The tensor-core form: the same caches (the same store), the output within the same budget.
    const int64_t mma_before = cuda_decode_attention_mma_launches();
    fused_mma->attention_from_projections(out3.gpu, norms(q3.gpu, k3.gpu, v3.gpu, true), eps, pos.gpu, inv.gpu,
                                          {kc3.gpu, vc3.gpu}, p);
    fused_mma->synchronize();
    const int64_t group = c.n_heads / c.n_kv;
    EXPECT_EQ(cuda_decode_attention_mma_launches() - mma_before, c.one_launch && (group == 4 || group == 8) ? 1 : 0);
    EXPECT_EQ(gpu_bytes(kc3), gpu_bytes(kc)) << "K cache, tensor-core form";
    EXPECT_EQ(gpu_bytes(vc3), gpu_bytes(vc)) << "V cache, tensor-core form";
    std::memcpy(out3.host.data(), out.host.data(), out.host.size());  // the CPU's output as out3's reference
    expect_close(out3, 10 * kSumBudget, "attention from projections on the tensor cores against the CPU", 1.0f);
  }
}

// BackendOptions::attention_prefetch_mb: decode attention by KV head pulls the next product's
// weights (AttentionParams::next_weights) into L2 before its wait, a hint that must change
// nothing: the same output bytes as without it, and the hint must reach the kernel (the prefetch
// launch count moves by one) for device weights, not for weights on the host or with the switch
// off. The weights: a 3 MB span starting 4 bytes past a 16-byte boundary and ending off one (the
// kernel takes the aligned interior), cut to 2 MB and whole; and a 156-byte span, fewer 16-byte
// units than the grid has blocks. Shapes: the 31B's sliding layer (16-17 splits of 2 tiles) and
// global layer (D 512, 8 heads per KV head), and one split.
TEST_F(CudaOps, AttentionWeightPrefetchChangesNothing) {
  if (!cuda::decode_by_kv_head_applies(16, 2, 512, DType::q8_0)) GTEST_SKIP() << "no decode kernel by KV head (HIP)";
  BackendOptions with, without;
  with.attention_prefetch_mb = 2;
  without.attention_prefetch_mb = 0;
  BackendOptions whole = with;
  whole.attention_prefetch_mb = 8;
  auto prefetching = make_backend("cuda", with), plain = make_backend("cuda", without),
       prefetching_all = make_backend("cuda", whole);
  Twin weights = twin_random(DType::f32, {(3 << 20) / 4 + 3});
  const Tensor device_spans[] = {weights.gpu.slice(1, weights.gpu.dim(0)), weights.gpu.slice(1, 40)};
  struct Case {
    int64_t D;
    int n_heads, n_kv, window;
    int64_t past;
  };
  for (const Case& c : {Case{256, 32, 16, 1024, 3000}, Case{512, 32, 4, 0, 4000}, Case{256, 16, 8, 0, 20}}) {
    SCOPED_TRACE("D=" + std::to_string(c.D) + " heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                 " past=" + std::to_string(c.past));
    const int64_t rows = c.window > 0 ? c.window : c.past + 1;
    auto [kc, vc] = zeroed_caches(DType::q8_0, rows, c.n_kv, c.D);
    write_history(kc, vc, c.past, c.n_kv, c.D, false);
    Twin q = twin_random(DType::f32, {1, c.n_heads, c.D}), k = twin_random(DType::f32, {1, c.n_kv, c.D}),
         v = twin_random(DType::f32, {1, c.n_kv, c.D});
    Twin pos = twin_positions(c.past, 1);
    AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)), c.window};
    auto run = [&](Backend& b, const Tensor* next) {
      p.next_weights = next;
      Twin out = twin_output(DType::f32, {1, c.n_heads, c.D});
      b.attention(out.gpu, q.gpu, k.gpu, v.gpu, {kc.gpu, vc.gpu}, pos.gpu, p);
      b.synchronize();
      return gpu_bytes(out);
    };
    const int64_t plain_before = cuda_l2_prefetch_launches();
    const std::vector<uint8_t> base = run(*plain, device_spans);
    EXPECT_EQ(cuda_l2_prefetch_launches(), plain_before) << "switch off: no prefetch";
    for (Backend* b : {prefetching.get(), prefetching_all.get()}) {
      for (const Tensor& span : device_spans) {
        const int64_t before = cuda_l2_prefetch_launches();
        EXPECT_EQ(run(*b, &span), base) << "with a prefetch of " << span.describe();
        EXPECT_EQ(cuda_l2_prefetch_launches() - before, 1) << span.describe();
      }
      const int64_t before = cuda_l2_prefetch_launches();
      EXPECT_EQ(run(*b, &weights.cpu), base) << "weights on the host";
      EXPECT_EQ(cuda_l2_prefetch_launches(), before) << "weights on the host: no prefetch";
    }
  }
}

// BackendOptions::decode_attention_mma: decode attention by KV head with 4 or 8 query heads per
// KV head on the tensor cores (attention_decode.cu), against the CPU within the sum budget, one
// sequence (attention) and batched rows (attention_rows); the form must run (its launch count
// moves) for 4- and 8-head groups and not for 2-head ones, and the default backend never runs it.
// Shapes: Gemma 4 26B's and 31B's global layers (D 512, 8 heads per KV head) at 4000 keys (splits
// of whole tiles, a partial last tile), at position 0 (only the step's own key) and at 33 keys;
// D 512 with 4 heads in a 100-key window whose ring wraps inside a tile; Qwen3.5-4B's (D 256, 4
// heads) and 35B-A3B's (D 256, 8 heads); sharp softmaxes (q scaled by 4); a 2-head sliding layer
// (the SIMT form); one tile of cached keys (one split: the kernel normalises and writes out).
TEST_F(CudaOps, DecodeAttentionOnTensorCoresMatchesTheOracle) {
  if (!cuda::decode_by_kv_head_applies(16, 2, 512, DType::q8_0)) GTEST_SKIP() << "no decode kernel by KV head (HIP)";
  BackendOptions options;
  options.decode_attention_mma = true;
  auto mma = make_backend("cuda", options);
  struct Case {
    int64_t D;
    int n_heads, n_kv, window;
    int64_t past;
    float q_scale = 1.0f;
  };
  const Case cases[] = {{512, 16, 2, 0, 4000},      {512, 32, 4, 0, 2500},    {512, 16, 2, 0, 0},
                        {512, 16, 2, 0, 33},        {512, 8, 2, 100, 1500},   {256, 16, 4, 0, 500},
                        {256, 16, 2, 0, 1500},      {256, 32, 4, 1024, 3000}, {512, 16, 2, 0, 700, 4.0f},
                        {256, 16, 4, 0, 300, 4.0f}, {256, 16, 8, 1024, 1200}, {512, 16, 2, 0, 20},
                        {256, 16, 4, 0, 31}};
  for (const Case& c : cases) {
    const int group = c.n_heads / c.n_kv;
    SCOPED_TRACE("D=" + std::to_string(c.D) + " heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                 " window=" + std::to_string(c.window) + " past=" + std::to_string(c.past));
    const int64_t rows = c.window > 0 ? c.window : c.past + 1;
    auto [kc, vc] = zeroed_caches(DType::q8_0, rows, c.n_kv, c.D);
    write_history(kc, vc, c.past, c.n_kv, c.D, true);
    Twin q = twin_random(DType::f32, {1, c.n_heads, c.D}, c.q_scale), k = twin_random(DType::f32, {1, c.n_kv, c.D}),
         v = twin_random(DType::f32, {1, c.n_kv, c.D});
    Twin pos = twin_positions(c.past, 1);
    Twin out = twin_output(DType::f32, {1, c.n_heads, c.D});
    const AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)),
                            c.window};
    cpu_->attention(out.cpu, q.cpu, k.cpu, v.cpu, {kc.cpu, vc.cpu}, pos.cpu, p);
    const int64_t before = cuda_decode_attention_mma_launches();
    gpu_->attention(out.gpu, q.gpu, k.gpu, v.gpu, {kc.gpu, vc.gpu}, pos.gpu, p);
    gpu_->synchronize();
    EXPECT_EQ(cuda_decode_attention_mma_launches(), before) << "the default backend: the SIMT form";
    expect_close(out, kSumBudget, "one row, SIMT form", 1.0f);
    // the tensor-core form into its own (NaN-filled) output: an element it fails to write shows
    Twin out_mma = twin_output(DType::f32, {1, c.n_heads, c.D});
    std::memcpy(out_mma.host.data(), out.host.data(), out.host.size());  // the CPU's output, the reference
    mma->attention(out_mma.gpu, q.gpu, k.gpu, v.gpu, {kc.gpu, vc.gpu}, pos.gpu, p);
    mma->synchronize();
    EXPECT_EQ(cuda_decode_attention_mma_launches() - before, group == 4 || group == 8 ? 1 : 0);
    expect_close(out_mma, kSumBudget, "one row on the tensor cores", 1.0f);
  }
  // Batched rows: each sequence over its own cache at its own position (before, at and long after
  // a ring's rollover), 8 and 4 heads per KV head.
  for (const Case& c : {Case{512, 16, 2, 0, 0}, Case{256, 16, 4, 100, 0}, Case{256, 16, 2, 0, 0}}) {
    SCOPED_TRACE("rows: D=" + std::to_string(c.D) + " heads " + std::to_string(c.n_heads) + "/" +
                 std::to_string(c.n_kv) + " window=" + std::to_string(c.window));
    const std::vector<int64_t> pasts = {0, 5, 31, 32, 33, 200, 333, 399, 64, 150};
    const int64_t B = static_cast<int64_t>(pasts.size()), rows = c.window > 0 ? c.window : 400;
    std::vector<Twin> kc, vc;
    std::vector<KvView> cpu_caches, gpu_caches;
    for (int64_t i = 0; i < B; ++i) {
      auto [k_cache, v_cache] = zeroed_caches(DType::q8_0, rows, c.n_kv, c.D);
      kc.push_back(std::move(k_cache));
      vc.push_back(std::move(v_cache));
      write_history(kc.back(), vc.back(), pasts[i], c.n_kv, c.D, true);
    }
    for (int64_t i = 0; i < B; ++i) {
      cpu_caches.push_back({kc[i].cpu, vc[i].cpu});
      gpu_caches.push_back({kc[i].gpu, vc[i].gpu});
    }
    std::vector<int32_t> pos_host(pasts.begin(), pasts.end());
    Twin pos = twin_bytes(DType::i32, {B}, pos_host.data());
    Twin q = twin_random(DType::f32, {B, c.n_heads, c.D}, 2.0f);
    Twin k = twin_random(DType::f32, {B, c.n_kv, c.D}), v = twin_random(DType::f32, {B, c.n_kv, c.D});
    Twin out = twin_output(DType::f32, {B, c.n_heads, c.D});
    const AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)),
                            c.window};
    cpu_->attention_rows(out.cpu, q.cpu, k.cpu, v.cpu, cpu_caches, pos.cpu, p);
    const int64_t before = cuda_decode_attention_mma_launches();
    mma->attention_rows(out.gpu, q.gpu, k.gpu, v.gpu, gpu_caches, pos.gpu, p);
    mma->synchronize();
    const int group = c.n_heads / c.n_kv;
    EXPECT_EQ(cuda_decode_attention_mma_launches() - before, group == 4 || group == 8 ? 1 : 0);
    expect_close(out, kSumBudget, "batched rows on the tensor cores", 1.0f);
  }
}

// Batched decode: one query per sequence, each over its own cache at its own position, in one
// launch (attention_rows / kv_write_rows: a device table of cache addresses) against the CPU's
// row-by-row default. Positions differ per row (rows before, at and long after a ring rollover).
TEST_F(CudaOps, AttentionRowsOneLaunchForManySequences) {
  struct Case {
    int64_t D;
    int n_heads, n_kv, window, n_seqs;
  };
  // f32 caches: 7 sequences take the SIMT kernel split along the context; 70 sequences of 8 query
  // heads per KV head (Gemma 4's global shape, D = 512; Qwen3.5-35B-A3B's, D = 256) the
  // tensor-core kernel, one block per sequence and KV head, with or without a window; 40 such
  // sequences the same kernel split in two along the context (80 blocks for the H200's 132 SMs).
  // Q8_0 caches of head dims 256 and 512 take the kernel by KV head at ~4 blocks per SM: 70
  // sequences of 2-head groups in a 100-key window are one split each of up to 4 tiles, their
  // ring wrapping inside the split.
  for (DType cache_type : {DType::f32, DType::q8_0})
    for (const Case& c :
         {Case{256, 16, 8, 64, 7}, Case{512, 16, 2, 0, 7}, Case{16, 4, 1, 8, 7}, Case{512, 16, 2, 0, 70},
          Case{512, 16, 2, 100, 70}, Case{256, 16, 2, 0, 70}, Case{512, 16, 2, 0, 40}, Case{256, 16, 2, 100, 40},
          Case{256, 16, 8, 100, 70}}) {
      SCOPED_TRACE(std::string(dtype_name(cache_type)) + " D=" + std::to_string(c.D) + " window=" +
                   std::to_string(c.window) + " sequences=" + std::to_string(c.n_seqs));
      std::vector<int64_t> pasts = {0, 5, 63, 64, 65, 200, 333};
      for (int64_t i = 7; i < c.n_seqs; ++i) pasts.push_back((i * 37) % 399);
      const int64_t B = static_cast<int64_t>(pasts.size());
      const int64_t rows = c.window > 0 ? c.window : 400;
      std::vector<Twin> kc, vc;
      std::vector<KvView> cpu_caches, gpu_caches;
      for (int64_t i = 0; i < B; ++i) {  // each sequence's history, written by both backends
        kc.push_back(twin_output(cache_type, {rows, c.n_kv, c.D}));
        vc.push_back(twin_output(cache_type, {rows, c.n_kv, c.D}));
        std::vector<uint8_t> zeros(kc.back().host.size(), 0);
        std::memset(kc.back().host.data(), 0, zeros.size());
        std::memset(vc.back().host.data(), 0, zeros.size());
        gpu_->copy_to_device(kc.back().gpu, zeros.data());
        gpu_->copy_to_device(vc.back().gpu, zeros.data());
        for (int64_t at = 0; at < pasts[i];) {
          const int64_t n = std::min<int64_t>(29, pasts[i] - at);
          Twin k = twin_random(DType::f32, {n, c.n_kv, c.D}), v = twin_random(DType::f32, {n, c.n_kv, c.D});
          Twin pos = twin_positions(at, n);
          cpu_->kv_write({kc.back().cpu, vc.back().cpu}, k.cpu, v.cpu, pos.cpu);
          gpu_->kv_write({kc.back().gpu, vc.back().gpu}, k.gpu, v.gpu, pos.gpu);
          at += n;
        }
      }
      for (int64_t i = 0; i < B; ++i) {
        cpu_caches.push_back({kc[i].cpu, vc[i].cpu});
        gpu_caches.push_back({kc[i].gpu, vc[i].gpu});
      }
      std::vector<int32_t> pos_host(pasts.begin(), pasts.end());
      Twin pos = twin_bytes(DType::i32, {B}, pos_host.data());
      Twin q = twin_random(DType::f32, {B, c.n_heads, c.D});
      Twin k = twin_random(DType::f32, {B, c.n_kv, c.D}), v = twin_random(DType::f32, {B, c.n_kv, c.D});
      Twin out = twin_output(DType::f32, {B, c.n_heads, c.D});
      AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)), c.window};
      cpu_->attention_rows(out.cpu, q.cpu, k.cpu, v.cpu, cpu_caches, pos.cpu, p);
      gpu_->attention_rows(out.gpu, q.gpu, k.gpu, v.gpu, gpu_caches, pos.gpu, p);
      expect_close(out, kSumBudget, "attention_rows", 1.0f);  // as AttentionAndKvWrite...
      cpu_->kv_write_rows(cpu_caches, k.cpu, v.cpu, pos.cpu);
      gpu_->kv_write_rows(gpu_caches, k.gpu, v.gpu, pos.gpu);
      for (int64_t i = 0; i < B; ++i) {
        expect_identical(kc[i], "K cache after kv_write_rows, row " + std::to_string(i));
        expect_identical(vc[i], "V cache after kv_write_rows, row " + std::to_string(i));
      }
    }
}

// The decode attention plan (cuda::plan_attention, host code: runs without a GPU) on the
// published shapes of an H200 (132 SMs): which kernel, how many splits. The op cases above check
// what each plan computes; this pins the choices bench/RESULTS.md measured.
TEST(AttentionPlan, KernelAndSplitsForThePublishedShapes) {
  const int sms = 132;
  auto expect_plan = [](const cuda::AttentionPlan& p, bool group_queries, int n_splits, const char* what) {
    EXPECT_EQ(p.group_queries, group_queries) << what;
    EXPECT_EQ(p.n_splits, n_splits) << what;
  };
  using cuda::plan_attention;
  // Gemma 4 sliding layers (2 query heads per KV head, window 1024): SIMT, one wave of ~2 blocks
  // per SM (16 heads x 17 splits), however long the context.
  expect_plan(plan_attention(1, 16, 8, 256, 1025, false, sms, DType::bf16), false, 17, "sliding");
  // No window, 2 heads per KV head, 32k keys: at least one split per 512 keys, but no more
  // than 8 blocks per SM.
  expect_plan(plan_attention(1, 16, 8, 256, 32769, false, sms, DType::bf16), false, 65, "32k, 2-head groups");
  // Head dims not in 64s stay on the SIMT kernel.
  EXPECT_FALSE(plan_attention(1, 16, 2, 72, 4097, false, sms, DType::bf16).group_queries);
  // Prefill-sized steps: the tensor-core kernel by token tiles, never split.
  expect_plan(plan_attention(100, 16, 8, 256, 1124, false, sms, DType::bf16), false, 1, "prefill");
  // Batched rows: 3 rows of 8-head groups fill too few SMs for a block per (sequence, KV head)
  // and stay on the SIMT kernel, with twice the splits that make 8 blocks per SM; so do 2-head
  // groups (64 rows x 16 heads: 2 x 2 splits).
  expect_plan(plan_attention(3, 16, 2, 512, 4097, true, sms, DType::bf16), false, 44, "3 batched rows");
  expect_plan(plan_attention(64, 16, 8, 256, 1025, true, sms, DType::bf16), false, 4, "64 batched rows, 2-head groups");
  // No rows: one unsplit launch (launch_attention returns at once).
  expect_plan(plan_attention(0, 16, 2, 512, 4097, false, sms, DType::bf16), false, 1, "no rows");
  // The tensor-core cases: HIP builds have no mma.sync and plan the SIMT kernel there.
  if (!cuda::flash_decode_applies(16, 2, 512)) {
    EXPECT_FALSE(plan_attention(1, 16, 2, 512, 4097, false, sms, DType::bf16).group_queries);
    return;
  }
  // Gemma 4 global layers (8 heads per KV head, D = 512, 16-key tiles): by query group, two
  // blocks per SM (2 KV heads x 132 splits).
  expect_plan(plan_attention(1, 16, 2, 512, 4097, false, sms, DType::bf16), true, 132, "global");
  // Qwen3.5-4B (4 heads per KV head, D = 256): by group, 4 x 66 blocks.
  expect_plan(plan_attention(1, 16, 4, 256, 4097, false, sms, DType::bf16), true, 66, "4-head groups");
  // A short cache: never more splits than tiles (17 keys = 2 tiles of 16).
  expect_plan(plan_attention(1, 16, 2, 512, 17, false, sms, DType::bf16), true, 2, "short cache");
  // Batched rows of 8-head groups: a block per (sequence, KV head) once those fill half the SMs,
  // split to one block per SM (64 x 2 KV heads: 2 splits; 200 x 2: unsplit).
  expect_plan(plan_attention(64, 16, 2, 512, 4097, true, sms, DType::bf16), true, 2, "64 batched rows, 8-head groups");
  expect_plan(plan_attention(200, 16, 2, 512, 4097, true, sms, DType::bf16), true, 1, "200 batched rows, 8-head groups");

  // Q8_0 caches (what the models run with): decode rows of head dims 256 and 512 take the kernel
  // by KV head, split to ~2 blocks per SM for one sequence and ~4 for batched rows, whole 32-key
  // tiles, never more splits than tiles. Other caches, head dims and prompts keep the plans above.
  if (!cuda::decode_by_kv_head_applies(16, 2, 512, DType::q8_0)) return;  // HIP: no cp.async
  auto expect_by_kv_head = [](const cuda::AttentionPlan& p, int n_splits, const char* what) {
    EXPECT_TRUE(p.by_kv_head) << what;
    EXPECT_FALSE(p.group_queries) << what;
    EXPECT_EQ(p.n_splits, n_splits) << what;
  };
  expect_by_kv_head(plan_attention(1, 16, 8, 256, 1025, false, sms, DType::q8_0), 33, "q8_0 sliding (33 tiles)");
  expect_by_kv_head(plan_attention(1, 16, 2, 512, 4097, false, sms, DType::q8_0), 129, "q8_0 global (129 tiles)");
  expect_by_kv_head(plan_attention(1, 16, 2, 512, 32769, false, sms, DType::q8_0), 132, "q8_0 global at 32k");
  expect_by_kv_head(plan_attention(1, 16, 4, 256, 4097, false, sms, DType::q8_0), 66, "q8_0 4-head groups");
  expect_by_kv_head(plan_attention(1, 32, 16, 256, 1025, false, sms, DType::q8_0), 17, "q8_0 31B sliding");
  expect_by_kv_head(plan_attention(64, 16, 8, 256, 1025, true, sms, DType::q8_0), 2, "q8_0 64 rows sliding");
  expect_by_kv_head(plan_attention(64, 16, 2, 512, 4097, true, sms, DType::q8_0), 5, "q8_0 64 rows global");
  EXPECT_FALSE(plan_attention(1, 16, 2, 128, 4097, false, sms, DType::q8_0).by_kv_head) << "D = 128";
  EXPECT_FALSE(plan_attention(1, 12, 2, 256, 4097, false, sms, DType::q8_0).by_kv_head) << "6 heads per KV head";
  EXPECT_FALSE(plan_attention(1, 16, 1, 512, 4097, false, sms, DType::q8_0).by_kv_head) << "16 heads of 512";
  EXPECT_FALSE(plan_attention(3, 16, 2, 512, 4097, false, sms, DType::q8_0).by_kv_head) << "3 tokens of one sequence";
  EXPECT_FALSE(plan_attention(100, 16, 8, 256, 1124, false, sms, DType::q8_0).by_kv_head) << "prefill";
}

// The models' memory plans (model.h attention_partials_workspace) hold the split partials that
// plan_attention asks for, for every published head shape, cache type, GPU size (SMs up to 256),
// context, and step: one sequence's prompt steps (unsplit from 16 tokens) and batched decode rows
// (one per sequence). Host code: runs without a GPU.
// The slices of a span that a grid's blocks pull into L2 (cuda::l2_prefetch_slice: host
// arithmetic, runs without a GPU): together they are the span's 16-byte-aligned interior, each
// once and in block order, 16-byte aligned and whole 16-byte units, never outside the span;
// spans with no aligned interior (under 16 bytes, or 16 bytes off a boundary) and a grid of 0
// blocks give none; more blocks than units leave the last blocks empty.
TEST(L2PrefetchSlice, TheBlocksCoverTheAlignedInteriorOnce) {
  for (uint64_t address : {uint64_t{0x7f0000000000}, uint64_t{0x7f0000000004}, uint64_t{0x7f000000000f}})
    for (int64_t bytes : {int64_t{0}, int64_t{5}, int64_t{16}, int64_t{17}, int64_t{156}, int64_t{(3 << 20) + 12}})
      for (uint64_t blocks : {uint64_t{1}, uint64_t{7}, uint64_t{264}, uint64_t{100000}}) {
        SCOPED_TRACE("address % 16 = " + std::to_string(address % 16) + ", " + std::to_string(bytes) + " bytes, " +
                     std::to_string(blocks) + " blocks");
        const uint64_t begin = (address + 15) / 16 * 16, end = (address + static_cast<uint64_t>(bytes)) / 16 * 16;
        uint64_t next = begin, covered = 0;
        for (uint64_t b = 0; b < blocks; ++b) {
          const cuda::ByteRange r = cuda::l2_prefetch_slice(address, bytes, b, blocks);
          if (r.last <= r.first) continue;
          ASSERT_EQ(r.first, next) << "block " << b << ": slices in block order, no gap, no overlap";
          ASSERT_EQ(r.first % 16, 0u) << "block " << b;
          ASSERT_EQ((r.last - r.first) % 16, 0u) << "block " << b;
          ASSERT_GE(r.first, address) << "block " << b;
          ASSERT_LE(r.last, address + static_cast<uint64_t>(bytes)) << "block " << b;
          next = r.last;
          covered += r.last - r.first;
        }
        EXPECT_EQ(covered, end > begin ? end - begin : 0) << "the aligned interior, all of it";
        const cuda::ByteRange none = cuda::l2_prefetch_slice(address, bytes, 0, 0);
        EXPECT_LE(none.last, none.first) << "a grid of no blocks";
      }
}

TEST(AttentionPlan, MemoryPlansCoverThePartials) {
  struct Heads {
    int n_heads, n_kv_heads, head_dim;
  };
  const Heads shapes[] = {{16, 8, 256}, {16, 2, 512}, {32, 16, 256}, {32, 4, 512}, {16, 4, 256}, {16, 1, 256}};
  for (const Heads& h : shapes)
    for (DType cache : {DType::q8_0, DType::bf16})
      for (int sms : {108, 132, 256})
        for (int64_t keys : {1024, 4096, 32768})
          for (int64_t T : {1, 2, 7, 15, 16, 17, 64, 512, 4096, 30000})
            for (bool per_row : {false, true}) {
              if (per_row && T > 512) continue;
              const cuda::AttentionPlan p =
                  cuda::plan_attention(T, h.n_heads, h.n_kv_heads, h.head_dim, keys, per_row, sms, cache);
              const double asked =
                  p.n_splits > 1 ? 4.0 * static_cast<double>(T * h.n_heads) * p.n_splits * (h.head_dim + 2) : 0.0;
              const double planned = attention_partials_workspace(static_cast<double>(T), per_row ? T : 1.0,
                                                                  h.n_heads, h.head_dim);
              EXPECT_LE(asked, planned) << h.n_heads << "/" << h.n_kv_heads << " heads of " << h.head_dim << ", "
                                        << dtype_name(cache) << ", " << sms << " SMs, " << keys << " keys, T=" << T
                                        << (per_row ? " batched" : " one sequence") << ": " << p.n_splits
                                        << " splits";
            }
  // A 30000-token prompt step plans what its attention's gather needs, not 64 splits a row: the
  // partials stay under 100 MB where every row counted took 63 GB (Gemma 4 26B-A4B's global layers).
  EXPECT_LT(attention_partials_workspace(30000, 1, 16, 512), 100e6);
}

}  // namespace
}  // namespace fl
