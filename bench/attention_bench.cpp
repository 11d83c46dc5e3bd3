// Decode attention alone on the H200, at the attention shapes of the published models: one query
// token over a Q8_0 KV cache at 4k and 32k context, through the plan the CUDA backend uses
// (cuda::plan_attention) and through the alternatives it chose against: the SIMT kernel split
// along the context (one block per query head), the tensor-core kernel with a block per KV
// head's query group, and the decode kernel by KV head (attention_decode.cu), at several split
// counts, in its SIMT form ("kv-head") and, for 4- and 8-head groups, its tensor-core form
// ("kv-mma"). Each time includes the merge of the splits.
// Prints microseconds per call (and of the merge alone) and the KV bytes' rate; `--json` adds one
// JSON object per line. --shape / --context / --variant pick cases (for a profiler), --iters the
// timed calls per case. --batch N times batched decode instead: N sequences, each one query row at
// the last position of its own cache (the per-row caches of serve's continuous batching), through
// the plan and the alternatives (SIMT and tensor-core group kernels at several split counts).
//   attention_bench [--json] [--shape NAME] [--context N] [--variant PATH] [--iters N] [--batch N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/gpu_runtime.h"
#include "bench_timing.h"

namespace {

using fl::bench::cuda_ok;

struct Shape {
  const char* name;
  int n_heads, n_kv_heads, head_dim, window;
};

// Random Q8_0 cache rows: random codes, scale 1/64 (f16 0x2400) in every 34-byte block.
void* random_q8_cache(int64_t rows, int64_t row_bytes) {
  std::vector<uint8_t> host(static_cast<size_t>(rows * row_bytes));
  std::mt19937 rng(11);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i + 34 <= static_cast<int64_t>(host.size()); i += 34) host[i] = 0x00, host[i + 1] = 0x24;
  void* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, host.size()), "cudaMalloc cache");
  cuda_ok(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), "copy cache");
  return dev;
}

float* random_floats(int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : host) x = dist(rng);
  float* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, host.size() * sizeof(float)), "cudaMalloc floats");
  cuda_ok(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "copy floats");
  return dev;
}

