// The op harness (ops_harness.h: budgets and fixture) for sampling, norms and the residual
// update, RoPE, embeddings and element-wise ops, the bf16 tensor-core precision, Gated DeltaNet's
// ops, and graph capture (attention and the KV cache: ops_attention_test.cpp).
#include <gtest/gtest.h>

#include "model/model.h"
#include "ops_harness.h"

namespace fl {
namespace {

using namespace ops_harness;

// Sampling on the device against the host reference (backend/sampling.h): the chain is defined
// to be computed bit for bit alike, so the budget is 0: the same token and the same adjusted,
// divided logits. Vocabularies from 7 to Gemma's 262144; every stage alone and together; ties
// (repeated logits), -inf and NaN logits; every token banned gives -1 on both.
TEST_F(CudaOps, SampleMatchesTheHostReference) {
  struct Case {
    const char* name;
    SampleSpec spec;
  };
  auto spec = [](float t, int k, float p, float min_p) {
    SampleSpec s;
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = min_p;
    return s;
  };
  std::vector<Case> cases = {{"greedy", spec(0.0f, 0, 1.0f, 0.0f)},       {"plain", spec(1.0f, 0, 1.0f, 0.0f)},
                             {"hot", spec(2.5f, 0, 1.0f, 0.0f)},          {"top-k 1", spec(0.9f, 1, 1.0f, 0.0f)},
                             {"top-k 40", spec(0.9f, 40, 1.0f, 0.0f)},    {"top-p 0.9", spec(0.9f, 0, 0.9f, 0.0f)},
                             {"top-p 0.2", spec(0.5f, 0, 0.2f, 0.0f)},    {"min-p 0.05", spec(1.0f, 0, 1.0f, 0.05f)},
                             {"all", spec(0.8f, 64, 0.95f, 0.02f)},       {"top-k > V", spec(1.0f, 1 << 30, 0.5f, 0.0f)}};
  Case penalised{"penalties and bias", spec(0.8f, 40, 0.9f, 0.0f)};
  penalised.spec.repetition_penalty = 1.3f;
  penalised.spec.presence_penalty = 0.4f;
  penalised.spec.frequency_penalty = 0.25f;
  penalised.spec.adjust = {{3, 0.0f, 2}, {5, 1.5f, 0}, {6, -INFINITY, 0}, {4, -2.0f, 5}, {100000000, 1.0f, 1}};
  cases.push_back(penalised);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // 100003: greedy's many-block pass with a last chunk part-filled.
  for (int64_t V : {7, 1000, 100003, 262144})
    for (const Case& c : cases)
      for (int draw = 0; draw < 8; ++draw) {
        Twin logits = twin_random(DType::f32, {V}, 4.0f);
        float* host = static_cast<float*>(logits.host.data());
        if (draw == 1) std::fill(host, host + V, 1.25f);  // all tied
        if (draw == 2)
          for (int64_t i = 0; i < V; i += 3) host[i] = host[i / 2];  // many ties
        if (draw == 3)
          for (int64_t i = 0; i < V; i += 2) host[i] = i % 4 ? -INFINITY : NAN;
        if (draw == 6)  // the best logit is zero, as -0 and +0 (equal: the lowest id wins)
          for (int64_t i = 0; i < V; ++i) host[i] = i % 3 == 0 ? -std::fabs(host[i]) - 1.0f : i % 3 == 1 ? -0.0f : 0.0f;
        if (draw == 7) std::fill(host, host + V, NAN);  // nothing to choose: -1
        gpu_->copy_to_device(logits.gpu, host);
        SampleSpec s = c.spec;
        s.uniform = draw == 4 ? 0.0 : draw == 5 ? std::nextafter(1.0, 0.0) : unit(rng_);
        int32_t want = -1;
        try {
          want = sample_logits_reference(std::span<float>(host, static_cast<size_t>(V)), s);
        } catch (const Error&) {
        }
        Twin chosen = twin_output(DType::i32, {1});
        gpu_->sample(chosen.gpu, logits.gpu, s);
        int32_t got = 0;
        gpu_->copy_to_host(&got, chosen.gpu);
        const std::string what = std::string(c.name) + " V=" + std::to_string(V) + " draw " + std::to_string(draw);
        ASSERT_EQ(got, want) << what;
        expect_identical(logits, what + ": adjusted logits");
      }
  // Every token banned: -1 from the device, an error from sample_token.
  Twin banned = twin_random(DType::f32, {1000});
  std::vector<float> all_banned(1000, -INFINITY);
  gpu_->copy_to_device(banned.gpu, all_banned.data());
  Twin chosen = twin_output(DType::i32, {1});
  for (float t : {0.0f, 1.0f})
    EXPECT_ERROR_HAS(sample_token(*gpu_, chosen.gpu, banned.gpu, spec(t, 0, 1.0f, 0.0f)), "every token is banned");
}

// Many rows sampled in one launch, each by its own spec (batched decode), against the host
// reference row by row: same tokens, same adjusted logits; a banned row gives -1 without
// disturbing its neighbours. Then the same specs again, so that the upload buffer is reused.
TEST_F(CudaOps, SampleRowsUsesEachRowsOwnSpec) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t V : {7, 1000, 262144})
    for (int64_t B : {1, 5, 64}) {
      std::vector<SampleSpec> specs(static_cast<size_t>(B));
      for (int64_t i = 0; i < B; ++i) {
        SampleSpec& s = specs[i];
        switch (i % 5) {
          case 0: s.temperature = 0.0f; break;
          case 1: s.temperature = 0.8f, s.top_k = 40; break;
          case 2: s.temperature = 1.1f, s.top_p = 0.5f, s.min_p = 0.01f; break;
          case 3:
            s.temperature = 0.9f, s.repetition_penalty = 1.3f, s.presence_penalty = 0.2f;
            s.adjust = {{static_cast<int32_t>(i % V), 1.5f, 2}, {static_cast<int32_t>((i + 3) % V), 0.0f, 4}};
            if (s.adjust[0].id == s.adjust[1].id) s.adjust.pop_back();
            break;
          default:  // every token banned
            s.temperature = 1.0f;
            for (int32_t id = 0; id < V && id < 4096; ++id) s.adjust.push_back({id, -INFINITY, 0});
        }
        s.uniform = unit(rng_);
      }
      const bool all_banned_fits = V <= 4096;
      Twin logits = twin_random(DType::f32, {B, V}, 4.0f);
      float* host = static_cast<float*>(logits.host.data());
      for (int pass = 0; pass < 2; ++pass) {
        gpu_->copy_to_device(logits.gpu, host);
        std::vector<float> reference(host, host + B * V);
        Twin chosen = twin_output(DType::i32, {B});
        gpu_->sample_rows(chosen.gpu, logits.gpu, specs);
        std::vector<int32_t> got(static_cast<size_t>(B));
        gpu_->copy_to_host(got.data(), chosen.gpu);
        std::vector<float> adjusted(static_cast<size_t>(B * V));
        gpu_->copy_to_host(adjusted.data(), logits.gpu);
        for (int64_t i = 0; i < B; ++i) {
          int32_t want = -1;
          try {
            want = sample_logits_reference(std::span<float>(reference.data() + i * V, static_cast<size_t>(V)), specs[i]);
          } catch (const Error&) {
          }
          const std::string what = "V=" + std::to_string(V) + " B=" + std::to_string(B) + " row " + std::to_string(i);
          ASSERT_EQ(got[i], want) << what;
          if (i % 5 == 4 && all_banned_fits) {
            EXPECT_EQ(got[i], -1) << what;
          }
          ASSERT_EQ(std::memcmp(adjusted.data() + i * V, reference.data() + i * V, V * sizeof(float)), 0) << what;
        }
      }
    }
  Twin logits = twin_random(DType::f32, {3, 10});
  Twin ids = twin_output(DType::i32, {3});
  EXPECT_ERROR_HAS(gpu_->sample_rows(ids.gpu, logits.gpu, std::vector<SampleSpec>(2)), "sample_rows");
}

TEST_F(CudaOps, RmsNormGainsAndStridedRows) {
  for (int64_t rows : {1, 3, 17, 128})
    for (int64_t cols : {16, 64, 256, 2816})
      for (NormGain gain : {NormGain::none, NormGain::weight, NormGain::one_plus_weight})
        for (DType wtype : {DType::f32, DType::bf16}) {
          Twin x = twin_random(DType::f32, {rows, 2 * cols}, 3.0f), w = twin_random(wtype, {cols});
          Twin out = twin_output(DType::f32, {rows, cols});
          // the input is the right half of a wider tensor: a strided view
          cpu_->rms_norm(out.cpu, x.cpu.narrow(1, cols, cols), &w.cpu, gain, 1e-6f);
          gpu_->rms_norm(out.gpu, x.gpu.narrow(1, cols, cols), &w.gpu, gain, 1e-6f);
          expect_close(out, kSumBudget, "rms_norm rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
        }
}

// The fused forms against the CPU's two separate ops (norm then add; norm then RoPE). The norm's
// f32 sum order differs (block tree vs left to right), hence kSumBudget; RoPE's sin/cos add an
// ulp or two on top.
TEST_F(CudaOps, FusedAddRmsNormAndRmsNormRope) {
  for (int64_t rows : {1, 3, 17})
    for (int64_t cols : {64, 2816})
      for (NormGain gain : {NormGain::none, NormGain::weight, NormGain::one_plus_weight}) {
        Twin h = twin_random(DType::f32, {rows, cols}, 2.0f), x = twin_random(DType::f32, {rows, cols}, 3.0f);
        Twin w = twin_random(DType::f32, {cols});
        cpu_->add_rms_norm(h.cpu, x.cpu, &w.cpu, gain, 1e-6f);
        gpu_->add_rms_norm(h.gpu, x.gpu, &w.gpu, gain, 1e-6f);
        const std::string what = "add_rms_norm rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
        expect_close(x, kSumBudget, what + " (normed x)");
        expect_close(h, kSumBudget, what + " (residual)");
      }
  for (int64_t D : {16, 256, 512})
    for (int64_t half : {D / 2, D / 8})  // full span, or a partial rotated span (Qwen: 64 of 256)
      for (NormGain gain : {NormGain::weight, NormGain::one_plus_weight}) {
        std::vector<float> freq(half);
        for (int64_t i = 0; i < half; ++i) freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / D);
        Twin inv = twin_bytes(DType::f32, {half}, freq.data());
        Twin w = twin_random(DType::bf16, {D});
        for (int64_t T : {1, 3}) {
          Twin x = twin_random(DType::f32, {T, 8, D}, 3.0f);
          Twin pos = twin_positions(4000 + 13 * T, T);
          cpu_->rms_norm_rope(x.cpu, &w.cpu, gain, 1e-6f, pos.cpu, inv.cpu);
          gpu_->rms_norm_rope(x.gpu, &w.gpu, gain, 1e-6f, pos.gpu, inv.gpu);
          expect_close(x, kSumBudget + kUlpBudget * 8, "rms_norm_rope D=" + std::to_string(D) + " half=" + std::to_string(half));
        }
      }
}

