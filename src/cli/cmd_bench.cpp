// fireline bench: prefill and decode speed of a model (a file, or a synthetic model with the
// shapes of a published one), with the memory-bandwidth roofline it is measured against.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_cli.h"
#include "cli/model_arg.h"
#include "core/error.h"
#include "core/host_bandwidth.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace fl::cli {
namespace {

// The GPU backend's switches for A/B timing (BackendOptions): each an on|off flag, reported in
// the JSON. None changes what the CPU does.
struct GpuSwitch {
  const char* flag;
  bool BackendOptions::*option;
  const char* json;
  const char* help;
};
constexpr GpuSwitch kGpuSwitches[] = {
    {"--gated-matvec", &BackendOptions::gated_matvec, "gated_matvec",
     "on: a gated MLP's gate and up products and its activation in one launch at decode (HFQ4); off (default): two "
     "products, then the activation (identical results; for A/B timing)"},
    {"--weight-prefetch", &BackendOptions::weight_prefetch, "weight_prefetch",
     "on: decode's small matrix-vector products pull their rows into L2 while the previous kernel finishes; off "
     "(default): they do not (identical results; for A/B timing)"},
    {"--hopper-experts", &BackendOptions::hopper_expert_gemm, "hopper_experts",
     "on: a mixture-of-experts model's expert GEMMs (prefill, long batches) on the Hopper wgmma kernel (sm_90, "
     "--precision bf16); off (default): on mma.sync (identical results; for A/B timing)"},
    {"--group-gemm", &BackendOptions::group_gemm, "group_gemm",
     "on (default): products of one input at many inputs (q/k/v, gate/up) in one GEMM launch (sm_90, --precision "
     "bf16); off: one product after another (results differ only in the order of K-split sums)"},
    {"--async-matvec", &BackendOptions::async_matvec, "async_matvec",
     "on: decode's matrix-vector products on HFQ4 rows of 8+ blocks stream their weights through shared memory by "
     "bulk copies (sm_90); off (default): through registers (identical results; for A/B timing)"},
    {"--split-matvec", &BackendOptions::split_matvec, "split_matvec",
     "on (default): decode's matrix-vector products with long HFQ4 rows and about one wave of row groups run on "
     "pairs of warps that split each row's steps; off: one warp per row group (results differ in the order of "
     "additions; for A/B timing)"},
    {"--imma-matvec", &BackendOptions::imma_matvec, "imma_matvec",
     "on (default): decode's HFQ4 matrix-vector products (not gated or expert ones) on the integer tensor cores (the "
     "input cut into int8 pieces; sm_80+); off: the f32 kernels (results differ within the op harness's budget; for "
     "A/B timing)"},
    {"--imma-ready-pieces", &BackendOptions::imma_ready_pieces, "imma_ready_pieces",
     "on (default): with --imma-matvec on, the residual update and the gated activation also cut their output into "
     "the next product's int8 pieces; off: every product cuts its input in a launch of its own (identical results; "
     "for A/B timing)"},
    {"--imma-experts", &BackendOptions::imma_experts, "imma_experts",
     "on: with --imma-matvec on, decode's routed expert products (gate_up and down per pair) on the integer tensor "
     "cores too; off (default): the f32 kernels (results differ within the op harness's budget; for A/B timing)"},
    {"--fused-experts", &BackendOptions::fused_experts, "fused_experts",
     "on: decode's routed experts (gate_up, activation, down and their sum; HFQ4, 1-4 tokens) in one launch; off "
     "(default): four kernels (identical results; for A/B timing)"},
    {"--cluster-update", &BackendOptions::cluster_residual_update, "cluster_update",
     "on (default): decode's one-row residual update spread over a cluster of blocks on several SMs (sm_90); off: "
     "one block (results differ in the order of the row's sums; for A/B timing)"},
    {"--fused-delta-net", &BackendOptions::fused_delta_net, "fused_delta_net",
     "on (default): decode's Gated DeltaNet step (Qwen3.5: gates, conv, delta rule, output norm and gate) in one "
     "launch on a cluster of blocks per key head (sm_90); off: six kernels (results differ in the order of the norm's "
     "sum; for A/B timing)"},
    {"--fused-decode-attention", &BackendOptions::fused_decode_attention, "fused_decode_attention",
     "on: one sequence's decode attention (Gemma 4) with its q/k/v head norms, RoPE and KV-cache write in one launch "
     "(Q8_0 cache); off (default): a norm kernel before it and a write kernel beside it (identical results; for A/B "
     "timing)"},
    {"--expert-matvec-ring", &BackendOptions::expert_matvec_ring, "expert_matvec_ring",
     "on: the expert launches that --expert-matvec gives a shape of their own load each warp's weights as a ring (a "
     "step's registers refilled as soon as it is multiplied); off (default): rounds of loads, then their arithmetic "
     "(identical results; for A/B timing)"},
    {"--imma-lean", &BackendOptions::imma_lean, "imma_lean",
     "on (default): with --imma-matvec on, the plain products and groups on the integer kernel's lean form (pieces "
     "loaded where used, three blocks per SM, tiles split until ~20 warps per SM); off: the register form (the same "
     "numbers but for the order of the warps' partial sums where it splits a tile more; for A/B timing)"},
    {"--decode-attention-mma", &BackendOptions::decode_attention_mma, "decode_attention_mma",
     "on: decode attention over a Q8_0 cache with 4 or 8 query heads per KV head on the tensor cores (bf16 "
     "mma.sync, f32-exact pieces); off (default): the SIMT form (results differ in summation order; for A/B timing)"},
    {"--experts-down-sum", &BackendOptions::experts_down_sum, "experts_down_sum",
     "on: decode's routed expert down products (HFQ4, top-k <= 8) summed per token in their own launch; off "
     "(default): per-pair outputs, then a combine launch (identical results; for A/B timing)"},
};

struct BenchOptions {
  std::string model;
  std::string like;
  std::string format;  // --format of a --like model; empty: hf4
  std::string backend = "cuda";
  std::string kv = "q8";
  std::string precision;  // empty: bf16 (generation_cli.h)
  int prompt_tokens = 512;
  int gen_tokens = 64;
  int64_t context = 4096;
  int runs = 3;
  double bandwidth_gbs = 0.0;  // --bandwidth; 0: the device's (see roofline_bandwidth)
  bool json = false;
  bool profile = false;
  int batch = 1;
  int tp = 1;  // --tp: ranks of a tensor-parallel split
  bool ep = false;  // --ep: deal the experts out over the ranks too
  std::string branches;  // --branches on|off (BackendOptions::concurrent_branches); empty: the default
  // The GPU switches of kGpuSwitches below, as asked (on|off; empty: the default), in its order.
  std::string gpu_switches[std::size(kGpuSwitches)];
  std::string profiler_region = "none";  // --profiler-region: what an external profiler records
  int imma_l2_ahead = 0;  // --imma-l2-ahead (BackendOptions::imma_l2_ahead)
  int64_t imma_min_bytes = 0;  // --imma-min-bytes (BackendOptions::imma_min_bytes)
  int imma_warps_per_sm = 0;   // --imma-warps-per-sm (BackendOptions::imma_warps_per_sm)
  int attention_prefetch_mb = 0;  // --attention-prefetch-mb (BackendOptions::attention_prefetch_mb)
  int update_prefetch_mb = 0;     // --update-prefetch-mb (BackendOptions::update_prefetch_mb)
  int fused_experts_blocks = 2;  // --fused-experts-blocks (BackendOptions::fused_experts_blocks)
  std::string expert_matvec;     // --expert-matvec (BackendOptions::expert_matvec); empty: the default
};

// Per-op device time of `steps` units (decode tokens, or one prefill), as table rows and JSON.
struct ProfileTable {
  std::string text;
  nlohmann::json json = nlohmann::json::array();
};

ProfileTable profile_table(const std::vector<OpProfile>& ops, double steps, const char* unit) {
  ProfileTable t;
  double total_ms = 0, total_bytes = 0;
  int64_t total_kernels = 0;
  for (const OpProfile& p : ops) total_ms += p.ms, total_bytes += p.bytes, total_kernels += p.kernels;
  t.text += fmt::format("  {:<18} {:>9} {:>9} {:>11} {:>7} {:>10}\n", "op", "calls", "kernels", "ms", "share", "GB/s");
  // A backend without kernels (the CPU's ops run on its threads) shows "-" for them.
  auto kernels = [&](int64_t n) { return total_kernels > 0 ? fmt::format("{:.1f}", n / steps) : std::string("-"); };
  for (const OpProfile& p : ops) {
    const double gbs = p.ms > 0 ? p.bytes / (p.ms * 1e-3) / 1e9 : 0.0;
    t.text += fmt::format("  {:<18} {:>9.1f} {:>9} {:>11.3f} {:>6.1f}% {:>10.1f}\n", p.op, p.calls / steps,
                          kernels(p.kernels), p.ms / steps, total_ms > 0 ? 100.0 * p.ms / total_ms : 0.0, gbs);
    t.json.push_back({{"op", p.op}, {"calls", p.calls / steps}, {"kernels", p.kernels / steps}, {"ms", p.ms / steps},
                      {"bytes", p.bytes / steps}, {"gb_s", gbs}});
  }
  t.text += fmt::format("  {:<18} {:>9} {:>9} {:>11.3f} {:>6.1f}% {:>10.1f}   (per {})\n", "total", "",
                        kernels(total_kernels), total_ms / steps, 100.0,
                        total_ms > 0 ? total_bytes / (total_ms * 1e-3) / 1e9 : 0.0, unit);
  return t;
}

DType kv_type(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "q8") return DType::q8_0;
  fail("--kv {} is not a KV cache type (f32, bf16, q8)", name);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The bandwidth the roofline divides by, GB/s, and where it comes from: --bandwidth; on the CPU
// its measured read bandwidth (a GPU's 4250 would make every CPU ratio ~0 %); on an H200 (or a
// GPU that does not say) the H200's measured device-to-device copy bandwidth (DESIGN §8), which
// the targets are set against; on another GPU its theoretical peak (a measured copy reaches
// ~85-90 % of it: ratios there read a little low).
struct RooflineBandwidth {
  double gbs;
  std::string source;
};
RooflineBandwidth roofline_bandwidth(const BenchOptions& opt, const Backend& backend) {
  const Device device = backend.device();
  if (opt.bandwidth_gbs > 0.0) return {opt.bandwidth_gbs, "--bandwidth"};
  if (device == Device::cpu) {
    const int threads = ThreadPool::global().size();
    return {measure_host_read_gbs(ThreadPool::global()),
            fmt::format("measured read bandwidth of this CPU, {} thread{}", threads, threads == 1 ? "" : "s")};
  }
  const std::optional<Backend::MemoryPeak> peak = backend.memory_peak();
  if (peak && peak->device_model.find("H200") == std::string::npos)
    return {peak->gbs, fmt::format("the theoretical peak of the {} (memory clock x bus width; --bandwidth for a "
                                   "measured one)",
                                   peak->device_model)};
  return {4250.0, "the H200's measured copy bandwidth"};
}

void run_bench(const BenchOptions& opt) {
  const std::string ranks_backend = check_tensor_parallel_flags(opt.tp, opt.ep, opt.backend);
  if (opt.tp > 1 && opt.profile) fail("--profile times one device's ops; it does not combine with --tp");
  if (opt.profiler_region == "batch" && opt.batch < 2)
    fail("--profiler-region batch records the batched steps: give --batch 2 or more");
  auto start = std::chrono::steady_clock::now();
  // (opened, not read: a .fire or safetensors file is mapped, a synthetic model made on load)
  std::unique_ptr<ModelSource> source = open_model_or_synthetic("bench", opt.model, opt.like, opt.format);
  BackendOptions backend_options = backend_options_from_flags(opt.precision);
  if (!opt.branches.empty()) backend_options.concurrent_branches = opt.branches == "on";
  for (size_t i = 0; i < std::size(kGpuSwitches); ++i)
    if (!opt.gpu_switches[i].empty()) backend_options.*kGpuSwitches[i].option = opt.gpu_switches[i] == "on";
  backend_options.imma_l2_ahead = opt.imma_l2_ahead;
  backend_options.imma_min_bytes = opt.imma_min_bytes;
  backend_options.imma_warps_per_sm = opt.imma_warps_per_sm;
  backend_options.attention_prefetch_mb = opt.attention_prefetch_mb;
  backend_options.update_prefetch_mb = opt.update_prefetch_mb;
  backend_options.fused_experts_blocks = opt.fused_experts_blocks;
  if (!opt.expert_matvec.empty()) backend_options.expert_matvec = parse_expert_matvec_shape(opt.expert_matvec);
  auto backend = make_backend(opt.tp > 1 ? rank_backend_name(ranks_backend, 0) : opt.backend, backend_options);
  const auto probe_start = std::chrono::steady_clock::now();
  const RooflineBandwidth bandwidth = roofline_bandwidth(opt, *backend);  // before the model fills memory
  start += std::chrono::steady_clock::now() - probe_start;  // the probe is not loading
  // The CPU has no tensor cores: it computes in f32 whatever the option.
  const std::string_view precision = backend->device() == Device::cpu
                                         ? std::string_view("f32")
                                         : tensor_core_precision_name(backend_options.tensor_core_precision);
  // Concurrent branches run side by side on a GPU only (the CPU runs every op in order).
  const bool side_by_side = backend->device() != Device::cpu && backend_options.concurrent_branches;
  const DType kv = kv_type(opt.kv);
  LoadOptions load;
  load.max_seq = std::max<int64_t>(opt.context + opt.gen_tokens + 3, opt.prompt_tokens + 1);
  load.kv_dtype = kv;
  load.max_tokens = std::max(opt.prompt_tokens, opt.batch);
  std::unique_ptr<Model> model;
  std::string backend_name(backend->name());
  if (opt.tp > 1) {  // one backend and thread per rank (model/tensor_parallel.h)
    model = make_command_line_split_model(*source, {opt.tp, opt.ep}, load, ranks_backend, backend_options);
    backend_name = command_line_split_name({opt.tp, opt.ep}, ranks_backend);
  } else {
    model = load_model(*source, *backend, load);
  }
  const double load_s = seconds_since(start);
  const int V = model->vocab_size();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(3, V - 1);

  // Prefill: a fresh sequence per run, the whole prompt in one forward.
  std::vector<double> prefill_tps;
  for (int r = 0; r < opt.runs + 1; ++r) {  // the first run warms up (allocations, caches)
    auto seq = model->new_sequence({opt.prompt_tokens + 1, kv, true});
    std::vector<int32_t> ids(opt.prompt_tokens);
    for (auto& id : ids) id = token(rng);
    auto t0 = std::chrono::steady_clock::now();
    model->forward(*seq, ids, LogitsMode::last);
    if (r > 0) prefill_tps.push_back(opt.prompt_tokens / seconds_since(t0));
  }

  // Decode at `context`: the sequence is advanced to the context without running a prompt (its KV
  // rows stay zero), which reads exactly the bytes a real context would; then one token per step,
  // replayed from a captured graph with the next token chosen on the device, as `run` decodes
  // (only the id crosses to the host), and, for comparison, launched eagerly with the logits
  // copied to the host.
  SampleSpec greedy;
  greedy.temperature = 0.0f;
  auto measure_decode = [&](bool graph) {
    std::vector<double> tps;
    for (int r = 0; r < opt.runs + 1; ++r) {
      auto seq = model->new_sequence({opt.context + opt.gen_tokens + 3, kv, true});
      seq->n_past = opt.context;
      auto steps = graph ? model->make_decode_graph(*seq) : nullptr;
      int32_t next = token(rng);
      auto decode_one = [&] {
        if (graph) {
          next = steps->step_sample(next, greedy);
          return;
        }
        std::vector<float> logits = model->forward(*seq, std::span<const int32_t>(&next, 1), LogitsMode::last);
        next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      };
      if (graph) decode_one(), decode_one();  // eager step and capture step are not timed
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.gen_tokens; ++i) decode_one();
      if (r > 0) tps.push_back(opt.gen_tokens / seconds_since(t0));
    }
    return median(tps);
  };
  const double decode_eager = measure_decode(false);
  // Batched decode (continuous batching): `batch` sequences at the context; a step is one token
  // each through forward_batch_sample, greedy (on a GPU each row is sampled there and only the
  // ids come back, as the server does). Reported: the aggregate rate over all of them.
  double decode_batch = 0.0;
  struct Batch {
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence*> seqs;
    std::vector<int32_t> next;
  };
  auto make_batch = [&] {
    Batch b;
    for (int i = 0; i < opt.batch; ++i) {
      b.owned.push_back(model->new_sequence({opt.context + opt.gen_tokens + 3, kv, true}));
      b.owned.back()->n_past = opt.context;
      b.seqs.push_back(b.owned.back().get());
      b.next.push_back(token(rng));
    }
    return b;
  };
  const std::vector<SampleSpec> greedy_rows(static_cast<size_t>(std::max(opt.batch, 1)), greedy);
  auto batch_step = [&](Batch& b) { b.next = model->forward_batch_sample(b.seqs, b.next, greedy_rows); };
  if (opt.batch > 1) {
    std::vector<double> tps;
    for (int r = 0; r < opt.runs + 1; ++r) {
      Batch b = make_batch();
      batch_step(b);  // warm-up step: scratch and workspace sizing
      // --profiler-region batch: the last run's timed steps (scripts/kernel-times --batch)
      const bool recorded = opt.profiler_region == "batch" && r == opt.runs;
      if (recorded) backend->profiler_region(true);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.gen_tokens; ++i) batch_step(b);
      if (r > 0) tps.push_back(static_cast<double>(opt.batch) * opt.gen_tokens / seconds_since(t0));
      if (recorded) backend->profiler_region(false);
    }
    decode_batch = median(tps);
  }
  std::vector<double> decode_tps = {measure_decode(true)};

  // Where the time goes: the same prefill and eager decode steps with every op timed on the device.
  ProfileTable prefill_profile, decode_profile, batch_profile;
  double batch_step_ms = 0.0;
  if (opt.profile) {
    backend->set_profiling(true);
    {
      auto seq = model->new_sequence({opt.prompt_tokens + 1, kv, true});
      std::vector<int32_t> ids(opt.prompt_tokens);
      for (auto& id : ids) id = token(rng);
      model->forward(*seq, ids, LogitsMode::last);
    }
    prefill_profile = profile_table(backend->take_profile(), 1.0, "prefill");
    {
      auto seq = model->new_sequence({opt.context + opt.gen_tokens + 3, kv, true});
      seq->n_past = opt.context;
      int32_t next = token(rng);
      for (int i = 0; i < opt.gen_tokens; ++i) {
        std::vector<float> logits = model->forward(*seq, std::span<const int32_t>(&next, 1), LogitsMode::last);
        next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
    }
    decode_profile = profile_table(backend->take_profile(), opt.gen_tokens, "token");
    if (opt.batch > 1) {  // the batched step, op by op (its wall time includes the host's part)
      Batch b = make_batch();
      batch_step(b);
      backend->take_profile();  // the warm-up step sizes scratch: not timed
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.gen_tokens; ++i) batch_step(b);
      batch_step_ms = 1000.0 * seconds_since(t0) / opt.gen_tokens;
      batch_profile = profile_table(backend->take_profile(), opt.gen_tokens, "step");
    }
    backend->set_profiling(false);
  }

  const DecodeTraffic traffic = model->decode_traffic(opt.context, kv);
  const double bytes = traffic.total();
  const double roofline = bandwidth.gbs * 1e9 / bytes;
  const double prefill = median(prefill_tps), decode = median(decode_tps);
  if (opt.json) {
    nlohmann::json j = {{"model", source->path()},
                        {"backend", backend_name},
                        {"tp", opt.tp},
                        {"ep", opt.ep},
                        {"kv", opt.kv},
                        {"precision", precision},
                        {"concurrent_branches", side_by_side},
                        {"load_s", load_s},
                        {"prompt_tokens", opt.prompt_tokens},
                        {"prefill_tok_s", prefill},
                        {"context", opt.context},
                        {"gen_tokens", opt.gen_tokens},
                        {"decode_tok_s", decode},
                        {"decode_eager_tok_s", decode_eager},
                        {"decode_ms_per_token", 1000.0 / decode},
                        {"bytes_per_token",
                         {{"weights", traffic.weight_bytes}, {"kv", traffic.kv_bytes}, {"state", traffic.state_bytes}}},
                        {"bandwidth_gbs", bandwidth.gbs},
                        {"bandwidth_source", bandwidth.source},
                        {"roofline_tok_s", roofline},
                        {"roofline_ratio", decode / roofline},
                        {"runs", opt.runs}};
    // What the GPU switches did: as asked on a GPU (whether it has the Hopper kernel is the
    // backend's to say; docs/cli.md), false on the CPU, which has none of them.
    for (const GpuSwitch& s : kGpuSwitches) j[s.json] = backend->device() != Device::cpu && backend_options.*s.option;
    j["imma_l2_ahead"] = backend->device() != Device::cpu ? backend_options.imma_l2_ahead : 0;
    j["imma_min_bytes"] = backend->device() != Device::cpu ? backend_options.imma_min_bytes : 0;
    j["imma_warps_per_sm"] = backend->device() != Device::cpu ? backend_options.imma_warps_per_sm : 0;
    j["attention_prefetch_mb"] = backend->device() != Device::cpu ? backend_options.attention_prefetch_mb : 0;
    j["update_prefetch_mb"] = backend->device() != Device::cpu ? backend_options.update_prefetch_mb : 0;
    j["fused_experts_blocks"] = backend->device() != Device::cpu ? backend_options.fused_experts_blocks : 0;
    j["expert_matvec"] = backend->device() != Device::cpu ? expert_matvec_shape_name(backend_options.expert_matvec)
                                                          : std::string("plain");
    if (opt.batch > 1) j["batch"] = {{"sequences", opt.batch}, {"decode_tok_s_total", decode_batch}};
    if (opt.profile) {
      j["profile"] = {{"prefill", prefill_profile.json}, {"decode_per_token", decode_profile.json}};
      if (opt.batch > 1) j["profile"]["batch_per_step"] = {{"wall_ms", batch_step_ms}, {"ops", batch_profile.json}};
    }
    std::puts(j.dump(2).c_str());
    return;
  }
  std::string out;
  out += fmt::format("model     {} on {} (KV {}, tensor cores {}{}), loaded in {:.1f} s\n", source->path(),
                     backend_name, opt.kv, precision, side_by_side ? ", branches side by side" : "", load_s);
  out += fmt::format("prefill   {:>10.1f} tok/s   ({} tokens, median of {})\n", prefill, opt.prompt_tokens, opt.runs);
  // The CPU backend's capture() re-runs the ops: its "replay" is the eager path with the token
  // picked by the sampler op.
  out += fmt::format("decode    {:>10.1f} tok/s   ({:.2f} ms/token at context {}, {} tokens, median of {}{})\n", decode,
                     1000.0 / decode, opt.context, opt.gen_tokens, opt.runs,
                     backend->device() == Device::cpu ? "" : ", graph replay");
  out += fmt::format("  eager   {:>10.1f} tok/s   (the same, launched op by op)\n", decode_eager);
  const std::string state =
      traffic.state_bytes > 0 ? fmt::format(" + {:.3f} GB recurrent state", traffic.state_bytes / 1e9) : "";
  out += fmt::format("roofline  {:>10.1f} tok/s   ({:.3f} GB weights + {:.3f} GB KV{} per token at {:.0f} GB/s: {})\n",
                     roofline, traffic.weight_bytes / 1e9, traffic.kv_bytes / 1e9, state, bandwidth.gbs,
                     bandwidth.source);
  out += fmt::format("ratio     {:>10.1f} %      of the decode roofline{}\n", 100.0 * decode / roofline,
                     opt.tp > 1 ? " (bytes of one rank's part: the ranks read theirs in parallel)" : "");
  if (opt.batch > 1)
    out += fmt::format("batch     {:>10.1f} tok/s   ({} sequences decoding together, total; eager, sampled on the device)\n",
                       decode_batch, opt.batch);
  if (opt.profile) {
    out += fmt::format("\ndecode, per token (eager launches, {} tokens at context {}):\n", opt.gen_tokens, opt.context);
    out += decode_profile.text;
    out += fmt::format("\nprefill of {} tokens:\n", opt.prompt_tokens);
    out += prefill_profile.text;
    if (opt.batch > 1) {
      out += fmt::format("\nbatched decode, per step of {} sequences ({:.2f} ms wall per step, with the sampled ids'\n"
                         "copy to the host; eager launches, {} steps at context {}):\n",
                         opt.batch, batch_step_ms, opt.gen_tokens, opt.context);
      out += batch_profile.text;
    }
  }
  std::fputs(out.c_str(), stdout);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed against the bandwidth roofline");
  cmd->add_option("model", opt->model, "Model: a Hugging Face directory, a .fire file or a name from `fireline list` (or use --like)");
  cmd->add_option("--like", opt->like, "Benchmark a synthetic model with these shapes: " + synthetic_model_list());
  cmd->add_option("--format", opt->format, "Weight format of the synthetic model: hf4 (default), hf6, q8, bf16, f32");
  cmd->add_option("--backend", opt->backend, "cuda (default), cuda:N or cpu");
  cmd->add_option("--kv", opt->kv, "KV cache type: q8 (default), bf16, f32");
  add_precision_option(cmd, opt->precision);
  cmd->add_option("--prompt-tokens", opt->prompt_tokens, "Prompt length for the prefill measurement (default 512)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen-tokens", opt->gen_tokens, "Tokens decoded per run (default 64)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--context", opt->context, "Context length at which decode is measured (default 4096)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--runs", opt->runs, "Timed runs after one warm-up; the median is reported (default 3)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--bandwidth", opt->bandwidth_gbs,
                  "Memory bandwidth for the roofline, GB/s (default: 4250, the H200's, on an H200; another GPU's "
                  "theoretical peak; measured on the CPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", opt->json, "Print the results as JSON");
  cmd->add_option("--batch", opt->batch, "Also decode this many sequences together and report the total rate (default 1: off)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--tp", opt->tp,
                  "Split the model over this many ranks (tensor parallel: heads and MLP columns; GPUs 0..N-1 over "
                  "NCCL, or CPU threads)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--ep", opt->ep, "With --tp: deal a mixture-of-experts model's experts out over the ranks");
  cmd->add_option("--branches", opt->branches,
                  "on: run independent lines of a layer (a MoE layer's dense MLP or shared expert and its routed "
                  "experts, a decode step's KV write and attention) side by side on the GPU; off: one after the "
                  "other (identical results; for A/B timing)")
      ->check(CLI::IsMember({"on", "off"}));
  for (size_t i = 0; i < std::size(kGpuSwitches); ++i)
    cmd->add_option(kGpuSwitches[i].flag, opt->gpu_switches[i], kGpuSwitches[i].help)
        ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--imma-l2-ahead", opt->imma_l2_ahead,
                  "N > 0: with --imma-matvec on, each warp of the integer matvec also pulls into L2 the weights of the "
                  "group N of its iterations past the one it loads; 0 (default): none (identical results; for A/B "
                  "timing)")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--imma-min-bytes", opt->imma_min_bytes,
                  "N > 0: with --imma-matvec on, a one-input product with fewer than N bytes of weights whose input "
                  "no earlier kernel cut runs on the f32 kernels, without the integer kernel's pieces launch; 0 "
                  "(default): none (for A/B timing)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option(
         "--imma-warps-per-sm", opt->imma_warps_per_sm,
         "N > 0: with --imma-matvec on, the integer matvec splits a product's row tiles over more warps (up to "
         "8) until N warps per SM; 0 (default): 10 for the register form, 20 for --imma-lean on (the same "
         "numbers but for the order of the warps' partial sums; for A/B timing)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--attention-prefetch-mb", opt->attention_prefetch_mb,
                  "N > 0: decode attention by KV head pulls the first N MB of the next product's weights (o_proj) "
                  "into L2 while it runs; 0: none (identical results; for A/B timing)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--update-prefetch-mb", opt->update_prefetch_mb,
                  "N > 0: the one-row residual update pulls the first N MB of the next product's weights (gate_proj, "
                  "the next q_proj) into L2 while it runs; 0: none (identical results; for A/B timing)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option(
         "--fused-experts-blocks", opt->fused_experts_blocks,
         "with --fused-experts on: the one launch's blocks per SM, 1 or 2 (default; 2 hold more weight loads in "
         "flight, 1 leaves room for the side line's kernels)")
      ->check(CLI::Range(1, 2));
  cmd->add_option("--expert-matvec", opt->expert_matvec,
                  "decode's routed expert pairs on the f32 rows kernel (HFQ4): auto (default: one token's pairs, where "
                  "the plain products' shape waits 3+ rounds of loads x waves, take the built shape with the fewest), "
                  "plain (the plain products' rows per warp and steps in flight), or RxS, one of 4x2, 2x4, 4x3, 4x4, "
                  "8x2, 8x3, for every expert launch (identical results; for A/B timing)")
      ->check(CLI::IsMember({"plain", "auto", "4x2", "2x4", "4x3", "4x4", "8x2", "8x3"}));
  cmd->add_option("--profiler-region", opt->profiler_region,
                  "batch: turn the GPU runtime's profiler on for the last run's batched steps only, for a profiler "
                  "started with recording off (scripts/kernel-times --batch); none (default)")
      ->check(CLI::IsMember({"none", "batch"}));
  cmd->add_flag("--profile", opt->profile,
                "Also time every op on the device (one prefill, --gen-tokens eager decode steps) and print where the time goes");
  cmd->callback([opt] { run_bench(*opt); });
}

}  // namespace fl::cli
