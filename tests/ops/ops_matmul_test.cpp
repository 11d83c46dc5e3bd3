// The op harness (ops_harness.h) for the matrix products and the mixture-of-experts ops: every
// weight format and odd shape, the one-input matvecs, the tensor-core GEMM, grouped products of
// one input, the gated matvec and the weight-prefetch switch, routing and the expert products.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include <gtest/gtest.h>

#include "model/model.h"
#include "backend/cuda/expert_rows_plan.h"
#include "backend/cuda/norm_pieces.h"
#include "ops_harness.h"

namespace fl {
namespace {

using namespace ops_harness;

TEST_F(CudaOps, MatmulEveryFormatAndOddShape) {
  for (DType type : kWeightTypes) {
    if (!has_quant_format(type)) continue;  // formats land in src/quant one by one
    for (int64_t K : {32, 127, 704, 2112, 2816})
      for (int64_t M : {1, 3, 17, 128})
        for (int64_t T : {1, 3, 17}) {
          Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {T, K});
          Twin out = twin_output(DType::f32, {T, M});
          cpu_->matmul(out.cpu, x.cpu, w.cpu);
          gpu_->matmul(out.gpu, x.gpu, w.gpu);
          // Reassociation error grows like sqrt(K) for random-sign terms, and with M = T = 1 the
          // single output may be a small result of cancellation (seen: 1.2e-5 relative at
          // K = 2816 for one output of 1.02). A wrong scale or a dropped tail group is >= 1e-2.
          const float budget = dot_budget(K);
          expect_close(out, budget,
                       std::string(dtype_name(type)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                           " T=" + std::to_string(T));
        }
  }
}

// Batch-1 decode matvecs give each warp 1, 2 or 4 rows depending on how many blocks the grid
// would have (matmul.cu): only matrices of thousands of rows take the 2- and 4-row kernels, and
// an x that is not 16-byte aligned (here a view one float into its buffer) takes the scalar loads.
// (HFQ4 picks by warps: 2050 rows take 2 per warp, 4100 and 8453 take 4; 4100 rows of 8448 k, a
// grid of about one wave with long rows on a GPU of 86+ SMs such as the H200, take 4 steps of
// loads in flight instead of 2.)
TEST_F(CudaOps, MatmulSingleInputRowsPerWarpAndUnalignedX) {
  for (DType type : kWeightTypes) {
    if (!has_quant_format(type)) continue;
    for (int64_t M : {2050, 4100, 8453})  // neither a multiple of 32
      for (int64_t K : {704, 2112, 8448})
        for (bool aligned : {true, false}) {
          // The plain formats share the chunk code path: one K is enough (the CPU oracle's f32
          // loops over 18M weights cost seconds); the long rows only where they change the kernel.
          if (K != 704 && (type == DType::f32 || type == DType::f16 || type == DType::bf16)) continue;
          if (K == 8448 && (M != 4100 || (type != DType::hfq4_g256 && type != DType::hfq4_g128))) continue;
          Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {1, K + 1});
          Twin out = twin_output(DType::f32, {1, M});
          const int64_t offset = aligned ? 0 : 1;
          cpu_->matmul(out.cpu, x.cpu.narrow(1, offset, K), w.cpu);
          gpu_->matmul(out.gpu, x.gpu.narrow(1, offset, K), w.gpu);
          expect_close(out, dot_budget(K),
                       std::string(dtype_name(type)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                           (aligned ? " aligned x" : " unaligned x"));
        }
  }
}

// A row's product must not depend on how many inputs share the launch: on HFQ4 one input runs
// the rows kernel, 2-15 the tokens kernel, which must do the same arithmetic in the same order.
// (The integer and split kernels, on by default, take one-input products with numbers of their
// own, within the budget; batched decode is held to a tolerance for them: the f32 kernels here.)
TEST_F(CudaOps, MatmulHfq4RowsIndependentOfInputCount) {
  BackendOptions options;
  options.imma_matvec = options.split_matvec = false;
  auto f32_kernels = make_backend("cuda", options);
  Backend& gpu = *f32_kernels;
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (int64_t K : {127, 704, 2816})
      for (int64_t M : {130, 2050, 4100}) {
        const int64_t T = 5;
        Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {T, K});
        Twin together = twin_output(DType::f32, {T, M}), alone = twin_output(DType::f32, {T, M});
        gpu.matmul(together.gpu, x.gpu, w.gpu);
        for (int64_t t = 0; t < T; ++t) gpu.matmul(alone.gpu.slice(t, t + 1), x.gpu.slice(t, t + 1), w.gpu);
        gpu.synchronize();
        const std::vector<uint8_t> a = gpu_bytes(together), b = gpu_bytes(alone);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << dtype_name(type) << " M=" << M << " K=" << K << ": "
                                                                << T << " inputs in one launch differ from one by one";
      }
}

// Many inputs on HFQ4 weights take the tensor-core GEMM (matmul_mma.cu: 64 inputs x 128 rows per
// block, bf16 pieces of the inputs times the exact 4-bit codes, the group's scale and min in f32).
// It must meet the matvec's budget: with the default three pieces the products are the f32 ones.
// Shapes cross every tile edge: T = 15 (the matvec kernel, just below the GEMM), 16, 64, 65, 200
// inputs; M = 1, 130 and 300 rows (partial row tiles); K = 80 (Q8_0: an odd block count, the
// last stage's second block absent), 176 (not a multiple of a 64-wide stage, the G128 tail block
// half used), 704 and 2816 (G256 tail blocks); an x view one float into its buffer takes the
// scalar input loads. Q8_0 (the LM head's format) applies its scale per 32-wide block.
TEST_F(CudaOps, MatmulTensorCoreGemmManyInputs) {
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128, DType::q8_0})
    for (int64_t T : {15, 16, 64, 65, 200})
      for (int64_t M : {1, 130, 300})
        for (int64_t K : {80, 176, 704, 2816})
          for (bool aligned : {true, false}) {
            if (!aligned && (M != 130 || T != 65)) continue;
            Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {T, K + 1});
            Twin out = twin_output(DType::f32, {T, M});
            const int64_t offset = aligned ? 0 : 1;
            cpu_->matmul(out.cpu, x.cpu.narrow(1, offset, K), w.cpu);
            gpu_->matmul(out.gpu, x.gpu.narrow(1, offset, K), w.gpu);
            expect_close(out, dot_budget(K),
                         std::string(dtype_name(type)) + " T=" + std::to_string(T) + " M=" + std::to_string(M) +
                             " K=" + std::to_string(K) + (aligned ? "" : " unaligned x"));
          }
}

// matmul_group: one launch for several weights of one input at batch 1 (segments of different
// heights, 1 to 4 of them); other shapes fall back to one matmul each. Against the CPU's
// separate matmuls, within the matmul budget.
TEST_F(CudaOps, MatmulGroupOneLaunchForSeveralWeights) {
  const std::vector<std::vector<int64_t>> groups = {{4096, 1024, 1024}, {2112, 2112}, {17}, {300, 5, 2048, 129}};
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128, DType::q8_0, DType::f32}) {
    if (!has_quant_format(type)) continue;
    for (int64_t K : {768, 2816})
      for (const auto& heights : groups)
        for (int64_t T : {1, 3}) {
          std::vector<Twin> weights, outs;
          for (int64_t M : heights) {
            weights.push_back(twin_random(type, {M, K}, 0.5f));
            outs.push_back(twin_output(DType::f32, {T, M}));
          }
          Twin x = twin_random(DType::f32, {T, K});
          std::vector<Tensor> cpu_outs, gpu_outs;
          std::vector<const Tensor*> cpu_w, gpu_w;
          for (size_t i = 0; i < heights.size(); ++i) {
            cpu_outs.push_back(outs[i].cpu), gpu_outs.push_back(outs[i].gpu);
            cpu_w.push_back(&weights[i].cpu), gpu_w.push_back(&weights[i].gpu);
          }
          cpu_->matmul_group(cpu_outs, x.cpu, cpu_w);
          gpu_->matmul_group(gpu_outs, x.gpu, gpu_w);
          for (size_t i = 0; i < heights.size(); ++i)
            expect_close(outs[i], dot_budget(K),
                         std::string(dtype_name(type)) + " segment " + std::to_string(i) + " of " +
                             std::to_string(heights.size()) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
        }
  }
  // Mixed formats take the fallback: still right.
  Twin a = twin_random(DType::hfq4_g256, {64, 512}), b = twin_random(DType::q8_0, {32, 512}),
       x = twin_random(DType::f32, {1, 512});
  Twin oa = twin_output(DType::f32, {1, 64}), ob = twin_output(DType::f32, {1, 32});
  const Tensor cpu_o[] = {oa.cpu, ob.cpu}, gpu_o[] = {oa.gpu, ob.gpu};
  const Tensor* cpu_w[] = {&a.cpu, &b.cpu};
  const Tensor* gpu_w[] = {&a.gpu, &b.gpu};
  cpu_->matmul_group(cpu_o, x.cpu, cpu_w);
  gpu_->matmul_group(gpu_o, x.gpu, gpu_w);
  expect_close(oa, kSumBudget * 2, "mixed formats, first");
  expect_close(ob, kSumBudget * 2, "mixed formats, second");
}

// A gated MLP's input half in one launch (HFQ4 at one input row, BackendOptions::gated_matvec):
// the same bits as the two products and gated_activation on the GPU, and close to the CPU oracle;
// other formats and several rows take the default and must still be right.
TEST_F(CudaOps, MatmulGatedMatchesTheTwoProductsAndTheActivation) {
  BackendOptions options;
  options.gated_matvec = true;
  auto fused = make_backend("cuda", options);
  options.gated_matvec = options.imma_matvec = false;  // the separate ops on the f32 kernels
  auto apart = make_backend("cuda", options);
  struct Case {
    DType type;
    int64_t I, K, T;
  };
  const Case cases[] = {{DType::hfq4_g256, 2112, 2816, 1}, {DType::hfq4_g256, 17, 768, 1},
                        {DType::hfq4_g128, 1408, 2816, 1}, {DType::hfq4_g128, 176, 704, 1},
                        {DType::hfq4_g256, 2112, 8448, 1}, {DType::hfq4_g256, 300, 2816, 3},
                        {DType::q8_0, 300, 768, 1}};
  for (const Case& c : cases)
    for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
      if (!has_quant_format(c.type)) continue;
      const std::string what = std::string(dtype_name(c.type)) + " I=" + std::to_string(c.I) +
                               " K=" + std::to_string(c.K) + " T=" + std::to_string(c.T) +
                               (act == Activation::silu ? " silu" : " gelu");
      Twin gate_w = twin_random(c.type, {c.I, c.K}, 0.5f), up_w = twin_random(c.type, {c.I, c.K}, 0.5f);
      Twin x = twin_random(DType::f32, {c.T, c.K});
      Twin out = twin_output(DType::f32, {c.T, c.I}), up = twin_output(DType::f32, {c.T, c.I});
      cpu_->matmul_gated(out.cpu, up.cpu, x.cpu, gate_w.cpu, up_w.cpu, act);
      fused->matmul_gated(out.gpu, up.gpu, x.gpu, gate_w.gpu, up_w.gpu, act);
      fused->synchronize();  // (another backend's stream: done before this one reads)
      // the activation of two dots: the products' budget, plus tanh/exp's ulps
      expect_close(out, dot_budget(c.K) * 2, "matmul_gated " + what);
      // the separate ops on the GPU: bit for bit
      Twin gate2 = twin_output(DType::f32, {c.T, c.I}), up2 = twin_output(DType::f32, {c.T, c.I});
      const Tensor outs[] = {gate2.gpu, up2.gpu};
      const Tensor* weights[] = {&gate_w.gpu, &up_w.gpu};
      apart->matmul_group(outs, x.gpu, weights);
      apart->gated_activation(gate2.gpu, gate2.gpu, up2.gpu, act);
      apart->synchronize();
      EXPECT_EQ(gpu_bytes(out), gpu_bytes(gate2)) << what << ": the fused form differs from the separate ops";
    }
}

