// The matmul op family's kernels alone on the H200, at the shapes of Gemma 4 26B-A4B and 31B (and
// Qwen3.5-4B's MLP):
// the tensor-core GEMM (plain and grouped over experts) for prefill-sized inputs, for each
// number of bf16 pieces per input (3 = exact; one piece also on the Hopper wgmma kernel, "1w"),
// and the batch-1 matvec. Prints time, TFLOP/s and
// the weight bytes' rate per case; `--json` adds one JSON object per line. The one-input matvecs
// are timed back to back over copies of the matrix that together exceed L2 (each read once per
// pass, as a decode step reads each weight once): bracketing one launch with events measured
// launch latency on the small matrices.
//   matmul_bench [--quick] [--one-input] [--shape SUBSTR]   (--quick: 1, 64 and 512 inputs only;
//   --one-input: the one-input matvecs only, no grouped experts; --shape: the
//   shapes whose name holds SUBSTR, e.g. "26b gate_up", "experts" for the grouped experts (also
//   on the Hopper kernel, "1w"), or "q/k/v" for three products one by one against one launch).
//   One input: the register kernel ("0", MatvecArgs' default), then the bulk-copy one
//   (BackendOptions::async_matvec, sm_90 only) at 2 and 4 rows per warp ("a2", "a4"), and the
//   split-steps one (BackendOptions::split_matvec, "s"; the register kernel where it does not apply;
//   "S" on every product with rows of 32+ blocks), and the integer tensor-core one
//   (BackendOptions::imma_matvec, "i": its input-pieces kernel and the product, sm_80+; "i1",
//   "i2", "i4": 1, 2 or 4 warps per row tile instead of the launcher's choice; "ir": the product
//   alone, its pieces cut beforehand, as decode runs it after a kernel that cut them:
//   BackendOptions::imma_ready_pieces; "ir4", "ir8": "ir" at 4 or 8 warps per row tile; "l", "l2",
//   "l4", "l8": as "ir" on the lean form, BackendOptions::imma_lean, at its launcher's choice or
//   2, 4 or 8 warps per row tile; "lh": "l" over one copy of the matrix, L2-resident where it fits
//   (what a product could take if its rows were prefetched into L2 before it ran)).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "bench_timing.h"

namespace {

using fl::bench::cuda_ok;
using fl::bench::time_rotating_us;

// Random HFQ4-G256 rows: random codes, scale 1/64 and min -1/8 in every block (any finite
// values time the same).
void* random_hfq4(int64_t rows, int64_t K, int64_t* row_bytes) {
  const int64_t blocks = (K + 255) / 256;
  *row_bytes = blocks * 136;
  std::vector<uint8_t> host(static_cast<size_t>(rows * *row_bytes));
  std::mt19937 rng(7);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  const float scale = 1.0f / 64, min = -0.125f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = host.data() + r * *row_bytes + b * 136;
      std::memcpy(block, &scale, 4);
      std::memcpy(block + 4, &min, 4);
    }
  void* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, host.size()), "cudaMalloc weights");
  cuda_ok(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), "copy weights");
  return dev;
}

// Random Q8_0 rows (the tied LM head's format): random codes, scale 1/64 (f16 0x2400) per block.
void* random_q8_0(int64_t rows, int64_t K, int64_t* row_bytes) {
  const int64_t blocks = (K + 31) / 32;
  *row_bytes = blocks * 34;
  std::vector<uint8_t> host(static_cast<size_t>(rows * *row_bytes));
  std::mt19937 rng(5);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = host.data() + r * *row_bytes + b * 34;
      block[0] = 0x00, block[1] = 0x24;
    }
  void* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, host.size()), "cudaMalloc weights");
  cuda_ok(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), "copy weights");
  return dev;
}

float* random_f32(int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : host) v = dist(rng);
  float* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, host.size() * 4), "cudaMalloc x");
  cuda_ok(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "copy x");
  return dev;
}

