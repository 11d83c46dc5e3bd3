#pragma once
// Tensor views: a typed pointer with a shape and byte strides, outermost dimension first
// (PyTorch order: a weight [out, in] has shape {out, in}). A view owns nothing; storage belongs
// to a mapped file, a HostBuffer or a backend arena, which must outlive every view of it.
//
// Strides are in bytes. For quantized dtypes the innermost dimension is packed in blocks and is
// not addressable element by element: its stride is 0 and a row (all of the innermost dim) is
// row_bytes(dtype, cols) long. Views of whole rows (row_slice, select) work for every dtype.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace fl {

enum class Device : uint8_t { cpu, cuda };
constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // bytes

  int64_t dim(int i) const {  // i < 0 counts from the end
    int index = i < 0 ? ndim + i : i;
    FL_ASSERT(index >= 0 && index < ndim);
    return shape[index];
  }
  int64_t numel() const;
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }  // innermost extent
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }  // everything else
  int64_t row_bytes() const { return fl::row_bytes(dtype, cols()); }
  bool is_contiguous() const;
  int64_t nbytes() const;  // contiguous tensors only

  // Rows [begin, end) of the outermost dimension; the result keeps ndim.
  Tensor slice(int64_t begin, int64_t end) const;
  // Element `index` of the outermost dimension; the result has ndim - 1 dims.
  Tensor select(int64_t index) const;
  // Elements [begin, begin + length) of dimension `dim` (not the packed innermost dim of a
  // quantized type); the result is usually not contiguous, e.g. one layer's slice of a
  // [tokens, layers * width] activation.
  Tensor narrow(int dim, int64_t begin, int64_t length) const;
  // Same data, new shape (contiguous tensors only; innermost extent must be kept for quantized types).
  Tensor reshape(std::initializer_list<int64_t> new_shape) const;

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  // "bf16[4096, 2816]"
};

// A contiguous view over `data`.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu);
Tensor make_tensor(void* data, DType dtype, const int64_t* shape, int ndim, Device device = Device::cpu);

// Host memory aligned to 64 bytes (one cache line, and the widest SIMD load), zero-filled.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  void* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> data_;
  size_t size_ = 0;
};

// A host tensor that owns its storage.
struct HostTensor {
  HostBuffer buffer;
  Tensor view;
  static HostTensor zeros(DType dtype, std::initializer_list<int64_t> shape);
  template <typename T>
  T* ptr() const {
    return view.ptr<T>();
  }
};

}  // namespace fl
