// `fireline synth`: a random-weight .fire with the shapes and default formats of a published
// model (the tiny MoE stand-in keeps the test fast), deterministic per seed, and runnable.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "util/run_command.h"
#include "util/test_util.h"
#include "util/tiny_chat_model.h"

namespace fl {
namespace {

using nlohmann::json;

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }

TEST(CliSynth, WritesARunnableDeterministicFireWithThePolicyFormats) {
  test::TempDir dir;
  const std::string a = dir.file("a.fire"), b = dir.file("b.fire"), c = dir.file("c.fire");
  auto r = fireline("synth --like tiny-gemma4-moe -o " + a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(fireline("synth --like tiny-gemma4-moe -o " + b).exit_code, 0);
  ASSERT_EQ(fireline("synth --like tiny-gemma4-moe --seed 2 -o " + c).exit_code, 0);
  auto show = [&](const std::string& path) {
    auto shown = fireline("show " + path + " --json");
    EXPECT_EQ(shown.exit_code, 0) << shown.err;
    return json::parse(shown.out);
  };
  json ja = show(a);
  EXPECT_EQ(ja.dump().find("hfq4_g256") != std::string::npos, true);  // K = 256 projections
  EXPECT_EQ(ja.dump().find("hfq4_g128") != std::string::npos, true);  // K = 352 / 176 down projections
  EXPECT_EQ(ja.dump().find("q8_0") != std::string::npos, true);       // the embedding / tied head
  EXPECT_EQ(fireline("verify " + a).exit_code, 0);
  // same seed, same bytes; another seed, other bytes
  const std::string sum_a = fireline("verify " + a).out, sum_b = fireline("verify " + b).out;
  EXPECT_EQ(sum_a.substr(sum_a.find("sha256")), sum_b.substr(sum_b.find("sha256")));
  const std::string sum_c = fireline("verify " + c).out;
  EXPECT_NE(sum_a.substr(sum_a.find("sha256")), sum_c.substr(sum_c.find("sha256")));

  auto run = fireline("logits " + a + " --ids 2,17,300,5 --generate 3 --top 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json out = json::parse(run.out);
  EXPECT_EQ(out["generated"].size(), 3u);
  EXPECT_TRUE(std::isfinite(out["top"][0][0]["logit"].get<double>()));

  auto bad = fireline("synth --like gemma-9 -o " + dir.file("x.fire"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown model"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.fire")));
}

TEST(CliSynth, QwenHybridRunsFromAFireFileInHf4) {
  test::TempDir dir;
  const std::string path = dir.file("qwen.fire");
  auto r = fireline("synth --like tiny-qwen35-moe -o " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto shown = fireline("show " + path + " --json");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  const std::string text = shown.out;
  EXPECT_NE(text.find("qwen35"), std::string::npos) << text;
  EXPECT_NE(text.find("linear_attention_layers"), std::string::npos) << text;
  EXPECT_NE(text.find("hfq4_g256"), std::string::npos);  // quantized projections and experts
  auto run = fireline("logits " + path + " --ids 2,17,300,5,9,11 --generate 3 --top 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json out = json::parse(run.out);
  EXPECT_EQ(out["generated"].size(), 3u);
  EXPECT_TRUE(std::isfinite(out["top"][0][0]["logit"].get<double>()));
}

// show --tp N [--ep]: the parallel plan's summary (model/parallel_plan.h; tested in depth in
// tests/unit/parallel_plan_test.cpp): per-GPU bytes, and clear errors where it cannot split.
TEST(CliSynth, ShowTpSummarisesTheParallelPlan) {
  auto parallel = [&](const std::string& args) {
    auto r = fireline("show fireline-tiny --json " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  };
  const json one = parallel("--tp 1");
  EXPECT_EQ(one["parallel"]["rank_bytes"][0], one["tensor_bytes"]);  // one GPU holds everything
  const json two = parallel("--tp 2");
  ASSERT_EQ(two["parallel"]["rank_bytes"].size(), 2u);
  EXPECT_EQ(two["parallel"]["all_reduces_per_layer"], 2);
  const uint64_t total = two["tensor_bytes"].get<uint64_t>(), r0 = two["parallel"]["rank_bytes"][0].get<uint64_t>(),
                 r1 = two["parallel"]["rank_bytes"][1].get<uint64_t>();
  EXPECT_LT(r0, total);  // something is split...
  EXPECT_GT(r0 + r1, total);  // ...and something (embeddings, norms) replicated
  EXPECT_FALSE(parallel("")["parallel"].is_object());
  auto text = fireline("show fireline-tiny --tp 2");
  EXPECT_NE(text.out.find("parallel      2 GPUs"), std::string::npos) << text.out;
  auto bad = fireline("show fireline-tiny --tp 3");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("do not divide into 3"), std::string::npos) << bad.err;
  test::TempDir dir;
  ASSERT_EQ(fireline("synth --like tiny-qwen35-moe -o " + dir.file("q.fire")).exit_code, 0);
  // Qwen3.5 splits too, by head; at HFQ4 the toy's 2 value heads of 64 per GPU would cut out_proj's
  // 256-weight blocks, which Q8_0's 32-weight blocks do not.
  auto qwen = fireline("show " + dir.file("q.fire") + " --tp 2");
  EXPECT_NE(qwen.exit_code, 0);
  EXPECT_NE(qwen.err.find("out_proj would be cut inside its 256-weight blocks"), std::string::npos) << qwen.err;
  ASSERT_EQ(fireline("synth --like tiny-qwen35-moe --format q8 -o " + dir.file("q8.fire")).exit_code, 0);
  auto qwen_split = fireline("show " + dir.file("q8.fire") + " --tp 4 --ep --json");
  ASSERT_EQ(qwen_split.exit_code, 0) << qwen_split.err;
  const json qwen_plan = json::parse(qwen_split.out)["parallel"];
  EXPECT_EQ(qwen_plan["all_reduces_per_layer"], 2);  // each mixer's, and the routed experts' with --ep
  EXPECT_EQ(qwen_plan["rank_bytes"].size(), 4u);
}

// A quick bench of a tiny synthetic model, for the tests of bench's options.
const std::string kTinyBench =
    "bench --like tiny-gemma4-moe --format q8 --context 32 --prompt-tokens 8 --gen-tokens 4 --runs 1";

// bench --tp N: the split model (model/tensor_parallel.h) as CPU threads; what the machine cannot
// give (GPUs) is a clear error.
TEST(CliSynth, BenchTpRunsTheSplitModelOnCpuThreads) {
  const std::string& common = kTinyBench;
  auto r = fireline(common + " --backend cpu --tp 2 --batch 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tp"], 2);
  EXPECT_EQ(j["backend"], "cpu x 2 (--tp 2)");
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["batch"]["decode_tok_s_total"].get<double>(), 0.0);
  auto ep = fireline(common + " --backend cpu --tp 4 --ep --json");
  ASSERT_EQ(ep.exit_code, 0) << ep.err;
  EXPECT_EQ(json::parse(ep.out)["backend"], "cpu x 4 (--tp 4 --ep)");
  auto ep_alone = fireline(common + " --backend cpu --ep");
  EXPECT_NE(ep_alone.exit_code, 0);
  EXPECT_NE(ep_alone.err.find("over the ranks of --tp N"), std::string::npos) << ep_alone.err;
  auto gpu = fireline(common + " --backend cuda --tp 64");  // more GPUs than any machine has
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_NE(gpu.err.find("--tp 64 on GPUs needs 64 of them"), std::string::npos) << gpu.err;
  auto profile = fireline(common + " --backend cpu --tp 2 --profile");
  EXPECT_NE(profile.exit_code, 0);
  EXPECT_NE(profile.err.find("does not combine with --tp"), std::string::npos) << profile.err;
  auto uneven = fireline(common + " --backend cpu --tp 3");
  EXPECT_NE(uneven.exit_code, 0);
  EXPECT_NE(uneven.err.find("do not divide into 3"), std::string::npos) << uneven.err;
}

// logits --like NAME --tp N [--ep]: a synthetic model's logits whole and split over CPU-thread
// ranks (what scripts/tp-check compares on larger shapes): the same greedy tokens, logits within
// the split's reassociation; a missing or doubled model and --ep alone are refused.
TEST(CliSynth, LogitsOfASplitModelMatchTheWholeModel) {
  const std::string common =
      "logits --like tiny-qwen35-moe --format q8 --ids 1,2,3,4,5,6,7,8 --generate 4 --backend cpu";
  auto whole = fireline(common);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const json a = json::parse(whole.out);
  ASSERT_EQ(a["generated"].size(), 4u);
  for (const char* split : {" --tp 2", " --tp 4 --ep"}) {
    auto r = fireline(common + split);
    ASSERT_EQ(r.exit_code, 0) << split << ": " << r.err;
    const json b = json::parse(r.out);
    EXPECT_EQ(b["generated"], a["generated"]) << split;
    const auto& x = a["logits"][0];
    const auto& y = b["logits"][0];
    ASSERT_EQ(x.size(), y.size());
    double scale = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, std::fabs(x[i].get<double>()));
      diff = std::max(diff, std::fabs(x[i].get<double>() - y[i].get<double>()));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(diff, 1e-4 * scale) << split;
  }
  auto neither = fireline("logits --ids 1,2");
  EXPECT_NE(neither.exit_code, 0);
  EXPECT_NE(neither.err.find("a MODEL or --like NAME"), std::string::npos) << neither.err;
  auto format_of_a_file = fireline("logits " + test::fixtures_dir() + "/qwen35-dense --format q8 --ids 1,2");
  EXPECT_NE(format_of_a_file.exit_code, 0);
  EXPECT_NE(format_of_a_file.err.find("--format applies to a --like model"), std::string::npos) << format_of_a_file.err;
  auto ep_alone = fireline(common + " --ep");
  EXPECT_NE(ep_alone.exit_code, 0);
  EXPECT_NE(ep_alone.err.find("over the ranks of --tp N"), std::string::npos) << ep_alone.err;
}

// --precision names the GPU's tensor-core activations: bench reports what ran (the CPU computes
// in f32 whatever is asked), and a value that is not a precision is refused before anything loads.
TEST(CliSynth, BenchReportsThePrecisionAndRefusesUnknownOnes) {
  const std::string common = kTinyBench + " --backend cpu";
  for (const char* asked : {"", " --precision bf16", " --precision f32"}) {
    auto r = fireline(common + asked + " --json");
    ASSERT_EQ(r.exit_code, 0) << asked << ": " << r.err;
    EXPECT_EQ(json::parse(r.out)["precision"], "f32") << asked;
  }
  auto text = fireline(common);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("(KV q8, tensor cores f32)"), std::string::npos) << text.out;
  for (const char* cmd : {"bench --like tiny-gemma4-moe --precision fp8", "run fireline-tiny --precision half hi",
                          "logits fireline-tiny --ids 2,3 --precision bf8"}) {
    auto bad = fireline(cmd);
    EXPECT_NE(bad.exit_code, 0) << cmd;
    EXPECT_NE(bad.err.find("--precision"), std::string::npos) << cmd << ": " << bad.err;
    EXPECT_EQ(bad.out, "") << cmd;
  }
}