// The residual update (one kernel on CUDA) against the CPU's default, which runs the ops it
// replaces: one or two branch terms (normed or raw), the merge norm, the layer scalar, and up to
// four norms of the new h with scales; strided views for h and a norm output. Gains all bf16, all
// f32 (the register kernel's two forms), or mixed with a Q8_0 merge gain and an f16 norm gain
// (the kernel that reads the row from memory). Widths take every kernel: in registers 4 elements
// per thread (64), 8 (1536, 2560, 2816, 4096) and 12 (5376); from memory (7000, 9000).
TEST_F(CudaOps, ResidualUpdateMatchesTheOpsItReplaces) {
  struct Case {
    int n_terms;
    bool normed, merge, scalar;
    int n_norms;
    DType gains = DType::bf16;  // q8_0: the merge gain Q8_0 (where the width allows), norm 2's f16, others bf16
  };
  const Case cases[] = {{1, true, false, false, 3},         {2, true, true, true, 1},
                        {1, false, false, false, 1},        {1, true, false, true, 0},
                        {2, false, false, false, 4},        {1, true, true, false, 2},
                        {2, true, true, true, 4, DType::f32}, {2, true, true, true, 3, DType::q8_0}};
  for (const Case& c : cases)
    for (int64_t rows : {1, 5})
      for (int64_t cols : {64, 1536, 2560, 2816, 4096, 5376, 7000, 9000}) {
        const std::string what = "residual_update terms=" + std::to_string(c.n_terms) +
                                 " normed=" + std::to_string(c.normed) + " merge=" + std::to_string(c.merge) +
                                 " scalar=" + std::to_string(c.scalar) + " norms=" + std::to_string(c.n_norms) +
                                 " gains=" + std::string(dtype_name(c.gains)) + " rows=" + std::to_string(rows) +
                                 " cols=" + std::to_string(cols);
        const bool mixed = c.gains == DType::q8_0;
        const DType plain = mixed ? DType::bf16 : c.gains;
        Twin h_wide = twin_random(DType::f32, {rows, 2 * cols}, 2.0f);
        Tensor h_cpu = h_wide.cpu.narrow(1, cols, cols), h_gpu = h_wide.gpu.narrow(1, cols, cols);
        std::vector<Twin> xs, ws, outs, out_ws;
        for (int t = 0; t < c.n_terms; ++t) {
          xs.push_back(twin_random(DType::f32, {rows, cols}, 3.0f));
          ws.push_back(twin_random(plain, {cols}));
        }
        const DType merge_type = mixed && cols % 32 == 0 ? DType::q8_0 : plain;  // Q8_0: whole 32-blocks
        Twin merge_w = twin_random(merge_type, {cols}), scalar = twin_random(plain, {1}, 2.0f);
        for (int n = 0; n < c.n_norms; ++n) {  // norm 1 writes the right half of a wider tensor
          outs.push_back(n == 1 ? twin_random(DType::f32, {rows, 2 * cols}) : twin_output(DType::f32, {rows, cols}));
          out_ws.push_back(twin_random(mixed && n == 2 ? DType::f16 : plain, {cols}));
        }
        auto run = [&](Backend& b, bool gpu) {
          std::vector<ResidualTerm> terms;
          std::vector<StreamNorm> norms;
          const NormGain gains[] = {NormGain::weight, NormGain::one_plus_weight, NormGain::none, NormGain::weight};
          for (int t = 0; t < c.n_terms; ++t)
            terms.push_back({gpu ? xs[t].gpu : xs[t].cpu, gpu ? &ws[t].gpu : &ws[t].cpu, gains[t], c.normed});
          for (int n = 0; n < c.n_norms; ++n) {
            const Tensor out = gpu ? outs[n].gpu : outs[n].cpu;
            norms.push_back({n == 1 ? out.narrow(1, cols, cols) : out, gpu ? &out_ws[n].gpu : &out_ws[n].cpu, gains[n],
                             n == 1 ? 0.0625f : 1.0f});
          }
          ResidualUpdate u;
          u.terms = terms;
          if (c.merge) u.merge_weight = gpu ? &merge_w.gpu : &merge_w.cpu, u.merge_gain = NormGain::one_plus_weight;
          if (c.scalar) u.layer_scalar = gpu ? &scalar.gpu : &scalar.cpu;
          u.norms = norms;
          u.eps = 1e-6f;
          b.residual_update(gpu ? h_gpu : h_cpu, u);
        };
        run(*cpu_, false);
        run(*gpu_, true);
        // Up to four reductions in a row (terms, merge, h): each adds the sum-order budget.
        expect_close(h_wide, kSumBudget * 4, what + " (h)");
        for (int n = 0; n < c.n_norms; ++n)
          expect_close(outs[n], kSumBudget * 5, what + " (norm " + std::to_string(n) + ")");
      }
  // Bad arguments: a clear error, not a launch.
  Twin h = twin_random(DType::f32, {2, 64}), x = twin_random(DType::f32, {2, 32});
  const ResidualTerm wrong_width[] = {{x.gpu, nullptr, NormGain::none, true}};
  ResidualUpdate u;
  u.terms = wrong_width;
  EXPECT_ERROR_HAS(gpu_->residual_update(h.gpu, u), "residual_update");
  u.terms = {};
  EXPECT_ERROR_HAS(gpu_->residual_update(h.gpu, u), "residual_update");
  const ResidualTerm h_itself[] = {{h.gpu, nullptr, NormGain::none, true}};
  u.terms = h_itself;
  EXPECT_ERROR_HAS(gpu_->residual_update(h.gpu, u), "h itself");
}

// BackendOptions::update_prefetch_mb: the one-row residual update pulls the next product's
// weights (ResidualUpdate::next_weights) into L2 before its wait, a hint that must change
// nothing: h and the norm's output the same bytes as without it. The hint must reach the kernel
// (the prefetch launch count moves by one) for device weights in one row, and not for weights on
// the host or for an update of 5 rows. The register kernel (cluster off) and the cluster kernel
// (its launch count moves too); the 31B's row (5376) and the 4B's (2560); weights a 3 MB span 4
// bytes past a 16-byte boundary, cut to 2 MB, and a 156-byte span (144 aligned bytes: the one
// block takes them all, the 31B's 7 cluster blocks 32, 32, 32, 32, 16, 0 and 0).
TEST_F(CudaOps, ResidualUpdateWeightPrefetchChangesNothing) {
  Twin weights = twin_random(DType::f32, {(3 << 20) / 4 + 3});
  const Tensor device_spans[] = {weights.gpu.slice(1, weights.gpu.dim(0)), weights.gpu.slice(1, 40)};
  for (bool cluster : {false, true}) {
    BackendOptions with, without;
    with.cluster_residual_update = without.cluster_residual_update = cluster;
    with.update_prefetch_mb = 2;
    auto prefetching = make_backend("cuda", with), plain = make_backend("cuda", without);
    if (cluster && !cuda_cluster_update_available(*prefetching)) continue;  // (no sm_90a: the one-block arm ran)
    for (int64_t rows : {1, 5})
      for (int64_t cols : {5376, 2560}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                     (cluster ? " cluster" : " one block"));
        Twin x = twin_random(DType::f32, {rows, cols}, 3.0f), w = twin_random(DType::bf16, {cols}),
             norm_w = twin_random(DType::bf16, {cols}), scalar = twin_random(DType::bf16, {1}, 2.0f);
        const Twin h_start = twin_random(DType::f32, {rows, cols}, 2.0f);
        auto run = [&](Backend& b, const Tensor* next) {
          Twin h = twin_bytes(DType::f32, {rows, cols}, h_start.host.data());
          Twin out = twin_output(DType::f32, {rows, cols});
          const ResidualTerm terms[] = {{x.gpu, &w.gpu, NormGain::weight, true}};
          const StreamNorm norms[] = {{out.gpu, &norm_w.gpu, NormGain::weight}};
          ResidualUpdate u;
          u.terms = terms;
          u.layer_scalar = &scalar.gpu;
          u.norms = norms;
          u.next_weights = next;
          b.residual_update(h.gpu, u);
          b.synchronize();
          std::vector<uint8_t> bytes = gpu_bytes(h), out_bytes = gpu_bytes(out);
          bytes.insert(bytes.end(), out_bytes.begin(), out_bytes.end());
          return bytes;
        };
        const int64_t plain_before = cuda_l2_prefetch_launches();
        const std::vector<uint8_t> base = run(*plain, device_spans);
        EXPECT_EQ(cuda_l2_prefetch_launches(), plain_before) << "switch off: no prefetch";
        for (const Tensor& span : device_spans) {
          const int64_t before = cuda_l2_prefetch_launches(), clusters = cuda_cluster_update_launches();
          EXPECT_EQ(run(*prefetching, &span), base) << span.describe();
          EXPECT_EQ(cuda_l2_prefetch_launches() - before, rows == 1 ? 1 : 0) << span.describe();
          if (cluster) {
            EXPECT_EQ(cuda_cluster_update_launches() - clusters, rows == 1 ? 1 : 0);
          }
        }
        const int64_t before = cuda_l2_prefetch_launches();
        EXPECT_EQ(run(*prefetching, &weights.cpu), base) << "weights on the host";
        EXPECT_EQ(cuda_l2_prefetch_launches(), before) << "weights on the host: no prefetch";
      }
  }
}

