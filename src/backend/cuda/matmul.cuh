#pragma once
// Matrix-vector products on packed weights, plain and per-expert (matmul.cu).
// Launchers take raw device pointers, sizes, element strides and a stream, and return the
// launch's cudaError_t; cuda_backend.cpp checks it and names the op. No fmt or other heavy host
// headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/expert_rows_plan.h"
#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernel_types.cuh"
#include "core/dtype.h"

namespace fl::cuda {

// out[i, m] = sum_k x[xrow(i), k] * W_i[m, k] for i < n_inputs, m < M, where W_i is `weight`, or,
// when expert_ids is given, the expert matrix weight + expert_ids[i] * expert_bytes, and
// xrow(i) = i / x_row_div (x_row_div = 1 for plain matmul).
// One weight of a grouped product (launch_matvec_group): its own output, matrix and rows.
struct MatvecSegment {
  float* out = nullptr;
  const uint8_t* weight = nullptr;
  int64_t M = 0, row_bytes = 0;
  int64_t first_block = 0;  // set by the launcher
};
constexpr int kMaxMatvecSegments = 4;

// How many bf16 pieces each f32 activation is split into before the bf16 tensor-core products
// (the weights' 4-bit codes are exact in bf16, and each group's scale and min are applied in
// f32 afterwards, so the activations are the only rounding):
//   3: hi + mid + lo carry all 24 bits of an f32 significand: the product is the f32 dot product
//      up to summation order (what the op harness's 1e-5 budget and the golden tests need);
//   2: ~16 bits (relative error ~1e-5 per input), 2/3 of the tensor work of 3;
//   1: plain bf16 inputs (~3e-3 relative per input), as most engines run prefill.
constexpr int kMmaExactParts = 3;

struct MatvecArgs {
  float* out = nullptr;
  int64_t out_stride = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  const uint8_t* weight = nullptr;
  DType weight_type = DType::f32;
  int64_t M = 0, K = 0;
  int64_t row_bytes = 0;
  int64_t n_inputs = 0;
  const int32_t* expert_ids = nullptr;
  int64_t expert_bytes = 0;
  int64_t x_row_div = 1;
  // Several inputs on HFQ4 weights go through the tensor-core GEMM (matmul_mma.cu), which splits
  // each f32 input into this many bf16 pieces: kMmaExactParts is exact, 1 and 2 trade precision
  // for tensor work.
  int act_pieces = kMmaExactParts;
  // Device scratch for the GEMM (the inputs cut into bf16 pieces once, not once per row tile):
  // at least matvec_scratch_bytes(*this) bytes; unused by the matvec kernels.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // Grouped: with n_segments > 0 the out/weight/M/row_bytes above are ignored and each segment
  // is multiplied by the inputs, all in one launch: the one input row on the matvec kernels
  // (launch_matvec_group), or many inputs on the GEMM (launch_matmul_mma, where
  // matmul_mma_takes_segments; each segment's output [n_inputs, M] contiguous). No experts.
  int n_segments = 0;
  MatvecSegment segments[kMaxMatvecSegments];
  // Gated (a gated MLP's input half in one launch): out[i, m] = act(gate_i[m] . x) * (up_i[m] . x)
  // for m < M, where gate_i is the matrix above (rows 0 .. M - 1) and up_i is up_weight, or with
  // up_weight null the same matrix's rows M .. 2M - 1 (an expert stack's fused gate_up [E, 2M, K]).
  // Each dot is the one the register kernel's plain product computes (the same per-row order, the
  // same bits; the split kernel, split_rows, adds in an order of its own), and
  // act(gate) * up is gated_activation's. See matvec_gated_supported.
  bool gated = false;
  Act act = Act::gelu_tanh;
  const uint8_t* up_weight = nullptr;
  // The matvec kernels may pull a one-wave grid's rows into L2 before waiting for the previous
  // kernel (BackendOptions::weight_prefetch); false: never.
  bool weight_prefetch = true;
  // One input per matrix on HFQ4 rows of 8+ blocks (plain, grouped, gated, expert pairs), sm_90:
  // the bulk-copy kernel (BackendOptions::async_matvec) with 2 or 4 rows per warp, or -1
  // for launch_matvec's choice of the two; 0: the register kernel.
  int async_rows = 0;
  // One input, plain rows (no segments, gate or experts) of 32+ blocks, where 4-row warps make at
  // most about one wave and 8-row blocks give every SM two or more: pairs of warps split each
  // row's warp steps (even, odd) and add their two sums lane by lane (BackendOptions::
  // split_matvec; an order of additions of its own). 1: there; 0: the register kernel; 2: every
  // plain one-input HFQ4 product with rows of 32+ blocks,
  // whatever its grid (matmul_bench's "S" lines, to time the kernel on many-wave products).
  int split_rows = 0;
  // One input, HFQ4 rows (one matrix or a group; no gate or experts), scratch of
  // hfq4_imma_scratch_bytes: the integer tensor-core matvec
  // (matvec_imma.cu, BackendOptions::imma_matvec; sm_80 and later; its own numbers, not the
  // register kernel's bits). Without the scratch the other kernels run. 0: off; -1: on, the
  // launcher's choice of warps per row tile; 1, 2, 4 or 8: that many (matmul_bench).
  int imma_rows = 0;
  // The integer matvec's scratch already holds x's pieces, cut by the kernel that wrote x
  // (imma_pieces.cuh; BackendOptions::imma_ready_pieces): its own pieces launch is left out.
  bool imma_pieces_ready = false;
  // The integer matvec's warps also pull into L2 the codes of the group this many of their
  // iterations past the one they load into registers (BackendOptions::imma_l2_ahead); 0: none.
  int imma_l2_ahead = 0;
  // Plain products and groups (no experts) on the integer matvec's lean form: pieces loaded in
  // the iteration that uses them, three blocks per SM, tiles split until ~20 warps per SM
  // (BackendOptions::imma_lean; the register form's bits at the same warps per tile).
  bool imma_lean = false;
  // Warps per SM below which the integer matvec's launcher splits row tiles over more warps
  // (BackendOptions::imma_warps_per_sm); 0: the form's own (10 register, 20 lean).
  int imma_warps_per_sm = 0;
  // Routed expert pairs on the HFQ4 register kernel (expert_ids, not gated): rows per warp and
  // warp steps of loads in flight per lane (BackendOptions::expert_matvec.rows / .steps); rows 0:
  // the launcher's choice, as for any one-input product; -1: auto_expert_rows_shape's. A shape
  // not built is ignored. Same bits whatever the shape (a row's sum is its lanes' blocks in
  // order, then warp_sum).
  int expert_rows = 0, expert_steps = 0;
  // Launches that take a shape of their own (above): the rows kernel's loads as a ring
  // (BackendOptions::expert_matvec_ring; the same bits). Launches left plain ignore it.
  bool expert_ring = false;
};
// With n_inputs >= kMmaMinInputs (and no expert ids) on a format the tensor-core GEMM takes, the
// product runs there; otherwise on the matvec kernels.
constexpr int64_t kMmaMinInputs = 16;
cudaError_t launch_matvec(const MatvecArgs& args, cudaStream_t stream);
// The scratch launch_matvec needs for these arguments (0 when the matvec kernels run).
size_t matvec_scratch_bytes(const MatvecArgs& args);
// The bytes of weights a one-input product reads: its matrix's, or its group's segments'.
int64_t matvec_weight_bytes(const MatvecArgs& args);
// Several weights of one format and width K times one input row x [K], one launch: Gemma's
// q/k/v and gate/up projections at batch 1, where each alone is too small to fill the GPU.
cudaError_t launch_matvec_group(const MatvecArgs& args, cudaStream_t stream);
// Whether launch_matvec takes these arguments with `gated` set: HFQ4 weights, one input per
// matrix (one input row, or routed expert pairs), no segments. Otherwise the caller runs the two
// products and gated_activation.
bool matvec_gated_supported(const MatvecArgs& args);
// Routed experts' down products summed per token in the launch (moe_experts' per-pair path): out
// [T, M] with out[t] = the sum over token t's top_k pairs (a.n_inputs = T * top_k, ids in
// a.expert_ids, weights pair_weights [T * top_k]) of weight * (that pair's expert rows . its input
// row), in ascending expert id: the bits of launch_matvec's per-pair outputs followed by
// launch_moe_combine. HFQ4 expert stacks, top_k <= 8, x_row_div 1; cudaErrorInvalidValue for
// anything else. Its launches in this process, for tests.
bool hfq4_pairs_sum_takes(const MatvecArgs& a, int64_t top_k);
cudaError_t launch_hfq4_pairs_sum(const MatvecArgs& a, const float* pair_weights, int top_k, cudaStream_t stream);
int64_t hfq4_pairs_sum_launches();
// Launches of the asynchronous-copy matvec in this process (MatvecArgs::async_rows), for tests
// that check it ran.
int64_t async_matvec_launches();
// Whether the asynchronous-copy matvec can run on the current GPU (a 9.0 device, a build with
// sm_90a code): elsewhere MatvecArgs::async_rows is ignored and the register kernel runs.
bool async_matvec_available();
// Launches of the split-steps matvec in this process (MatvecArgs::split_rows), for tests.
int64_t split_matvec_launches();
// Launches of routed expert pairs at a shape of their own (MatvecArgs::expert_rows), that shape
// (rows, steps), or 0, 0: every shape; for tests.
int64_t expert_rows_launches(int rows, int steps);
// 4-warp blocks of the rows kernel at that shape (its ring form or not) one SM of the current GPU
// holds: what MatvecArgs::expert_rows -1 counts with.
int expert_rows_blocks_per_sm(ExpertRowsShape shape, int group, bool ring);
// The integer tensor-core matvec (matvec_imma.cu): the scratch it needs for rows of K weights in
// groups of `group` (the input's int8 pieces and per-group factors), whether this GPU runs it
// (sm_80 and later, CUDA), the launch (HFQ4 rows of one matrix or a group, one input;
// cudaErrorInvalidValue for anything else or too little scratch), and its launches in this
// process, for tests.
size_t hfq4_imma_scratch_bytes(int64_t K, int group);
bool imma_matvec_available();
cudaError_t launch_hfq4_imma(const MatvecArgs& args, int group, cudaStream_t stream);
int64_t imma_matvec_launches();
// The pieces launches of its own (those not left out by MatvecArgs::imma_pieces_ready) and of
// launch_gated_activation_imma_pieces, for tests.
int64_t imma_pieces_launches();
int64_t imma_lean_launches();  // the lean form's (MatvecArgs::imma_lean)
// out = act(gate) * up over one row of K (gated_activation, the same bits), and its integer
// matvec pieces for `group`-weight groups at `pieces` (hfq4_imma_scratch_bytes(K, group)): a dense
// MLP's down projection input, cut in the launch that makes it. CUDA only (HIP:
// cudaErrorInvalidValue).
cudaError_t launch_gated_activation_imma_pieces(float* out, const float* gate, const float* up, int64_t K, Act act,
                                                int group, void* pieces, cudaStream_t stream);
// Decode's routed expert products on the integer matvec (BackendOptions::imma_experts):
// out[p, m] = x[p / x_row_div] . W_{expert_ids[p]}[m] for pair p < n_inputs (HFQ4 rows of the
// expert stack, expert_bytes apart; a negative id stores nothing). The scratch holds one row of
// pieces per distinct input (hfq4_imma_rows_scratch_bytes), cut here unless imma_pieces_ready
// (launch_gated_activation_imma_pieces_rows cut them). cudaErrorInvalidValue for anything else.
size_t hfq4_imma_rows_scratch_bytes(int64_t rows, int64_t K, int group);
cudaError_t launch_hfq4_imma_experts(const MatvecArgs& args, int group, cudaStream_t stream);
// launch_gated_activation_imma_pieces over `rows` rows: gate and up in_stride apart, out
// out_stride apart, each row's pieces in its place of a hfq4_imma_rows_scratch_bytes scratch
// (the routed experts' activations, the down products' inputs).
cudaError_t launch_gated_activation_imma_pieces_rows(float* out, int64_t out_stride, const float* gate,
                                                     const float* up, int64_t in_stride, int64_t rows, int64_t K,
                                                     Act act, int group, void* pieces, cudaStream_t stream);

}  // namespace fl::cuda