// --profiler-region batch (for a profiler started with recording off): on the CPU a no-op that
// must not change the run; without batched steps to record, or with another region, refused
// before anything loads.
TEST(CliSynth, BenchProfilerRegionNeedsBatchedSteps) {
  const std::string common = kTinyBench + " --backend cpu";
  auto r = fireline(common + " --batch 2 --profiler-region batch --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["batch"]["sequences"], 2);
  auto alone = fireline(common + " --profiler-region batch");
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.err.find("--batch 2 or more"), std::string::npos) << alone.err;
  EXPECT_EQ(alone.out, "");
  auto bad = fireline(common + " --batch 2 --profiler-region prefill");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--profiler-region"), std::string::npos) << bad.err;
}

// --branches on|off: the CPU runs every op in order whatever is asked, and says so; a value that is
// neither is refused before anything loads.
TEST(CliSynth, BenchBranchesOnTheCpuRunInOrder) {
  const std::string common = kTinyBench + " --backend cpu";
  for (const char* asked : {"", " --branches on", " --branches off"}) {
    auto r = fireline(common + asked + " --json");
    ASSERT_EQ(r.exit_code, 0) << asked << ": " << r.err;
    EXPECT_EQ(json::parse(r.out)["concurrent_branches"], false) << asked;
  }
  auto bad = fireline(common + " --branches sometimes");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--branches"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
}