// BackendOptions::cluster_residual_update: the one-row update spread over a cluster of blocks
// (sm_90) against the CPU, and the one-block form (the option off) likewise: rows of the 31B
// (5376: 21 warps in 7 blocks of 3), 26B-A4B (2816: 6 blocks of 2, the last warp past the row),
// Qwen3.5-4B (2560) and 64 (a cluster of one block); Gemma 4's form (one normed term, the layer
// scalar, one norm) and the widest (two terms, the merge norm, two norms, one of them into the
// right half of a wider tensor), with bf16 and f32 gains. Declined (one block instead; the
// cluster counter unmoved, the numbers the same): 1004 columns (not whole 8-column lanes) and h
// one element off a 16-byte boundary. And the pieces it cuts for an integer product: the bytes
// the product's own cut gives.
TEST_F(CudaOps, ClusterResidualUpdateMatchesOneBlock) {
  BackendOptions on, off;
  on.cluster_residual_update = true;
  off.cluster_residual_update = false;
  auto cluster = make_backend("cuda", on), one_block = make_backend("cuda", off);
  if (!cuda_cluster_update_available(*cluster)) GTEST_SKIP() << "no thread-block clusters (an sm_90 GPU, sm_90a code)";
  struct Case {
    int64_t cols, h_offset;
    bool widest;
    DType gains;
  };
  const Case cases[] = {{5376, 0, false, DType::bf16}, {5376, 0, true, DType::f32},  {2816, 0, false, DType::bf16},
                        {2816, 0, true, DType::bf16},  {2560, 0, true, DType::f32},  {64, 0, false, DType::bf16},
                        {1004, 0, false, DType::bf16}, {5376, 1, false, DType::bf16}};
  for (const Case& c : cases) {
    const int64_t cols = c.cols, n_terms = c.widest ? 2 : 1, n_norms = c.widest ? 2 : 1;
    const bool takes_cluster = cols % 8 == 0 && c.h_offset == 0;
    const std::string what = "cols=" + std::to_string(cols) + " h_offset=" + std::to_string(c.h_offset) +
                             (c.widest ? " two terms, merge, two norms" : " one term, one norm") + " gains " +
                             std::string(dtype_name(c.gains));
    std::vector<Twin> x_starts, ws, norm_ws;
    for (int64_t t = 0; t < n_terms; ++t)
      x_starts.push_back(twin_random(DType::f32, {1, cols}, 3.0f)), ws.push_back(twin_random(c.gains, {cols}));
    for (int64_t n = 0; n < n_norms; ++n) norm_ws.push_back(twin_random(c.gains, {cols}));
    Twin merge_w = twin_random(c.gains, {cols}), scalar = twin_random(c.gains, {1}, 2.0f);
    const Twin h_start = twin_random(DType::f32, {1, cols + c.h_offset}, 2.0f);
    for (Backend* b : {cluster.get(), one_block.get()}) {
      const bool is_cluster = b == cluster.get();
      // Fresh copies each time: the CPU's update (the ops it replaces) norms its terms in place.
      Twin h = twin_bytes(DType::f32, {1, cols + c.h_offset}, h_start.host.data());
      std::vector<Twin> xs;
      for (const Twin& x : x_starts) xs.push_back(twin_bytes(DType::f32, {1, cols}, x.host.data()));
      std::vector<Twin> outs;
      for (int64_t n = 0; n < n_norms; ++n)
        outs.push_back(n == 1 ? twin_random(DType::f32, {1, 2 * cols}) : twin_output(DType::f32, {1, cols}));
      auto run = [&](Backend& on_backend, bool gpu) {
        std::vector<ResidualTerm> terms;
        std::vector<StreamNorm> norms;
        const NormGain gains[] = {NormGain::weight, NormGain::one_plus_weight};
        for (int64_t t = 0; t < n_terms; ++t)
          terms.push_back({gpu ? xs[t].gpu : xs[t].cpu, gpu ? &ws[t].gpu : &ws[t].cpu, gains[t], true});
        for (int64_t n = 0; n < n_norms; ++n) {
          const Tensor out = gpu ? outs[n].gpu : outs[n].cpu;
          norms.push_back({n == 1 ? out.narrow(1, cols, cols) : out, gpu ? &norm_ws[n].gpu : &norm_ws[n].cpu,
                           gains[1 - n], n == 1 ? 0.0625f : 1.0f});
        }
        ResidualUpdate u;
        u.terms = terms;
        if (c.widest) u.merge_weight = gpu ? &merge_w.gpu : &merge_w.cpu, u.merge_gain = NormGain::one_plus_weight;
        u.layer_scalar = gpu ? &scalar.gpu : &scalar.cpu;
        u.norms = norms;
        u.eps = 1e-6f;
        const Tensor whole = gpu ? h.gpu : h.cpu;
        on_backend.residual_update(whole.narrow(1, c.h_offset, cols), u);
      };
      run(*cpu_, false);
      const int64_t before = cuda_cluster_update_launches();
      run(*b, true);
      b->synchronize();
      const std::string form = what + (is_cluster ? " (cluster)" : " (one block)");
      EXPECT_EQ(cuda_cluster_update_launches() - before, is_cluster && takes_cluster ? 1 : 0) << form;
      expect_close(h, kSumBudget * 4, form + ": h");
      for (int64_t n = 0; n < n_norms; ++n) expect_close(outs[n], kSumBudget * 5, form + ": norm " + std::to_string(n));
    }
  }
  // Its pieces (the integer matvec on): the product right after the update takes them (no pieces
  // launch) and gives the bytes of a product that cuts its own from the update's output. Rows of
  // 5376 and 2816 (G256), 2112 (G128, a half-used last group).
  BackendOptions ready_options = on;
  ready_options.imma_matvec = true;
  BackendOptions apart_options = ready_options;
  apart_options.imma_ready_pieces = false;
  auto ready = make_backend("cuda", ready_options), apart = make_backend("cuda", apart_options);
  if (!cuda_imma_matvec_available(*ready)) return;
  for (Backend* b : {ready.get(), apart.get()}) {  // producers cut once an integer product has run
    Twin w = twin_random(DType::hfq4_g256, {16, 256}), x = twin_random(DType::f32, {1, 256});
    Twin out = twin_output(DType::f32, {1, 16});
    b->matmul(out.gpu, x.gpu, w.gpu);
  }
  for (int64_t cols : {5376, 2816, 2112}) {
    const std::string what = "pieces cols=" + std::to_string(cols);
    Twin x = twin_random(DType::f32, {1, cols}, 3.0f), gain = twin_random(DType::bf16, {cols});
    Twin norm_gain = twin_random(DType::bf16, {cols}), h_start = twin_random(DType::f32, {1, cols}, 2.0f);
    Twin w = twin_random(cols % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128, {300, cols}, 0.5f);
    std::vector<uint8_t> product[2];
    int64_t pieces[2], clusters[2];
    for (int i = 0; i < 2; ++i) {
      Backend& b = i == 0 ? *ready : *apart;
      Twin h = twin_bytes(DType::f32, {1, cols}, h_start.host.data());
      Twin normed = twin_output(DType::f32, {1, cols}), out = twin_output(DType::f32, {1, 300});
      const ResidualTerm term[] = {{x.gpu, &gain.gpu, NormGain::weight, true}};
      const StreamNorm norm[] = {{normed.gpu, &norm_gain.gpu, NormGain::one_plus_weight, 1.0f}};
      ResidualUpdate u;
      u.terms = term;
      u.norms = norm;
      u.eps = 1e-6f;
      const int64_t pieces_before = cuda_imma_pieces_launches(), clusters_before = cuda_cluster_update_launches();
      b.residual_update(h.gpu, u);
      b.matmul(out.gpu, normed.gpu, w.gpu);
      b.synchronize();
      pieces[i] = cuda_imma_pieces_launches() - pieces_before;
      clusters[i] = cuda_cluster_update_launches() - clusters_before;
      product[i] = gpu_bytes(out);
    }
    EXPECT_EQ(clusters[0], 1) << what;
    EXPECT_EQ(clusters[1], 1) << what;
    EXPECT_EQ(pieces[0], 0) << what << ": the product cut its own pieces";
    EXPECT_EQ(pieces[1], 1) << what;
    EXPECT_EQ(product[0], product[1]) << what << ": the cluster's pieces against the product's own";
  }
}

// q, k and v head norms in one launch (Gemma 4: q and k with gain and RoPE, v without gain)
// against the CPU's rms_norm_rope / rms_norm one by one.
TEST_F(CudaOps, RmsNormRopeGroupMatchesThePartsOneByOne) {
  for (int64_t D : {256, 512})
    for (int64_t T : {1, 4}) {
      const int64_t half = D / 2;
      std::vector<float> freq(half);
      for (int64_t i = 0; i < half; ++i) freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / D);
      Twin inv = twin_bytes(DType::f32, {half}, freq.data());
      Twin pos = twin_positions(777 + T, T);
      Twin q = twin_random(DType::f32, {T, 16, D}, 3.0f), k = twin_random(DType::f32, {T, D == 512 ? 2 : 8, D}, 3.0f);
      Twin v = twin_random(DType::f32, {T, D == 512 ? 2 : 8, D}, 3.0f);
      Twin qw = twin_random(DType::bf16, {D}), kw = twin_random(DType::f32, {D});
      for (bool gpu : {false, true}) {
        Backend& b = gpu ? *gpu_ : *cpu_;
        const HeadNorm parts[] = {{gpu ? q.gpu : q.cpu, gpu ? &qw.gpu : &qw.cpu, NormGain::weight, true},
                                  {gpu ? k.gpu : k.cpu, gpu ? &kw.gpu : &kw.cpu, NormGain::one_plus_weight, true},
                                  {gpu ? v.gpu : v.cpu, nullptr, NormGain::none, false}};
        b.rms_norm_rope_group(parts, 1e-6f, gpu ? pos.gpu : pos.cpu, gpu ? inv.gpu : inv.cpu);
      }
      const std::string what = "rms_norm_rope_group D=" + std::to_string(D) + " T=" + std::to_string(T);
      expect_close(q, kSumBudget + kUlpBudget * 8, what + " (q)");
      expect_close(k, kSumBudget + kUlpBudget * 8, what + " (k)");
      expect_close(v, kSumBudget, what + " (v)");
    }
  // A part read from a strided source (Qwen3.5's query halves of [T, heads, 2D] query/gate rows)
  // into its own rows, with partial RoPE (32 of 128 pairs), beside a part normed in place.
  for (int64_t T : {1, 3}) {
    const int64_t D = 256, half = 32;
    std::vector<float> freq(half);
    for (int64_t i = 0; i < half; ++i) freq[i] = 1.0f / std::pow(1e7f, static_cast<float>(2 * i) / 64);
    Twin inv = twin_bytes(DType::f32, {half}, freq.data());
    Twin pos = twin_positions(4000 + T, T);
    Twin query_gate = twin_random(DType::f32, {T, 16, 2 * D}, 3.0f), k = twin_random(DType::f32, {T, 4, D}, 3.0f);
    Twin q = twin_output(DType::f32, {T, 16, D});
    Twin qw = twin_random(DType::bf16, {D}, 0.2f), kw = twin_random(DType::bf16, {D}, 0.2f);
    for (bool gpu : {false, true}) {
      Backend& b = gpu ? *gpu_ : *cpu_;
      const Tensor query = (gpu ? query_gate.gpu : query_gate.cpu).narrow(2, 0, D);
      const HeadNorm parts[] = {{gpu ? q.gpu : q.cpu, gpu ? &qw.gpu : &qw.cpu, NormGain::one_plus_weight, true, &query},
                                {gpu ? k.gpu : k.cpu, gpu ? &kw.gpu : &kw.cpu, NormGain::one_plus_weight, true}};
      b.rms_norm_rope_group(parts, 1e-6f, gpu ? pos.gpu : pos.cpu, gpu ? inv.gpu : inv.cpu);
    }
    const std::string what = "rms_norm_rope_group from a source, T=" + std::to_string(T);
    expect_close(q, kSumBudget + kUlpBudget * 8, what + " (q)");
    expect_close(k, kSumBudget + kUlpBudget * 8, what + " (k)");
    expect_identical(query_gate, what + ": the source is left as it was");
  }
  Twin a = twin_random(DType::f32, {2, 4, 64}), b = twin_random(DType::f32, {3, 4, 64});
  Twin inv = twin_random(DType::f32, {32}), pos = twin_positions(0, 2);
  const HeadNorm mismatched[] = {{a.gpu, nullptr, NormGain::none, false}, {b.gpu, nullptr, NormGain::none, false}};
  EXPECT_ERROR_HAS(gpu_->rms_norm_rope_group(mismatched, 1e-6f, pos.gpu, inv.gpu), "tokens");
}

