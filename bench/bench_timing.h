#pragma once
// What the kernel benches share: a CUDA error check that ends the bench with one line, and the
// back-to-back timing over rotating copies of the data (matmul_bench, bandwidth_bench). Plain CUDA
// runtime and printf, so that .cu benches (nvcc: no fmt) include it too.
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace fl::bench {

// Ends the bench with "PROGRAM: what: error" when e is an error.
inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Microseconds per call of f(copy), launched back to back on `stream` over copies 0 .. copies - 1
// in turn (at least min_calls calls per timing); the median of `runs` timings, after one warm-up
// pass. With copies that together exceed L2, every call reads DRAM, as a decode step reads each
// weight once (bracketing one launch with events measures launch latency on small data).
template <typename Fn>
double time_rotating_us(cudaStream_t stream, int runs, int copies, Fn&& f, int min_calls = 32) {
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  for (int c = 0; c < copies; ++c) f(c);
  const int calls = copies * ((min_calls + copies - 1) / copies);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    cuda_ok(cudaEventRecord(start, stream), "record");
    for (int n = 0; n < calls; ++n) f(n % copies);
    cuda_ok(cudaEventRecord(stop, stream), "record");
    cuda_ok(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms * 1000.0 / calls);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

}  // namespace fl::bench
