// The CUDA backend's host-side checks of an op's tensors (tensor_checks.h).
#include "backend/cuda/tensor_checks.h"

#include "core/error.h"

namespace fl::cuda {

F32Rows f32_rows(const Tensor& t, const char* op) {
  if (t.device != Device::cuda) fail("{}: tensor {} is not in GPU memory", op, t.describe());
  if (t.dtype != DType::f32) fail("{}: expected an f32 activation, got {}", op, t.describe());
  F32Rows r{static_cast<float*>(t.data), t.rows(), t.cols(), t.cols()};
  if (t.ndim >= 2) {
    if (t.stride[t.ndim - 1] != 4) fail("{}: innermost dimension of {} is not contiguous", op, t.describe());
    r.stride = t.stride[t.ndim - 2] / 4;
    for (int i = t.ndim - 3; i >= 0; --i)
      if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1])
        fail("{}: the leading dimensions of {} cannot be folded into rows", op, t.describe());
  }
  return r;
}

void require_device(const Tensor& t, const char* op) {
  if (t.device != Device::cuda) fail("{}: tensor {} is not in GPU memory", op, t.describe());
}

F32Heads f32_heads(const Tensor& t, const char* op, const char* what) {
  require_device(t, op);
  if (t.dtype != DType::f32 || t.ndim != 3)
    fail("{}: {} must be f32 [tokens, heads, dim], got {}", op, what, t.describe());
  if (t.stride[2] != 4) fail("{}: innermost dimension of {} {} is not contiguous", op, what, t.describe());
  if (t.stride[0] % 4 || t.stride[1] % 4)
    fail("{}: {} {} has strides that are not whole floats", op, what, t.describe());
  return {static_cast<float*>(t.data), t.shape[0], t.shape[1], t.shape[2], t.stride[0] / 4, t.stride[1] / 4};
}

void same_shape(const F32Rows& a, const F32Rows& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    fail("{}: shape mismatch ({} x {} vs {} x {})", op, a.rows, a.cols, b.rows, b.cols);
}

void check_gain(const Tensor* weight, NormGain gain, int64_t cols, const char* op) {
  if (gain == NormGain::none) return;
  if (!weight || weight->numel() != cols) fail("{}: gain weight must have {} elements", op, cols);
  require_device(*weight, op);
}

void check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const char* op) {
  if (x.ndim != 3 || !x.is_contiguous()) fail("{}: expected a contiguous x [T, heads, D], got {}", op, x.describe());
  f32_rows(x, op);
  require_device(positions, op);
  require_device(inv_freq, op);
  if (positions.dtype != DType::i32 || positions.numel() != x.dim(0))
    fail("{}: positions must be i32[{}]", op, x.dim(0));
  if (inv_freq.numel() * 2 > x.dim(2)) fail("{}: inv_freq must be f32[<= {}]", op, x.dim(2) / 2);
}

}  // namespace fl::cuda