TEST_F(CudaOps, RopeStandardProportionalAndPartial) {
  for (int64_t D : {16, 256, 512})
    for (int64_t half : {D / 2, D / 8})  // full span, or a partial rotated span (Qwen: 64 of 256)
      for (bool proportional : {false, true}) {
        std::vector<float> freq(half, 0.0f);
        const int64_t rotated = proportional ? half / 4 : half;  // Gemma full layers: zeros after 25%
        for (int64_t i = 0; i < rotated; ++i) freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / D);
        Twin inv = twin_bytes(DType::f32, {half}, freq.data());
        for (int64_t T : {1, 3, 17}) {
          Twin x = twin_random(DType::f32, {T, 4, D});
          Twin pos = twin_positions(1000 + 7 * T, T);
          cpu_->rope(x.cpu, pos.cpu, inv.cpu);
          gpu_->rope(x.gpu, pos.gpu, inv.gpu);
          expect_close(x, kUlpBudget * 8, "rope D=" + std::to_string(D) + " half=" + std::to_string(half));
        }
      }
}

TEST_F(CudaOps, EmbedScaleAddActivationsSoftcap) {
  for (DType type : kWeightTypes) {
    if (!has_quant_format(type)) continue;
    Twin table = twin_random(type, {300, 704});
    Twin ids = twin_ids({17}, 300);
    Twin out = twin_output(DType::f32, {17, 704});
    cpu_->embed(out.cpu, table.cpu, ids.cpu, 53.0f);
    gpu_->embed(out.gpu, table.gpu, ids.gpu, 53.0f);
    expect_close(out, 0.0f, std::string("embed ") + std::string(dtype_name(type)));
  }
  for (int64_t rows : {1, 3, 17}) {
    Twin a = twin_random(DType::f32, {rows, 2112}, 2.0f), b = twin_random(DType::f32, {rows, 2112}, 2.0f);
    Twin out = twin_output(DType::f32, {rows, 2112});
    cpu_->add(out.cpu, a.cpu, b.cpu);
    gpu_->add(out.gpu, a.gpu, b.gpu);
    expect_identical(out, "add");
    for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
      Twin o2 = twin_output(DType::f32, {rows, 2112});
      cpu_->gated_activation(o2.cpu, a.cpu, b.cpu, act);
      gpu_->gated_activation(o2.gpu, a.gpu, b.gpu, act);
      expect_close(o2, kUlpBudget * 4, "gated activation");
    }
    Twin s = twin_random(DType::bf16, {1});
    cpu_->scale(a.cpu, 0.125f);
    gpu_->scale(a.gpu, 0.125f);
    cpu_->scale_by(a.cpu, s.cpu);
    gpu_->scale_by(a.gpu, s.gpu);
    expect_identical(a, "scale and scale_by");
    Twin l = twin_random(DType::f32, {rows, 512}, 40.0f);
    cpu_->softcap(l.cpu, 30.0f);
    gpu_->softcap(l.gpu, 30.0f);
    expect_close(l, kUlpBudget * 4, "softcap");
    Twin top = twin_output(DType::i32, {rows});
    cpu_->argmax(top.cpu, l.cpu);
    gpu_->argmax(top.gpu, l.gpu);
    expect_identical(top, "argmax");
  }
}