// --gated-matvec, --weight-prefetch, --hopper-experts, --group-gemm, --async-matvec, --split-matvec,
// --imma-matvec, --imma-ready-pieces, --imma-experts, --fused-experts, --cluster-update,
// --fused-delta-net, --fused-decode-attention, --experts-down-sum, --imma-l2-ahead, --imma-lean, --imma-warps-per-sm,
// --attention-prefetch-mb, --update-prefetch-mb, --decode-attention-mma
// and --expert-matvec: GPU switches for A/B timing. The CPU has neither (the JSON says false whatever is asked); a
// value other than on or off is refused before anything loads.
TEST(CliSynth, BenchGpuSwitchesAreOffOnTheCpuAndCheckedEverywhere) {
  const std::string common = kTinyBench + " --backend cpu";
  for (const char* asked :
       {"",
        " --gated-matvec on --weight-prefetch on --hopper-experts on --group-gemm on --async-matvec on"
        " --split-matvec on --imma-matvec on --imma-ready-pieces on --cluster-update on"
        " --fused-delta-net on --imma-l2-ahead 2 --imma-experts on --imma-min-bytes 1048576 --fused-experts on"
        " --fused-experts-blocks 1 --fused-decode-attention on --experts-down-sum on --expert-matvec 8x3"
        " --expert-matvec-ring on --imma-lean on --imma-warps-per-sm 20 --attention-prefetch-mb 24"
        " --update-prefetch-mb 16 --decode-attention-mma on",
        " --gated-matvec off --weight-prefetch off --hopper-experts off --group-gemm off --async-matvec off"
        " --split-matvec off --imma-matvec off --imma-ready-pieces off --cluster-update off"
        " --fused-delta-net off --imma-experts off --fused-experts off --fused-decode-attention off --experts-down-sum "
        "off --expert-matvec auto --expert-matvec-ring off --imma-lean off --decode-attention-mma off"}) {
    auto r = fireline(common + asked + " --json");
    ASSERT_EQ(r.exit_code, 0) << asked << ": " << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["gated_matvec"], false) << asked;
    EXPECT_EQ(j["weight_prefetch"], false) << asked;
    EXPECT_EQ(j["hopper_experts"], false) << asked;
    EXPECT_EQ(j["group_gemm"], false) << asked;
    EXPECT_EQ(j["async_matvec"], false) << asked;
    EXPECT_EQ(j["split_matvec"], false) << asked;
    EXPECT_EQ(j["imma_matvec"], false) << asked;
    EXPECT_EQ(j["imma_ready_pieces"], false) << asked;
    EXPECT_EQ(j["cluster_update"], false) << asked;
    EXPECT_EQ(j["fused_delta_net"], false) << asked;
    EXPECT_EQ(j["imma_experts"], false) << asked;
    EXPECT_EQ(j["fused_experts"], false) << asked;
    EXPECT_EQ(j["fused_decode_attention"], false) << asked;
    EXPECT_EQ(j["experts_down_sum"], false) << asked;
    EXPECT_EQ(j["expert_matvec_ring"], false) << asked;
    EXPECT_EQ(j["imma_lean"], false) << asked;
    EXPECT_EQ(j["decode_attention_mma"], false) << asked;
    EXPECT_EQ(j["imma_l2_ahead"], 0) << asked;
    EXPECT_EQ(j["imma_min_bytes"], 0) << asked;
    EXPECT_EQ(j["imma_warps_per_sm"], 0) << asked;
    EXPECT_EQ(j["attention_prefetch_mb"], 0) << asked;
    EXPECT_EQ(j["update_prefetch_mb"], 0) << asked;
    EXPECT_EQ(j["fused_experts_blocks"], 0) << asked;
    EXPECT_EQ(j["expert_matvec"], "plain") << asked;
  }
  for (const char* flag :
       {"--gated-matvec",           "--weight-prefetch",    "--hopper-experts", "--group-gemm",
        "--async-matvec",           "--split-matvec",       "--imma-matvec",    "--imma-ready-pieces",
        "--cluster-update",         "--fused-delta-net",    "--imma-experts",   "--fused-experts",
        "--fused-decode-attention", "--experts-down-sum",   "--imma-l2-ahead",  "--imma-min-bytes",
        "--expert-matvec",          "--expert-matvec-ring", "--imma-lean",      "--decode-attention-mma"}) {
    auto bad = fireline(common + " " + flag + " maybe");
    EXPECT_NE(bad.exit_code, 0) << flag;
    EXPECT_NE(bad.err.find(flag), std::string::npos) << bad.err;
    EXPECT_EQ(bad.out, "") << flag;
  }
  // a distance outside 0..16, a warp count outside 0..64, megabytes outside 0..1024
  for (auto [flag, value] : {std::pair<const char*, const char*>{"--imma-l2-ahead", "-1"},
                             {"--imma-l2-ahead", "17"},
                             {"--imma-warps-per-sm", "-1"},
                             {"--imma-warps-per-sm", "65"},
                             {"--attention-prefetch-mb", "-1"},
                             {"--attention-prefetch-mb", "1025"},
                             {"--update-prefetch-mb", "-1"},
                             {"--update-prefetch-mb", "1025"}}) {
    auto bad = fireline(common + " " + flag + " " + value);
    EXPECT_NE(bad.exit_code, 0) << flag << " " << value;
    EXPECT_NE(bad.err.find(flag), std::string::npos) << bad.err;
    EXPECT_EQ(bad.out, "") << flag << " " << value;
  }
  for (const char* shape : {"8x4", "3x3", "8"}) {  // shapes not built
    auto bad = fireline(common + " --expert-matvec " + shape);
    EXPECT_NE(bad.exit_code, 0) << shape;
    EXPECT_NE(bad.err.find("--expert-matvec"), std::string::npos) << bad.err;
    EXPECT_EQ(bad.out, "") << shape;
  }
  for (const char* blocks : {"0", "3"}) {  // blocks per SM outside 1..2
    auto bad = fireline(common + " --fused-experts-blocks " + blocks);
    EXPECT_NE(bad.exit_code, 0) << blocks;
    EXPECT_NE(bad.err.find("--fused-experts-blocks"), std::string::npos) << bad.err;
    EXPECT_EQ(bad.out, "") << blocks;
  }
}

