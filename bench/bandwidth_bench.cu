// What the H200 can read, as ceilings for the decode matvec (bench/RESULTS.md, 2026-12-04 fifth):
// a plain stream of 16-byte loads, and the HFQ4 rows kernel's exact load pattern (matmul.cu,
// matvec_hfq4_rows_kernel: kRows rows per warp, each lane 8 code bytes and its block's 8-byte
// (scale, min) per row and step, kUnroll steps in flight, 4-warp blocks) with its arithmetic
// replaced by an XOR per loaded word. If the pattern alone runs near the stream, the rows kernel
// loses its bandwidth to its arithmetic and latency; if it runs near the rows kernel, the pattern
// (bytes in flight per SM, 8-byte requests) is the limit. Timed back to back over copies that
// together exceed L2, as matmul_bench times the matvec.
// Then the L2 prefetch hints' fill rate (BackendOptions::attention_prefetch_mb and
// update_prefetch_mb): a kernel of B blocks that each issue their slice of an N MB span
// (prefetch_slice_l2, launch.cuh) and then wait D us, as a latency-bound kernel would, followed by
// a plain stream of the span; against the same wait with nothing prefetched (cold) and with the
// span left in L2 by the previous call (hot). "filled" = (cold - prefetched) / (cold - hot): the
// share of the read's DRAM time the prefetch took away. B = 1 is the one-block residual update
// (Qwen3.5's), 7 the cluster update's blocks on the 31B's row, 2 per SM the 31B's sliding
// attention. With nothing else reading DRAM, so an upper bound on what the hints get in a step.
//   bandwidth_bench
// Plain CUDA and printf: nvcc compiles this file, which stays free of fmt (docs/architecture.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/launch.cuh"
#include "bench_timing.h"

namespace {

using fl::bench::cuda_ok;
using fl::bench::time_rotating_us;

// Each thread reads kUnroll 16-byte words per grid-stride step, all requested before any is used.
template <int kUnroll>
__global__ void stream_read_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = i + u * stride < n ? p[i + u * stride] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;  // never true for the bench's data: keeps the loads
}