// TensorCorePrecision::bf16 (backend.h), on a second GPU backend made with it: the tensor-core
// products of many tokens take each activation rounded to bf16 once. Budgets:
// - dense GEMM: the CPU's f32 product of the rounded inputs (the HFQ4 min term sums the rounded
//   inputs too, matmul_mma.cu), so the f32 path's budget holds; and the bits differ from the f32
//   path's (the option reached the kernel).
// - grouped experts: the rounded x into gate_up as on the CPU; the activations entering down are
//   rounded on the GPU alone, each by <= 2^-9 relative, which moves an output by ~1e-3 of the
//   largest on these shapes: 1e-2 of it still fails a wrong expert or scale (errors of order 1).
// - prefill attention: q, k, v rounded on both sides; P is rounded on the GPU alone, and
//   |sum_j (bf16(P_j) - P_j) V_j| / sum_j P_j <= 2^-9 max |V|: budget 2^-8 max |V|. A Q8_0 cache
//   adds the cached rows of a tile shared with fresh rows, dequantised and then rounded (an S
//   error of up to 2^-9 sum |q k| scale): 1e-2 max |V| there.
// - one sequence's decode (a single input; the decode attention kernel) is f32 in both: the same
//   bits as the f32 backend.
TEST_F(CudaOps, Bf16TensorCoresMultiplyRoundedInputs) {
  BackendOptions options;
  options.tensor_core_precision = TensorCorePrecision::bf16;
  auto bf16 = make_backend("cuda", options);
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128, DType::q8_0})
    for (int64_t T : {1, 16, 65, 200})
      for (int64_t K : {176, 704, 2816}) {
        const int64_t M = 300;
        const std::string what = std::string("bf16 GEMM ") + std::string(dtype_name(type)) + " T=" + std::to_string(T) +
                                 " K=" + std::to_string(K);
        Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {T, K});
        Twin out = twin_output(DType::f32, {T, M});
        HostBuffer rounded;
        bf16->matmul(out.gpu, x.gpu, w.gpu);
        bf16->synchronize();
        const std::vector<uint8_t> got = gpu_bytes(out);
        gpu_->matmul(out.gpu, x.gpu, w.gpu);
        const std::vector<uint8_t> exact = gpu_bytes(out);
        if (T == 1) {
          EXPECT_EQ(got, exact) << what << ": one input's matvec must not depend on the precision";
          continue;
        }
        EXPECT_NE(got, exact) << what << ": bf16 and f32 precision gave the same bits";
        gpu_->copy_to_device(out.gpu, got.data());
        cpu_->matmul(out.cpu, rounded_to_bf16(x, rounded), w.cpu);
        expect_close(out, dot_budget(K), what);
      }

  // Enough row tiles for the 128-input tiles without a K split (more tiles than SMs: 65 x 3
  // blocks), a partial last tile in both directions and a partial last group; on the Hopper kernel
  // (where it runs: an H200) and on mma.sync.
  for (bool hopper : {true, false})
    for (DType type : {DType::hfq4_g256, DType::hfq4_g128}) {
      cuda_allow_hopper_gemm(hopper);
      const int64_t T = 257, M = 8300, K = 352;
      const std::string what = std::string("bf16 GEMM, 128-input tiles, ") + std::string(dtype_name(type)) +
                               (hopper ? "" : ", mma.sync kernel");
      Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {T, K});
      Twin out = twin_output(DType::f32, {T, M});
      HostBuffer rounded;
      bf16->matmul(out.gpu, x.gpu, w.gpu);
      bf16->synchronize();
      cpu_->matmul(out.cpu, rounded_to_bf16(x, rounded), w.cpu);
      expect_close(out, dot_budget(K), what);
      if (hopper && cuda_hopper_gemm_active(*bf16)) {  // the same product on mma.sync
        const std::vector<uint8_t> on_hopper = gpu_bytes(out);
        cuda_allow_hopper_gemm(false);
        bf16->matmul(out.gpu, x.gpu, w.gpu);
        bf16->synchronize();
        cuda_allow_hopper_gemm(true);
        // Both sum each group's k-steps in the same order and fold it alike: the same bits.
        EXPECT_EQ(on_hopper, gpu_bytes(out)) << what << ": the Hopper and mma.sync kernels differ";
      }
    }
  cuda_allow_hopper_gemm(true);

  // 64 and 512 tokens over 128 experts: 16- and 64-pair work items (4 and 32 pairs per expert);
  // 517 tokens over 8 experts: 517 pairs each, eight full 64-pair items and a partial one.
  struct ExpertCase {
    int64_t T, E;
  };
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (const ExpertCase c : {ExpertCase{64, 128}, ExpertCase{512, 128}, ExpertCase{517, 8}}) {
      const int64_t T = c.T;
      RoutedExperts e = routed_experts(type, T, false, c.E);
      Twin &x = e.x, &out = e.out, &gate_up = e.gate_up, &down = e.down, &ids = e.ids, &w = e.w;
      HostBuffer rounded;
      cpu_->moe_experts(out.cpu, rounded_to_bf16(x, rounded), gate_up.cpu, down.cpu, ids.cpu, w.cpu,
                        Activation::gelu_tanh);
      const std::string what = std::string("bf16 grouped moe_experts ") + std::string(dtype_name(type)) +
                               " T=" + std::to_string(T) + " E=" + std::to_string(c.E);
      bf16->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
      bf16->synchronize();
      expect_close(out, 1e-2f, what);
      const std::vector<uint8_t> got = gpu_bytes(out);
      // BackendOptions::hopper_expert_gemm: the 64-pair items on the wgmma kernel, their pairs
      // gathered into tiles first (the 16-pair items of T = 64 stay on the pipelined kernel). The
      // two kernels sum and fold alike: the same bits.
      if (cuda_hopper_gemm_active(*bf16)) {
        BackendOptions hopper_options = options;
        hopper_options.hopper_expert_gemm = true;
        auto hopper = make_backend("cuda", hopper_options);
        const int64_t launches = cuda_hopper_expert_gemm_launches();
        hopper->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
        hopper->synchronize();
        EXPECT_EQ(got, gpu_bytes(out)) << what << ": the Hopper expert GEMM differs from the pipelined kernel";
        // 64-pair items (all but T = 64's 16-pair ones) took it: gate_up and down
        EXPECT_EQ(cuda_hopper_expert_gemm_launches() - launches, T == 64 ? 0 : 2) << what;
      }
      gpu_->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
      EXPECT_NE(got, gpu_bytes(out)) << what << ": bf16 and f32 precision gave the same bits";
    }

  struct Case {
    int64_t D;
    int n_heads, n_kv, window;
    int64_t past, T;
  };
  // Prefill-sized steps as in AttentionAndKvWriteAcrossRingRollovers, on the bf16 kernel
  // (attention_flash_bf16.cu): windows inside a step and across a cached prefix in a ring, D =
  // 512 (two warps per row group), 256, 128, 80, 64 and 16, partial 64-row blocks, several key
  // tiles; and one decode row of the group kernel.
  const Case cases[] = {{256, 16, 8, 64, 0, 100}, {256, 16, 8, 1024, 1000, 70}, {512, 16, 2, 0, 0, 130},
                        {512, 8, 2, 0, 45, 40},   {128, 8, 2, 0, 5, 64},        {80, 4, 4, 16, 20, 31},
                        {64, 8, 2, 0, 300, 200},  {16, 4, 1, 8, 37, 17},        {512, 16, 2, 0, 700, 1}};
  for (DType cache_type : {DType::f32, DType::bf16, DType::q8_0})
    for (const Case& c : cases) {
      const int64_t rows = c.window > 0 ? c.window : c.past + c.T;
      SCOPED_TRACE(std::string("bf16 attention, cache ") + std::string(dtype_name(cache_type)) +
                   " D=" + std::to_string(c.D) + " window=" + std::to_string(c.window) +
                   " past=" + std::to_string(c.past) + " T=" + std::to_string(c.T));
      auto [kc, vc] = zeroed_caches(cache_type, rows, c.n_kv, c.D);
      KvView cpu_cache{kc.cpu, vc.cpu}, gpu_cache{kc.gpu, vc.gpu};
      // The history: rounded on the CPU side where the GPU rounds what it reads back (f32, bf16
      // caches); a Q8_0 cache holds the same codes on both sides.
      const bool round_history = cache_type != DType::q8_0;
      float max_v = 0.0f;
      for (int64_t at = 0; at < c.past;) {
        const int64_t n = std::min<int64_t>(29, c.past - at);
        Twin k = twin_random(DType::f32, {n, c.n_kv, c.D}), v = twin_random(DType::f32, {n, c.n_kv, c.D});
        Twin pos = twin_positions(at, n);
        HostBuffer rk, rv;
        cpu_->kv_write(cpu_cache, round_history ? rounded_to_bf16(k, rk) : k.cpu,
                       round_history ? rounded_to_bf16(v, rv) : v.cpu, pos.cpu);
        gpu_->kv_write(gpu_cache, k.gpu, v.gpu, pos.gpu);
        max_v = std::max(max_v, max_abs(v));
        at += n;
      }
      Twin q = twin_random(DType::f32, {c.T, c.n_heads, c.D});
      Twin k = twin_random(DType::f32, {c.T, c.n_kv, c.D}), v = twin_random(DType::f32, {c.T, c.n_kv, c.D});
      max_v = std::max(max_v, max_abs(v));
      Twin pos = twin_positions(c.past, c.T);
      Twin out = twin_output(DType::f32, {c.T, c.n_heads, c.D});
      AttentionParams p{c.n_heads, c.n_kv, static_cast<int>(c.D), 1.0f / std::sqrt(static_cast<float>(c.D)), c.window};
      bf16->set_profiling(true);
      bf16->attention(out.gpu, q.gpu, k.gpu, v.gpu, gpu_cache, pos.gpu, p);
      bf16->set_profiling(false);
      bf16->synchronize();
      const std::vector<OpProfile> profile = bf16->take_profile();
      const std::vector<uint8_t> got = gpu_bytes(out);
      gpu_->attention(out.gpu, q.gpu, k.gpu, v.gpu, gpu_cache, pos.gpu, p);
      const std::vector<uint8_t> exact = gpu_bytes(out);
      if (c.T == 1) {
        EXPECT_EQ(got, exact) << "one decode row must not depend on the precision";
        continue;
      }
      // The bf16 kernel ran where the device fits it (D = 512 needs Hopper's shared memory): its
      // gather and itself, where attention_mma.cu's is one kernel; and other bits than the f32
      // path's.
      // (D = 512 takes 201 KiB of shared memory per block: Hopper's 227 KiB hold it, an A100's
      // 163 KiB do not.) The op profile counts 2 kernels (the gather and the kernel) where the
      // backend gave the bf16 kernel its scratch, which is what launch_flash_attention runs it on.
      const bool bf16_kernel = cuda_bf16_prompt_attention_applies(*bf16, c.T, static_cast<int>(c.D));
      const bool fits = c.D < 512 || cuda_max_block_shared_memory(*bf16) >= 201 * 1024;
      EXPECT_EQ(bf16_kernel, fits) << "the bf16 prompt kernel's shapes";
      ASSERT_EQ(profile.size(), 1u);
      EXPECT_EQ(profile[0].kernels, bf16_kernel ? 2 : 1);
      EXPECT_NE(got, exact) << "bf16 and f32 precision gave the same bits";
      gpu_->copy_to_device(out.gpu, got.data());
      HostBuffer rq, rk, rv;
      cpu_->attention(out.cpu, rounded_to_bf16(q, rq), rounded_to_bf16(k, rk), rounded_to_bf16(v, rv), cpu_cache,
                      pos.cpu, p);
      expect_close(out, cache_type == DType::q8_0 ? 1e-2f : 1.0f / 256.0f, "attention", max_v);
    }
}

// Columns [col0, col0 + heads * dim) of [T, width] rows as a strided [T, heads, dim] view, as the
// Qwen3.5 model cuts q, k and v out of the convolved projection.
Tensor head_view(const Tensor& rows, int64_t col0, int64_t heads, int64_t dim) {
  Tensor out = rows.narrow(1, col0, heads * dim);
  out.ndim = 3;
  out.shape = {rows.shape[0], heads, dim, 0};
  out.stride = {rows.stride[0], dim * 4, 4, 0};
  return out;
}

