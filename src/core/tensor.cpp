#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace fl {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  if (ndim == 0) return true;
  const DTypeTraits& traits = dtype_traits(dtype);
  int64_t expected = traits.quantized ? row_bytes() : traits.block_bytes;
  int inner = ndim - 1;
  if (!traits.quantized) {
    if (stride[inner] != expected) return false;
    expected *= shape[inner];
  } else if (stride[inner] != 0) {
    return false;
  }
  for (int i = inner - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

int64_t Tensor::nbytes() const {
  FL_ASSERT(is_contiguous());
  return rows() * row_bytes();
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  FL_ASSERT(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0]);
  Tensor out = *this;
  out.shape[0] = end - begin;
  if (ndim == 1 && dtype_traits(dtype).quantized) fail("cannot slice inside a packed row of {}", describe());
  out.data = static_cast<char*>(data) + begin * stride[0];
  return out;
}

Tensor Tensor::select(int64_t index) const {
  FL_ASSERT(ndim >= 2 && 0 <= index && index < shape[0]);
  Tensor out;
  out.data = static_cast<char*>(data) + index * stride[0];
  out.dtype = dtype;
  out.device = device;
  out.ndim = ndim - 1;
  for (int i = 1; i < ndim; ++i) {
    out.shape[i - 1] = shape[i];
    out.stride[i - 1] = stride[i];
  }
  return out;
}

Tensor Tensor::narrow(int dim, int64_t begin, int64_t length) const {
  int d = dim < 0 ? ndim + dim : dim;
  FL_ASSERT(d >= 0 && d < ndim && begin >= 0 && length >= 0 && begin + length <= shape[d]);
  if (d == ndim - 1 && dtype_traits(dtype).quantized) fail("cannot narrow inside a packed row of {}", describe());
  Tensor out = *this;
  out.shape[d] = length;
  out.data = static_cast<char*>(data) + begin * stride[d];
  return out;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> new_shape) const {
  FL_ASSERT(is_contiguous());
  Tensor out = make_tensor(data, dtype, new_shape, device);
  if (out.numel() != numel()) fail("cannot reshape {} to {} elements", describe(), out.numel());
  if (dtype_traits(dtype).quantized && out.cols() != cols())
    fail("cannot reshape {}: a packed row must stay whole", describe());
  return out;
}

std::string Tensor::describe() const {
  std::string dims;
  for (int i = 0; i < ndim; ++i) dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return fmt::format("{}[{}]", dtype_name(dtype), dims);
}

Tensor make_tensor(void* data, DType dtype, const int64_t* shape, int ndim, Device device) {
  FL_ASSERT(ndim >= 0 && ndim <= kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) fail("negative dimension {} in a tensor shape", shape[i]);
    t.shape[i] = shape[i];
  }
  if (ndim == 0) return t;
  const DTypeTraits& traits = dtype_traits(dtype);
  int64_t step;
  if (traits.quantized) {
    t.stride[ndim - 1] = 0;
    step = row_bytes(dtype, shape[ndim - 1]);
  } else {
    t.stride[ndim - 1] = traits.block_bytes;
    step = traits.block_bytes * shape[ndim - 1];
  }
  for (int i = ndim - 2; i >= 0; --i) {
    t.stride[i] = step;
    step *= shape[i];
  }
  return t;
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return make_tensor(data, dtype, shape.begin(), static_cast<int>(shape.size()), device);
}

void HostBuffer::FreeDeleter::operator()(void* p) const { std::free(p); }

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) fail("out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  data_.reset(p);
}

HostTensor HostTensor::zeros(DType dtype, std::initializer_list<int64_t> shape) {
  HostTensor t;
  Tensor probe = make_tensor(nullptr, dtype, shape);
  t.buffer = HostBuffer(static_cast<size_t>(probe.nbytes()));
  t.view = make_tensor(t.buffer.data(), dtype, shape);
  return t;
}

}  // namespace fl
