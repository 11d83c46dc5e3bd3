#pragma once
// The slice of a byte span that one block of a grid pulls into L2 (prefetch_slice_l2, launch.cuh):
// the span's 16-byte-aligned interior (the bulk prefetch takes 16-byte-aligned addresses and
// sizes in 16s) cut into `blocks` slices of whole 16-byte units, in block order. Plain constexpr
// so that device code calls it (--expt-relaxed-constexpr) and host tests check its arithmetic
// without a GPU.
#include <cstdint>

namespace fl::cuda {

struct ByteRange {
  uint64_t first = 0, last = 0;  // [first, last); empty where last <= first
};

constexpr ByteRange l2_prefetch_slice(uint64_t address, int64_t bytes, uint64_t block, uint64_t blocks) {
  if (bytes <= 0 || blocks == 0) return {};
  const uint64_t begin = (address + 15) & ~uint64_t{15};
  const uint64_t end = (address + static_cast<uint64_t>(bytes)) & ~uint64_t{15};
  if (end <= begin) return {};
  const uint64_t slice = ((end - begin + blocks - 1) / blocks + 15) & ~uint64_t{15};
  const uint64_t first = begin + block * slice;
  if (first >= end) return {};
  return {first, first + slice < end ? first + slice : end};
}

}  // namespace fl::cuda