// Gated DeltaNet (Qwen3.5). The conv sums the same products in the same order on both sides
// (only silu's exp differs by an ulp) and moves its window bit for bit. The delta rule sums dk
// products per column in a different order (lane groups, then shuffles) and contracts the state
// update into FMAs, token after token: its budget is kSumBudget twice over. The chunked form
// runs the CPU's chunked algorithm where its tiles fit (head sizes up to 128, chunks up to 64:
// here chunks of 64, and of 5, whose T = 130 and 250 take several slabs of 16 chunks), else the
// recurrence; either way it gets the budget the CPU tests give the two forms against each other
// (2e-5 of max(1, |ref|), linear_attention_test).
TEST_F(CudaOps, LinearAttentionOpsMatchTheCpu) {
  // ---- causal conv: a strided x, a window carried across two calls, several weight formats ----
  for (DType type : kWeightTypes) {
    if (!has_quant_format(type)) continue;
    for (int64_t K : {4, 3})
      for (auto [T1, T2] : {std::pair<int64_t, int64_t>{3, 1}, {1, 1}, {70, 130}, {2, 70}}) {
        const int64_t C = 709;
        SCOPED_TRACE(std::string(dtype_name(type)) + " K=" + std::to_string(K) + " T=" + std::to_string(T1) + "+" +
                     std::to_string(T2));
        Twin w = twin_random(type, {C, K}, 0.5f);
        Twin state = twin_random(DType::f32, {K - 1, C});  // a warm window, as mid-sequence
        for (int64_t T : {T1, T2}) {
          Twin x = twin_random(DType::f32, {T, C + 13}, 2.0f);
          Twin out = twin_output(DType::f32, {T, C});
          cpu_->causal_conv1d(out.cpu, x.cpu.narrow(1, 5, C), w.cpu, state.cpu, Activation::silu);
          gpu_->causal_conv1d(out.gpu, x.gpu.narrow(1, 5, C), w.gpu, state.gpu, Activation::silu);
          expect_close(out, kUlpBudget * 4, "causal_conv1d out");
          expect_identical(state, "causal_conv1d state");
        }
      }
  }

  // ---- gates: a_log / dt_bias as f32 and bf16, out of place and in place ----
  for (DType type : {DType::f32, DType::bf16})
    for (int64_t T : {1, 3, 70}) {
      const int64_t nV = 48;
      Twin a_log = twin_random(type, {nV}), dt_bias = twin_random(type, {nV});
      Twin a = twin_random(DType::f32, {T, nV}, 8.0f), b = twin_random(DType::f32, {T, nV}, 4.0f);  // a + dt > 20 too
      Twin g = twin_output(DType::f32, {T, nV}), beta = twin_output(DType::f32, {T, nV});
      cpu_->delta_rule_gates(g.cpu, beta.cpu, a.cpu, b.cpu, a_log.cpu, dt_bias.cpu);
      gpu_->delta_rule_gates(g.gpu, beta.gpu, a.gpu, b.gpu, a_log.gpu, dt_bias.gpu);
      expect_close(g, kUlpBudget * 8, "delta_rule_gates g " + std::string(dtype_name(type)));
      expect_close(beta, kUlpBudget * 4, "delta_rule_gates beta");
      cpu_->delta_rule_gates(a.cpu, b.cpu, a.cpu, b.cpu, a_log.cpu, dt_bias.cpu);
      gpu_->delta_rule_gates(a.gpu, b.gpu, a.gpu, b.gpu, a_log.gpu, dt_bias.gpu);
      expect_close(a, kUlpBudget * 8, "delta_rule_gates g in place");
      expect_close(b, kUlpBudget * 4, "delta_rule_gates beta in place");
    }

  // ---- the delta rule: q, k, v cut from one fused row, a warm state, both forms ----
  struct Case {
    int64_t nK, nV, dk, dv;
  };
  // Qwen3.5's head sizes; odd small ones; a dk that needs 8 threads per column (and is past the
  // chunked kernels' 128: the recurrence); dk = 30 (the chunked tiles pad it to 32) with dv = 40
  // (a whole and a part tile of 32 state columns); the fixtures' dk = 16 with a prompt of 250
  // tokens (its stages stay at 32 tokens: shared memory under 48 KB)
  for (const Case& c :
       {Case{2, 4, 128, 128}, Case{1, 3, 36, 21}, Case{2, 6, 200, 40}, Case{1, 2, 30, 40}, Case{1, 2, 16, 16}})
    for (int64_t T : {1, 3, 70, 130, 250}) {
      if (T == 250 && c.dk != 16) continue;
      const int64_t width = 2 * c.nK * c.dk + c.nV * c.dv + 7;  // 7 spare columns: rows are not packed
      std::uniform_real_distribution<float> decay(-2.5f, -0.005f), strength(0.0f, 1.0f);
      std::vector<float> g_host(T * c.nV), beta_host(T * c.nV);
      for (float& v : g_host) v = decay(rng_);
      for (float& v : beta_host) v = strength(rng_);
      Twin qkv = twin_random(DType::f32, {T, width});
      Twin g = twin_bytes(DType::f32, {T, c.nV}, g_host.data()), beta = twin_bytes(DType::f32, {T, c.nV}, beta_host.data());
      DeltaRuleParams p;
      p.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
      for (int chunk : {0, 64, 5}) {  // 0: the recurrence
        const bool chunked = chunk > 0;
        if (chunked) p.chunk = chunk;
        SCOPED_TRACE("nK=" + std::to_string(c.nK) + " nV=" + std::to_string(c.nV) + " dk=" + std::to_string(c.dk) +
                     " dv=" + std::to_string(c.dv) + " T=" + std::to_string(T) +
                     (chunked ? " chunked by " + std::to_string(chunk) : " recurrent"));
        Twin state = twin_random(DType::f32, {c.nV, c.dk, c.dv}, 0.3f);
        Twin out = twin_output(DType::f32, {T, c.nV, c.dv});
        auto run = [&](Backend& backend, const Tensor& rows, Tensor o, Tensor s, const Tensor& gt, const Tensor& bt) {
          const Tensor q = head_view(rows, 1, c.nK, c.dk), k = head_view(rows, 1 + c.nK * c.dk, c.nK, c.dk),
                       v = head_view(rows, 1 + 2 * c.nK * c.dk, c.nV, c.dv);
          if (chunked)
            backend.gated_delta_rule_chunked(o, q, k, v, gt, bt, s, p);
          else
            backend.gated_delta_rule(o, q, k, v, gt, bt, s, p);
        };
        run(*cpu_, qkv.cpu, out.cpu, state.cpu, g.cpu, beta.cpu);
        gpu_->set_profiling(true);
        run(*gpu_, qkv.gpu, out.gpu, state.gpu, g.gpu, beta.gpu);
        gpu_->set_profiling(false);
        const std::vector<OpProfile> profile = gpu_->take_profile();
        ASSERT_EQ(profile.size(), 1u);
        // The chunked kernels (2 per slab of 16 chunks) where they apply and T > 1, else the one
        // recurrent launch: the form under test is the one that ran.
        const bool chunked_kernels = chunked && T > 1 && c.dk <= 128 && c.dv <= 128;
        const int64_t chunks = chunked ? (T + chunk - 1) / chunk : 0;
        EXPECT_EQ(profile[0].kernels, chunked_kernels ? 2 * ((chunks + 15) / 16) : 1);
        if (chunked) {
          expect_close(out, 2e-5f, "gated_delta_rule_chunked out", 1.0f);
          expect_close(state, 2e-5f, "gated_delta_rule_chunked state", 1.0f);
        } else {
          expect_close(out, 2 * kSumBudget, "gated_delta_rule out");
          expect_close(state, 2 * kSumBudget, "gated_delta_rule state");
        }
      }
    }

  // ---- batched decode: the rows forms (one launch for B sequences of one row each, each on its
  // own states) must give every row what the one-row calls give it on the GPU, byte for byte,
  // and stay within the budget of the CPU's ----
  {
    const int64_t B = 5, C = 709, K = 4;
    const Case c{2, 4, 128, 128};
    const int64_t width = 2 * c.nK * c.dk + c.nV * c.dv;
    Twin w = twin_random(DType::bf16, {C, K}, 0.5f), x = twin_random(DType::f32, {B, C}, 2.0f);
    Twin qkv = twin_random(DType::f32, {B, width}), g = twin_random(DType::f32, {B, c.nV}, 0.5f);
    Twin beta = twin_random(DType::f32, {B, c.nV}, 0.5f);
    std::vector<Twin> conv_rows, conv_alone, delta_rows, delta_alone;
    for (int64_t i = 0; i < B; ++i) {
      conv_rows.push_back(twin_random(DType::f32, {K - 1, C}));
      conv_alone.push_back(twin_bytes(DType::f32, {K - 1, C}, conv_rows.back().host.data()));
      delta_rows.push_back(twin_random(DType::f32, {c.nV, c.dk, c.dv}, 0.3f));
      delta_alone.push_back(twin_bytes(DType::f32, {c.nV, c.dk, c.dv}, delta_rows.back().host.data()));
    }
    Twin conv_out = twin_output(DType::f32, {B, C}), conv_out_alone = twin_output(DType::f32, {B, C});
    Twin core = twin_output(DType::f32, {B, c.nV, c.dv}), core_alone = twin_output(DType::f32, {B, c.nV, c.dv});
    DeltaRuleParams p;
    p.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
    for (bool gpu : {false, true}) {
      Backend& backend = gpu ? *gpu_ : *cpu_;
      std::vector<Tensor> conv_states, delta_states;
      for (int64_t i = 0; i < B; ++i) {
        conv_states.push_back(gpu ? conv_rows[i].gpu : conv_rows[i].cpu);
        delta_states.push_back(gpu ? delta_rows[i].gpu : delta_rows[i].cpu);
      }
      const Tensor rows = gpu ? qkv.gpu : qkv.cpu;
      backend.causal_conv1d_rows(gpu ? conv_out.gpu : conv_out.cpu, gpu ? x.gpu : x.cpu, gpu ? w.gpu : w.cpu,
                                 conv_states, Activation::silu);
      backend.gated_delta_rule_rows(gpu ? core.gpu : core.cpu, head_view(rows, 0, c.nK, c.dk),
                                    head_view(rows, c.nK * c.dk, c.nK, c.dk),
                                    head_view(rows, 2 * c.nK * c.dk, c.nV, c.dv), gpu ? g.gpu : g.cpu,
                                    gpu ? beta.gpu : beta.cpu, delta_states, p);
    }
    for (int64_t i = 0; i < B; ++i) {  // the GPU one row at a time, on the copies of the states
      gpu_->causal_conv1d(conv_out_alone.gpu.slice(i, i + 1), x.gpu.slice(i, i + 1), w.gpu, conv_alone[i].gpu,
                          Activation::silu);
      const Tensor rows = qkv.gpu.slice(i, i + 1);
      gpu_->gated_delta_rule(core_alone.gpu.slice(i, i + 1), head_view(rows, 0, c.nK, c.dk),
                             head_view(rows, c.nK * c.dk, c.nK, c.dk), head_view(rows, 2 * c.nK * c.dk, c.nV, c.dv),
                             g.gpu.slice(i, i + 1), beta.gpu.slice(i, i + 1), delta_alone[i].gpu, p);
    }
    auto same_bytes = [&](const Twin& a, const Twin& b, const std::string& what) {
      const std::vector<uint8_t> x_bytes = gpu_bytes(a), y_bytes = gpu_bytes(b);
      EXPECT_EQ(std::memcmp(x_bytes.data(), y_bytes.data(), x_bytes.size()), 0) << what << ": rows form != one by one";
    };
    same_bytes(conv_out, conv_out_alone, "causal_conv1d_rows out");
    same_bytes(core, core_alone, "gated_delta_rule_rows out");
    for (int64_t i = 0; i < B; ++i) {
      same_bytes(conv_rows[i], conv_alone[i], "causal_conv1d_rows state " + std::to_string(i));
      same_bytes(delta_rows[i], delta_alone[i], "gated_delta_rule_rows state " + std::to_string(i));
      expect_identical(conv_rows[i], "causal_conv1d_rows state vs the CPU");
      expect_close(delta_rows[i], 2 * kSumBudget, "gated_delta_rule_rows state vs the CPU");
    }
    expect_close(conv_out, kUlpBudget * 4, "causal_conv1d_rows out vs the CPU");
    expect_close(core, 2 * kSumBudget, "gated_delta_rule_rows out vs the CPU");
    // Two rows on one state would race: refused.
    const Tensor shared_conv[] = {conv_rows[0].gpu, conv_rows[0].gpu};
    EXPECT_ERROR_HAS(
        gpu_->causal_conv1d_rows(conv_out.gpu.slice(0, 2), x.gpu.slice(0, 2), w.gpu, shared_conv, Activation::silu),
        "share one state");
  }

  // ---- sigmoid gate: elementwise with a strided gate (attention's query gate), and per row ----
  for (int64_t T : {1, 3, 70}) {
    const int64_t heads = 5, D = 96, H = 333;
    Twin x = twin_random(DType::f32, {T, heads, D}, 2.0f), query_gate = twin_random(DType::f32, {T, heads, 2 * D}, 3.0f);
    cpu_->sigmoid_gate(x.cpu, query_gate.cpu.narrow(2, D, D));
    gpu_->sigmoid_gate(x.gpu, query_gate.gpu.narrow(2, D, D));
    expect_close(x, kUlpBudget * 4, "sigmoid_gate [R, N]");
    Twin y = twin_random(DType::f32, {T, H}, 2.0f), row_gate = twin_random(DType::f32, {T, 3}, 3.0f);
    cpu_->sigmoid_gate(y.cpu, row_gate.cpu.narrow(1, 2, 1));
    gpu_->sigmoid_gate(y.gpu, row_gate.gpu.narrow(1, 2, 1));
    expect_close(y, kUlpBudget * 4, "sigmoid_gate [R, 1]");
  }
}