// Decode's early L2 prefetch of a matvec's rows (BackendOptions::weight_prefetch; HFQ4 on the
// integer matvec) moves no numbers: on and off (the default) give the same bits, for
// one matrix and a group of them.
TEST_F(CudaOps, WeightPrefetchGivesTheSameBits) {
  BackendOptions options;
  options.weight_prefetch = !BackendOptions{}.weight_prefetch;  // the other way from gpu_
  auto plain = make_backend("cuda", options);
  for (DType type : {DType::hfq4_g256, DType::q8_0, DType::bf16}) {
    if (!has_quant_format(type)) continue;
    const std::string what = std::string("weight_prefetch switched ") + std::string(dtype_name(type));
    Twin w = twin_random(type, {1024, 2816}, 0.5f), w2 = twin_random(type, {256, 2816}, 0.5f);
    Twin x = twin_random(DType::f32, {1, 2816});
    Twin out = twin_output(DType::f32, {1, 1024}), out2 = twin_output(DType::f32, {1, 256});
    // (each launch writes over NaN: a launch that stored nothing cannot pass)
    const std::vector<uint8_t> nan_bytes(out.host.size(), 0xff), nan_bytes2(out2.host.size(), 0xff);
    auto poison = [&] {
      gpu_->copy_to_device(out.gpu, nan_bytes.data());
      gpu_->copy_to_device(out2.gpu, nan_bytes2.data());
    };
    gpu_->matmul(out.gpu, x.gpu, w.gpu);
    const std::vector<uint8_t> by_default = gpu_bytes(out);
    poison();
    plain->matmul(out.gpu, x.gpu, w.gpu);
    plain->synchronize();
    EXPECT_EQ(gpu_bytes(out), by_default) << what;
    const Tensor outs[] = {out.gpu, out2.gpu};
    const Tensor* weights[] = {&w.gpu, &w2.gpu};
    gpu_->matmul_group(outs, x.gpu, weights);
    const std::vector<uint8_t> group_a = gpu_bytes(out), group_b = gpu_bytes(out2);
    poison();
    plain->matmul_group(outs, x.gpu, weights);
    plain->synchronize();
    EXPECT_EQ(gpu_bytes(out), group_a) << what << " (group)";
    EXPECT_EQ(gpu_bytes(out2), group_b) << what << " (group)";
    // and the oracle, so that two equally wrong paths do not pass
    cpu_->matmul(out.cpu, x.cpu, w.cpu);
    expect_close(out, dot_budget(2816), what);
  }
}

// BackendOptions::async_matvec (the one-input HFQ4 products on rows of 8+ blocks stream their
// weights into shared memory by bulk copies, on an sm_90 GPU) moves no numbers: the register
// kernel's bits, for plain products at both kernel choices (2 rows per warp at 131 and 2050 rows,
// 4 at 4102; 131 and 4102 leave a warp part-filled), rows of exactly one chunk (2048: 8 G256 or 16
// G128 blocks), part-filled last chunks (2816: 11 G256 blocks) and more chunks than the ring holds
// with a part-used last block (9000), rows that start 8 bytes past a 16-byte boundary (odd rows
// at 11 G256 or 71 G128 blocks, copied from the boundary before), a group of three, the gated form
// (two matrices), and expert pairs (hidden 2304, one pair another rank's: id -1) plain and gated
// (the stack's up rows), each launch writing over NaN; close to the CPU oracle; and the launch
// counter proves the asynchronous kernel ran where the switch is on (on other GPUs the register
// kernel runs on both sides and the test says so).
TEST_F(CudaOps, AsyncMatvecGivesTheSameBits) {
  // register kernel (first) and asynchronous one (second), with and without the gated matvec
  BackendOptions registers, async, gated_registers, gated_async;
  registers.async_matvec = gated_registers.async_matvec = false;
  async.async_matvec = gated_async.async_matvec = true;
  // (the split and integer kernels, on by default, have their own numbers: the register kernel here)
  registers.split_matvec = gated_registers.split_matvec = false;
  registers.imma_matvec = async.imma_matvec = gated_registers.imma_matvec = gated_async.imma_matvec = false;
  gated_registers.gated_matvec = gated_async.gated_matvec = true;
  auto plain_backend = make_backend("cuda", registers), async_backend = make_backend("cuda", async);
  auto gated_plain = make_backend("cuda", gated_registers), gated_async_backend = make_backend("cuda", gated_async);
  const bool async_here = cuda_async_matvec_available(*async_backend);
  if (!async_here) std::printf("(no sm_90 GPU or sm_90a code: the register kernel runs on both sides)\n");
  // run() on `first` and then on `second`, each over NaN in every output: the same bytes
  auto same_bytes_on = [&](Backend& first, Backend& second, std::span<Twin* const> outs,
                           const std::function<void(Backend&)>& run, const std::string& what) {
    std::vector<std::vector<uint8_t>> by_first;
    for (Backend* b : {&first, &second}) {
      for (Twin* out : outs) {
        const std::vector<uint8_t> nan_bytes(out->host.size(), 0xff);
        b->copy_to_device(out->gpu, nan_bytes.data());
      }
      const int64_t launches = cuda_async_matvec_launches();
      run(*b);
      b->synchronize();
      EXPECT_EQ(cuda_async_matvec_launches() > launches, b == &second && async_here)
          << what << ": the asynchronous kernel " << (b == &second && async_here ? "did not run" : "ran");
      for (size_t i = 0; i < outs.size(); ++i) {
        if (b == &first)
          by_first.push_back(gpu_bytes(*outs[i]));
        else
          EXPECT_EQ(gpu_bytes(*outs[i]), by_first[i]) << what << " (output " << i << ")";
      }
    }
  };
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (int64_t K : {2048, 2816, 9000})
      for (int64_t M : {131, 2050, 4102}) {
        const std::string what = std::string(dtype_name(type)) + " M=" + std::to_string(M) + " K=" + std::to_string(K);
        Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {1, K});
        Twin out = twin_output(DType::f32, {1, M});
        Twin* outs[] = {&out};
        same_bytes_on(
            *plain_backend, *async_backend, outs, [&](Backend& b) { b.matmul(out.gpu, x.gpu, w.gpu); }, what);
        cpu_->matmul(out.cpu, x.cpu, w.cpu);
        expect_close(out, dot_budget(K), what);
      }
  {
    const int64_t K = 2816;
    Twin q = twin_random(DType::hfq4_g256, {4096, K}, 0.5f), k = twin_random(DType::hfq4_g256, {1024, K}, 0.5f),
         v = twin_random(DType::hfq4_g256, {1024, K}, 0.5f), x = twin_random(DType::f32, {1, K});
    Twin oq = twin_output(DType::f32, {1, 4096}), ok = twin_output(DType::f32, {1, 1024}),
         ov = twin_output(DType::f32, {1, 1024});
    const Tensor outs[] = {oq.gpu, ok.gpu, ov.gpu};
    const Tensor* weights[] = {&q.gpu, &k.gpu, &v.gpu};
    Twin* twins[] = {&oq, &ok, &ov};
    same_bytes_on(
        *plain_backend, *async_backend, twins, [&](Backend& b) { b.matmul_group(outs, x.gpu, weights); },
        "a group of three");
  }
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (int64_t K : {2816, 8448}) {
      const int64_t I = 2112;
      const std::string what = std::string("gated ") + std::string(dtype_name(type)) + " K=" + std::to_string(K);
      Twin gate_w = twin_random(type, {I, K}, 0.5f), up_w = twin_random(type, {I, K}, 0.5f);
      Twin x = twin_random(DType::f32, {1, K});
      Twin out = twin_output(DType::f32, {1, I}), up = twin_output(DType::f32, {1, I});
      Twin* outs[] = {&out};
      same_bytes_on(
          *gated_plain, *gated_async_backend, outs,
          [&](Backend& b) { b.matmul_gated(out.gpu, up.gpu, x.gpu, gate_w.gpu, up_w.gpu, Activation::silu); }, what);
    }
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (int64_t T : {1, 3}) {
      const int64_t E = 8, K = 2, H = 2304, I = 176;
      const std::string what = std::string("experts ") + std::string(dtype_name(type)) + " T=" + std::to_string(T);
      Twin gate_up = twin_random(type, {E, 2 * I, H}, 0.3f), down = twin_random(type, {E, H, I}, 0.3f);
      Twin x = twin_random(DType::f32, {T, H});
      std::vector<int32_t> id_host(static_cast<size_t>(T * K));
      std::vector<float> w_host(id_host.size());
      for (size_t i = 0; i < id_host.size(); ++i) {
        id_host[i] = static_cast<int32_t>((i * 5 + 3) % E);  // distinct within each token
        w_host[i] = 0.25f + 0.125f * static_cast<float>(i);
      }
      id_host.back() = -1, w_host.back() = 0.0f;  // as moe_keep_experts leaves another rank's pair
      Twin ids = twin_bytes(DType::i32, {T, K}, id_host.data()), w = twin_bytes(DType::f32, {T, K}, w_host.data());
      Twin out = twin_output(DType::f32, {T, H});
      Twin* outs[] = {&out};
      auto experts = [&](Backend& b) {
        b.moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::silu);
      };
      same_bytes_on(*plain_backend, *async_backend, outs, experts, what);
      cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::silu);
      expect_close(out, kSumBudget, what);
      same_bytes_on(*gated_plain, *gated_async_backend, outs, experts, what + " gated");
    }
}

