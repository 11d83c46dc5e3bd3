#pragma once
// The SIMD kernels of cpu_matmul (see cpu_matmul.h): AVX2 (FIRELINE_CPU_AVX2) and AVX-512
// (FIRELINE_CPU_AVX512), each built in a translation unit of its own with its target flags and
// called only after a CPU check. This header is included by those units: it must stay free of
// inline functions and templates shared with other translation units, or the linker could pick
// an AVX2- or AVX-512-compiled copy of them for code that runs on CPUs without them.
#include <cstdint>

namespace fl::simd {

// What a kernel needs, already validated by cpu_matmul.cpp. Strides are in bytes.
struct MatmulArgs {
  int w_type;  // static_cast<int>(DType)
  const uint8_t* w;
  int64_t w_stride;
  int64_t K;
  const float* x;
  int64_t x_stride;
  int64_t T;
  float* out;
  int64_t out_stride;
};

}  // namespace fl::simd

// Each path has the same four functions: whether it has a kernel for a weight type (every
// registry format today); the floats of x its factored kernel prepares, and preparing them (once
// per matmul, before the rows, into a 64-byte aligned buffer; each path lays x out its own way,
// so prepare with the path's own functions); and out[t, m] for all t and m in [m_begin, m_end).
namespace fl::avx2 {

bool supports(int w_type);
int64_t prepared_floats(const simd::MatmulArgs& args);
void prepare_x(const simd::MatmulArgs& args, float* prepared);
void matmul_rows(const simd::MatmulArgs& args, const float* prepared, int64_t m_begin, int64_t m_end);

}  // namespace fl::avx2

// The same kernel at 16 lanes.
namespace fl::avx512 {

bool supports(int w_type);
int64_t prepared_floats(const simd::MatmulArgs& args);
void prepare_x(const simd::MatmulArgs& args, float* prepared);
void matmul_rows(const simd::MatmulArgs& args, const float* prepared, int64_t m_begin, int64_t m_end);

}  // namespace fl::avx512