// The roofline's bandwidth is the device's: on the CPU its measured read bandwidth (the H200's 4250
// GB/s made every CPU ratio ~0 %), or --bandwidth; the JSON says which, and the roofline is the
// bytes per token over it. The CPU's decode line does not claim a graph replay.
TEST(CliSynth, BenchRooflineUsesTheCpusMeasuredBandwidth) {
  const std::string common = kTinyBench + " --backend cpu";
  auto measured = fireline(common + " --json");
  ASSERT_EQ(measured.exit_code, 0) << measured.err;
  const json j = json::parse(measured.out);
  EXPECT_EQ(j["bandwidth_source"].get<std::string>().rfind("measured read bandwidth of this CPU", 0), 0u)
      << j["bandwidth_source"];
  const double gbs = j["bandwidth_gbs"].get<double>();
  EXPECT_GT(gbs, 0.1);
  EXPECT_LT(gbs, 4250.0);  // no host reads at an H200's rate
  const json& bytes = j["bytes_per_token"];
  const double per_token = bytes["weights"].get<double>() + bytes["kv"].get<double>() + bytes["state"].get<double>();
  EXPECT_NEAR(j["roofline_tok_s"].get<double>(), gbs * 1e9 / per_token, 1e-6 * gbs * 1e9 / per_token);
  auto given = fireline(common + " --bandwidth 100 --json");
  ASSERT_EQ(given.exit_code, 0) << given.err;
  const json g = json::parse(given.out);
  EXPECT_EQ(g["bandwidth_source"], "--bandwidth");
  EXPECT_EQ(g["bandwidth_gbs"].get<double>(), 100.0);
  auto text = fireline(common + " --bandwidth 100");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("per token at 100 GB/s: --bandwidth)"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("graph replay"), std::string::npos) << text.out;
  EXPECT_NE(fireline(common + " --bandwidth 0").exit_code, 0);
}