// BackendOptions::split_matvec: the products with long rows and at most about one wave of 4-row
// warps on pairs of warps that split each row's warp steps. Rows for about one wave (1025 warps:
// 4097 rows leave the last warp one row, 4100 leave the last block's second pair past M) and for
// 640 warps (2560 rows, Qwen3.5-4B's down, where the register kernel takes 2 rows per warp), rows
// of exactly 32 blocks and of 33 with a part-used last one (the even half one step more than the
// odd), G256 and G128: close to the CPU oracle, the same bytes twice (the pair's sums meet in a
// fixed order), each launch over NaN, and the launch counter proves the split kernel ran; a
// product of more waves, of short rows, or of too few rows for two 8-row blocks per SM keeps the
// register kernel's bits.
TEST_F(CudaOps, SplitMatvecMatchesTheOracle) {
  BackendOptions split_options, register_options;
  split_options.split_matvec = true;
  register_options.split_matvec = false;
  split_options.imma_matvec = register_options.imma_matvec = false;  // (it takes the products first)
  auto split = make_backend("cuda", split_options), registers = make_backend("cuda", register_options);
  // (under 86 SMs, 1025 warps are not about one wave; over 160, 2560 rows are under two blocks per
  // SM: only the last part applies)
  const int64_t sms = cuda_sm_count(*split);
  const bool one_wave_here = 12 * sms >= 1025 && 320 >= 2 * sms;
  if (!one_wave_here)
    std::printf("(%lld SMs: the split kernel's shapes here are not its own)\n", static_cast<long long>(sms));
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128}) {
    if (!one_wave_here) continue;
    const int64_t group = type == DType::hfq4_g256 ? 256 : 128;
    for (int64_t K : {32 * group, 32 * group + group / 2 + 8})
      for (int64_t M : {4097, 4100, 2560}) {
        const std::string what = std::string(dtype_name(type)) + " M=" + std::to_string(M) + " K=" + std::to_string(K);
        Twin w = twin_random(type, {M, K}, 0.5f), x = twin_random(DType::f32, {1, K});
        expect_counted_matvec(*split, cuda_split_matvec_launches, x, w, what);
      }
  }
  // 16385 rows (4097 warps: several waves), rows of 31 blocks, or 1024 rows (128 blocks of 8 rows,
  // under two per SM on 65+ SMs): the register kernel, its bits
  for (auto [M, K] : {std::pair<int64_t, int64_t>{16385, 8192}, {4100, 31 * 256}, {1024, 8192}}) {
    if (M == 1024 && 128 >= 2 * sms) continue;
    const std::string what = "M=" + std::to_string(M) + " K=" + std::to_string(K);
    Twin w = twin_random(DType::hfq4_g256, {M, K}, 0.5f), x = twin_random(DType::f32, {1, K});
    Twin out = twin_output(DType::f32, {1, M});
    const std::vector<uint8_t> by_registers = matmul_over_nan(*registers, out, x, w);
    const int64_t launches = cuda_split_matvec_launches();
    EXPECT_EQ(matmul_over_nan(*split, out, x, w), by_registers) << what;
    EXPECT_EQ(cuda_split_matvec_launches(), launches) << what << ": the split kernel ran";
  }
}

// BackendOptions::imma_matvec: the one-input HFQ4 products on the integer tensor cores. One row
// (a tile of 16 with 15 past M), 17, 33, 300 and 4100 rows (a last tile part past M), rows of 1,
// 2, 3 and 6 groups (1, 2 and 4 warps per row tile), of 11 or 22 groups, of a part-used last
// group (K = 2856) and of 84 or 168 (8 warps per tile), G256 and G128; inputs over many binades
// (every 7th element 1000x, every 11th 1e-5x, every 13th zero), so that each group's exponent and
// all four int8 pieces count: close to the CPU oracle, the same bytes twice, each launch over NaN,
// and the launch counter proves the kernel ran; grouped products (three and four matrices of one
// input, one launch) likewise. A zero input gives zeros (written over NaN); a NaN input makes
// every row NaN (written over zeros, so that rows the kernel skipped would fail).
TEST_F(CudaOps, ImmaMatvecMatchesTheOracle) {
  BackendOptions options;
  options.imma_matvec = true;
  options.imma_lean = false;  // (the register form; ImmaLeanMatchesTheOracle takes the lean one, the default)
  auto imma = make_backend("cuda", options);
  if (!cuda_imma_matvec_available(*imma)) GTEST_SKIP() << "no integer mma on this GPU (sm_80 and later)";
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto input = [&](int64_t K) {
    std::vector<float> x(static_cast<size_t>(K));
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = normal(rng);
      if (i % 7 == 3) x[i] *= 1000.0f;
      if (i % 11 == 5) x[i] *= 1e-5f;
      if (i % 13 == 8) x[i] = 0.0f;
    }
    return x;
  };
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (auto [M, K] :
         {std::pair<int64_t, int64_t>{1, 256}, {33, 768}, {17, 2816}, {300, 2856}, {4100, 8192}, {64, 21504}}) {
      const std::string what = std::string(dtype_name(type)) + " M=" + std::to_string(M) + " K=" + std::to_string(K);
      const std::vector<float> xs = input(K);
      Twin w = twin_random(type, {M, K}, 0.5f), x = twin_bytes(DType::f32, {1, K}, xs.data());
      expect_counted_matvec(*imma, cuda_imma_matvec_launches, x, w, what);
    }
  // BackendOptions::imma_l2_ahead: a prefetch changes no number, so the same bytes as without one,
  // at 1, 2 and 8 warps per tile (4100 x 8192 on 132 SMs, 64 x 21504, 33 x 768) and distances that
  // reach past the row's last group (3 groups of a 768-long row).
  for (int ahead : {1, 4}) {
    BackendOptions ahead_options = options;
    ahead_options.imma_l2_ahead = ahead;
    auto with_ahead = make_backend("cuda", ahead_options);
    for (auto [M, K] : {std::pair<int64_t, int64_t>{4100, 8192}, {64, 21504}, {33, 768}}) {
      const std::string what =
          "l2 ahead " + std::to_string(ahead) + " M=" + std::to_string(M) + " K=" + std::to_string(K);
      const std::vector<float> xs = input(K);
      Twin w = twin_random(DType::hfq4_g256, {M, K}, 0.5f), x = twin_bytes(DType::f32, {1, K}, xs.data());
      Twin out = twin_output(DType::f32, {1, M});
      const std::vector<uint8_t> plain = matmul_over_nan(*imma, out, x, w);
      const int64_t launches = cuda_imma_matvec_launches();
      EXPECT_EQ(matmul_over_nan(*with_ahead, out, x, w), plain) << what;
      EXPECT_EQ(cuda_imma_matvec_launches(), launches + 1) << what << ": the integer kernel ran";
    }
  }
  // BackendOptions::imma_min_bytes: a product under it (128 x 2816 G256: 191488 bytes, the 26B's
  // router) runs on the register kernel, its bits, with no integer launch; one at or over it (the
  // same bytes as the threshold, or 1024 rows) still on the integer kernel, its bits.
  {
    BackendOptions min_options = options, register_options = options;
    min_options.imma_min_bytes = 128 * 2816 / 256 * 136;
    register_options.imma_matvec = false;
    auto with_min = make_backend("cuda", min_options);
    auto registers = make_backend("cuda", register_options);
    for (int64_t M : {127, 128, 1024}) {
      const std::string what = "min bytes M=" + std::to_string(M);
      const std::vector<float> xs = input(2816);
      Twin w = twin_random(DType::hfq4_g256, {M, 2816}, 0.5f), x = twin_bytes(DType::f32, {1, 2816}, xs.data());
      Twin out = twin_output(DType::f32, {1, M});
      const bool small = M < 128;
      const std::vector<uint8_t> expected = matmul_over_nan(small ? *registers : *imma, out, x, w);
      const int64_t launches = cuda_imma_matvec_launches();
      EXPECT_EQ(matmul_over_nan(*with_min, out, x, w), expected) << what;
      EXPECT_EQ(cuda_imma_matvec_launches(), launches + (small ? 0 : 1)) << what;
    }
  }
  // Grouped (q/k/v of one input: one pieces launch, one product launch over the segments' tiles),
  // with 132 SMs at 4, 8, 2 and 1 (G256) warps per tile; segments whose last block of tiles ends
  // inside them (heights not multiples of 128), a part-used last group (K = 2856)
  const std::pair<std::vector<int64_t>, int64_t> groups[] = {
      {{4096, 1024, 1024}, 2816}, {{300, 5, 2048, 129}, 2856}, {{8232, 2056, 2056}, 2816}, {{37, 5, 100}, 256}};
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (const auto& [heights, K] : groups) {
      const std::vector<float> xs = input(K);
      Twin x = twin_bytes(DType::f32, {1, K}, xs.data());
      std::vector<Twin> weights;
      for (int64_t M : heights) weights.push_back(twin_random(type, {M, K}, 0.5f));
      expect_counted_group(*imma, cuda_imma_matvec_launches, x, weights,
                           std::string(dtype_name(type)) + " grouped K=" + std::to_string(K));
    }
  Twin w = twin_random(DType::hfq4_g256, {40, 1024}, 0.5f);
  std::vector<float> xs = input(1024);
  xs[300] = std::nanf("");
  Twin x_nan = twin_bytes(DType::f32, {1, 1024}, xs.data());
  std::fill(xs.begin(), xs.end(), 0.0f);
  Twin x_zero = twin_bytes(DType::f32, {1, 1024}, xs.data());
  Twin out = twin_output(DType::f32, {1, 40});
  auto rows_of = [](const std::vector<uint8_t>& bytes) {
    std::vector<float> rows(bytes.size() / 4);
    std::memcpy(rows.data(), bytes.data(), rows.size() * 4);
    return rows;
  };
  for (float v : rows_of(matmul_over_nan(*imma, out, x_zero, w))) EXPECT_EQ(v, 0.0f) << "a row of a zero input";
  const std::vector<uint8_t> zeros(out.host.size(), 0);
  imma->copy_to_device(out.gpu, zeros.data());
  imma->matmul(out.gpu, x_nan.gpu, w.gpu);
  imma->synchronize();
  for (float v : rows_of(gpu_bytes(out))) EXPECT_TRUE(std::isnan(v)) << "a row of a NaN input: " << v;
}

// BackendOptions::imma_lean: the integer matvec's lean form (pieces loaded where used, three
// blocks per SM, its own warps-per-tile rule, so not always the register form's order of the
// warps' partial sums) close to the CPU oracle, the same bytes twice, its counter proving it ran,
// G256 and G128: a tile 15 rows past M, tiles wholly past M in a block, a part-used group (one
// group of 100), rows of 1 to 84 groups, 1 to 8 warps per tile (on 132 SMs: 5 x 100 takes 1,
// 21200 x 768 2, 10600 x 2816 4, the rest 8), and grouped products (one lean launch, segments
// whose blocks end inside them).
TEST_F(CudaOps, ImmaLeanMatchesTheOracle) {
  BackendOptions options;
  options.imma_matvec = true;
  options.imma_lean = true;
  auto lean = make_backend("cuda", options);
  if (!cuda_imma_matvec_available(*lean)) GTEST_SKIP() << "no integer mma on this GPU (sm_80 and later)";
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto input = [&](int64_t K) {
    std::vector<float> x(static_cast<size_t>(K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % 7 == 3 ? 1000.0f : 1.0f);
    return x;
  };
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128}) {
    for (auto [M, K] : {std::pair<int64_t, int64_t>{5, 100},
                        {1, 256},
                        {33, 768},
                        {17, 2816},
                        {300, 2856},
                        {4100, 8192},
                        {64, 21504},
                        {10600, 2816},
                        {21200, 768}}) {
      const std::vector<float> xs = input(K);
      Twin w = twin_random(type, {M, K}, 0.5f), x = twin_bytes(DType::f32, {1, K}, xs.data());
      expect_counted_matvec(*lean, cuda_imma_lean_launches, x, w,
                            std::string(dtype_name(type)) + " lean M=" + std::to_string(M) + " K=" + std::to_string(K));
    }
    for (const std::vector<int64_t>& heights :
         {std::vector<int64_t>{4096, 1024, 1024}, {300, 5, 2048, 129}, {37, 5, 100}}) {
      const int64_t K = 2816;
      const std::vector<float> xs = input(K);
      Twin x = twin_bytes(DType::f32, {1, K}, xs.data());
      std::vector<Twin> weights;
      for (int64_t M : heights) weights.push_back(twin_random(type, {M, K}, 0.5f));
      expect_counted_group(*lean, cuda_imma_lean_launches, x, weights, std::string(dtype_name(type)) + " lean grouped");
    }
  }
}

