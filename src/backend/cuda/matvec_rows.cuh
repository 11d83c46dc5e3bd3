#pragma once
// Where a block of a one-input matvec launch (the rows kernels in matmul.cu, the integer kernel in
// matvec_imma.cu) writes and reads: the plain product's one matrix, or a grouped launch's segment
// (q/k/v of one input in one launch). Device code: included by .cu files only.
#include <cstdint>

#include "backend/cuda/matmul.cuh"

namespace fl::cuda {

// Where a rows-kernel block writes and reads: a grouped launch's segment (few, so a linear
// search) and the block's index within it, or the plain product's one matrix.
struct RowsTarget {
  float* out;
  const uint8_t* matrix;
  int64_t M, row_bytes, block;
};
__device__ __forceinline__ RowsTarget rows_target(const MatvecArgs& a) {
  RowsTarget t{a.out, a.weight, a.M, a.row_bytes, static_cast<int64_t>(blockIdx.x)};
  if (a.n_segments > 0) {
    int s = 0;
    while (s + 1 < a.n_segments && t.block >= a.segments[s + 1].first_block) ++s;
    t = {a.segments[s].out, a.segments[s].weight, a.segments[s].M, a.segments[s].row_bytes,
         t.block - a.segments[s].first_block};
  }
  return t;
}

// Blocks of rows_per_block rows a rows launch needs; a grouped launch's segments get theirs one
// after another (first_block set here).
inline int64_t number_row_blocks(MatvecArgs& a, int64_t rows_per_block) {
  if (a.n_segments == 0) return (a.M + rows_per_block - 1) / rows_per_block;
  int64_t blocks = 0;
  for (int s = 0; s < a.n_segments; ++s) {
    a.segments[s].first_block = blocks;
    blocks += (a.segments[s].M + rows_per_block - 1) / rows_per_block;
  }
  return blocks;
}

#if defined(__CUDACC__) || defined(__HIPCC__)
// Pulls rows m_first .. m_first + n_rows - 1 of the target (clamped to its M) into L2, the
// block's threads taking the span's 128-byte lines in turn. Rows lie back to back, so a block's
// rows are one span. Called before enter_kernel(): weights are never written by a kernel.
__device__ __forceinline__ void prefetch_block_rows_l2(const RowsTarget& t, int64_t m_first, int64_t n_rows) {
  const int64_t rows = m_first + n_rows <= t.M ? n_rows : t.M - m_first;
  if (rows <= 0) return;
  const uint8_t* first = t.matrix + m_first * t.row_bytes;
  const int64_t lines = (rows * t.row_bytes + 127) / 128;
  for (int64_t i = threadIdx.x; i < lines; i += blockDim.x) prefetch_l2(first + i * 128);
}
#endif

}  // namespace fl::cuda
