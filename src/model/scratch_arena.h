#pragma once
// Per-forward scratch memory on the backend's device: a bump allocator over one buffer, reset at
// the start of every forward. When a forward needs more than the buffer holds it spills into
// extra blocks and, at the next reset, replaces everything with one buffer big enough for the
// high-water mark. In steady state every forward therefore gets the same addresses in the same
// order, which a replayed CUDA graph relies on.
//
// A spilled block belongs to the offset (in the arena's bump order) it was allocated at: after a
// rewind, an allocation at the same offset that fits reuses it, as the main buffer's bytes are
// reused. So the first long prompt holds about one layer's temporaries in spills, not every
// layer's (a 30000-token Qwen3.5-4B prompt ran a 141 GB GPU out of memory that way). Reuse is as
// safe as the main buffer's: the backend runs its ops in order on one stream.
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
  // Bytes held now: the main buffer and every spilled block.
  size_t held_bytes() const;

 private:
  static constexpr size_t kAlign = 256;  // generous: keeps GPU loads aligned
  Backend& backend_;
  std::unique_ptr<DeviceBuffer> main_;
  size_t used_ = 0;
  struct Spill {
    size_t offset;  // where the allocation began in the bump order
    std::unique_ptr<DeviceBuffer> block;
  };
  std::vector<Spill> spill_;
  size_t high_water_ = 0;
};

}  // namespace fl
