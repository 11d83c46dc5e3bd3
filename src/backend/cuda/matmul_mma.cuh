#pragma once
// The tensor-core GEMM behind launch_matvec for many inputs (prefill, batched decode, routed
// expert pairs) on HFQ4 weights (matmul_mma.cu). Internal to the matmul op family: callers go
// through launch_matvec / launch_moe_experts_mma, which decide when it applies.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/matmul.cuh"
#include "core/dtype.h"

namespace fl::cuda {

// Benches and tests that compare the GEMM's kernels: whether the Hopper (wgmma) kernel may take
// the products it would (default yes; it runs only on a 9.0 device in a build with sm_90a code).
// Process-wide; set it while no product is being launched.
void allow_hopper_gemm(bool allowed);
// Whether it would take them now (allowed, the build carries sm_90a code, the device is a 9.0 one).
bool hopper_gemm_active();
// Benches that compare K-split plans: false splits the Hopper kernel's plain products for about
// two blocks per SM, as before the one-wave plan (matmul_mma.cu, plan_k_splits), which puts them
// into two waves. Default true. Process-wide; set it while no product is being launched.
void allow_one_wave_k_splits(bool allowed);
// How many grouped (expert) products this process has launched on the Hopper kernel
// (MmaGroupedRows::hopper); for tests that check the path ran.
int64_t hopper_expert_gemm_launches();
// How many products of several matrices (segments, matmul_mma_takes_segments) it has launched.
int64_t segment_gemm_launches();

// Whether this build has the mma.sync GEMM (CUDA, sm_80 and later; not HIP) and it takes `type`.
bool matmul_mma_supports(DType type);

// The rows of a grouped (mixture-of-experts) GEMM: each work item is up to tile_rows (16 or 64)
// routed pairs of one expert, listed in `pair_ids` from `first`; pair p reads input row
// p / x_row_div and writes output row p. Built on the device by launch_moe_sort_pairs, so routing
// never visits the host.
struct MmaWorkItem {
  int32_t expert;
  int32_t first;  // into pair_ids
  int32_t count;  // 1 .. tile_rows
  int32_t pad;
};

struct MmaGroupedRows {
  const MmaWorkItem* items = nullptr;
  const int32_t* n_items = nullptr;  // device: how many items are real (the grid is an upper bound)
  const int32_t* pair_ids = nullptr;
  int64_t max_items = 0;
  int tile_rows = 64;  // inputs per block: 16 when the experts get few pairs each (batched decode)
  // The 64-pair items on the Hopper (wgmma) kernel where it is active, one piece only
  // (BackendOptions::hopper_expert_gemm): the split kernel then gathers each item's pairs into a
  // tile of its own, in the layout one bulk copy per stage brings in. Same bits as the pipelined
  // kernel that takes them otherwise. Needs mma_grouped_scratch_bytes(..., true).
  bool hopper = false;
};

// out[i, m] = sum_k x[i, k] * W[m, k] for i < n_inputs (a.expert_ids must be null), or with
// `grouped`, the routed pairs of each work item times its expert's matrix. a.scratch must hold
// mma_scratch_bytes(x rows, K, parts) bytes, x rows being n_inputs / x_row_div rounded up
// (grouped: mma_grouped_scratch_bytes).
size_t mma_scratch_bytes(int64_t x_rows, int64_t K, int parts);
// A grouped product's scratch: the split x rows, or where `hopper` (MmaGroupedRows::hopper) will
// take the items (one piece, HFQ4, 64-pair items, the Hopper kernel active) room for every
// possible item's tile (max_work_items x 64 rows) if that is more.
size_t mma_grouped_scratch_bytes(int64_t x_rows, int64_t n_pairs, int64_t n_experts, int64_t K, DType type,
                                 int parts, bool hopper);
// What a plain (ungrouped) product needs: the split inputs, plus the partial outputs when few
// row tiles make it split K across blocks.
size_t matmul_mma_scratch_bytes(const MatvecArgs& a, int parts);
cudaError_t launch_matmul_mma(const MatvecArgs& a, int parts, cudaStream_t stream,
                              const MmaGroupedRows* grouped = nullptr);
// Whether launch_matmul_mma takes a plain product of several matrices of one input in one launch
// (a.segments: q/k/v or gate/up at many inputs; each segment's output [n_inputs, M_s] contiguous;
// a.M unused): the inputs split once, the segments' row tiles and K splits in one grid, one
// K-split sum. Hopper's wgmma kernel only (one piece, HFQ4, a 9.0 GPU); otherwise the caller runs
// the products one by one. matmul_mma_scratch_bytes covers it.
bool matmul_mma_takes_segments(const MatvecArgs& a, int parts);

// Sorts the routed pairs (ids [n_pairs], expert ids < n_experts) by expert into pair_ids and cuts
// them into work items of at most 16 or 64 pairs (items: max_work_items(n_pairs, n_experts) of them,
// pair_ids: n_pairs, n_items: one int32, all device memory), and fills `out` to use them.
int64_t max_work_items(int64_t n_pairs, int64_t n_experts);
// The pairs per work item for these counts: 16 when the experts get few each (batched decode), else 64.
int grouped_tile_rows(int64_t n_pairs, int64_t n_experts);
cudaError_t launch_moe_sort_pairs(MmaGroupedRows& out, MmaWorkItem* items, int32_t* n_items, int32_t* pair_ids,
                                  const int32_t* ids, int64_t n_pairs, int64_t n_experts, cudaStream_t stream);

}  // namespace fl::cuda
