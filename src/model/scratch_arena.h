#pragma once
// Per-forward scratch memory on the backend's device: a bump allocator over one buffer, reset at
// the start of every forward. When a forward needs more than the buffer holds it spills into
// extra blocks and, at the next reset, replaces everything with one buffer big enough for the
// high-water mark. In steady state every forward therefore gets the same addresses in the same
// order, which a replayed CUDA graph relies on.
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace fl {

class ScratchArena {
 public:
  explicit ScratchArena(Backend& backend) : backend_(backend) {}

  void reset();
  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape);
  // Everything allocated after mark() is released by rewind(mark): per-layer temporaries reuse
  // the same bytes layer after layer, so scratch grows with the token count, not the depth.
  size_t mark() const { return used_; }
  void rewind(size_t mark);
  size_t capacity() const;

 private:
  static constexpr size_t kAlign = 256;  // generous: keeps GPU loads aligned
  Backend& backend_;
  std::unique_ptr<DeviceBuffer> main_;
  size_t used_ = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> spill_;
  size_t high_water_ = 0;
};

}  // namespace fl
