// The tensor/expert-parallel partition plan (model/parallel_plan.h), checked without GPUs: on
// the published shapes (Gemma 4 and Qwen3.5), every head, intermediate column and expert lands on
// exactly one rank (KV and key heads: on every rank that reads them), column splits fall on
// block boundaries, and bad
// splits are clear errors; on a small synthetic model, the shards multiplied rank by rank and
// summed (what the all-reduce does) give the single-device result.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <variant>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/parallel_plan.h"
#include "model/synthetic.h"
#include "quant/quant_policy.h"
#include "util/test_util.h"

namespace fl {
namespace {

Gemma4Config gemma4_like(const std::string& like) {
  return std::get<Gemma4Config>(make_synthetic_source({like, "hf4", 1, {}})->config().arch);
}

DType hf4(const std::string& name, const std::vector<int64_t>& shape) {
  return preset_tensor_format(QuantPreset::hf4, "model.language_model." + name, shape);
}

const TensorShard& find(const ParallelPlan& plan, const std::string& name) {
  for (const TensorShard& t : plan.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Every index of [0, n) in exactly one rank's range.
void expect_partition(const TensorShard& t, int64_t n) {
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (size_t r = 0; r < t.begin.size(); ++r)
    for (int64_t i = t.begin[r]; i < t.end[r]; ++i) ++seen.at(static_cast<size_t>(i));
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; })) << t.name;
}

TEST(ParallelPlan, PublishedShapesSplitWholeHeadsBlocksAndExperts) {
  for (const char* like : {"gemma-4-26b-a4b", "gemma-4-31b"})
    for (int N : {2, 4, 8})
      for (bool ep : {false, true}) {
        SCOPED_TRACE(std::string(like) + " tp " + std::to_string(N) + (ep ? " ep" : ""));
        const Gemma4Config c = gemma4_like(like);
        const ParallelPlan plan = plan_gemma4_parallel(c, {N, ep}, hf4);
        EXPECT_EQ(plan.all_reduces_per_layer, 2 + (c.enable_moe_block && ep ? 1 : 0));
        for (size_t l = 0; l < c.layers.size(); ++l) {
          const Gemma4LayerConfig& lc = c.layers[l];
          const std::string p = "layers." + std::to_string(l) + ".";
          const TensorShard& q = find(plan, p + "self_attn.q_proj.weight");
          const TensorShard& o = find(plan, p + "self_attn.o_proj.weight");
          expect_partition(q, c.num_heads * lc.head_dim);
          EXPECT_EQ(q.begin, o.begin);  // o_proj's columns are the rank's own heads
          EXPECT_EQ(q.end, o.end);
          const TensorShard& k = find(plan, p + "self_attn.k_proj.weight");
          for (int r = 0; r < N; ++r) {  // each rank holds the KV heads its query heads read
            const int64_t first_q_head = q.begin[r] / lc.head_dim, last_q_head = q.end[r] / lc.head_dim - 1;
            const int group = c.num_heads / lc.n_kv_heads;
            EXPECT_EQ(k.begin[r], first_q_head / group * lc.head_dim);
            EXPECT_EQ(k.end[r], (last_q_head / group + 1) * lc.head_dim);
          }
          if (lc.n_kv_heads % N == 0) expect_partition(k, lc.n_kv_heads * lc.head_dim);
          const TensorShard& gate = find(plan, p + "mlp.gate_proj.weight");
          const TensorShard& down = find(plan, p + "mlp.down_proj.weight");
          expect_partition(gate, lc.intermediate_size);
          EXPECT_EQ(gate.begin, down.begin);
          EXPECT_EQ(gate.end, down.end);
          const int64_t block = dtype_traits(down.dtype).block_elems;
          for (int r = 0; r < N; ++r) EXPECT_EQ(down.begin[r] % block, 0) << "column split inside a block";
          if (c.enable_moe_block) {
            const TensorShard& experts = find(plan, p + "experts.gate_up_proj");
            if (ep)
              expect_partition(experts, c.num_experts);
            else
              EXPECT_EQ(experts.split, ShardSplit::replicated);
          }
        }
        EXPECT_EQ(find(plan, "embed_tokens.weight").split, ShardSplit::replicated);
        // Balance: the dense 31B's ranks hold within 5 % of each other; the 26B-A4B's replicated
        // embedding and (without --ep) experts make its ranks equal by construction.
        const auto [lo, hi] = std::minmax_element(plan.rank_bytes.begin(), plan.rank_bytes.end());
        EXPECT_LT(static_cast<double>(*hi) / static_cast<double>(*lo), 1.05);
      }
}

TEST(ParallelPlan, UnsplittableShapesAreClearErrors) {
  const Gemma4Config c = gemma4_like("gemma-4-26b-a4b");
  EXPECT_ERROR_HAS(plan_gemma4_parallel(c, {3, false}, hf4), "16 query heads do not divide into 3");
  EXPECT_ERROR_HAS(plan_gemma4_parallel(c, {0, false}, hf4), "at least 1");
  const Gemma4Config tiny = gemma4_like("tiny-gemma4-moe");
  EXPECT_ERROR_HAS(plan_gemma4_parallel(tiny, {2, false}, hf4), "o_proj would be cut inside its 256-weight blocks");
  auto q8 = [](const std::string&, const std::vector<int64_t>&) { return DType::q8_0; };
  Gemma4Config narrow_mlp = tiny;
  for (Gemma4LayerConfig& lc : narrow_mlp.layers) lc.intermediate_size = 64;  // 2 blocks of 32
  EXPECT_ERROR_HAS(plan_gemma4_parallel(narrow_mlp, {tiny.num_heads, false}, q8), "fewer than one per GPU");
  Gemma4Config few_experts = c;
  few_experts.num_experts = 4;
  EXPECT_ERROR_HAS(plan_gemma4_parallel(few_experts, {8, true}, hf4), "only 4 experts");
  const ParallelPlan one = plan_gemma4_parallel(c, {1, true}, hf4);
  EXPECT_EQ(one.all_reduces_per_layer, 0);
  for (const TensorShard& t : one.tensors) EXPECT_EQ(t.split, ShardSplit::replicated) << t.name;
}

Qwen35Config qwen35_like(const std::string& like) {
  return std::get<Qwen35Config>(make_synthetic_source({like, "hf4", 1, {}})->config().arch);
}

// Qwen3.5: a DeltaNet layer's value heads are dealt out with the key heads they read (in_proj_qkv
// and the conv taps as three runs: Q, K, V channels), full-attention layers as Gemma's, the dense
// MLP by blocks; the MoE block stays whole unless --ep deals out the routed experts.
TEST(ParallelPlan, QwenShapesSplitValueHeadsWithTheirKeyHeads) {
  for (const char* like : {"qwen3.5-4b", "qwen3.5-35b-a3b"})
    for (int N : {2, 4, 8})
      for (bool ep : {false, true}) {
        SCOPED_TRACE(std::string(like) + " tp " + std::to_string(N) + (ep ? " ep" : ""));
        const Qwen35Config c = qwen35_like(like);
        const ParallelPlan plan =
            plan_model_parallel(make_synthetic_source({like, "hf4", 1, {}})->config(), {N, ep}, hf4);
        EXPECT_EQ(plan.all_reduces_per_layer, 1 + (!c.moe || ep ? 1 : 0));
        const int64_t nV = c.linear_num_value_heads, nK = c.linear_num_key_heads, dk = c.linear_key_head_dim,
                      dv = c.linear_value_head_dim, D = c.head_dim;
        for (int l = 0; l < c.num_layers; ++l) {
          const std::string p = "layers." + std::to_string(l) + ".";
          if (c.layer_types[l] == AttentionType::linear) {
            const TensorShard& z = find(plan, p + "linear_attn.in_proj_z.weight");
            const TensorShard& out = find(plan, p + "linear_attn.out_proj.weight");
            expect_partition(z, nV * dv);
            expect_partition(find(plan, p + "linear_attn.A_log"), nV);
            expect_partition(find(plan, p + "linear_attn.in_proj_b.weight"), nV);
            EXPECT_EQ(out.split, ShardSplit::columns);
            EXPECT_EQ(out.begin, z.begin);  // out_proj's columns are the rank's value heads
            EXPECT_EQ(out.end, z.end);
            const TensorShard& qkv = find(plan, p + "linear_attn.in_proj_qkv.weight");
            EXPECT_EQ(find(plan, p + "linear_attn.conv1d.weight").runs, qkv.runs);
            ASSERT_EQ(qkv.runs.size(), static_cast<size_t>(N));
            std::vector<int> v_seen(static_cast<size_t>(nV * dv), 0);
            for (int r = 0; r < N; ++r) {
              const auto& runs = qkv.runs[r];
              ASSERT_EQ(runs.size(), 3u);
              // V: the rank's value heads, as in_proj_z's rows.
              EXPECT_EQ(runs[2].first - 2 * nK * dk, z.begin[r]);
              EXPECT_EQ(runs[2].second - 2 * nK * dk, z.end[r]);
              for (int64_t i = runs[2].first; i < runs[2].second; ++i) ++v_seen.at(i - 2 * nK * dk);
              // Q and K: the same key heads, whole, and exactly those the value heads read.
              EXPECT_EQ(runs[1].first - nK * dk, runs[0].first);
              EXPECT_EQ(runs[1].second - nK * dk, runs[0].second);
              EXPECT_EQ(runs[0].first % dk, 0);
              const int64_t first_v = z.begin[r] / dv, last_v = z.end[r] / dv - 1, group = nV / nK;
              EXPECT_EQ(runs[0].first, first_v / group * dk);
              EXPECT_EQ(runs[0].second, (last_v / group + 1) * dk);
              EXPECT_EQ(out.begin[r] % dtype_traits(out.dtype).block_elems, 0) << "column split inside a block";
            }
            EXPECT_TRUE(std::all_of(v_seen.begin(), v_seen.end(), [](int n) { return n == 1; }));
          } else {
            const TensorShard& q = find(plan, p + "self_attn.q_proj.weight");
            const TensorShard& o = find(plan, p + "self_attn.o_proj.weight");
            expect_partition(q, c.num_heads * 2 * D);  // each head's query rows, then its gate rows
            expect_partition(o, c.num_heads * D);
            const TensorShard& k = find(plan, p + "self_attn.k_proj.weight");
            const int group = c.num_heads / c.num_kv_heads;
            for (int r = 0; r < N; ++r) {
              EXPECT_EQ(o.begin[r] * 2, q.begin[r]);
              EXPECT_EQ(k.begin[r], o.begin[r] / D / group * D);
              EXPECT_EQ(k.end[r], ((o.end[r] / D - 1) / group + 1) * D);
            }
          }
          if (c.moe) {
            EXPECT_EQ(find(plan, p + "mlp.experts.gate_up_proj").split,
                      ep ? ShardSplit::experts : ShardSplit::replicated);
            if (ep) expect_partition(find(plan, p + "mlp.experts.down_proj"), c.num_experts);
            EXPECT_EQ(find(plan, p + "mlp.shared_expert.down_proj.weight").split, ShardSplit::replicated);
            EXPECT_EQ(find(plan, p + "mlp.gate.weight").split, ShardSplit::replicated);
          } else {
            const TensorShard& gate = find(plan, p + "mlp.gate_proj.weight");
            const TensorShard& down = find(plan, p + "mlp.down_proj.weight");
            expect_partition(gate, c.intermediate_size);
            EXPECT_EQ(gate.begin, down.begin);
            for (int r = 0; r < N; ++r) EXPECT_EQ(down.begin[r] % dtype_traits(down.dtype).block_elems, 0);
          }
        }
        const auto [lo, hi] = std::minmax_element(plan.rank_bytes.begin(), plan.rank_bytes.end());
        EXPECT_LT(static_cast<double>(*hi) / static_cast<double>(*lo), 1.05);
      }
}

// A dense Qwen3.5 whose layers' MLPs have different formats (quantize --override) still splits
// every layer alike (its config has one MLP width), at the coarsest block: with layer 0 in f32
// (blocks of 1) and the rest in Q8_0 (32), a width of 9120 = 285 blocks of 32 gives each of 8
// ranks 36 or 35 blocks in every layer, where a per-layer plan gave layer 0 1140 columns each.
TEST(ParallelPlan, QwenMlpSplitIsOneForEveryLayerWhateverTheirFormats) {
  Qwen35Config c = qwen35_like("qwen3.5-4b");
  c.intermediate_size = 9216 - 96;  // 285 blocks of 32: dealt 36 x 5 + 35 x 3
  auto mixed = [](const std::string& name, const std::vector<int64_t>& shape) {
    if (name.rfind("layers.0.mlp.", 0) == 0) return DType::f32;
    return hf4(name, shape) == DType::f32 ? DType::f32 : DType::q8_0;
  };
  const ParallelPlan plan = plan_qwen35_parallel(c, {8, false}, mixed);
  const TensorShard& first = find(plan, "layers.0.mlp.gate_proj.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const TensorShard& gate = find(plan, "layers." + std::to_string(l) + ".mlp.gate_proj.weight");
    EXPECT_EQ(gate.begin, first.begin) << "layer " << l;
    EXPECT_EQ(gate.end, first.end) << "layer " << l;
  }
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(first.begin[r] % 32, 0);
    EXPECT_EQ(first.end[r] - first.begin[r], r < 5 ? 36 * 32 : 35 * 32);
  }
}