// bench --profile on the CPU times every op by wall clock: the decode table has the model's ops
// with calls per token as the forward makes them (one embed; a matmul per projection), positive
// times, no kernel counts, and moe_experts' inner matmuls counted once (in moe_experts, not again
// under matmul: the tiny MoE's matmuls per token stay those of the model's own projections).
TEST(CliSynth, BenchProfileTimesTheCpuOps) {
  auto r = fireline(kTinyBench + " --backend cpu --profile --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json ops = json::parse(r.out)["profile"]["decode_per_token"];
  ASSERT_TRUE(ops.is_array());
  std::map<std::string, json> by_op;
  double sum_ms = 0.0;
  for (const json& op : ops) {
    by_op[op["op"].get<std::string>()] = op;
    sum_ms += op["ms"].get<double>();
    EXPECT_EQ(op["kernels"].get<double>(), 0.0) << op;
    EXPECT_GE(op["ms"].get<double>(), 0.0) << op;
  }
  for (const char* name : {"embed", "rms_norm", "matmul", "attention", "moe_route", "moe_experts"})
    ASSERT_TRUE(by_op.count(name)) << name << " missing from " << ops;
  EXPECT_EQ(by_op["embed"]["calls"].get<double>(), 1.0);
  EXPECT_GT(by_op["matmul"]["ms"].get<double>(), 0.0);
  EXPECT_GT(by_op["matmul"]["bytes"].get<double>(), 0.0);
  EXPECT_GT(sum_ms, 0.0);
  // Per layer of tiny-gemma4-moe (one moe_experts call each): q, k, v, o, the dense MLP's gate,
  // up and down, the router; then the LM head. No expert matmul among them.
  const double layers = by_op["moe_experts"]["calls"].get<double>();
  EXPECT_GT(layers, 0.0);
  EXPECT_EQ(by_op["matmul"]["calls"].get<double>(), 1.0 + layers * 8.0) << ops;
  auto text = fireline(kTinyBench + " --backend cpu --profile");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("decode, per token"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("moe_experts"), std::string::npos) << text.out;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// --tokenizer DIR embeds a tokenizer and chat template: the synthetic model then chats (random
// text through the real text path), which `fireline serve` and the battery need.
TEST(CliSynth, TokenizerFromADirectoryMakesAChattableModel) {
  test::TempDir dir;
  const std::string tok = dir.file("tok");
  std::filesystem::create_directories(tok);
  write_file(tok + "/tokenizer.json", test::tiny::tokenizer_json());
  write_file(tok + "/generation_config.json", test::tiny::generation_config_json());
  write_file(tok + "/chat_template.jinja", test::tiny::chat_template());
  const std::string model = dir.file("chat.fire");
  auto r = fireline("synth --like tiny-gemma4-moe -o " + model + " --tokenizer " + tok);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto run = fireline("run " + model + " --backend cpu --temperature 0 --max-tokens 5 --ignore-eos --json Hello </dev/null");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json j = json::parse(run.out);
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 5) << run.out;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 1) << run.out;  // the chat template wrapped the prompt

  // Without --tokenizer the model has no text side: run says so.
  const std::string bare = dir.file("bare.fire");
  ASSERT_EQ(fireline("synth --like tiny-gemma4-moe -o " + bare).exit_code, 0);
  auto no_text = fireline("run " + bare + " --backend cpu --max-tokens 2 Hello </dev/null");
  EXPECT_NE(no_text.exit_code, 0);
  EXPECT_NE(no_text.err.find("tokenizer.json"), std::string::npos) << no_text.err;

  // A directory without tokenizer.json, a missing directory, a tokenizer with more tokens than the
  // model has embedding rows: clear errors, no file written.
  const std::string empty = dir.file("empty");
  std::filesystem::create_directories(empty);
  auto missing_json = fireline("synth --like tiny-gemma4-moe -o " + dir.file("x.fire") + " --tokenizer " + empty);
  EXPECT_NE(missing_json.exit_code, 0);
  EXPECT_NE(missing_json.err.find("no tokenizer.json"), std::string::npos) << missing_json.err;
  auto no_dir = fireline("synth --like tiny-gemma4-moe -o " + dir.file("x.fire") + " --tokenizer " + dir.file("nope"));
  EXPECT_NE(no_dir.exit_code, 0);
  EXPECT_NE(no_dir.err.find("not a directory"), std::string::npos) << no_dir.err;
  json big = json::parse(test::tiny::tokenizer_json());
  for (int i = 0; i < 1600; ++i) big["model"]["vocab"]["extra" + std::to_string(i)] = test::tiny::kVocab + i;
  const std::string big_dir = dir.file("big");
  std::filesystem::create_directories(big_dir);
  write_file(big_dir + "/tokenizer.json", big.dump());
  auto too_big = fireline("synth --like tiny-gemma4-moe -o " + dir.file("x.fire") + " --tokenizer " + big_dir);
  EXPECT_NE(too_big.exit_code, 0);
  EXPECT_NE(too_big.err.find("2112 tokens, more than the 1024 rows"), std::string::npos) << too_big.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.fire")));
}

}  // namespace
}  // namespace fl
