#include "backend/cpu/cpu_rows.h"

#include "core/error.h"

namespace fl::cpu {

Rows as_rows(const Tensor& t, const char* op) {
  if (t.device != Device::cpu) fail("{}: tensor {} is not in host memory", op, t.describe());
  Rows r;
  r.base = static_cast<char*>(t.data);
  r.dtype = t.dtype;
  r.cols = t.cols();
  r.rows = t.rows();
  if (t.ndim <= 1) {
    r.stride = t.row_bytes();
    return r;
  }
  r.stride = t.stride[t.ndim - 2];
  if (!dtype_traits(t.dtype).quantized && t.stride[t.ndim - 1] != dtype_traits(t.dtype).block_bytes)
    fail("{}: innermost dimension of {} is not contiguous", op, t.describe());
  // Leading dims must fold: each stride equals the next one times its extent.
  for (int i = t.ndim - 3; i >= 0; --i)
    if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1])
      fail("{}: the leading dimensions of {} cannot be folded into rows", op, t.describe());
  return r;
}

Rows f32_rows(const Tensor& t, const char* op) {
  if (t.dtype != DType::f32) fail("{}: expected an f32 activation, got {}", op, t.describe());
  return as_rows(t, op);
}

void check_same_shape(const Rows& a, const Rows& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    fail("{}: shape mismatch ({} x {} vs {} x {})", op, a.rows, a.cols, b.rows, b.cols);
}

}  // namespace fl::cpu