// Microseconds per call of `launch` (launch_attention: kernel + merge; or the merge alone),
// averaged over `iters` after warm-up.
using Launcher = cudaError_t (*)(const fl::cuda::AttentionArgs&, cudaStream_t);
double time_attention(const fl::cuda::AttentionArgs& a, cudaStream_t stream, int iters, Launcher launch) {
  for (int i = 0; i < 5; ++i) cuda_ok(launch(a, stream), "attention warm-up");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  cuda_ok(cudaEventRecord(start, stream), "record");
  for (int i = 0; i < iters; ++i) cuda_ok(launch(a, stream), "attention");
  cuda_ok(cudaEventRecord(stop, stream), "record");
  cuda_ok(cudaEventSynchronize(stop), "sync");
  float ms = 0.0f;
  cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string only_shape, only_variant;
  int64_t only_context = 0;
  int iters = 200, batch = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--json")
      json = true;
    else if (arg == "--shape" && has_value)
      only_shape = argv[++i];
    else if (arg == "--variant" && has_value)
      only_variant = argv[++i];
    else if (arg == "--context" && has_value)
      only_context = std::atoll(argv[++i]);
    else if (arg == "--iters" && has_value)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--batch" && has_value)
      batch = std::clamp(std::atoi(argv[++i]), 1, 1024);
    else {
      fmt::print(stderr,
                 "usage: attention_bench [--json] [--shape NAME] [--context N] [--variant PATH] [--iters N] "
                 "[--batch N]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "device properties");
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  const Shape shapes[] = {{"gemma4-26b sliding", 16, 8, 256, 1024},
                          {"gemma4-26b global", 16, 2, 512, 0},
                          {"gemma4-31b sliding", 32, 16, 256, 1024},
                          {"gemma4-31b global", 32, 4, 512, 0},
                          {"qwen3.5-4b", 16, 4, 256, 0},
                          {"qwen3.5-35b-a3b", 16, 2, 256, 0}};
  fmt::print("{} ({} SMs): decode attention, {} query row(s) of {} sequence(s), Q8_0 cache; us per call incl. merge\n",
             prop.name, prop.multiProcessorCount, batch, batch);
  fmt::print("{:<20} {:>6} {:<14} {:>6} {:>9} {:>9} {:>8}\n", "shape", "ctx", "path", "splits", "us", "merge us",
             "GB/s");
  for (const Shape& s : shapes)
    for (int64_t context : {4096, 32768}) {
      if ((!only_shape.empty() && only_shape != s.name) || (only_context && only_context != context)) continue;
      const int64_t rows = s.window > 0 ? std::min<int64_t>(s.window, context) : context;
      const int64_t row_bytes = s.head_dim / 32 * 34;
      // One cache per sequence (batch > 1: row t's cache is slice t of one allocation).
      const int64_t cache_bytes = rows * s.n_kv_heads * row_bytes;
      void* k_cache = random_q8_cache(batch * rows * s.n_kv_heads, row_bytes);
      void* v_cache = random_q8_cache(batch * rows * s.n_kv_heads, row_bytes);
      float* q = random_floats(static_cast<int64_t>(batch) * s.n_heads * s.head_dim);
      float* k_new = random_floats(static_cast<int64_t>(batch) * s.n_kv_heads * s.head_dim);
      float* v_new = random_floats(static_cast<int64_t>(batch) * s.n_kv_heads * s.head_dim);
      float* out = nullptr;
      cuda_ok(cudaMalloc(&out, sizeof(float) * batch * s.n_heads * s.head_dim), "cudaMalloc out");
      int32_t* positions = nullptr;
      // the last row: every key visible
      const std::vector<int32_t> position(static_cast<size_t>(batch), static_cast<int32_t>(context - 1));
      cuda_ok(cudaMalloc(&positions, sizeof(int32_t) * batch), "cudaMalloc positions");
      cuda_ok(cudaMemcpy(positions, position.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice), "copy positions");
      const uint8_t** row_caches = nullptr;  // [K cache of each row..., V cache of each row...]
      if (batch > 1) {
        std::vector<const uint8_t*> table(2 * static_cast<size_t>(batch));
        for (int t = 0; t < batch; ++t) {
          table[t] = static_cast<const uint8_t*>(k_cache) + t * cache_bytes;
          table[batch + t] = static_cast<const uint8_t*>(v_cache) + t * cache_bytes;
        }
        cuda_ok(cudaMalloc(&row_caches, sizeof(void*) * table.size()), "cudaMalloc cache table");
        cuda_ok(cudaMemcpy(row_caches, table.data(), sizeof(void*) * table.size(), cudaMemcpyHostToDevice),
                "copy cache table");
      }
      const int64_t visible = s.window > 0 ? std::min<int64_t>(s.window, context) : context;
      const double kv_bytes = 2.0 * batch * visible * s.n_kv_heads * row_bytes;
      const int64_t max_keys = rows + 1;
      const fl::cuda::AttentionPlan plan = fl::cuda::plan_attention(batch, s.n_heads, s.n_kv_heads, s.head_dim,
                                                                    max_keys, batch > 1, prop.multiProcessorCount,
                                                                    fl::DType::q8_0);

      fl::cuda::AttentionArgs a;
      a.out = out;
      a.q = q;
      a.k_new = k_new;
      a.v_new = v_new;
      a.k_cache = static_cast<const uint8_t*>(k_cache);
      a.v_cache = static_cast<const uint8_t*>(v_cache);
      a.cache_type = fl::DType::q8_0;
      a.cache_rows = rows;
      a.cache_row_bytes = row_bytes;
      a.positions = positions;
      a.n_tokens = batch;
      if (batch > 1) {
        a.k_row_caches = row_caches;
        a.v_row_caches = row_caches + batch;
      }
      a.n_heads = s.n_heads;
      a.n_kv_heads = s.n_kv_heads;
      a.head_dim = s.head_dim;
      a.scale = 1.0f / 16;
      a.window = s.window;
      float* partial = nullptr;
      // the partials buffer: batch x heads x splits rows (the plan's own count may exceed 64 for a
      // few batched rows: 2 rows x 16 heads plan 66 SIMT splits on 132 SMs)
      const int max_splits = batch > 1 ? std::max(64, plan.n_splits) : std::max(1024, plan.n_splits);
      cuda_ok(cudaMalloc(&partial, sizeof(float) * batch * s.n_heads * max_splits * (s.head_dim + 2)),
              "cudaMalloc partial");
      a.partial = partial;

      struct Variant {
        std::string path;
        bool group;
        int splits;
        int pieces = 3;  // the tensor-core kernel's bf16 pieces per value (3: f32-exact, as decode runs)
        bool by_kv_head = false;
        bool tensor_cores = false;  // the kernel by KV head's tensor-core form (4- and 8-head groups)
      };
      std::vector<Variant> variants = {{"plan", plan.group_queries, plan.n_splits, 3, plan.by_kv_head}};
      const int64_t heads = static_cast<int64_t>(batch) * s.n_heads, kv_heads = static_cast<int64_t>(batch) * s.n_kv_heads;
      const int simt_splits = static_cast<int>(std::clamp<int64_t>((8 * prop.multiProcessorCount + heads - 1) / heads, 1,
                                                                   std::max<int64_t>(1, max_keys / 16)));
      variants.push_back({"simt", false, simt_splits});
      for (int fewer : {2, 4, 8})  // longer key runs per split: fewer blocks, less merging
        if (simt_splits / fewer >= 2) variants.push_back({fmt::format("simt /{}", fewer), false, simt_splits / fewer});
      if (batch > 1)
        for (int more : {2, 4})  // a batch's 8 blocks per SM may be one split: try shorter runs too
          variants.push_back({fmt::format("simt x{}", more), false, std::min(simt_splits * more, max_splits)});
      if (fl::cuda::flash_decode_applies(s.n_heads, s.n_kv_heads, s.head_dim)) {
        const int64_t tiles = (max_keys + fl::cuda::flash_decode_tile_keys(s.head_dim) - 1) /
                              fl::cuda::flash_decode_tile_keys(s.head_dim);
        for (int per_sm : {1, 2, 4}) {
          const int splits = static_cast<int>(std::clamp<int64_t>((per_sm * prop.multiProcessorCount + kv_heads - 1) / kv_heads,
                                                                  1, std::min<int64_t>(tiles, max_splits)));
          variants.push_back({fmt::format("group {}/SM", per_sm), true, splits});
          if (batch > 1 && per_sm == 1) variants.push_back({"group 1/SM bf16", true, splits, 1});
        }
      }
      if (fl::cuda::decode_by_kv_head_applies(s.n_heads, s.n_kv_heads, s.head_dim, fl::DType::q8_0)) {
        const int64_t tile = fl::cuda::decode_by_kv_head_tile_keys(), tiles = (max_keys + tile - 1) / tile;
        for (int per_sm : {1, 2, 3, 4, 8}) {
          const int splits = static_cast<int>(std::clamp<int64_t>((per_sm * prop.multiProcessorCount + kv_heads - 1) / kv_heads,
                                                                  1, std::min<int64_t>(tiles, max_splits)));
          variants.push_back({fmt::format("kv-head {}/SM", per_sm), false, splits, 3, true});
          const int group = s.n_heads / s.n_kv_heads;
          if (group == 4 || group == 8)
            variants.push_back({fmt::format("kv-mma {}/SM", per_sm), false, splits, 3, true, true});
        }
      }
      for (const Variant& v : variants) {
        if (!only_variant.empty() && only_variant != v.path) continue;
        a.by_kv_head = v.by_kv_head;
        a.tensor_cores = v.tensor_cores;
        a.group_queries = v.group;
        a.n_splits = v.splits;
        a.pieces = v.pieces;
        const double us = time_attention(a, stream, iters, fl::cuda::launch_attention);
        const double merge_us = v.splits > 1 ? time_attention(a, stream, iters, fl::cuda::launch_attention_merge) : 0.0;
        const double gbs = kv_bytes / (us * 1e-6) / 1e9;
        fmt::print("{:<20} {:>6} {:<14} {:>6} {:>9.2f} {:>9.2f} {:>8.1f}\n", s.name, context, v.path, v.splits, us,
                   merge_us, gbs);
        if (json)
          fmt::print(
              "{{\"shape\": \"{}\", \"context\": {}, \"path\": \"{}\", \"splits\": {}, \"us\": {:.3f}, \"merge_us\": "
              "{:.3f}, \"gb_s\": {:.1f}}}\n",
              s.name, context, v.path, v.splits, us, merge_us, gbs);
      }
      for (void* p : {k_cache, v_cache, static_cast<void*>(q), static_cast<void*>(k_new), static_cast<void*>(v_new),
                      static_cast<void*>(out), static_cast<void*>(positions), static_cast<void*>(partial),
                      static_cast<void*>(row_caches)})
        cudaFree(p);
    }
  cudaStreamDestroy(stream);
  return 0;
}
