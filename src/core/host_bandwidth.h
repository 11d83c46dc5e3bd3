#pragma once
#include <cstddef>

namespace fl {

class ThreadPool;

// The host's memory read bandwidth, GB/s, as `pool`'s threads see it: each thread sums its share
// of a 256 MiB buffer, best of three passes (the buffer is written first, so page faults are not
// timed). The CPU backend streams its weights through the same threads, so this is the
// bandwidth its rooflines (fireline bench, cpu_matmul_bench) are measured against.
double measure_host_read_gbs(ThreadPool& pool);

}  // namespace fl