// BackendOptions::imma_ready_pieces: with the integer matvec on, a one-row residual update cuts its
// first norm's output, and the gated activation its output, into the integer matvec's pieces; the
// product right after takes them and launches no pieces of its own (the counters say so), with
// the oracle's numbers (the oracle multiplies the GPU's own input bytes, so the product's budget is
// a product's). Rows of 640 (G128), 2112 (G128, a half-used last group), 2816 and 5376 (G256; the
// 31B's 14-warp update), a grouped product; a G128 weight after G256 pieces, an op between (the
// input scaled by 1/2: stale pieces would double the result) and a copy between make the product
// cut its own, from the input as it is then. (Producers cut once the backend has run an integer
// product: one runs first.)
TEST_F(CudaOps, ImmaReadyPiecesServeOnlyTheNextProduct) {
  BackendOptions options;
  options.imma_matvec = true;
  auto imma = make_backend("cuda", options);
  if (!cuda_imma_matvec_available(*imma)) GTEST_SKIP() << "no integer mma on this GPU (sm_80 and later)";
  auto take_gpu_values = [&](Twin& t) {  // the CPU side := the GPU's bytes
    imma->synchronize();
    const std::vector<uint8_t> bytes = gpu_bytes(t);
    std::memcpy(t.host.data(), bytes.data(), bytes.size());
  };
  struct Counts {
    int64_t pieces = cuda_imma_pieces_launches(), products = cuda_imma_matvec_launches();
  };
  auto expect_counts = [&](const Counts& before, int64_t pieces, int64_t products, const std::string& what) {
    imma->synchronize();
    EXPECT_EQ(cuda_imma_pieces_launches() - before.pieces, pieces) << what << ": pieces launches";
    EXPECT_EQ(cuda_imma_matvec_launches() - before.products, products) << what << ": integer products";
  };
  {
    Twin w = twin_random(DType::hfq4_g256, {16, 256}), x = twin_random(DType::f32, {1, 256});
    Twin out = twin_output(DType::f32, {1, 16});
    imma->matmul(out.gpu, x.gpu, w.gpu);
  }
  for (int64_t cols : {640, 2112, 2816, 5376}) {
    const DType type = cols % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128;
    // A one-row update (a normed term, one output norm); returns the norm's output twin.
    struct Update {
      Twin h, x, gain, norm_gain, normed;
    };
    auto make_update = [&] {
      return Update{twin_random(DType::f32, {1, cols}, 2.0f), twin_random(DType::f32, {1, cols}, 3.0f),
                    twin_random(DType::bf16, {cols}), twin_random(DType::bf16, {cols}),
                    twin_output(DType::f32, {1, cols})};
    };
    auto run_update = [&](Backend& b, Update& u, bool gpu) {
      const ResidualTerm term[] = {{gpu ? u.x.gpu : u.x.cpu, gpu ? &u.gain.gpu : &u.gain.cpu, NormGain::weight, true}};
      const StreamNorm norm[] = {{gpu ? u.normed.gpu : u.normed.cpu, gpu ? &u.norm_gain.gpu : &u.norm_gain.cpu,
                                  NormGain::one_plus_weight, 1.0f}};
      ResidualUpdate r;
      r.terms = term;
      r.norms = norm;
      r.eps = 1e-6f;
      b.residual_update(gpu ? u.h.gpu : u.h.cpu, r);
    };
    const std::string at = " cols=" + std::to_string(cols);
    {  // served: the update and its oracle agree, and the product takes the update's pieces
      Update u = make_update();
      Twin w = twin_random(type, {300, cols}, 0.5f), out = twin_output(DType::f32, {1, 300});
      const Counts before;
      run_update(*cpu_, u, false);
      run_update(*imma, u, true);
      imma->matmul(out.gpu, u.normed.gpu, w.gpu);
      expect_counts(before, 0, 1, "served" + at);
      expect_close(u.h, kSumBudget * 4, "served: h" + at);
      expect_close(u.normed, kSumBudget * 5, "served: the norm" + at);
      take_gpu_values(u.normed);
      cpu_->matmul(out.cpu, u.normed.cpu, w.cpu);
      expect_close(out, dot_budget(cols), "served: the product" + at);
    }
    {  // served to a grouped product (q/k/v)
      Update u = make_update();
      std::vector<Twin> ws, outs;
      for (int64_t M : {256, 64, 64})
        ws.push_back(twin_random(type, {M, cols}, 0.5f)), outs.push_back(twin_output(DType::f32, {1, M}));
      const Tensor gpu_outs[] = {outs[0].gpu, outs[1].gpu, outs[2].gpu},
                   cpu_outs[] = {outs[0].cpu, outs[1].cpu, outs[2].cpu};
      const Tensor* gpu_w[] = {&ws[0].gpu, &ws[1].gpu, &ws[2].gpu};
      const Tensor* cpu_w[] = {&ws[0].cpu, &ws[1].cpu, &ws[2].cpu};
      const Counts before;
      run_update(*imma, u, true);
      imma->matmul_group(gpu_outs, u.normed.gpu, gpu_w);
      expect_counts(before, 0, 1, "grouped" + at);
      take_gpu_values(u.normed);
      cpu_->matmul_group(cpu_outs, u.normed.cpu, cpu_w);
      for (size_t i = 0; i < outs.size(); ++i)
        expect_close(outs[i], dot_budget(cols), "grouped, segment " + std::to_string(i) + at);
    }
    {  // an op between: the product cuts the scaled input itself
      Update u = make_update();
      Twin w = twin_random(type, {300, cols}, 0.5f), out = twin_output(DType::f32, {1, 300});
      const Counts before;
      run_update(*imma, u, true);
      imma->scale(u.normed.gpu, 0.5f);
      imma->matmul(out.gpu, u.normed.gpu, w.gpu);
      expect_counts(before, 1, 1, "an op between" + at);
      take_gpu_values(u.normed);
      cpu_->matmul(out.cpu, u.normed.cpu, w.cpu);
      expect_close(out, dot_budget(cols), "an op between: the product" + at);
    }
    {  // a copy between (into another tensor: the input's bytes are unchanged, its pieces not trusted)
      Update u = make_update();
      Twin w = twin_random(type, {300, cols}, 0.5f), out = twin_output(DType::f32, {1, 300});
      Twin elsewhere = twin_output(DType::f32, {1, cols});
      const Counts before;
      run_update(*imma, u, true);
      imma->copy_on_device(elsewhere.gpu, u.h.gpu);
      imma->matmul(out.gpu, u.normed.gpu, w.gpu);
      expect_counts(before, 1, 1, "a copy between" + at);
      take_gpu_values(u.normed);
      cpu_->matmul(out.cpu, u.normed.cpu, w.cpu);
      expect_close(out, dot_budget(cols), "a copy between: the product" + at);
    }
    if (type == DType::hfq4_g256) {  // G256 pieces, a G128 weight: cut again for 128-weight groups
      Update u = make_update();
      Twin w = twin_random(DType::hfq4_g128, {300, cols}, 0.5f), out = twin_output(DType::f32, {1, 300});
      const Counts before;
      run_update(*imma, u, true);
      imma->matmul(out.gpu, u.normed.gpu, w.gpu);
      expect_counts(before, 1, 1, "another group size" + at);
      take_gpu_values(u.normed);
      cpu_->matmul(out.cpu, u.normed.cpu, w.cpu);
      expect_close(out, dot_budget(cols), "another group size: the product" + at);
    }
  }
  // Three norms and a branch (Gemma 4's MoE layers: the dense MLP's input on the side line, the
  // router's on the main line): the update cuts every norm's row, and each line's first product
  // takes its row's pieces; a second product on the main line (the experts' row) cuts its own.
  // In order on the main stream (concurrent_branches off) and on two streams alike; the update
  // on a cluster (sm_90) and in one block (the register kernel, which cuts one row at a time).
  for (int variant = 0; variant < 3; ++variant) {
    const bool concurrent = variant != 0, cluster = variant != 2;
    BackendOptions branch_options = options;
    branch_options.concurrent_branches = concurrent;
    branch_options.cluster_residual_update = cluster;
    auto b = make_backend("cuda", branch_options);
    const int64_t cols = 2816, M = 200;
    const std::string at = std::string(concurrent ? " (two streams" : " (in order") + (cluster ? ")" : ", one block)");
    Twin w = twin_random(DType::hfq4_g256, {M, cols}, 0.5f);
    {
      Twin out = twin_output(DType::f32, {1, M});
      Twin x = twin_random(DType::f32, {1, cols});
      b->matmul(out.gpu, x.gpu, w.gpu);  // (an integer product first: producers cut after one)
    }
    Twin h = twin_random(DType::f32, {1, cols}, 2.0f), term = twin_random(DType::f32, {1, cols}, 3.0f);
    Twin gain = twin_random(DType::bf16, {cols});
    std::vector<Twin> norm_gain, normed, out;
    for (int i = 0; i < 3; ++i) {
      norm_gain.push_back(twin_random(DType::bf16, {cols}));
      normed.push_back(twin_output(DType::f32, {1, cols}));
      out.push_back(twin_output(DType::f32, {1, M}));
    }
    const ResidualTerm terms[] = {{term.gpu, &gain.gpu, NormGain::weight, true}};
    const StreamNorm norms[] = {{normed[0].gpu, &norm_gain[0].gpu, NormGain::weight, 1.0f},
                                {normed[1].gpu, &norm_gain[1].gpu, NormGain::weight, 0.25f},
                                {normed[2].gpu, &norm_gain[2].gpu, NormGain::one_plus_weight, 1.0f}};
    ResidualUpdate r;
    r.terms = terms;
    r.norms = norms;
    r.eps = 1e-6f;
    b->synchronize();
    const Counts before;
    const int64_t clusters_before = cuda_cluster_update_launches();
    b->residual_update(h.gpu, r);
    if (!cluster) {
      EXPECT_EQ(cuda_cluster_update_launches(), clusters_before) << "the register kernel ran" << at;
    }
    run_side_by_side(
        *b, [&] { b->matmul(out[0].gpu, normed[0].gpu, w.gpu); },
        [&] {
          b->matmul(out[1].gpu, normed[1].gpu, w.gpu);
          b->matmul(out[2].gpu, normed[2].gpu, w.gpu);
        });
    b->synchronize();
    EXPECT_EQ(cuda_imma_pieces_launches() - before.pieces, 1)
        << "a branch: only the second main-line product cuts" << at;
    EXPECT_EQ(cuda_imma_matvec_launches() - before.products, 3) << "a branch: integer products" << at;
    for (int i = 0; i < 3; ++i) {
      const std::vector<uint8_t> bytes = gpu_bytes(normed[i]);  // the oracle multiplies the GPU's rows
      std::memcpy(normed[i].host.data(), bytes.data(), bytes.size());
      cpu_->matmul(out[i].cpu, normed[i].cpu, w.cpu);
      expect_close(out[i], dot_budget(cols), "a branch: norm " + std::to_string(i) + "'s product" + at);
    }
  }
  // The gated activation (a dense MLP's down projection input; 2112 = 16.5 x 128: a part-used
  // last group) cuts its output in its own launch; the product right after launches none.
  for (int64_t I : {2112, 21504}) {
    const std::string at = " I=" + std::to_string(I);
    for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
      Twin gate = twin_random(DType::f32, {1, I}, 2.0f), up = twin_random(DType::f32, {1, I}, 2.0f);
      Twin a = twin_output(DType::f32, {1, I});
      Twin w = twin_random(I % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128, {200, I}, 0.5f);
      Twin out = twin_output(DType::f32, {1, 200});
      const Counts before;
      imma->gated_activation(a.gpu, gate.gpu, up.gpu, act);
      imma->matmul(out.gpu, a.gpu, w.gpu);
      expect_counts(before, 1, 1, "gated" + at);
      cpu_->gated_activation(a.cpu, gate.cpu, up.cpu, act);
      expect_close(a, kUlpBudget * 4, "gated: the activation" + at);
      take_gpu_values(a);
      cpu_->matmul(out.cpu, a.cpu, w.cpu);
      expect_close(out, dot_budget(I), "gated: the product" + at);
    }
  }
}

