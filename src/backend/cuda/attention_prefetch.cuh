#pragma once
// The L2 prefetch of a decode split's cached K/V rows that both decode attention kernels (the
// SIMT kernel in attention.cu, the kernel by KV head in attention_decode.cu) issue before their
// enter_kernel(): the rows were written by earlier steps, so pulling them into L2 while the
// previous kernel runs is a hint that changes no result (launch.cuh).
#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace fl::cuda {

// Pulls the cached K and V rows of keys [b, e) (KV head g's slice of each row) into L2, the
// block's threads taking the rows' 128-byte lines in turn.
__device__ __forceinline__ void prefetch_cached_keys(const uint8_t* k_cache, const uint8_t* v_cache, int64_t b,
                                                     int64_t e, int64_t cache_rows, int64_t row_stride,
                                                     int64_t row_bytes) {
  const int64_t lines = (row_bytes + 127) / 128 + 1;  // a row may straddle one more line than its size
  for (int64_t i = threadIdx.x; i < (e - b) * 2 * lines; i += blockDim.x) {
    const int64_t key = b + i / (2 * lines), part = i % (2 * lines);
    const uint8_t* row = (part < lines ? k_cache : v_cache) + (key % cache_rows) * row_stride;
    const int64_t offset = (part % lines) * 128;
    prefetch_l2(row + (offset < row_bytes ? offset : row_bytes - 1));
  }
}

}  // namespace fl::cuda