// Median of `runs` timings of one call of f() in microseconds, after one warm-up call.
template <typename Fn>
double time_us(cudaStream_t stream, int runs, Fn&& f) {
  return time_rotating_us(stream, runs, 1, [&](int) { f(); }, 1);
}

// The pieces column: "1w" for one piece on the Hopper (wgmma) kernel ("1w2" at 64 inputs: with
// the K-split plan of two blocks per SM it had before the one-wave plan), "1" for one piece on
// mma.sync, 2 and 3 pieces (mma.sync), 0 for the one-input matvec.
std::string piece_label(int64_t T, int variant) {
  if (T == 1) return "0";
  return variant == 0 ? "1w" : std::to_string(variant);
}

struct Shape {
  const char* name;
  int64_t M, K;
  fl::DType type = fl::DType::hfq4_g256;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, one_input = false;
  std::string only;  // --shape SUBSTR: only the shapes whose name holds it (for a profiler run)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") quick = true;
    else if (arg == "--one-input")
      one_input = true;
    else if (arg == "--shape" && i + 1 < argc) only = argv[++i];
    else {
      fmt::print(stderr, "usage: matmul_bench [--quick] [--one-input] [--shape SUBSTR]\n");
      return 2;
    }
  }
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  const int runs = quick ? 3 : 10;
  fmt::print("{:<28} {:>6} {:>6} {:>10} {:>9} {:>9}\n", "case", "T", "pieces", "us", "TFLOP/s", "W GB/s");

  const Shape shapes[] = {{"26b q_proj 4096x2816", 4096, 2816},
                          {"26b gate_up 4224x2816", 4224, 2816},
                          {"26b down 2816x2112", 2816, 2112},
                          {"4b gate_up 18432x2560", 18432, 2560},
                          {"4b down 2560x9216", 2560, 9216},
                          {"31b qkv 16384x5376", 16384, 5376},
                          {"31b o_proj 5376x8192", 5376, 8192},
                          {"31b gate_up 43008x5376", 43008, 5376},
                          {"31b down 5376x21504", 5376, 21504},
                          {"26b lm_head q8_0 262144x2816", 262144, 2816, fl::DType::q8_0}};
  const int64_t max_T = 4096;
  float* x = random_f32(max_T * 21504);
  float* out = nullptr;
  cuda_ok(cudaMalloc(&out, static_cast<size_t>(max_T) * 43008 * 4), "cudaMalloc out");
  // The GEMM's scratch (the inputs cut into bf16 pieces): enough for every case below.
  const size_t scratch_bytes = std::max(fl::cuda::mma_scratch_bytes(max_T, 21504, 3), fl::cuda::mma_scratch_bytes(max_T * 8, 2816, 3));
  void* scratch = nullptr;
  cuda_ok(cudaMalloc(&scratch, scratch_bytes), "cudaMalloc scratch");
  for (const Shape& s : shapes) {
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    // Copies of the matrix for the matvec timing: at least 256 MB in all (H200 L2: 50 MB).
    int64_t row_bytes = 0;
    const double matrix_bytes = static_cast<double>(s.M) *
                                (s.type == fl::DType::q8_0 ? (s.K + 31) / 32 * 34 : (s.K + 255) / 256 * 136);
    const int copies = static_cast<int>(std::clamp(std::ceil(256e6 / matrix_bytes), 1.0, 64.0));
    void* w = s.type == fl::DType::q8_0 ? random_q8_0(s.M * copies, s.K, &row_bytes)
                                        : random_hfq4(s.M * copies, s.K, &row_bytes);
    fl::cuda::MatvecArgs a;
    a.out = out;
    a.out_stride = s.M;
    a.x = x;
    a.x_stride = s.K;
    a.weight = static_cast<const uint8_t*>(w);
    a.weight_type = s.type;
    a.M = s.M;
    a.K = s.K;
    a.row_bytes = row_bytes;
    a.scratch = scratch;
    a.scratch_bytes = scratch_bytes;
    const double weight_bytes = static_cast<double>(s.M) * row_bytes;
    for (int64_t T : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{512}, int64_t{4096}}) {
      if (quick && T != 1 && T != 64 && T != 512) continue;
      if (one_input && T != 1) continue;
      if (T > 1024 && s.M * s.K > 100'000'000) continue;  // the 31B shapes at 4k inputs take seconds
      if (T * s.M > max_T * 43008) continue;               // more outputs than `out` holds
      a.n_inputs = T;
      for (int variant : {0, 1, 2, 3}) {  // 0: one piece on the Hopper (wgmma) kernel; else the pieces
        const int pieces = variant == 0 ? 1 : variant;
        if (T == 1 && pieces != 3) continue;  // the matvec has no pieces
        if (variant == 0 && (T < 64 || s.type == fl::DType::q8_0)) continue;  // its tiles: 64 or 128 HFQ4 inputs
        a.act_pieces = pieces;
        fl::cuda::allow_hopper_gemm(variant == 0);
        const uint8_t* first = static_cast<const uint8_t*>(w);
        const double us =
            T == 1 ? time_rotating_us(stream, runs, copies,
                                      [&](int c) {
                                        a.weight = first + static_cast<int64_t>(c) * s.M * row_bytes;
                                        cuda_ok(fl::cuda::launch_matvec(a, stream), "matvec");
                                      })
                   : time_us(stream, runs, [&] { cuda_ok(fl::cuda::launch_matvec(a, stream), "matvec"); });
        a.weight = first;
        fl::cuda::allow_hopper_gemm(true);
        const double flops = 2.0 * T * s.M * s.K;
        fmt::print("{:<28} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>9.1f}\n", s.name, T, piece_label(T, variant), us,
                   flops / us / 1e6, weight_bytes / us / 1e3);
        // One input: the bulk-copy kernel at 2 and 4 rows ("a2", "a4"), the split-steps one ("s":
        // where launch_matvec takes it, else the register kernel again; "S": on every long-row
        // product), and the integer tensor-core one with its input pieces kernel ("i") or with
        // its pieces cut once before the timing ("ir").
        auto time_one_input = [&](const char* label, int async_rows, int split_rows, int imma = 0,
                                  bool pieces_ready = false, bool lean = false, bool hot = false) {
          a.async_rows = async_rows;
          a.split_rows = split_rows;
          a.imma_rows = imma;
          a.imma_lean = lean;
          if (pieces_ready) {
            cuda_ok(fl::cuda::launch_matvec(a, stream), "matvec");  // (cuts x's pieces into the scratch)
            a.imma_pieces_ready = true;
          }
          const double kernel_us = time_rotating_us(stream, runs, hot ? 1 : copies, [&](int c) {
            a.weight = first + static_cast<int64_t>(c) * s.M * row_bytes;
            cuda_ok(fl::cuda::launch_matvec(a, stream), "matvec");
          });
          a.weight = first;
          a.async_rows = 0;
          a.split_rows = 0;
          a.imma_rows = 0;
          a.imma_lean = false;
          a.imma_pieces_ready = false;
          fmt::print("{:<28} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>9.1f}\n", s.name, T, label, kernel_us,
                     flops / kernel_us / 1e6, weight_bytes / kernel_us / 1e3);
        };
        if (T == 1 && s.type != fl::DType::q8_0) {
          if (fl::cuda::async_matvec_available()) {
            time_one_input("a2", 2, 0);
            time_one_input("a4", 4, 0);
          }
          time_one_input("s", 0, 1);
          time_one_input("S", 0, 2);
          if (fl::cuda::imma_matvec_available()) {
            time_one_input("i", 0, 0, -1);
            time_one_input("ir", 0, 0, -1, true);
            time_one_input("i1", 0, 0, 1);
            time_one_input("i2", 0, 0, 2);
            time_one_input("i4", 0, 0, 4);
            time_one_input("ir4", 0, 0, 4, true);
            time_one_input("ir8", 0, 0, 8, true);
            time_one_input("l", 0, 0, -1, true, true);
            time_one_input("l2", 0, 0, 2, true, true);
            time_one_input("l4", 0, 0, 4, true, true);
            time_one_input("l8", 0, 0, 8, true, true);
            time_one_input("lh", 0, 0, -1, true, true, true);
          }
        }
        if (variant == 0 && T == 64) {  // "1w2": the K-split plan before the one-wave one (two waves)
          fl::cuda::allow_one_wave_k_splits(false);
          const double old_us = time_us(stream, runs, [&] { cuda_ok(fl::cuda::launch_matvec(a, stream), "matvec"); });
          fl::cuda::allow_one_wave_k_splits(true);
          fmt::print("{:<28} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>9.1f}\n", s.name, T, "1w2", old_us, flops / old_us / 1e6,
                     weight_bytes / old_us / 1e3);
        }
      }
    }
    cudaFree(w);
  }

  // Grouped experts (26B-A4B: 128 experts, top-8, gate_up [1408, 2816], down [2816, 704]): the
  // pairs sorted by expert, then both products.
  const std::string experts_name = "26b experts (sort+2 GEMM)";
  if (!one_input && (only.empty() || experts_name.find(only) != std::string::npos)) {
    const int64_t E = 128, top_k = 8, H = 2816, I = 704;
    int64_t gu_row = 0, down_row = 0;
    void* gate_up = random_hfq4(E * 2 * I, H, &gu_row);
    void* down = random_hfq4(E * H, I, &down_row);
    for (int64_t T : {int64_t{64}, int64_t{512}, int64_t{4096}}) {
      if (quick && T == 4096) continue;  // 64: 16-input tiles (4 pairs per expert); 512: 64-input tiles
      const int64_t pairs = T * top_k;
      std::vector<int32_t> ids(static_cast<size_t>(pairs));
      std::mt19937 rng(3);
      for (int64_t t = 0; t < T; ++t) {  // top_k distinct experts per token
        std::vector<int32_t> all(E);
        for (int32_t e = 0; e < E; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t j = 0; j < top_k; ++j) ids[t * top_k + j] = all[j];
      }
      int32_t* d_ids = nullptr;
      const int64_t max_items = fl::cuda::max_work_items(pairs, E);
      fl::cuda::MmaWorkItem* items = nullptr;
      int32_t* ints = nullptr;
      cuda_ok(cudaMalloc(&d_ids, pairs * 4), "ids");
      cuda_ok(cudaMalloc(&items, max_items * sizeof(fl::cuda::MmaWorkItem)), "items");
      cuda_ok(cudaMalloc(&ints, (1 + pairs) * 4), "pair ids");
      cuda_ok(cudaMemcpy(d_ids, ids.data(), pairs * 4, cudaMemcpyHostToDevice), "copy ids");
      float* hidden = nullptr;
      cuda_ok(cudaMalloc(&hidden, pairs * 2 * I * 4), "hidden");
      // variant 0: one piece with the 64-pair items on the Hopper kernel (MmaGroupedRows::hopper,
      // their pairs gathered into tiles: BackendOptions::hopper_expert_gemm), "1w"; else pieces
      for (int variant : {0, 1, 2, 3}) {
        const int pieces = variant == 0 ? 1 : variant;
        if (variant == 0 && (fl::cuda::grouped_tile_rows(pairs, E) != 64 || !fl::cuda::hopper_gemm_active())) continue;
        fl::cuda::MmaGroupedRows grouped;
        const double us = time_us(stream, runs, [&] {
          cuda_ok(fl::cuda::launch_moe_sort_pairs(grouped, items, ints, ints + 1, d_ids, pairs, E, stream), "sort");
          grouped.hopper = variant == 0;
          fl::cuda::MatvecArgs a;
          a.scratch = scratch;
          a.scratch_bytes = scratch_bytes;
          a.out = hidden;
          a.out_stride = 2 * I;
          a.x = x;
          a.x_stride = H;
          a.weight = static_cast<const uint8_t*>(gate_up);
          a.weight_type = fl::DType::hfq4_g256;
          a.M = 2 * I;
          a.K = H;
          a.row_bytes = gu_row;
          a.expert_bytes = 2 * I * gu_row;
          a.x_row_div = top_k;
          a.n_inputs = pairs;
          cuda_ok(fl::cuda::launch_matmul_mma(a, pieces, stream, &grouped), "gate_up");
          a.out = out;
          a.out_stride = H;
          a.x = hidden;  // its first I columns as the activated input: the timing is the same
          a.x_stride = 2 * I;
          a.weight = static_cast<const uint8_t*>(down);
          a.M = H;
          a.K = I;
          a.row_bytes = down_row;
          a.expert_bytes = H * down_row;
          a.x_row_div = 1;
          cuda_ok(fl::cuda::launch_matmul_mma(a, pieces, stream, &grouped), "down");
        });
        const double flops = 2.0 * pairs * (2 * I * H + H * I);
        const double bytes = static_cast<double>(E) * (2 * I * gu_row + H * down_row);
        fmt::print("{:<28} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>9.1f}\n", experts_name, T, piece_label(T, variant), us,
                   flops / us / 1e6, bytes / us / 1e3);
      }
      cudaFree(d_ids);
      cudaFree(items);
      cudaFree(ints);
      cudaFree(hidden);
    }
    cudaFree(gate_up);
    cudaFree(down);
  }
  // Products of one input (26B q/k/v: 4096, 2048 and 2048 rows x 2816) on the Hopper kernel: one
  // after another ("3 launches": each splits the inputs, multiplies, sums its K splits), and as
  // one launch of three segments (BackendOptions::group_gemm).
  const std::string qkv_name = "26b q/k/v";
  if (!one_input && (only.empty() || qkv_name.find(only) != std::string::npos) && fl::cuda::hopper_gemm_active()) {
    const int64_t K = 2816, rows[3] = {4096, 2048, 2048};
    int64_t row_bytes = 0;
    void* w = random_hfq4(rows[0] + rows[1] + rows[2], K, &row_bytes);
    for (int64_t T : {int64_t{64}, int64_t{512}, int64_t{4096}}) {
      if (quick && T == 4096) continue;
      fl::cuda::MatvecArgs a;
      a.x = x;
      a.x_stride = K;
      a.weight_type = fl::DType::hfq4_g256;
      a.K = K;
      a.n_inputs = T;
      a.act_pieces = 1;
      a.scratch = scratch;
      a.scratch_bytes = scratch_bytes;
      a.n_segments = 3;
      int64_t first_row = 0, first_out = 0;
      for (int i = 0; i < 3; ++i) {
        a.segments[i].out = out + first_out;
        a.segments[i].weight = static_cast<const uint8_t*>(w) + first_row * row_bytes;
        a.segments[i].M = rows[i];
        a.segments[i].row_bytes = row_bytes;
        first_row += rows[i];
        first_out += T * rows[i];
      }
      for (bool one_launch : {false, true}) {
        const double us = time_us(stream, runs, [&] {
          if (one_launch) return cuda_ok(fl::cuda::launch_matmul_mma(a, 1, stream), "q/k/v grouped");
          for (int i = 0; i < 3; ++i) {
            fl::cuda::MatvecArgs p = a;
            p.n_segments = 0;
            p.out = a.segments[i].out;
            p.out_stride = rows[i];
            p.weight = a.segments[i].weight;
            p.M = rows[i];
            p.row_bytes = row_bytes;
            cuda_ok(fl::cuda::launch_matvec(p, stream), "q/k/v one by one");
          }
        });
        const double flops = 2.0 * T * first_row * K, bytes = static_cast<double>(first_row) * row_bytes;
        fmt::print("{:<28} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>9.1f}\n",
                   qkv_name + (one_launch ? " 1 launch" : " 3 launches"), T, "1w", us, flops / us / 1e6,
                   bytes / us / 1e3);
      }
    }
    cudaFree(w);
  }
  cudaFree(x);
  cudaFree(out);
  cudaFree(scratch);
  return 0;
}