// NormPiecesBook's rule (norm_pieces.h), host logic alone: a residual update's pieces serve the
// first op of each line after it, and nothing after another op, a copy or a replay.
TEST(NormPiecesBook, ServesTheFirstProductOfEachLineOnly) {
  float rows[3][16] = {};
  char pieces[3] = {};
  using Entry = cuda::NormPiecesBook::Entry;
  const Entry cut[] = {{rows[0], 16, 128, &pieces[0]}, {rows[1], 16, 128, &pieces[1]}, {rows[2], 16, 256, &pieces[2]}};
  cuda::NormPiecesBook book;
  EXPECT_EQ(book.find(rows[0], 16, 128, cuda::OpLine::unbranched, 1), nullptr) << "nothing cut yet";
  book.cut(cut, 10);
  // no branch: the op right after the update, on any of the rows, in the row's own group
  ASSERT_NE(book.find(rows[1], 16, 128, cuda::OpLine::unbranched, 11), nullptr);
  EXPECT_EQ(book.find(rows[1], 16, 128, cuda::OpLine::unbranched, 11)->pieces, &pieces[1]);
  EXPECT_EQ(book.find(rows[1], 16, 128, cuda::OpLine::unbranched, 12), nullptr) << "an op between";
  EXPECT_EQ(book.find(rows[2], 16, 128, cuda::OpLine::unbranched, 11), nullptr) << "another group size";
  EXPECT_EQ(book.find(rows[0], 8, 128, cuda::OpLine::unbranched, 11), nullptr) << "another width";
  EXPECT_EQ(book.find(rows[0] + 1, 16, 128, cuda::OpLine::unbranched, 11), nullptr) << "another row";
  // a branch forked right after it (op 11): the side line's first op (12), the main line's first
  // op after the side line's end (side ops 12-13, end 14: op 15)
  book.branch_forked(11);
  EXPECT_NE(book.find(rows[0], 16, 128, cuda::OpLine::side, 12), nullptr);
  EXPECT_EQ(book.find(rows[0], 16, 128, cuda::OpLine::side, 13), nullptr) << "the side line's second op";
  book.side_ended(14);
  EXPECT_NE(book.find(rows[1], 16, 128, cuda::OpLine::main, 15), nullptr);
  EXPECT_EQ(book.find(rows[1], 16, 128, cuda::OpLine::main, 16), nullptr) << "the main line's second op";
  // a branch forked later (an op between the update and the fork): neither line
  book.cut(cut, 20);
  book.branch_forked(22);
  book.side_ended(24);
  EXPECT_EQ(book.find(rows[0], 16, 128, cuda::OpLine::side, 23), nullptr);
  EXPECT_EQ(book.find(rows[1], 16, 128, cuda::OpLine::main, 25), nullptr);
  // an update that cut nothing (inside no branch) forgets the earlier rows
  book.cut({}, 30);
  EXPECT_EQ(book.find(rows[0], 16, 128, cuda::OpLine::unbranched, 31), nullptr);
}

TEST_F(CudaOps, MoeRouteAndExperts) {
  // Routing alone over the kernels' size classes: one warp per token holding 4 (<= 128 experts)
  // or 16 (<= 512, Qwen3.5's 256) per lane, and the block kernel beyond; T = 17 leaves a block
  // of the warp kernel part-empty.
  for (int64_t T : {1, 17})
    for (int64_t E : {256, 600}) {
      Twin logits = twin_random(DType::f32, {T, E}, 2.0f), scale = twin_random(DType::bf16, {E});
      Twin w = twin_output(DType::f32, {T, 8}), ids = twin_output(DType::i32, {T, 8});
      cpu_->moe_route(w.cpu, ids.cpu, logits.cpu, &scale.cpu);
      gpu_->moe_route(w.gpu, ids.gpu, logits.gpu, &scale.gpu);
      expect_identical(ids, "moe_route ids E=" + std::to_string(E));
      expect_close(w, kUlpBudget * 8, "moe_route weights E=" + std::to_string(E));
    }
  for (int64_t T : {1, 3, 17}) {
    for (int64_t E : {8, 128}) {
      const int64_t K = E == 8 ? 2 : 8;
      Twin logits = twin_random(DType::f32, {T, E}, 2.0f), scale = twin_random(DType::bf16, {E});
      Twin w = twin_output(DType::f32, {T, K}), ids = twin_output(DType::i32, {T, K});
      cpu_->moe_route(w.cpu, ids.cpu, logits.cpu, &scale.cpu);
      gpu_->moe_route(w.gpu, ids.gpu, logits.gpu, &scale.gpu);
      expect_identical(ids, "moe_route ids");
      expect_close(w, kUlpBudget * 8, "moe_route weights");

      for (DType type : kWeightTypes) {
        if (!has_quant_format(type)) continue;
        const int64_t H = 256, I = 176;  // I = 176: the down projection's K is not a multiple of 128
        Twin gate_up = twin_random(type, {E, 2 * I, H}, 0.3f), down = twin_random(type, {E, H, I}, 0.3f);
        Twin x = twin_random(DType::f32, {T, H});
        Twin out = twin_output(DType::f32, {T, H});
        cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::gelu_tanh);
        // both sides use the CPU's routing so that the expert maths alone is compared
        gpu_->copy_to_device(w.gpu, w.host.data());
        gpu_->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
        expect_close(out, kSumBudget, std::string("moe_experts ") + std::string(dtype_name(type)));
        // SiLU (Qwen3.5's experts; HFQ4's matvec path fuses it into the gate_up product)
        Twin silu_out = twin_output(DType::f32, {T, H});
        cpu_->moe_experts(silu_out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::silu);
        gpu_->moe_experts(silu_out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::silu);
        expect_close(silu_out, kSumBudget, std::string("moe_experts silu ") + std::string(dtype_name(type)));
        // BackendOptions::gated_matvec: the matvec path's gate_up product applies the activation
        // itself (HFQ4), with the same bits as the product and gated_activation apart
        {
          BackendOptions gated_options;
          gated_options.gated_matvec = true;
          auto gated = make_backend("cuda", gated_options);
          const std::vector<uint8_t> apart = gpu_bytes(silu_out);
          gated->moe_experts(silu_out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::silu);
          gated->synchronize();
          EXPECT_EQ(gpu_bytes(silu_out), apart) << "moe_experts gated matvec " << dtype_name(type) << " T=" << T;
        }
        // --ep: the pairs of experts outside [E/4, 3E/4) are not run, on the matvec path (T = 1,
        // 3) and the grouped GEMM's (T = 17).
        expect_kept_experts_close(*gpu_, x, gate_up, down, ids, w, E, kSumBudget,
                                  std::string("moe_experts --ep ") + std::string(dtype_name(type)));
      }
    }
  }
}

// BackendOptions::imma_experts: decode's routed expert products on the integer matvec (x cut
// once, gate_up per pair, the activation cutting the down products' pieces per pair, down per
// pair), against the CPU oracle: G256 and G128 stacks, one token and three (8 and 24 pairs, still
// the per-pair path), the 26B-A4B's expert shape (H 2816, I 704: down rows of 5.5 G128 groups;
// 16 experts, not 128, to keep the stacks' generation short) and a small one with a part-used
// last group (I 176), GELU and SiLU, and --ep's pairs of id -1 (not run). Two integer launches
// per call (the counter says the kernels ran).
TEST_F(CudaOps, ImmaExpertsMatchTheOracle) {
  BackendOptions options;
  options.imma_matvec = true;
  options.imma_experts = true;
  auto imma = make_backend("cuda", options);
  if (!cuda_imma_matvec_available(*imma)) GTEST_SKIP() << "no integer mma on this GPU (sm_80 and later)";
  const int64_t E = 16, K = 8;  // (T = 3: 24 pairs, under 2E, still the per-pair path)
  for (auto [H, I] : {std::pair<int64_t, int64_t>{2816, 704}, {512, 176}})
    for (DType type : {DType::hfq4_g256, DType::hfq4_g128}) {
      Twin gate_up = twin_random(type, {E, 2 * I, H}, 0.3f), down = twin_random(type, {E, H, I}, 0.3f);
      for (int64_t T : {1, 3}) {
        const std::string what = std::string(dtype_name(type)) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                                 " T=" + std::to_string(T);
        auto [w, ids] = twin_routing(T, E, K);
        Twin x = twin_random(DType::f32, {T, H});
        for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
          Twin out = twin_output(DType::f32, {T, H});
          const int64_t launches = cuda_imma_matvec_launches();
          cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, act);
          imma->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, act);
          imma->synchronize();
          EXPECT_EQ(cuda_imma_matvec_launches(), launches + 2) << what << ": the integer kernels did not run";
          expect_close(out, dot_budget(std::max(H, I)), "imma experts " + what);
        }
        expect_kept_experts_close(*imma, x, gate_up, down, ids, w, E, dot_budget(std::max(H, I)),
                                  "imma experts --ep " + what);
      }
    }
}

// Whether moe_experts of T tokens with top K over E experts takes the fused launch: 1-4 tokens,
// and fewer pairs than the grouped GEMM takes (the backend's plan: 16+ pairs and 2+ per expert).
bool takes_fused_experts(int64_t T, int64_t K, int64_t E) {
  const int64_t pairs = T * K;
  return T <= 4 && !(pairs >= 16 && pairs >= 2 * E);
}

