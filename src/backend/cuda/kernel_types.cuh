#pragma once
// Small enums shared by the kernel launchers and cuda_backend.cpp.
namespace fl::cuda {

enum class Gain : int { none = 0, weight = 1, one_plus_weight = 2 };
enum class Act : int { gelu_tanh = 0, silu = 1 };

}  // namespace fl::cuda