// The HFQ4-G256 rows kernel's loads: a 136-byte block (f32 scale, f32 min, 128 code bytes) is read
// by 16 lanes (8 code bytes each, and all 16 the block's first 8 bytes), 2 blocks per warp step.
template <int kRows, int kUnroll>
__global__ void __launch_bounds__(128)
    hfq4_rows_loads_kernel(const uint8_t* w, int64_t M, int64_t row_bytes, int64_t n_blocks, uint32_t* sink) {
  constexpr int64_t kBlockBytes = 136;
  const int lane = threadIdx.x % 32, sub = lane % 16, lane_block = lane / 16;
  const int64_t m_first = (static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32) * kRows;
  if (m_first >= M) return;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = w + (m_first + r < M ? m_first + r : M - 1) * row_bytes + 8 * sub;
  uint32_t acc = 0;
  for (int64_t first = lane_block; first < n_blocks; first += 2 * kUnroll) {
    uint2 codes[kUnroll][kRows];
    uint2 scale_min[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = first + 2 * u;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* p = rows[r] + b * kBlockBytes;
        codes[u][r] = b < n_blocks ? *reinterpret_cast<const uint2*>(p + 8) : make_uint2(0, 0);
        scale_min[u][r] = b < n_blocks ? *reinterpret_cast<const uint2*>(p - 8 * sub) : make_uint2(0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc ^= codes[u][r].x ^ codes[u][r].y ^ scale_min[u][r].x ^ scale_min[u][r].y;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

// B blocks: each prefetches its slice of [p, p + bytes) into L2 (nothing where bytes is 0), then
// waits until `wait_ns` have passed since it started (the global timer).
__global__ void prefetch_then_wait_kernel(const uint8_t* p, int64_t bytes, int64_t wait_ns) {
  uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  if (bytes > 0) fl::cuda::prefetch_slice_l2(p, bytes);
  for (uint64_t now = start; now - start < static_cast<uint64_t>(wait_ns);)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

// us per (wait kernel + stream read of the span), over `copies` rotating spans (cold or
// prefetched) or one (hot).
double time_wait_then_read(const uint8_t* w, int64_t bytes, int copies, unsigned blocks, int64_t wait_ns,
                           bool prefetch, uint32_t* sink, int sms) {
  return time_rotating_us(nullptr, 5, copies, [&](int c) {
    const uint8_t* span = w + c * bytes;
    prefetch_then_wait_kernel<<<blocks, 128>>>(span, prefetch ? bytes : 0, wait_ns);
    stream_read_kernel<4><<<8 * sms, 256>>>(reinterpret_cast<const uint4*>(span), bytes / 16, sink);
  });
}

void time_prefetch_fill(int sms, uint32_t* sink) {
  for (int64_t mb : {8, 24}) {
    const int64_t bytes = mb << 20;
    const int copies = 16;  // 128-384 MB: every cold call reads DRAM
    uint8_t* w = nullptr;
    cuda_ok(cudaMalloc(&w, static_cast<size_t>(bytes * copies)), "cudaMalloc");
    cuda_ok(cudaMemset(w, 0x5A, static_cast<size_t>(bytes * copies)), "memset");
    for (int64_t wait_us : {5, 15}) {
      const int64_t wait_ns = wait_us * 1000;
      const double cold = time_wait_then_read(w, bytes, copies, 1, wait_ns, false, sink, sms);
      const double hot = time_wait_then_read(w, bytes, 1, 1, wait_ns, false, sink, sms);
      for (unsigned blocks : {1u, 7u, 33u, static_cast<unsigned>(sms), static_cast<unsigned>(2 * sms)}) {
        const double pre = time_wait_then_read(w, bytes, copies, blocks, wait_ns, true, sink, sms);
        cuda_ok(cudaGetLastError(), "launch");
        std::printf("L2 prefetch %3lld MB, wait %2lld us, %3u blocks: cold %7.1f  hot %7.1f  prefetched %7.1f us"
                    "  filled %5.1f %%\n",
                    static_cast<long long>(mb), static_cast<long long>(wait_us), blocks, cold, hot, pre,
                    100.0 * (cold - pre) / (cold - hot));
      }
    }
    cudaFree(w);
  }
}

struct Matrix {
  const char* name;
  int64_t M, K;
};

template <int kRows, int kUnroll>
void time_rows_pattern(const Matrix& m, const uint8_t* w, int copies, uint32_t* sink) {
  const int64_t n_blocks = (m.K + 255) / 256, row_bytes = n_blocks * 136;
  const int64_t bytes = m.M * row_bytes;
  const unsigned grid = static_cast<unsigned>((m.M + 4 * kRows - 1) / (4 * kRows));
  const double us = time_rotating_us(nullptr, 5, copies, [&](int c) {
    hfq4_rows_loads_kernel<kRows, kUnroll><<<grid, 128>>>(w + c * bytes, m.M, row_bytes, n_blocks, sink);
  });
  cuda_ok(cudaGetLastError(), "launch");
  std::printf("%-26s rows pattern %d rows x %d steps  %8.1f us %8.1f GB/s\n", m.name, kRows, kUnroll, us,
              static_cast<double>(bytes) / us / 1e3);
}

}  // namespace

int main() {
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device");
  uint32_t* sink = nullptr;
  cuda_ok(cudaMalloc(&sink, 4), "sink");
  const Matrix shapes[] = {{"31b gate_up 43008x5376", 43008, 5376},
                           {"31b down 5376x21504", 5376, 21504},
                           {"4b gate_up 18432x2560", 18432, 2560},
                           {"26b q_proj 4096x2816", 4096, 2816}};
  for (const Matrix& m : shapes) {
    const int64_t bytes = m.M * ((m.K + 255) / 256 * 136);
    const int copies = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(64, (256'000'000 + bytes - 1) / bytes)));
    uint8_t* w = nullptr;
    cuda_ok(cudaMalloc(&w, static_cast<size_t>(bytes * copies)), "cudaMalloc");
    cuda_ok(cudaMemset(w, 0x5A, static_cast<size_t>(bytes * copies)), "memset");
    // the same bytes as a plain stream, 4 x 16-byte loads in flight per thread, 8 blocks of 256 per SM
    const int64_t words = bytes / 16;
    const double stream_us = time_rotating_us(nullptr, 5, copies, [&](int c) {
      stream_read_kernel<4><<<8 * sms, 256>>>(reinterpret_cast<const uint4*>(w + c * bytes), words, sink);
    });
    cuda_ok(cudaGetLastError(), "launch");
    std::printf("%-26s stream, 16-byte loads     %8.1f us %8.1f GB/s\n", m.name, stream_us,
                static_cast<double>(words * 16) / stream_us / 1e3);
    time_rows_pattern<4, 2>(m, w, copies, sink);  // the shipped kernel's choice for large matrices
    time_rows_pattern<4, 4>(m, w, copies, sink);
    time_rows_pattern<2, 4>(m, w, copies, sink);
    time_rows_pattern<1, 8>(m, w, copies, sink);
    cudaFree(w);
  }
  time_prefetch_fill(sms, sink);
  cudaFree(sink);
  return 0;
}