// BackendOptions::fused_experts: decode's routed experts in one launch (moe_decode.cu) give the
// four kernels' bytes (gate_up, the activation, down, the combine: the default path), and the
// oracle's values within the products' budget. The 26B-A4B's stacks (gate_up G256, down G128)
// and both single-format pairs; its expert shape (H 2816, I 704: down rows of 5.5 G128 groups; 16
// experts, not 128, to keep the stacks' generation short, top 8) and a small one whose last
// activation tile and last column tile are part-used and whose top 6 leaves a pass of the down
// sums short (I 180, H 516); 1 to 4 tokens, GELU and SiLU; each twice (a launch must leave its
// counters zeroed for the next); --ep's pairs of id -1, bytes against the four kernels too; one
// block per SM (--fused-experts-blocks 1). 5 tokens are past the fused kernel's limit: the four
// kernels run, as at 4 tokens of top 8 over 16 experts, which take the grouped GEMM (the counter
// says which path ran).
TEST_F(CudaOps, FusedExpertsMatchTheFourKernels) {
  BackendOptions options;
  options.fused_experts = true;
  auto fused = make_backend("cuda", options);
  options.fused_experts_blocks = 1;
  auto fused_one_block = make_backend("cuda", options);
  const int64_t E = 16;
  struct Shape {
    int64_t H, I, K;
  };
  for (Shape shape : {Shape{2816, 704, 8}, Shape{516, 180, 6}})
    for (auto [up_type, down_type] : {std::pair{DType::hfq4_g256, DType::hfq4_g128},
                                      {DType::hfq4_g256, DType::hfq4_g256},
                                      {DType::hfq4_g128, DType::hfq4_g128}}) {
      const int64_t H = shape.H, I = shape.I, K = shape.K;
      Twin gate_up = twin_random(up_type, {E, 2 * I, H}, 0.3f), down = twin_random(down_type, {E, H, I}, 0.3f);
      for (int64_t T : {1, 2, 3, 4, 5}) {
        const std::string what = std::string(dtype_name(up_type)) + "/" + std::string(dtype_name(down_type)) +
                                 " H=" + std::to_string(H) + " I=" + std::to_string(I) + " K=" + std::to_string(K) +
                                 " T=" + std::to_string(T);
        auto [w, ids] = twin_routing(T, E, K);
        Twin x = twin_random(DType::f32, {T, H});
        // the four kernels' bytes, then the fused launch's (over NaN) on backend b, twice
        auto expect_fused_bytes = [&](Backend& b, const Twin& route_ids, const Twin& route_w, Activation act,
                                      const std::string& at) {
          Twin out = twin_output(DType::f32, {T, H});
          gpu_->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu, act);
          gpu_->synchronize();
          const std::vector<uint8_t> four_kernels = gpu_bytes(out), nan_bytes(four_kernels.size(), 0xff);
          for (int run = 0; run < 2; ++run) {
            const int64_t launches = cuda_moe_experts_decode_launches();
            b.copy_to_device(out.gpu, nan_bytes.data());
            b.moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu, act);
            b.synchronize();
            EXPECT_EQ(cuda_moe_experts_decode_launches(), launches + (takes_fused_experts(T, K, E) ? 1 : 0))
                << at << ": which path ran";
            EXPECT_EQ(gpu_bytes(out), four_kernels) << at << " run " << run << ": not the four kernels' bytes";
          }
          return out;
        };
        for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
          Twin out = expect_fused_bytes(*fused, ids, w, act, what);
          cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, act);
          expect_close(out, dot_budget(std::max(H, I)), "fused experts " + what);
        }
        if (T == 1) expect_fused_bytes(*fused_one_block, ids, w, Activation::gelu_tanh, what + " one block per SM");
        // --ep: the experts outside [E/4, 3E/4) become id -1 (not run), against the four kernels' bytes
        Twin kept_ids = twin_bytes(DType::i32, {T, K}, ids.host.data());
        Twin kept_w = twin_bytes(DType::f32, {T, K}, w.host.data());
        gpu_->moe_keep_experts(kept_ids.gpu, kept_w.gpu, E / 4, E / 2);
        expect_fused_bytes(*fused, kept_ids, kept_w, Activation::gelu_tanh, what + " --ep");
        expect_kept_experts_close(*fused, x, gate_up, down, ids, w, E, dot_budget(std::max(H, I)),
                                  "fused experts --ep " + what);
      }
    }
}

// --ep's routing in the experts tests: the pairs outside experts [E/4, 3E/4) dropped (id -1, as
// moe_keep_experts maps them) and given a NaN weight, so that adding or running one would show;
// both twins' device copies updated.
static void drop_pairs_as_ep(Backend& cpu, Backend& gpu, Twin& route_ids, Twin& route_w, int64_t E) {
  cpu.moe_keep_experts(route_ids.cpu, route_w.cpu, E / 4, E / 2);
  float* kept_w = static_cast<float*>(route_w.host.data());
  const int32_t* kept_ids = static_cast<const int32_t*>(route_ids.host.data());
  for (int64_t i = 0; i < route_ids.cpu.numel(); ++i)
    if (kept_ids[i] < 0) kept_w[i] = std::numeric_limits<float>::quiet_NaN();
  gpu.copy_to_device(route_ids.gpu, route_ids.host.data());
  gpu.copy_to_device(route_w.gpu, route_w.host.data());
}

// BackendOptions::experts_down_sum (on by default): on the per-pair path the down products and
// the combine are one launch that writes out [T, H] itself. The same bytes as per-pair outputs and
// the combine (the option off), and close to the CPU oracle; also with --ep's -1 ids (those pairs
// add nothing). Shapes: the 26B-A4B's experts (H 2816, I 704, top 8), the Qwen3.5-35B-A3B's (2048,
// 512, 8), odd sizes at top 6; G256 and G128 down rows; 1-5 tokens over 16 experts (4 tokens of 8
// pairs take the grouped GEMM, which keeps its combine).
TEST_F(CudaOps, ExpertsDownSumMatchesTheCombine) {
  BackendOptions on;  // (the f32 per-pair path whatever the other switches' defaults)
  on.experts_down_sum = true, on.fused_experts = false, on.imma_experts = false, on.gated_matvec = false;
  BackendOptions off = on;
  off.experts_down_sum = false;
  auto apart = make_backend("cuda", off), summed = make_backend("cuda", on);
  const int64_t E = 16;
  struct Shape {
    int64_t H, I, K;
  };
  for (Shape shape : {Shape{2816, 704, 8}, Shape{2048, 512, 8}, Shape{516, 180, 6}})
    for (auto [up_type, down_type] :
         {std::pair{DType::hfq4_g256, DType::hfq4_g128}, {DType::hfq4_g128, DType::hfq4_g256}}) {
      const int64_t H = shape.H, I = shape.I, K = shape.K;
      Twin gate_up = twin_random(up_type, {E, 2 * I, H}, 0.3f), down = twin_random(down_type, {E, H, I}, 0.3f);
      for (int64_t T : {1, 2, 3, 4, 5}) {
        const std::string what = std::string(dtype_name(down_type)) + " H=" + std::to_string(H) +
                                 " I=" + std::to_string(I) + " K=" + std::to_string(K) + " T=" + std::to_string(T);
        const bool per_pair = !(T * K >= 16 && T * K >= 2 * E);  // (else the grouped GEMM: plan_experts_scratch)
        auto [w, ids] = twin_routing(T, E, K);
        Twin x = twin_random(DType::f32, {T, H});
        for (bool ep : {false, true}) {
          Twin route_ids = twin_bytes(DType::i32, {T, K}, ids.host.data());
          Twin route_w = twin_bytes(DType::f32, {T, K}, w.host.data());
          if (ep) drop_pairs_as_ep(*cpu_, *gpu_, route_ids, route_w, E);
          Twin out = twin_output(DType::f32, {T, H}), out_apart = twin_output(DType::f32, {T, H});
          const int64_t launches = cuda_experts_down_sum_launches();
          summed->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu, Activation::gelu_tanh);
          summed->synchronize();
          EXPECT_EQ(cuda_experts_down_sum_launches(), launches + (per_pair ? 1 : 0)) << what << ": which path ran";
          apart->moe_experts(out_apart.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu,
                             Activation::gelu_tanh);
          apart->synchronize();
          EXPECT_EQ(cuda_experts_down_sum_launches(), launches + (per_pair ? 1 : 0)) << what << ": off, yet summed";
          EXPECT_EQ(gpu_bytes(out), gpu_bytes(out_apart)) << what << (ep ? " --ep" : "") << ": not the combine's bytes";
          if (!ep) {
            cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::gelu_tanh);
            expect_close(out, dot_budget(std::max(H, I)), "experts down sum " + what);
          }
        }
      }
    }
}

// The expert pairs' shape plan (expert_rows_plan.h) on 132 SMs with the resident blocks ptxas's
// registers give on sm_90a (96 -> 5 blocks of 128 threads, 127-128 -> 4, 167 -> 3, 64 -> 8): the
// 26B-A4B's gate_up (plain 4x2: 2 waves x 3 rounds) moves to 8x3 (1 x 2) and its down (4x2: 3
// waves x 1 round) to 8x2 (2 x 1; 8x3 ties and comes later); the Qwen3.5-35B-A3B's (cost 2 each)
// stay plain, as do several tokens' launches (not timed), shapes without pairs and groups the
// rows kernel lacks. Host code: runs without a GPU (in ops_tests, built with the CUDA backend).
TEST(ExpertRowsPlan, AutoMovesOnlyTheLaunchesThatWaitThreeRounds) {
  using cuda::ExpertRowsShape;
  const auto blocks_per_sm = [](ExpertRowsShape s) {
    if (s == ExpertRowsShape{8, 3}) return 3;
    if (s == ExpertRowsShape{1, 4}) return 8;
    if (s == ExpertRowsShape{4, 2} || s == ExpertRowsShape{2, 4}) return 5;
    return 4;
  };
  const int sms = 132;
  struct Case {
    const char* what;
    int64_t M, K;
    int group;
    int64_t pairs;
    ExpertRowsShape plain;
    int64_t plain_cost;
    ExpertRowsShape chosen;
  };
  const Case cases[] = {
      {"26B-A4B gate_up", 1408, 2816, 256, 8, {4, 2}, 6, {8, 3}},
      {"26B-A4B down", 2816, 704, 128, 8, {4, 2}, 3, {8, 2}},
      {"35B-A3B gate_up", 1024, 2048, 256, 8, {4, 2}, 2, {}},
      {"35B-A3B down", 2048, 512, 256, 8, {4, 2}, 2, {}},
      {"small: one pair of 64 rows", 64, 256, 256, 1, {1, 4}, 1, {}},
      // two tokens of the 26B-A4B (16 pairs: plain 3 waves x 3 rounds), not timed: auto keeps it
      {"26B-A4B gate_up, 2 tokens", 1408, 2816, 256, 16, {4, 2}, 9, {}},
  };
  for (const Case& c : cases) {
    const ExpertRowsShape plain = cuda::plain_expert_rows_shape(c.M, c.K, c.group, c.pairs, sms);
    EXPECT_EQ(plain.rows, c.plain.rows) << c.what;
    EXPECT_EQ(plain.steps, c.plain.steps) << c.what;
    EXPECT_EQ(cuda::expert_rows_cost(plain, c.M, c.K, c.group, c.pairs, sms, blocks_per_sm(plain)), c.plain_cost)
        << c.what;
    const ExpertRowsShape chosen = cuda::auto_expert_rows_shape(c.M, c.K, c.group, c.pairs, sms, blocks_per_sm);
    EXPECT_EQ(chosen.rows, c.chosen.rows) << c.what;
    EXPECT_EQ(chosen.steps, c.chosen.steps) << c.what;
  }
  // the 26B-A4B gate_up's 8x3: one wave (352 blocks, 396 resident) of 2 rounds (6 steps over 3)
  EXPECT_EQ(cuda::expert_rows_cost({8, 3}, 1408, 2816, 256, 8, sms, 3), 2);
  // no shape, no group: no cost (no division by zero)
  EXPECT_EQ(cuda::expert_rows_cost({}, 1408, 2816, 256, 8, sms, 3), 0);
  EXPECT_EQ(cuda::expert_rows_cost({8, 3}, 1408, 2816, 0, 8, sms, 3), 0);
  EXPECT_EQ(cuda::plain_expert_rows_shape(1408, 2816, 0, 8, sms).rows, 0);
  // nothing to plan: no rows, no pairs, no SMs, a group the kernel does not have
  for (auto [M, K, group, pairs, sm] : {std::tuple{0, 2816, 256, 8, 132},
                                        {1408, 2816, 256, 0, 132},
                                        {1408, 2816, 256, 8, 0},
                                        {1408, 2816, 64, 8, 132}}) {
    const ExpertRowsShape s = cuda::auto_expert_rows_shape(M, K, group, pairs, sm, blocks_per_sm);
    EXPECT_EQ(s.rows, 0) << M << " " << K << " " << group << " " << pairs << " " << sm;
  }
}