// A decode step's linear-attention ops recorded once as a CUDA graph and replayed: the kernels
// take no host synchronisation or allocation, and each replay advances the carried states.
TEST_F(CudaOps, LinearAttentionDecodeStepReplaysAsAGraph) {
  const int64_t nK = 2, nV = 4, dk = 128, dv = 128, K = 4, C = 2 * nK * dk + nV * dv;
  Twin qkv = twin_random(DType::f32, {1, C}, 2.0f), conv = twin_output(DType::f32, {1, C});
  Twin taps = twin_random(DType::bf16, {C, K}, 0.5f), window = twin_random(DType::f32, {K - 1, C});
  Twin a_log = twin_random(DType::bf16, {nV}), dt_bias = twin_random(DType::bf16, {nV});
  Twin state = twin_random(DType::f32, {nV, dk, dv}, 0.3f), out = twin_output(DType::f32, {1, nV, dv});
  Twin ab = twin_random(DType::f32, {1, 2 * nV}), gates = twin_output(DType::f32, {1, 2 * nV});
  Twin head_gate = twin_random(DType::f32, {nV, 1});
  DeltaRuleParams p;
  p.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  auto body = [&](Backend& b, const Tensor& x, Tensor y, const Tensor& w, Tensor win, const Tensor& al,
                  const Tensor& dt, Tensor s, Tensor o, const Tensor& ab_in, Tensor gb, const Tensor& hg) {
    b.causal_conv1d(y, x, w, win, Activation::silu);
    Tensor g = gb.narrow(1, 0, nV), beta = gb.narrow(1, nV, nV);
    b.delta_rule_gates(g, beta, ab_in.narrow(1, 0, nV), ab_in.narrow(1, nV, nV), al, dt);
    b.gated_delta_rule(o, head_view(y, 0, nK, dk), head_view(y, nK * dk, nK, dk), head_view(y, 2 * nK * dk, nV, dv),
                       g, beta, s, p);
    b.sigmoid_gate(o.reshape({nV, dv}), hg);
  };
  std::unique_ptr<CapturedSteps> graph = gpu_->capture([&] {
    body(*gpu_, qkv.gpu, conv.gpu, taps.gpu, window.gpu, a_log.gpu, dt_bias.gpu, state.gpu, out.gpu, ab.gpu, gates.gpu,
         head_gate.gpu);
  });
  for (int replay = 0; replay < 2; ++replay) {
    body(*cpu_, qkv.cpu, conv.cpu, taps.cpu, window.cpu, a_log.cpu, dt_bias.cpu, state.cpu, out.cpu, ab.cpu, gates.cpu,
         head_gate.cpu);
    graph->replay();
  }
  gpu_->synchronize();
  expect_identical(window, "conv window after two replays");
  expect_close(conv, kUlpBudget * 4, "conv");
  expect_close(gates, kUlpBudget * 8, "gates");
  expect_close(state, 2 * kSumBudget, "delta rule state after two replays");
  expect_close(out, 2 * kSumBudget, "gated output");
}

// Backend::gated_delta_net_rows, decode's whole Gated DeltaNet step: with
// BackendOptions::fused_delta_net on an sm_90 GPU one launch (a cluster per key head), off the
// default's six kernels; both against the CPU's default over three steps in a row (the states
// carried). Shapes: Qwen3.5-4B's heads (2 value heads per key head, dv 128: 8 blocks of 32
// columns) with one and three sequences; 3 value heads per key head (blocks of 64 columns); a key
// head per value head at dk = dv = 64 (16-column blocks); odd sizes (dk 36, dv 21: part tiles).
// Taps bf16, f32 and Q8_0; qkv a strided view. dk = 200 is declined (the default runs: the
// fused counter unmoved, the numbers within budget all the same). The conv window moves bit for
// bit; the delta rule keeps its op's budget; the output adds the norm's sum order on top. Then
// the pieces it cuts for out_proj (below), and one sequence's step captured as a graph and
// replayed twice: the same as eager calls.
TEST_F(CudaOps, FusedDeltaNetStepMatchesTheOps) {
  BackendOptions on, off;
  on.fused_delta_net = true;
  off.fused_delta_net = false;
  auto fused = make_backend("cuda", on), separate = make_backend("cuda", off);
  const bool available = cuda_delta_net_step_available(*fused);
  struct Case {
    int64_t nK, nV, dk, dv, rows;
    DType taps;
  };
  const Case cases[] = {{16, 32, 128, 128, 1, DType::bf16}, {16, 32, 128, 128, 3, DType::f32},
                        {2, 6, 128, 128, 1, DType::bf16},   {4, 4, 64, 64, 2, DType::q8_0},
                        {1, 3, 36, 21, 1, DType::f32},      {1, 2, 200, 40, 1, DType::bf16}};
  const int64_t K = 4;
  for (const Case& c : cases) {
    const int64_t R = c.rows, C = 2 * c.nK * c.dk + c.nV * c.dv;
    const bool fits = c.dk <= 128;
    SCOPED_TRACE("nK=" + std::to_string(c.nK) + " nV=" + std::to_string(c.nV) + " dk=" + std::to_string(c.dk) + " dv=" +
                 std::to_string(c.dv) + " rows=" + std::to_string(R) + " taps " + std::string(dtype_name(c.taps)));
    Twin taps = twin_random(c.taps, {C, K}, 0.5f), a_log = twin_random(DType::bf16, {c.nV});
    Twin dt_bias = twin_random(DType::bf16, {c.nV}), norm = twin_random(DType::bf16, {c.dv}, 0.5f);
    std::vector<Twin> conv_states, delta_states;  // [backend: fused, separate][row], the CPU's in each
    for (int64_t i = 0; i < 2 * R; ++i) {
      if (i < R) {
        conv_states.push_back(twin_random(DType::f32, {K - 1, C}));
        delta_states.push_back(twin_random(DType::f32, {c.nV, c.dk, c.dv}, 0.3f));
      } else {
        conv_states.push_back(twin_bytes(DType::f32, {K - 1, C}, conv_states[i - R].host.data()));
        delta_states.push_back(twin_bytes(DType::f32, {c.nV, c.dk, c.dv}, delta_states[i - R].host.data()));
      }
    }
    DeltaNetStep step;
    step.norm_eps = 1e-6f;
    step.rule.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
    for (int t = 0; t < 3; ++t) {
      Twin qkv = twin_random(DType::f32, {R, C + 9}, 2.0f), z = twin_random(DType::f32, {R, c.nV * c.dv}, 2.0f);
      Twin a_start = twin_random(DType::f32, {R, c.nV}, 8.0f), b_start = twin_random(DType::f32, {R, c.nV}, 4.0f);
      for (int which = 0; which < 2; ++which) {
        Backend& gpu = which == 0 ? *fused : *separate;
        Twin out = twin_output(DType::f32, {R, c.nV, c.dv}), conv = twin_output(DType::f32, {R, C});
        Twin a = twin_bytes(DType::f32, {R, c.nV}, a_start.host.data());
        Twin b = twin_bytes(DType::f32, {R, c.nV}, b_start.host.data());
        std::vector<Tensor> cpu_conv, cpu_delta, gpu_conv, gpu_delta;
        for (int64_t i = 0; i < R; ++i) {
          const Twin &cs = conv_states[which * R + i], &ds = delta_states[which * R + i];
          cpu_conv.push_back(cs.cpu), cpu_delta.push_back(ds.cpu), gpu_conv.push_back(cs.gpu),
              gpu_delta.push_back(ds.gpu);
        }
        auto run = [&](Backend& backend, bool on_gpu) {
          DeltaNetStep s = step;
          s.conv_taps = on_gpu ? &taps.gpu : &taps.cpu;
          s.a_log = on_gpu ? &a_log.gpu : &a_log.cpu;
          s.dt_bias = on_gpu ? &dt_bias.gpu : &dt_bias.cpu;
          s.norm = on_gpu ? &norm.gpu : &norm.cpu;
          backend.gated_delta_net_rows(on_gpu ? out.gpu : out.cpu, on_gpu ? conv.gpu : conv.cpu,
                                       (on_gpu ? qkv.gpu : qkv.cpu).narrow(1, 4, C), on_gpu ? z.gpu : z.cpu,
                                       on_gpu ? a.gpu : a.cpu, on_gpu ? b.gpu : b.cpu, on_gpu ? gpu_conv : cpu_conv,
                                       on_gpu ? gpu_delta : cpu_delta, s);
        };
        run(*cpu_, false);
        const int64_t before = cuda_delta_net_step_launches();
        run(gpu, true);
        gpu.synchronize();
        const std::string what = std::string(which == 0 ? "fused" : "separate") + " step " + std::to_string(t);
        EXPECT_EQ(cuda_delta_net_step_launches() - before, which == 0 && available && fits ? 1 : 0) << what;
        expect_close(out, 4 * kSumBudget, what + " out");
        for (int64_t i = 0; i < R; ++i) {
          expect_identical(conv_states[which * R + i], what + " conv state " + std::to_string(i));
          expect_close(delta_states[which * R + i], 2 * kSumBudget, what + " delta state " + std::to_string(i));
        }
      }
      // The delta rule is the separate kernel's arithmetic: the states' bytes agree.
      for (int64_t i = 0; i < R; ++i)
        EXPECT_EQ(gpu_bytes(delta_states[i]), gpu_bytes(delta_states[R + i]))
            << "step " << t << ": fused and separate delta state " << i << " differ";
    }
  }
  if (!available) GTEST_SKIP() << "checked the default only: no thread-block clusters (an sm_90 GPU, sm_90a code)";

  // Its pieces (the integer matvec on): out_proj right after the step takes them (no pieces
  // launch) and gives the bytes of a product that cuts its own from the step's output. A key
  // head's value heads as one G256 group (the 4B's heads) and one G128 group (6 x 64 columns, so
  // G128 weights); 8 x 64 columns are G256 weights over two key heads: not cut, the product cuts.
  BackendOptions ready_options = on;
  ready_options.imma_matvec = true;
  BackendOptions apart_options = ready_options;
  apart_options.imma_ready_pieces = false;
  auto ready = make_backend("cuda", ready_options), apart = make_backend("cuda", apart_options);
  if (cuda_imma_matvec_available(*ready)) {
    for (Backend* b : {ready.get(), apart.get()}) {  // producers cut once an integer product has run
      Twin w = twin_random(DType::hfq4_g256, {16, 256}), x = twin_random(DType::f32, {1, 256});
      Twin out = twin_output(DType::f32, {1, 16});
      b->matmul(out.gpu, x.gpu, w.gpu);
    }
    struct PiecesCase {
      int64_t nK, nV, dk, dv;
      bool cut;
    };
    for (const PiecesCase& c :
         {PiecesCase{16, 32, 128, 128, true}, PiecesCase{3, 6, 64, 64, true}, PiecesCase{4, 8, 64, 64, false}}) {
      const int64_t C = 2 * c.nK * c.dk + c.nV * c.dv, width = c.nV * c.dv;
      const std::string what = "pieces nK=" + std::to_string(c.nK) + " nV=" + std::to_string(c.nV);
      Twin taps = twin_random(DType::bf16, {C, K}, 0.5f), a_log = twin_random(DType::bf16, {c.nV});
      Twin dt_bias = twin_random(DType::bf16, {c.nV}), norm = twin_random(DType::bf16, {c.dv}, 0.5f);
      Twin qkv = twin_random(DType::f32, {1, C}, 2.0f), z = twin_random(DType::f32, {1, width}, 2.0f);
      Twin ab = twin_random(DType::f32, {1, 2 * c.nV}, 4.0f), window = twin_random(DType::f32, {K - 1, C});
      Twin state = twin_random(DType::f32, {c.nV, c.dk, c.dv}, 0.3f);
      Twin w = twin_random(width % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128, {300, width}, 0.5f);
      DeltaNetStep s;
      s.conv_taps = &taps.gpu, s.a_log = &a_log.gpu, s.dt_bias = &dt_bias.gpu, s.norm = &norm.gpu;
      s.rule.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
      std::vector<uint8_t> product[2];
      int64_t pieces[2];
      for (int i = 0; i < 2; ++i) {
        Backend& b = i == 0 ? *ready : *apart;
        Twin win = twin_bytes(DType::f32, {K - 1, C}, window.host.data());
        Twin st = twin_bytes(DType::f32, {c.nV, c.dk, c.dv}, state.host.data());
        Twin scratch = twin_bytes(DType::f32, {1, 2 * c.nV}, ab.host.data());
        Twin core = twin_output(DType::f32, {1, c.nV, c.dv}), conv = twin_output(DType::f32, {1, C});
        Twin out = twin_output(DType::f32, {1, 300});
        const Tensor wins[] = {win.gpu}, sts[] = {st.gpu};
        const int64_t pieces_before = cuda_imma_pieces_launches(), steps_before = cuda_delta_net_step_launches();
        b.gated_delta_net_rows(core.gpu, conv.gpu, qkv.gpu, z.gpu, scratch.gpu.narrow(1, 0, c.nV),
                               scratch.gpu.narrow(1, c.nV, c.nV), wins, sts, s);
        b.matmul(out.gpu, core.gpu.reshape({1, width}), w.gpu);
        b.synchronize();
        EXPECT_EQ(cuda_delta_net_step_launches() - steps_before, 1) << what;
        pieces[i] = cuda_imma_pieces_launches() - pieces_before;
        product[i] = gpu_bytes(out);
      }
      EXPECT_EQ(pieces[0], c.cut ? 0 : 1) << what << (c.cut ? ": the product cut its own pieces" : "");
      EXPECT_EQ(pieces[1], 1) << what;
      EXPECT_EQ(product[0], product[1]) << what << ": the step's pieces against the product's own";
    }
  }

  // One sequence's step as a graph on the fused backend, replayed twice, against two eager steps
  // on copies of the states: the same bytes.
  const int64_t nK = 16, nV = 32, dk = 128, dv = 128, C = 2 * nK * dk + nV * dv;
  Twin taps = twin_random(DType::bf16, {C, K}, 0.5f), a_log = twin_random(DType::bf16, {nV});
  Twin dt_bias = twin_random(DType::bf16, {nV}), norm = twin_random(DType::bf16, {dv}, 0.5f);
  Twin qkv = twin_random(DType::f32, {1, C}, 2.0f), z = twin_random(DType::f32, {1, nV * dv}, 2.0f);
  Twin ab = twin_random(DType::f32, {1, 2 * nV}, 4.0f);
  Twin window = twin_random(DType::f32, {K - 1, C}), state = twin_random(DType::f32, {nV, dk, dv}, 0.3f);
  Twin window_eager = twin_bytes(DType::f32, {K - 1, C}, window.host.data());
  Twin state_eager = twin_bytes(DType::f32, {nV, dk, dv}, state.host.data());
  Twin out = twin_output(DType::f32, {1, nV, dv}), out_eager = twin_output(DType::f32, {1, nV, dv});
  Twin conv = twin_output(DType::f32, {1, C}), scratch = twin_output(DType::f32, {1, 2 * nV});
  DeltaNetStep s;
  s.conv_taps = &taps.gpu, s.a_log = &a_log.gpu, s.dt_bias = &dt_bias.gpu, s.norm = &norm.gpu;
  s.rule.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  auto body = [&](Tensor o, Tensor win, Tensor st) {
    fused->copy_on_device(scratch.gpu, ab.gpu);  // a and b are scratch: each step starts from the same inputs
    const Tensor wins[] = {win}, sts[] = {st};
    fused->gated_delta_net_rows(o, conv.gpu, qkv.gpu, z.gpu, scratch.gpu.narrow(1, 0, nV),
                                scratch.gpu.narrow(1, nV, nV), wins, sts, s);
  };
  const int64_t launches_before = cuda_delta_net_step_launches();
  std::unique_ptr<CapturedSteps> graph = fused->capture([&] { body(out.gpu, window.gpu, state.gpu); });
  for (int replay = 0; replay < 2; ++replay) {
    graph->replay();
    body(out_eager.gpu, window_eager.gpu, state_eager.gpu);
  }
  fused->synchronize();
  EXPECT_EQ(cuda_delta_net_step_launches() - launches_before, 3) << "the capture and both eager steps fused";
  EXPECT_EQ(gpu_bytes(out), gpu_bytes(out_eager)) << "graph replay vs eager: out";
  EXPECT_EQ(gpu_bytes(window), gpu_bytes(window_eager)) << "graph replay vs eager: conv window";
  EXPECT_EQ(gpu_bytes(state), gpu_bytes(state_eager)) << "graph replay vs eager: delta state";

  // Two steps with no op between on the same states: the second runs the separate kernels (the
  // fused kernel reads the states before its launch waits for the launch before it to finish).
  // The states come out as from two fused steps with a copy between (a and b are read, not
  // written, by the fused step, so both steps see the same inputs either way).
  const Tensor wins[] = {window.gpu}, sts[] = {state.gpu}, wins_eager[] = {window_eager.gpu},
               sts_eager[] = {state_eager.gpu};
  const Tensor a_in = scratch.gpu.narrow(1, 0, nV), b_in = scratch.gpu.narrow(1, nV, nV);
  const int64_t back_to_back = cuda_delta_net_step_launches();
  fused->copy_on_device(scratch.gpu, ab.gpu);
  fused->gated_delta_net_rows(out.gpu, conv.gpu, qkv.gpu, z.gpu, a_in, b_in, wins, sts, s);
  fused->gated_delta_net_rows(out.gpu, conv.gpu, qkv.gpu, z.gpu, a_in, b_in, wins, sts, s);
  fused->synchronize();
  EXPECT_EQ(cuda_delta_net_step_launches() - back_to_back, 1) << "a step right after a step fused";
  for (int step = 0; step < 2; ++step) {
    fused->copy_on_device(scratch.gpu, ab.gpu);
    fused->gated_delta_net_rows(out_eager.gpu, conv.gpu, qkv.gpu, z.gpu, a_in, b_in, wins_eager, sts_eager, s);
  }
  fused->synchronize();
  EXPECT_EQ(gpu_bytes(window), gpu_bytes(window_eager)) << "back to back: conv window";
  EXPECT_EQ(gpu_bytes(state), gpu_bytes(state_eager)) << "back to back: delta state";
}

