#include "backend/cuda/experts_scratch.h"

#include <algorithm>

#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"

namespace fl::cuda {

ExpertsScratch plan_experts_scratch(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, DType gate_up, DType down,
                                    const BackendOptions& options, int act_pieces) {
  ExpertsScratch s;
  const int64_t pairs = T * K;
  // Many pairs per expert (prefill, batched decode): the pairs are sorted by expert on the
  // device and each expert's matrices are read once per 64 pairs by the tensor-core GEMM;
  // otherwise (decode) each pair runs the matvec kernel over its expert's rows.
  s.mma = matmul_mma_supports(gate_up) && matmul_mma_supports(down) && pairs >= kMmaMinInputs && pairs >= 2 * E;
  s.max_items = s.mma ? max_work_items(pairs, E) : 0;
  // Scratch: hidden, activated, expert outputs; with the GEMM also the work items (4 int32
  // each), their count and the sorted pair ids
  const size_t sort_floats = s.mma ? static_cast<size_t>(s.max_items * 4 + 1 + pairs) : 0;
  // and the GEMM's split inputs (x for gate_up, then the activations for down), 16-byte aligned
  s.split_bytes =
      s.mma ? std::max(mma_grouped_scratch_bytes(T, pairs, E, H, gate_up, act_pieces, options.hopper_expert_gemm),
                       mma_grouped_scratch_bytes(pairs, pairs, E, I, down, act_pieces, options.hopper_expert_gemm))
            : 0;
  s.head_floats = (static_cast<size_t>(pairs) * (3 * I + H) + sort_floats + 3) / 4 * 4;
  // The integer kernel: x's T rows of pieces for gate_up, then the pairs' activations' for down
  // (16-byte aligned, as their loads need: the head is a multiple of 4 floats, and rows of
  // pieces take multiples of 256 bytes). No pairs: the matvec path, which launches nothing.
  const int gate_up_group = hfq4_group_size(gate_up), down_group = hfq4_group_size(down);
  s.imma = !s.mma && options.imma_experts && gate_up_group > 0 && down_group > 0 && pairs > 0;
  if (s.imma) {
    s.imma_x_bytes = hfq4_imma_rows_scratch_bytes(T, H, gate_up_group);
    s.split_bytes = s.imma_x_bytes + hfq4_imma_rows_scratch_bytes(pairs, I, down_group);
  }
  return s;
}

}  // namespace fl::cuda
