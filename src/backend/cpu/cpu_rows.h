#pragma once
// Host tensors seen as rows, for the CPU backend's ops.
#include <cstdint>

#include "core/tensor.h"

namespace fl::cpu {

// A tensor seen as rows of contiguous elements: all leading dims folded into `rows`.
struct Rows {
  char* base = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // bytes between rows
  DType dtype = DType::f32;

  template <typename T = float>
  T* row(int64_t r) const {
    return reinterpret_cast<T*>(base + r * stride);
  }
};

// Fails (fl::Error naming `op`) unless `t` is in host memory with a contiguous innermost
// dimension and leading dimensions that fold into rows.
Rows as_rows(const Tensor& t, const char* op);
// The same, for an f32 activation.
Rows f32_rows(const Tensor& t, const char* op);
void check_same_shape(const Rows& a, const Rows& b, const char* op);

}  // namespace fl::cpu
