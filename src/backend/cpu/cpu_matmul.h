#pragma once
// CPU matmul on packed weight rows: out[t, m] = sum_k x[t, k] * W[m, k], for every weight
// format in the registry (src/quant), GEMV (T = 1) and small-batch GEMM alike.
//
// Four implementations of the same contract:
// - reference: the oracle -- dequantize the whole row with the registry's dequantize_row, then
//   a sequential f32 dot per token. Slow and obvious; the others are tested against it.
// - scalar:    one group at a time through the registry decoder, accumulating in index order;
//   equal to the reference bit for bit. Always available.
// - avx2:      the factored kernel (cpu_matmul_factored.h: codes converted straight into four
//   FMA chains per token, scale and min applied per block) for every format, 8 lanes: a
//   different summation order, so within 1e-5 of the reference relative to sum |w x|, not
//   bit-equal. Compiled when the compiler can target AVX2 and used only when the CPU has AVX2,
//   FMA, F16C.
// - avx512:    the factored kernel at 16 lanes, when the CPU also has AVX-512 F, BW and VL; the
//   same tolerance, its own summation order.
// Each path computes a token's outputs the same way whatever other tokens share the call and
// whatever the thread count. No path reads a weight byte outside the row's blocks nor x past K;
// the factored kernel multiplies the codes of a last block's padding against zeros in its
// prepared x (a plain row's partial last step is copied into a zero-padded buffer).
#include <cstdint>

#include "core/dtype.h"

namespace fl {

class ThreadPool;

struct MatmulOperands {
  DType w_type = DType::f32;
  const void* w = nullptr;
  int64_t w_stride = 0;  // bytes between weight rows (>= row_bytes(w_type, K))
  int64_t M = 0;         // weight rows = output columns
  int64_t K = 0;         // reduction length
  const float* x = nullptr;
  int64_t x_stride = 0;  // bytes between token rows of x (>= 4 K)
  int64_t T = 0;         // tokens
  float* out = nullptr;
  int64_t out_stride = 0;  // bytes between token rows of out (>= 4 M)
};

enum class MatmulPath { reference, scalar, avx2, avx512 };

bool matmul_path_available(MatmulPath path);
MatmulPath best_matmul_path();  // avx512, else avx2 where available, else scalar
const char* matmul_path_name(MatmulPath path);

// Splits the M weight rows over the thread pool (each output element is computed by one thread
// in a fixed order, so the result does not depend on the thread count). Throws fl::Error for
// impossible operands (K <= 0, negative sizes, null pointers, strides shorter than a row, a dtype
// without a codec) or an unavailable path.
void matmul_rows(const MatmulOperands& op, MatmulPath path, ThreadPool& pool);
void matmul_rows(const MatmulOperands& op);  // best path, global pool

}  // namespace fl
