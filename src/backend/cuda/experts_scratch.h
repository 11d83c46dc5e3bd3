#pragma once
// moe_experts' plan on the CUDA backend (cuda_backend.cpp): for T tokens with K experts each (of
// E; hidden H, intermediate I), which path runs and the workspace it takes. The memory plans ask
// the same function (moe_experts_workspace_bytes), so that a model's workspace covers its step.
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "core/dtype.h"

namespace fl::cuda {

struct ExpertsScratch {
  bool mma = false;         // the tensor-core GEMM (else each pair's matvec)
  bool imma = false;        // the matvec path on the integer kernel (BackendOptions::imma_experts)
  int64_t max_items = 0;    // the GEMM's work items
  size_t head_floats = 0;   // hidden [pairs, 2I], activated [pairs, I], outputs [pairs, H], the sort
  size_t split_bytes = 0;   // the GEMM's split inputs, or the integer kernel's pieces (x's, then the activations')
  size_t imma_x_bytes = 0;  // the integer kernel's: x's pieces, where the activations' begin
  // The workspace in floats: the head, then the split inputs from a float boundary.
  size_t floats() const { return head_floats + (split_bytes + 3) / 4; }
};

// act_pieces: bf16 pieces per activation in the tensor-core products (the backend's precision).
ExpertsScratch plan_experts_scratch(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, DType gate_up, DType down,
                                    const BackendOptions& options, int act_pieces);

}  // namespace fl::cuda