// BackendOptions::expert_matvec: decode's routed expert pairs at each built shape of the rows
// kernel (rows per warp x steps in flight), and the automatic choice, with and without the ring of
// loads (expert_matvec_ring), give the plain choice's
// bytes (a row's sum is its lanes' blocks in order, then the warp sum, whatever the shape): the
// 26B-A4B's expert shape (gate_up rows of 11 G256 blocks, down rows of 5.5 G128 groups), the
// 35B-A3B's, and a small one with part-used groups and a top 6; 1 and 3 tokens (the per-pair
// path), --ep's dropped pairs (id -1, NaN weight) too. Two shaped launches per call (gate_up,
// down), each of the asked shape; the outputs also within budget of the CPU oracle.
TEST_F(CudaOps, ExpertMatvecShapesGiveThePlainBits) {
  BackendOptions plain_options;  // (the f32 per-pair path whatever the other switches' defaults)
  plain_options.fused_experts = plain_options.imma_experts = plain_options.gated_matvec = false;
  plain_options.experts_down_sum = false;
  plain_options.expert_matvec = {0, 0};
  auto plain = make_backend("cuda", plain_options);
  struct Asked {
    int rows, steps;
    bool ring;  // BackendOptions::expert_matvec_ring
  };
  std::vector<Asked> shapes;
  for (bool ring : {false, true})
    for (auto [rows, steps] : {std::pair{-1, 0}, {4, 2}, {2, 4}, {4, 3}, {4, 4}, {8, 2}, {8, 3}})
      shapes.push_back({rows, steps, ring});
  std::vector<std::unique_ptr<Backend>> shaped;
  for (const Asked& asked : shapes) {
    BackendOptions o = plain_options;
    o.expert_matvec = {asked.rows, asked.steps};
    o.expert_matvec_ring = asked.ring;
    shaped.push_back(make_backend("cuda", o));
  }
  const int64_t E = 16;
  struct Shape {
    int64_t H, I, K;
  };
  for (Shape shape : {Shape{2816, 704, 8}, Shape{2048, 512, 8}, Shape{516, 180, 6}})
    for (auto [up_type, down_type] :
         {std::pair{DType::hfq4_g256, DType::hfq4_g128}, {DType::hfq4_g128, DType::hfq4_g256}}) {
      const int64_t H = shape.H, I = shape.I, K = shape.K;
      Twin gate_up = twin_random(up_type, {E, 2 * I, H}, 0.3f), down = twin_random(down_type, {E, H, I}, 0.3f);
      for (int64_t T : {1, 3}) {
        auto [w, ids] = twin_routing(T, E, K);
        Twin x = twin_random(DType::f32, {T, H});
        for (bool ep : {false, true}) {
          const std::string what = std::string(dtype_name(up_type)) + "/" + std::string(dtype_name(down_type)) +
                                   " H=" + std::to_string(H) + " I=" + std::to_string(I) + " K=" + std::to_string(K) +
                                   " T=" + std::to_string(T) + (ep ? " --ep" : "");
          Twin route_ids = twin_bytes(DType::i32, {T, K}, ids.host.data());
          Twin route_w = twin_bytes(DType::f32, {T, K}, w.host.data());
          if (ep) drop_pairs_as_ep(*cpu_, *gpu_, route_ids, route_w, E);
          Twin expected = twin_output(DType::f32, {T, H});
          const int64_t before_plain = cuda_expert_rows_launches(0, 0);
          plain->moe_experts(expected.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu,
                             Activation::gelu_tanh);
          plain->synchronize();
          EXPECT_EQ(cuda_expert_rows_launches(0, 0), before_plain) << what << ": plain ran a shaped launch";
          if (!ep) {
            cpu_->moe_experts(expected.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::gelu_tanh);
            expect_close(expected, dot_budget(std::max(H, I)), "expert matvec plain " + what);
          }
          // auto: the plan's choice for gate_up ([2I, H] per pair) and down ([H, I]), on this GPU
          const auto auto_shape = [&](int64_t M, int64_t cols, DType type, bool ring) {
            const int group = type == DType::hfq4_g256 ? 256 : 128;
            return cuda::auto_expert_rows_shape(
                M, cols, group, T * K, cuda_sm_count(*plain),
                [&](cuda::ExpertRowsShape s) { return cuda_expert_rows_blocks_per_sm(s.rows, s.steps, group, ring); });
          };
          for (size_t i = 0; i < shaped.size(); ++i) {
            const auto [rows, steps, ring] = shapes[i];
            const cuda::ExpertRowsShape auto_up = auto_shape(2 * I, H, up_type, ring),
                                        auto_down = auto_shape(H, I, down_type, ring);
            Twin out = twin_output(DType::f32, {T, H});
            // launches of each shape this call should make: the asked one twice, or auto's picks
            std::vector<std::pair<cuda::ExpertRowsShape, int64_t>> expected_launches;
            for (cuda::ExpertRowsShape s :
                 rows < 0 ? std::vector{auto_up, auto_down} : std::vector{cuda::ExpertRowsShape{rows, steps}}) {
              if (s.rows == 0) continue;  // (auto kept the plain shape)
              auto at = std::find_if(expected_launches.begin(), expected_launches.end(),
                                     [&](const auto& e) { return e.first == s; });
              if (at == expected_launches.end())
                expected_launches.push_back({s, rows < 0 ? 1 : 2});
              else
                ++at->second;
            }
            std::vector<int64_t> before;
            for (const auto& [s, n] : expected_launches) before.push_back(cuda_expert_rows_launches(s.rows, s.steps));
            const int64_t before_any = cuda_expert_rows_launches(0, 0);
            shaped[i]->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, route_ids.gpu, route_w.gpu,
                                   Activation::gelu_tanh);
            shaped[i]->synchronize();
            const std::string at =
                (rows < 0 ? std::string("auto") : std::to_string(rows) + "x" + std::to_string(steps)) +
                (ring ? " ring" : "");
            int64_t expected_any = 0;
            for (size_t e = 0; e < expected_launches.size(); ++e) {
              const auto& [s, n] = expected_launches[e];
              expected_any += n;
              EXPECT_EQ(cuda_expert_rows_launches(s.rows, s.steps), before[e] + n)
                  << what << " " << at << ": launches at " << s.rows << "x" << s.steps;
            }
            EXPECT_EQ(cuda_expert_rows_launches(0, 0), before_any + expected_any) << what << " " << at;
            EXPECT_EQ(gpu_bytes(out), gpu_bytes(expected)) << what << " " << at << ": not the plain choice's bytes";
          }
        }
      }
    }
}

// BackendOptions::fused_experts with the routing (Backend::moe_route_experts): the router's
// product, the routing and the experts in the experts' one launch write the bytes of the three ops
// apart (the router on the f32 matvec, as every product of several tokens and, with the integer
// kernel off, of one token is) to the logits, the weights, the ids and the output; twice (the
// counters left zeroed); and the oracle's logits and sums (on the GPU's routing) within budget.
// Gemma 4's form (the 26B-A4B's expert shape on 16 experts, a per-expert scale, top 8; and 128
// experts of a small shape) and Qwen3.5's (no scale; 300 experts: more than 8 per lane and a part
// tile of logits, top 10). 5 tokens are past the fused kernel, and the 26B-A4B's top 8 of 16
// experts at 4 tokens take the grouped GEMM (pairs >= 2E): the three ops run.
TEST_F(CudaOps, FusedRouteMatchesTheRouterRouteAndExperts) {
  BackendOptions options;
  options.fused_experts = true;
  auto fused = make_backend("cuda", options);
  BackendOptions apart_options;
  apart_options.imma_matvec = false;
  auto apart = make_backend("cuda", apart_options);
  struct Shape {
    int64_t E, H, I, K;
    bool scale;
    Activation act;
  };
  for (Shape c :
       {Shape{16, 2816, 704, 8, true, Activation::gelu_tanh}, Shape{128, 256, 128, 8, true, Activation::gelu_tanh},
        Shape{300, 256, 64, 10, false, Activation::silu}}) {
    const DType up_type = c.H % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128;
    const DType down_type = c.I % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128;
    // (logits of about unit spread, as Gemma 4's router input norm / sqrt(H) makes them: every
    // chosen expert's weight then shows in the output's bytes)
    Twin router = twin_random(up_type, {c.E, c.H}, 1.0f / std::sqrt(static_cast<float>(c.H)));
    Twin scale = twin_random(DType::bf16, {c.E});
    Twin gate_up = twin_random(up_type, {c.E, 2 * c.I, c.H}, 0.3f),
         down = twin_random(down_type, {c.E, c.H, c.I}, 0.3f);
    const Tensor* gpu_scale = c.scale ? &scale.gpu : nullptr;
    for (int64_t T : {1, 2, 4, 5}) {
      const std::string what = "E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I) +
                               " K=" + std::to_string(c.K) + " T=" + std::to_string(T);
      Twin x = twin_random(DType::f32, {T, c.H}), x_router = twin_random(DType::f32, {T, c.H});
      Twin out = twin_output(DType::f32, {T, c.H}), logits = twin_output(DType::f32, {T, c.E});
      Twin w = twin_output(DType::f32, {T, c.K}), ids = twin_output(DType::i32, {T, c.K});
      auto run = [&](Backend& b) {  // every output's bytes, each written over NaN
        for (const Twin* t : {&out, &logits, &w, &ids}) {
          const std::vector<uint8_t> nan_bytes(t->host.size(), 0xff);
          b.copy_to_device(t->gpu, nan_bytes.data());
        }
        b.moe_route_experts(out.gpu, x.gpu, x_router.gpu, router.gpu, gpu_scale, logits.gpu, w.gpu, ids.gpu,
                            gate_up.gpu, down.gpu, c.act);
        b.synchronize();
        return std::vector<std::vector<uint8_t>>{gpu_bytes(out), gpu_bytes(logits), gpu_bytes(w), gpu_bytes(ids)};
      };
      const auto three_ops = run(*apart);
      for (int round = 0; round < 2; ++round) {
        const int64_t launches = cuda_moe_experts_decode_launches();
        const auto one = run(*fused);
        EXPECT_EQ(cuda_moe_experts_decode_launches(), launches + (takes_fused_experts(T, c.K, c.E) ? 1 : 0))
            << what << ": which path ran";
        const char* names[] = {"the output", "the logits", "the weights", "the ids"};
        for (int i = 0; i < 4; ++i)
          EXPECT_EQ(one[i], three_ops[i])
              << what << " round " << round << ": " << names[i] << " differ from the three ops'";
      }
      // the oracle: its logits, and its experts on the GPU's routing
      cpu_->matmul(logits.cpu, x_router.cpu, router.cpu);
      expect_close(logits, dot_budget(c.H), "fused route: the logits " + what);
      std::memcpy(w.host.data(), three_ops[2].data(), w.host.size());
      std::memcpy(ids.host.data(), three_ops[3].data(), ids.host.size());
      cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, c.act);
      expect_close(out, dot_budget(std::max(c.H, c.I)), "fused route: the experts " + what);
    }
  }
}