// A captured graph keeps the workspace it was captured with: a longer call on the same backend
// afterwards grows the workspace (a larger buffer replaces it), and the graph's replays must
// neither read freed memory nor write into what the freed range is reused for. The graph is one
// decode-sized expert block (its scratch in the workspace); the growth, a 300-token block on the
// grouped GEMM; then a buffer the size of the old workspace, filled with a pattern, likely lands
// in the freed range: the replay must leave it as it was and give the first result again.
TEST_F(CudaOps, AGraphKeepsItsWorkspaceWhenTheWorkspaceGrows) {
  RoutedExperts small = routed_experts(DType::hfq4_g256, 1, false);
  gpu_->moe_experts(small.out.gpu, small.x.gpu, small.gate_up.gpu, small.down.gpu, small.ids.gpu, small.w.gpu,
                    Activation::gelu_tanh);  // eager: sizes the workspace
  gpu_->synchronize();
  const std::vector<uint8_t> want = gpu_bytes(small.out);
  std::unique_ptr<CapturedSteps> graph = gpu_->capture([&] {
    gpu_->moe_experts(small.out.gpu, small.x.gpu, small.gate_up.gpu, small.down.gpu, small.ids.gpu, small.w.gpu,
                      Activation::gelu_tanh);
  });
  graph->replay();
  gpu_->synchronize();
  ASSERT_EQ(gpu_bytes(small.out), want) << "replay before the growth";

  const int64_t growths = cuda_workspace_growths(*gpu_);
  RoutedExperts big = routed_experts(DType::hfq4_g256, 300, false);
  gpu_->moe_experts(big.out.gpu, big.x.gpu, big.gate_up.gpu, big.down.gpu, big.ids.gpu, big.w.gpu,
                    Activation::gelu_tanh);
  gpu_->synchronize();
  ASSERT_GT(cuda_workspace_growths(*gpu_), growths) << "the 300-token call did not grow the workspace";
  // (the first workspace is at least 1 MiB)
  std::unique_ptr<DeviceBuffer> bystander = gpu_->allocate(size_t{1} << 20);
  const std::vector<uint8_t> pattern(bystander->size(), 0xA5);
  const Tensor bystander_bytes =
      make_tensor(bystander->data(), DType::u8, {static_cast<int64_t>(pattern.size())}, Device::cuda);
  gpu_->copy_to_device(bystander_bytes, pattern.data());

  const std::vector<uint8_t> poison(small.out.host.size(), 0xff);
  gpu_->copy_to_device(small.out.gpu, poison.data());
  graph->replay();
  gpu_->synchronize();
  EXPECT_EQ(gpu_bytes(small.out), want) << "replay after the growth";
  std::vector<uint8_t> after(pattern.size());
  gpu_->copy_to_host(after.data(), bystander_bytes);
  EXPECT_EQ(after, pattern) << "the replay wrote into memory the old workspace no longer owns";
  // and eager calls go on with the grown workspace
  Twin again = twin_output(DType::f32, {1, 256});
  gpu_->moe_experts(again.gpu, small.x.gpu, small.gate_up.gpu, small.down.gpu, small.ids.gpu, small.w.gpu,
                    Activation::gelu_tanh);
  gpu_->synchronize();
  EXPECT_EQ(gpu_bytes(again), want) << "eager after the growth";
}

}  // namespace
}  // namespace fl