TEST(ParallelPlan, QwenUnsplittableShapesAreClearErrors) {
  const Qwen35Config c = qwen35_like("qwen3.5-4b");
  EXPECT_ERROR_HAS(plan_qwen35_parallel(c, {3, false}, hf4), "16 query heads do not divide into 3");
  Qwen35Config odd_values = c;
  odd_values.linear_num_value_heads = 24;
  EXPECT_ERROR_HAS(plan_qwen35_parallel(odd_values, {16, false}, hf4),
                   "24 linear-attention value heads do not divide into 16");
  Qwen35Config odd_keys = c;
  odd_keys.linear_num_key_heads = 8;  // 32 value heads over 16 GPUs: 2 each, in 8 groups of 4...
  EXPECT_NO_THROW(plan_qwen35_parallel(odd_keys, {16, false}, hf4));  // ...each within one key head
  odd_keys.linear_num_key_heads = 6;
  odd_keys.linear_num_value_heads = 24;  // 6 value heads per GPU at --tp 4 straddle key heads of 4
  EXPECT_ERROR_HAS(plan_qwen35_parallel(odd_keys, {4, false}, hf4), "6 linear-attention key heads neither divide");
  Qwen35Config odd_kv = c;
  odd_kv.num_kv_heads = 3;
  EXPECT_ERROR_HAS(plan_qwen35_parallel(odd_kv, {4, false}, hf4), "3 KV heads neither divide into 4");
  EXPECT_ERROR_HAS(plan_qwen35_parallel(qwen35_like("tiny-qwen35-moe"), {2, false}, hf4),
                   "out_proj would be cut inside its 256-weight blocks");
  Qwen35Config narrow_mlp = c;
  narrow_mlp.intermediate_size = 512;  // 2 blocks of 256
  EXPECT_ERROR_HAS(plan_qwen35_parallel(narrow_mlp, {4, false}, hf4), "fewer than one per GPU");
  Qwen35Config few_experts = qwen35_like("qwen3.5-35b-a3b");
  few_experts.num_experts = 4;
  EXPECT_ERROR_HAS(plan_qwen35_parallel(few_experts, {8, true}, hf4), "only 4 experts");
  EXPECT_NO_THROW(plan_qwen35_parallel(few_experts, {8, false}, hf4));  // experts whole on every GPU
}