// Expert parallelism's filter (--ep): the kernel against the CPU's host default, bit for bit, on
// routed ids of 128 experts with ranges at the start, the middle and the end of the stack; a
// pair's weight is kept exactly or zeroed.
TEST_F(CudaOps, MoeKeepExpertsMatchesTheHostDefault) {
  for (int64_t T : {1, 17, 300})
    for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 32}, {40, 24}, {96, 32}, {0, 128}}) {
      SCOPED_TRACE("T=" + std::to_string(T) + " experts [" + std::to_string(first) + ", " +
                   std::to_string(first + count) + ")");
      std::vector<int32_t> id_host(static_cast<size_t>(T * 8));
      for (size_t i = 0; i < id_host.size(); ++i) id_host[i] = static_cast<int32_t>((i * 37 + 5) % 128);
      Twin ids = twin_bytes(DType::i32, {T, 8}, id_host.data());
      Twin w = twin_random(DType::f32, {T, 8});
      cpu_->moe_keep_experts(ids.cpu, w.cpu, first, count);
      gpu_->moe_keep_experts(ids.gpu, w.gpu, first, count);
      expect_identical(ids, "moe_keep_experts ids");
      expect_identical(w, "moe_keep_experts weights");
    }
  Twin ids = twin_output(DType::i32, {2, 8}), halves = twin_output(DType::bf16, {2, 8});
  EXPECT_ERROR_HAS(gpu_->moe_keep_experts(ids.gpu, halves.gpu, 0, 4), "expected contiguous ids i32 and weights f32");
  Twin w = twin_output(DType::f32, {2, 8});
  EXPECT_ERROR_HAS(gpu_->moe_keep_experts(ids.gpu, w.gpu, 3, 0), "are no range");
}

// Many routed pairs take the grouped tensor-core GEMM: the pairs are sorted by expert on the
// device (atomics, so in no fixed order) and each expert's matrices are read once per work item.
// 64 tokens x top-8 over 128 experts (4 pairs per expert on average) run 16-input tiles; 512
// tokens (32 per expert) 64-input tiles. With expert 0 favoured by every token, one expert gets
// more pairs than a tile holds (several work items). Checked against the CPU, and twice on the
// GPU for identical bytes: a pair's output must not depend on the order.
TEST_F(CudaOps, MoeExpertsGroupedGemm) {
  for (DType type : {DType::hfq4_g256, DType::hfq4_g128})
    for (int64_t T : {64, 512})
      for (bool favoured : {false, true}) {
        RoutedExperts e = routed_experts(type, T, favoured);
        Twin &x = e.x, &out = e.out, &gate_up = e.gate_up, &down = e.down, &ids = e.ids, &w = e.w;
        cpu_->moe_experts(out.cpu, x.cpu, gate_up.cpu, down.cpu, ids.cpu, w.cpu, Activation::gelu_tanh);
        gpu_->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
        const std::string what = std::string("grouped moe_experts ") + std::string(dtype_name(type)) +
                                 " T=" + std::to_string(T) + (favoured ? " expert 0 favoured" : "");
        expect_close(out, kSumBudget, what);
        const std::vector<uint8_t> first = gpu_bytes(out);
        gpu_->moe_experts(out.gpu, x.gpu, gate_up.gpu, down.gpu, ids.gpu, w.gpu, Activation::gelu_tanh);
        EXPECT_EQ(first, gpu_bytes(out)) << what << ": the output depends on the order of the sorted pairs";
      }
}

// BackendOptions::group_gemm: products of one input at many inputs in one GEMM launch (Hopper's
// wgmma kernel, bf16 tensor cores): each product close to the CPU's of the rounded inputs (the
// bf16 GEMM budget of Bf16TensorCoresMultiplyRoundedInputs, ops_test.cpp), one launch counted
// where the Hopper kernel runs (elsewhere the
// products run one by one). Cases: the 26B's q/k/v at 64 inputs (few tiles: K split, the
// segmented K-split sum), two G128 matrices with partial tiles, four segments with more tiles
// than SMs (no split, 128-input tiles, a partial one), a partial 64-input tile, and four
// segments with a K split (Qwen3.5's delta-net projections: two of 32 rows). Below kMmaMinInputs
// the products keep their matvecs (batched decode's bits per sequence): no launch at 15 inputs.
TEST_F(CudaOps, GroupGemmOneLaunchForSeveralMatrices) {
  BackendOptions options;
  options.tensor_core_precision = TensorCorePrecision::bf16;
  options.group_gemm = true;
  auto grouped = make_backend("cuda", options);
  struct Case {
    DType type;
    int64_t T, K;
    std::vector<int64_t> M;
  };
  const Case cases[] = {{DType::hfq4_g256, 64, 2816, {4096, 2048, 2048}},
                        {DType::hfq4_g128, 64, 704, {300, 77}},
                        {DType::hfq4_g256, 300, 1024, {8300, 1000, 513, 64}},
                        {DType::hfq4_g256, 17, 352, {200, 130}},
                        {DType::hfq4_g256, 64, 2048, {4096, 1024, 32, 32}}};
  for (const Case& c : cases) {
    const size_t n = c.M.size();
    std::string what = std::string("group GEMM ") + std::string(dtype_name(c.type)) + " T=" + std::to_string(c.T) +
                       " K=" + std::to_string(c.K) + " M=";
    for (int64_t m : c.M) what += std::to_string(m) + ",";
    Twin x = twin_random(DType::f32, {c.T, c.K});
    std::vector<Twin> w, out;
    for (int64_t m : c.M) {
      w.push_back(twin_random(c.type, {m, c.K}, 0.5f));
      out.push_back(twin_output(DType::f32, {c.T, m}));
    }
    std::vector<Tensor> outs;
    std::vector<const Tensor*> weights;
    for (size_t i = 0; i < n; ++i) outs.push_back(out[i].gpu), weights.push_back(&w[i].gpu);
    const int64_t before = cuda_group_gemm_launches();
    grouped->matmul_group(outs, x.gpu, weights);
    grouped->synchronize();
    EXPECT_EQ(cuda_group_gemm_launches() - before, cuda_hopper_gemm_active(*grouped) ? 1 : 0) << what;
    HostBuffer rounded;
    const Tensor x_rounded = rounded_to_bf16(x, rounded);
    for (size_t i = 0; i < n; ++i) {
      cpu_->matmul(out[i].cpu, x_rounded, w[i].cpu);
      expect_close(out[i], dot_budget(c.K), what + " product " + std::to_string(i));
    }
  }
  // 15 inputs: the one-by-one matvecs, the same bits as the default backend's
  Twin x = twin_random(DType::f32, {15, 704});
  Twin w1 = twin_random(DType::hfq4_g256, {300, 704}, 0.5f), w2 = twin_random(DType::hfq4_g256, {64, 704}, 0.5f);
  Twin o1 = twin_output(DType::f32, {15, 300}), o2 = twin_output(DType::f32, {15, 64});
  const Tensor outs[] = {o1.gpu, o2.gpu};
  const Tensor* weights[] = {&w1.gpu, &w2.gpu};
  const int64_t before = cuda_group_gemm_launches();
  grouped->matmul_group(outs, x.gpu, weights);
  grouped->synchronize();
  EXPECT_EQ(cuda_group_gemm_launches(), before) << "15 inputs took the grouped GEMM";
  const std::vector<uint8_t> got1 = gpu_bytes(o1), got2 = gpu_bytes(o2);
  gpu_->matmul_group(outs, x.gpu, weights);
  EXPECT_EQ(gpu_bytes(o1), got1);
  EXPECT_EQ(gpu_bytes(o2), got2);
}

// The memory plans' expert workspace (model.h moe_experts_workspace) against what the backend's
// moe_experts asks of its workspace for the published MoE shapes, with the Hopper expert items on
// (their gathered inputs are the largest form) and off, at both tensor-core precisions: prompt
// chunks, batched decode and a 30000-token prompt. (The Hopper kernel's sizing applies only on a
// 9.0 device, which the fixture has or skips.)
TEST_F(CudaOps, MemoryPlanCoversTheExpertBlocksWorkspace) {
  struct Shape {
    const char* name;
    int64_t E, k, H, I;
  };
  const Shape shapes[] = {{"gemma-4-26b-a4b", 128, 8, 2816, 704}, {"qwen3.5-35b-a3b", 256, 8, 2048, 512}};
  for (TensorCorePrecision precision : {TensorCorePrecision::f32, TensorCorePrecision::bf16})
    for (bool hopper : {false, true}) {
      BackendOptions options;
      options.tensor_core_precision = precision;
      options.hopper_expert_gemm = hopper;
      auto backend = make_backend("cuda", options);
      for (const Shape& s : shapes)
        for (int64_t T : {1, 64, 512, 4096, 30000}) {
          const double asked =
              static_cast<double>(cuda_moe_experts_workspace_bytes(*backend, T, s.k, s.E, s.H, s.I, DType::hfq4_g256));
          const double plan =
              moe_experts_workspace(static_cast<double>(T), static_cast<double>(s.k), static_cast<double>(s.E),
                                    static_cast<double>(s.H), static_cast<double>(s.I));
          EXPECT_GT(asked, 0.0);
          EXPECT_LE(asked, plan) << s.name << " T=" << T << (hopper ? " hopper" : "")
                                 << (precision == TensorCorePrecision::bf16 ? " bf16" : " f32");
        }
    }
}

}  // namespace
}  // namespace fl
