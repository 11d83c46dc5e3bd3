#include "model/scratch_arena.h"

namespace fl {

void ScratchArena::reset() {
  if (!spill_.empty() || (!main_ && high_water_ > 0)) {
    spill_.clear();
    main_.reset();
    main_ = backend_.allocate(high_water_);
  }
  used_ = 0;
  high_water_ = main_ ? main_->size() : 0;
}

Tensor ScratchArena::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe = make_tensor(nullptr, dtype, shape, backend_.device());
  size_t bytes = (static_cast<size_t>(probe.nbytes()) + kAlign - 1) / kAlign * kAlign;
  used_ += bytes;
  high_water_ = std::max(high_water_, used_);
  void* data;
  if (main_ && used_ <= main_->size()) {
    data = static_cast<char*>(main_->data()) + (used_ - bytes);
  } else {
    const size_t offset = used_ - bytes;
    DeviceBuffer* block = nullptr;
    for (Spill& s : spill_)  // a block this offset had before a rewind: only rewound tensors used it
      if (s.offset == offset && s.block->size() >= bytes) block = s.block.get();
    if (!block) {
      spill_.push_back({offset, backend_.allocate(bytes == 0 ? kAlign : bytes)});
      block = spill_.back().block.get();
    }
    data = block->data();
  }
  return make_tensor(data, dtype, shape, backend_.device());
}

void ScratchArena::rewind(size_t mark) {
  // Spilled blocks stay alive until reset() (queued kernels may still read them); allocations at
  // their offsets reuse them.
  if (mark <= used_) used_ = mark;
}

size_t ScratchArena::capacity() const { return main_ ? main_->size() : 0; }

size_t ScratchArena::held_bytes() const {
  size_t bytes = capacity();
  for (const Spill& s : spill_) bytes += s.block->size();
  return bytes;
}

}  // namespace fl