// The plan's meaning, numerically: layer 0 of the tiny MoE model in Q8_0 (32-weight blocks: its
// 128-wide heads would cut HFQ4's 256-weight o_proj blocks, an error tested above), split over 2
// ranks, with the formats read from the weights themselves as a loader would. Row shards of q/k give exactly the rows of the full product; the MLP and o_proj, run
// rank by rank on their shards and summed, give the full output within f32 reassociation.
TEST(ParallelPlan, ShardsMultipliedAndSummedEqualTheWholeLayer) {
  auto source = make_synthetic_source({"tiny-gemma4-moe", "q8", 3, {}});
  const Gemma4Config c = std::get<Gemma4Config>(source->config().arch);
  const int N = 2;
  const ParallelPlan plan = plan_gemma4_parallel(c, {N, false}, [&](const std::string& name, const std::vector<int64_t>&) {
    return source->find("model.language_model." + name)->dtype;
  });
  auto cpu = make_backend("cpu");
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  auto weight = [&](const std::string& name) { return *source->find("model.language_model." + name); };
  auto matmul = [&](const std::vector<float>& x, const Tensor& w) {  // x [1, K] times w [M, K]^T
    std::vector<float> out(static_cast<size_t>(w.dim(0)));
    std::vector<float> in = x;
    cpu->matmul(make_tensor(out.data(), DType::f32, {1, w.dim(0)}), make_tensor(in.data(), DType::f32, {1, w.dim(1)}), w);
    return out;
  };
  auto shard_of = [&](const std::string& name, int r, std::vector<uint8_t>& bytes) {
    const TensorShard& t = find(plan, name);
    const Tensor whole = weight(name);
    bytes = extract_shard(t, r, static_cast<const uint8_t*>(whole.data));
    const std::vector<int64_t> shape = shard_shape(t, r);
    return make_tensor(bytes.data(), whole.dtype, shape.data(), static_cast<int>(shape.size()));
  };
  const std::string p = "layers.0.";
  const int64_t H = c.hidden_size, I = c.layers[0].intermediate_size;
  const std::vector<float> x = random(H);

  // q / k: row shards are exact slices of the whole product.
  for (const char* proj : {"self_attn.q_proj.weight", "self_attn.k_proj.weight"}) {
    const std::vector<float> whole = matmul(x, weight(p + proj));
    const TensorShard& t = find(plan, p + proj);
    for (int r = 0; r < N; ++r) {
      std::vector<uint8_t> bytes;
      const std::vector<float> part = matmul(x, shard_of(p + proj, r, bytes));
      ASSERT_EQ(static_cast<int64_t>(part.size()), t.end[r] - t.begin[r]);
      for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[t.begin[r] + i]) << proj << " rank " << r;
    }
  }

  // The MLP: gate/up row shards, down column shards, partial outputs summed.
  std::vector<float> gate = matmul(x, weight(p + "mlp.gate_proj.weight")), up = matmul(x, weight(p + "mlp.up_proj.weight"));
  std::vector<float> act(static_cast<size_t>(I));
  cpu->gated_activation(make_tensor(act.data(), DType::f32, {1, I}), make_tensor(gate.data(), DType::f32, {1, I}),
                        make_tensor(up.data(), DType::f32, {1, I}), Activation::gelu_tanh);
  const std::vector<float> whole_mlp = matmul(act, weight(p + "mlp.down_proj.weight"));
  std::vector<double> summed(static_cast<size_t>(H), 0.0);
  const TensorShard& down = find(plan, p + "mlp.down_proj.weight");
  for (int r = 0; r < N; ++r) {
    std::vector<uint8_t> gb, ub, db;
    std::vector<float> g = matmul(x, shard_of(p + "mlp.gate_proj.weight", r, gb));
    std::vector<float> u = matmul(x, shard_of(p + "mlp.up_proj.weight", r, ub));
    const int64_t n = down.end[r] - down.begin[r];
    std::vector<float> a(static_cast<size_t>(n));
    cpu->gated_activation(make_tensor(a.data(), DType::f32, {1, n}), make_tensor(g.data(), DType::f32, {1, n}),
                          make_tensor(u.data(), DType::f32, {1, n}), Activation::gelu_tanh);
    const std::vector<float> partial = matmul(a, shard_of(p + "mlp.down_proj.weight", r, db));
    for (int64_t i = 0; i < H; ++i) summed[i] += partial[i];
  }
  float scale = 0;
  for (float v : whole_mlp) scale = std::max(scale, std::fabs(v));
  for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(summed[i], whole_mlp[i], 1e-5 * scale) << "mlp output " << i;

  // o_proj: each rank's heads' columns.
  const int64_t width = c.num_heads * c.layers[0].head_dim;
  const std::vector<float> attn = random(width);
  const std::vector<float> whole_o = matmul(attn, weight(p + "self_attn.o_proj.weight"));
  const TensorShard& o = find(plan, p + "self_attn.o_proj.weight");
  std::vector<double> o_sum(static_cast<size_t>(H), 0.0);
  for (int r = 0; r < N; ++r) {
    std::vector<uint8_t> ob;
    const std::vector<float> mine(attn.begin() + o.begin[r], attn.begin() + o.end[r]);
    const std::vector<float> partial = matmul(mine, shard_of(p + "self_attn.o_proj.weight", r, ob));
    for (int64_t i = 0; i < H; ++i) o_sum[i] += partial[i];
  }
  scale = 0;
  for (float v : whole_o) scale = std::max(scale, std::fabs(v));
  for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(o_sum[i], whole_o[i], 1e-5 * scale) << "o_proj output " << i;
}

}  // namespace
}  // namespace fl
