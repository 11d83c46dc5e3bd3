// What tests, benches and the CLI ask of the GPU backend that needs no CudaBackend object
// (cuda_backend.h): the device count, kernel launch counters, which kernel families the current
// GPU and build run.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/linear_attention.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/norm.cuh"

namespace fl {

bool cuda_device_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  return count;
}

int64_t cuda_hopper_expert_gemm_launches() { return cuda::hopper_expert_gemm_launches(); }
int64_t cuda_group_gemm_launches() { return cuda::segment_gemm_launches(); }
int64_t cuda_async_matvec_launches() { return cuda::async_matvec_launches(); }
int64_t cuda_split_matvec_launches() { return cuda::split_matvec_launches(); }
int64_t cuda_expert_rows_launches(int rows, int steps) { return cuda::expert_rows_launches(rows, steps); }
int cuda_expert_rows_blocks_per_sm(int rows, int steps, int group, bool ring) {
  return cuda::expert_rows_blocks_per_sm(cuda::ExpertRowsShape{rows, steps}, group, ring);
}
int64_t cuda_imma_matvec_launches() { return cuda::imma_matvec_launches(); }
int64_t cuda_imma_pieces_launches() { return cuda::imma_pieces_launches(); }
int64_t cuda_imma_lean_launches() { return cuda::imma_lean_launches(); }
int64_t cuda_cluster_update_launches() { return cuda::residual_update_cluster_launches(); }
int64_t cuda_l2_prefetch_launches() { return cuda::l2_prefetch_launches(); }
int64_t cuda_moe_experts_decode_launches() { return cuda::moe_experts_decode_launches(); }
int64_t cuda_delta_net_step_launches() { return cuda::delta_net_step_launches(); }
int64_t cuda_attention_from_projections_launches() { return cuda::decode_from_projections_launches(); }
int64_t cuda_decode_attention_mma_launches() { return cuda::decode_by_kv_head_mma_launches(); }
int64_t cuda_experts_down_sum_launches() { return cuda::hfq4_pairs_sum_launches(); }

// A kernel family's availability on the backend's GPU (the answer depends on the current device).
static bool available_on(Backend& backend, bool (*available)()) {
  backend.bind_to_this_thread();
  return available();
}
bool cuda_cluster_update_available(Backend& b) { return available_on(b, cuda::residual_update_cluster_available); }
bool cuda_delta_net_step_available(Backend& b) { return available_on(b, cuda::delta_net_step_available); }
bool cuda_imma_matvec_available(Backend& b) { return available_on(b, cuda::imma_matvec_available); }
bool cuda_async_matvec_available(Backend& b) { return available_on(b, cuda::async_matvec_available); }

void cuda_allow_hopper_gemm(bool allowed) { cuda::allow_hopper_gemm(allowed); }

bool cuda_hopper_gemm_active(Backend& backend) {
  backend.bind_to_this_thread();  // the answer depends on the current device
  return cuda::hopper_gemm_active();
}

bool cuda_bf16_prompt_attention_applies(Backend& backend, int64_t n_tokens, int head_dim) {
  backend.bind_to_this_thread();  // flash_bf16_applies asks the current device
  cuda::AttentionArgs a;
  a.pieces = 1;
  a.n_tokens = static_cast<int>(n_tokens);
  a.head_dim = head_dim;
  return cuda::flash_bf16_applies(a);
}

}  // namespace fl
