#pragma once
// Entry points of the CUDA backend. This header has no CUDA includes, so code outside
// src/backend/cuda (the model, the CLI) can create the backend without seeing CUDA types.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace fl {

// Creates the backend on GPU `device_index`; throws fl::Error when there is no such device.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0, const BackendOptions& options = {});
// True when at least one CUDA device is usable (a driver and a GPU are present).
bool cuda_device_available();
// How many GPUs the runtime sees (0 without a driver).
int cuda_device_count();

// The GPU index and the stream (a cudaStream_t) of a backend made by make_cuda_backend; throws
// fl::Error for any other backend.
int cuda_device_index(Backend& backend);
void* cuda_stream_of(Backend& backend);
// How many times the backend forked its side stream for a concurrent branch (Backend::
// branch_begin): zero while branches run in order; for tests.
int64_t cuda_branch_forks(Backend& backend);
// How many times the backend's workspaces grew (a larger buffer replacing the old); for tests.
int64_t cuda_workspace_growths(Backend& backend);
// Whether a bf16 backend's prompt attention of n_tokens x head_dim runs attention_flash_bf16.cu's
// kernel on the backend's GPU (its shared memory: D = 512 needs Hopper's), for tests that check
// which kernel ran.
bool cuda_bf16_prompt_attention_applies(Backend& backend, int64_t n_tokens, int head_dim);
// Whether the GEMM's Hopper (wgmma) kernel may take the products it would take (default yes), for
// tests and benches that compare it with the mma.sync kernels; process-wide, set between launches.
// And whether it takes them now on the backend's GPU (allowed, the build has sm_90a code, a 9.0 GPU).
void cuda_allow_hopper_gemm(bool allowed);
bool cuda_hopper_gemm_active(Backend& backend);
// How many expert products this process has run on the Hopper kernel (BackendOptions::
// hopper_expert_gemm), for tests that check the path ran.
int64_t cuda_hopper_expert_gemm_launches();
// How many products of one input it has run as one GEMM launch (BackendOptions::group_gemm).
int64_t cuda_group_gemm_launches();
// How many one-input products it has run on the asynchronous-copy matvec (BackendOptions::
// async_matvec), and whether it runs on the backend's GPU (an sm_90 one, in a build with sm_90a code).
int64_t cuda_async_matvec_launches();
bool cuda_async_matvec_available(Backend& backend);
// How many one-input products it has run on the split-steps matvec (BackendOptions::split_matvec).
int64_t cuda_split_matvec_launches();
// Decode's routed expert pairs run at a shape of their own (BackendOptions::expert_matvec): at
// rows x steps, or (0, 0) at any.
int64_t cuda_expert_rows_launches(int rows, int steps);
// 4-warp blocks of the rows kernel at rows x steps (HFQ4, `group`-weight blocks; its ring form or
// not) one SM of the current GPU holds: what BackendOptions::expert_matvec's automatic choice
// counts with.
int cuda_expert_rows_blocks_per_sm(int rows, int steps, int group, bool ring);
// How many one-input products it has run on the integer tensor-core matvec (BackendOptions::
// imma_matvec), and whether the backend's GPU runs it (sm_80 and later).
int64_t cuda_imma_matvec_launches();
bool cuda_imma_matvec_available(Backend& backend);
// How many launches have cut an input into the integer matvec's pieces: the product's own (not
// left out by BackendOptions::imma_ready_pieces) and the gated activation's pieces form.
int64_t cuda_imma_pieces_launches();
// How many of the integer products ran in the lean form (BackendOptions::imma_lean).
int64_t cuda_imma_lean_launches();
// How many one-row residual updates have run as a cluster of blocks (BackendOptions::
// cluster_residual_update), and whether the backend's GPU runs them (sm_90, a build with sm_90a code).
int64_t cuda_cluster_update_launches();
// How many launches have carried an L2 prefetch hint of the next product's weights (BackendOptions::
// attention_prefetch_mb, update_prefetch_mb).
int64_t cuda_l2_prefetch_launches();
// How many times routed experts have run as one launch (BackendOptions::fused_experts).
int64_t cuda_moe_experts_decode_launches();
bool cuda_cluster_update_available(Backend& backend);
// How many decode steps of a Gated DeltaNet mixer have run as one launch (BackendOptions::
// fused_delta_net), and whether the backend's GPU runs that launch (sm_90, a build with sm_90a code).
int64_t cuda_delta_net_step_launches();
bool cuda_delta_net_step_available(Backend& backend);
// How many decode attention steps have run from their projections in one launch (BackendOptions::
// fused_decode_attention).
int64_t cuda_attention_from_projections_launches();
// How many decode attention launches by KV head have run on the tensor cores (BackendOptions::
// decode_attention_mma).
int64_t cuda_decode_attention_mma_launches();
// How many routed experts' down products have run summed per token in their launch
// (BackendOptions::experts_down_sum).
int64_t cuda_experts_down_sum_launches();
// A write on the backend's stream that is not one of its ops (NCCL's in-place all-reduce): the
// integer matvec's input pieces cut before it serve no product after it.
void cuda_note_foreign_write(Backend& backend);
// Bytes of workspace the backend's moe_experts asks for T tokens routed to k of E experts
// (hidden H, intermediate I, expert weights of `type`), for tests that hold the models' memory
// plans against it.
size_t cuda_moe_experts_workspace_bytes(Backend& backend, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I,
                                        DType type);
// Bytes of shared memory one block may opt in to on the backend's GPU (sm_80: 163 KiB, sm_90:
// 227 KiB).
int cuda_max_block_shared_memory(Backend& backend);
// The backend's GPU's streaming multiprocessors (for tests of launch plans sized by waves).
int cuda_sm_count(Backend& backend);

// Communicators over NCCL for ranks that are threads of this process, one per GPU: backends[r]
// is rank r's (a make_cuda_backend backend, each on its own GPU), and its all-reduce runs on that
// backend's stream, called from the rank's thread (model/tensor_parallel.h). NCCL is loaded with
// dlopen here: a missing library is an fl::Error naming it.
struct NcclOptions {
  std::string library;       // empty: libnccl.so.2 (librccl.so.1 in HIP builds)
  bool disable_nvls = true;  // NCCL_NVLS_ENABLE=0: no NVLink multicast (issue 10)
};
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<Backend* const> backends,
                                                                   const NcclOptions& options = {});

}  // namespace fl
