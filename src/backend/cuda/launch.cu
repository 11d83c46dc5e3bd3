// Per-device facts that launchers size their grids by, and the L2 prefetch hints' launch count (launch.cuh).
#include <atomic>

#include "backend/cuda/launch.cuh"

namespace fl::cuda {

namespace {
std::atomic<int64_t> g_l2_prefetch_launches{0};
}  // namespace
int64_t l2_prefetch_launches() { return g_l2_prefetch_launches.load(std::memory_order_relaxed); }
void count_l2_prefetch_launch() { g_l2_prefetch_launches.fetch_add(1, std::memory_order_relaxed); }

DeviceTraits current_device_traits() {
  // Asked once per device: launchers call this for every kernel launch. Threads may race to fill
  // a device's entry: each writes the same values, the SM count last with release order, so a
  // reader that acquires a nonzero count sees the other two.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_counts[kMaxDevices] = {};
  static std::atomic<int> majors[kMaxDevices] = {};
  static std::atomic<int> block_smems[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {132, 0, 48 * 1024};
  DeviceTraits t;
  t.sm_count = sm_counts[device].load(std::memory_order_acquire);
  if (t.sm_count != 0) {
    t.major = majors[device].load(std::memory_order_relaxed);
    t.max_block_smem = block_smems[device].load(std::memory_order_relaxed);
    return t;
  }
  if (cudaDeviceGetAttribute(&t.sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || t.sm_count <= 0)
    t.sm_count = 132;
  if (cudaDeviceGetAttribute(&t.major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) t.major = 0;
  if (cudaDeviceGetAttribute(&t.max_block_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      t.max_block_smem <= 0)
    t.max_block_smem = 48 * 1024;
  majors[device].store(t.major, std::memory_order_relaxed);
  block_smems[device].store(t.max_block_smem, std::memory_order_relaxed);
  sm_counts[device].store(t.sm_count, std::memory_order_release);
  return t;
}

}  // namespace fl::cuda
