#pragma once
// The AVX2 kernels of cpu_matmul (see cpu_matmul.h); built only when FIRELINE_CPU_AVX2 is defined. This header is included by the AVX2
// translation unit, which is compiled with -mavx2 -mfma -mf16c: it must stay free of inline
// functions and templates shared with other translation units, or the linker could pick an
// AVX2-compiled copy of them for code that runs on CPUs without AVX2.
#include <cstdint>

namespace fl::avx2 {

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

// Whether the kernels handle this weight type (every registry format does).
bool supports(int w_type);
// Floats of x prepared for the factored kernels (HFQ4, Q8_0; 0 for the other formats), and
// filling them: call once per matmul, before the rows, with a 32-byte aligned buffer.
int64_t prepared_floats(const MatmulArgs& args);
void prepare_x(const MatmulArgs& args, float* prepared);
// Computes out[t, m] for all t and m in [m_begin, m_end); `prepared` as filled by prepare_x.
void matmul_rows(const MatmulArgs& args, const float* prepared, int64_t m_begin, int64_t m_end);

}  // namespace fl::avx2
