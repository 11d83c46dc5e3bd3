#pragma once
// The fused Gated DeltaNet decode step's launch arguments (cuda::launch_delta_net_step) from the
// tensors of Backend::gated_delta_net_rows, every shape checked here: the kernel trusts them.
// Host code (fmt); CudaBackend::gated_delta_net_rows uploads the state tables and launches.
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/linear_attention.cuh"

namespace fl::cuda {

struct DeltaNetStepLaunch {
  DeltaNetStepArgs args;            // one row: its states set; several: the tables left to fill
  std::vector<const void*> states;  // every row's conv state, then every row's delta state
  double bytes = 0;                 // what the step moves (OpTimer)
};
DeltaNetStepLaunch delta_net_step_launch(const Tensor& out, const Tensor& qkv, const Tensor& z, const Tensor& a,
                                         const Tensor& b, std::span<const Tensor> conv_states,
                                         std::span<const Tensor> delta_states, const DeltaNetStep& step);

}  // namespace fl::cuda
