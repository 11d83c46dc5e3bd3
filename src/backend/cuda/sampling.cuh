#pragma once
// Sampling one token on the device (sampling.cu): the chain of backend/sampling.h, so that only
// the chosen id crosses to the host. No fmt or other heavy host headers: nvcc compiles this file.
#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "backend/sampling_math.h"

namespace fl::cuda {

struct SampleArgs {
  float* logits = nullptr;  // [V], adjusted and divided in place, as the reference does
  int64_t vocab = 0;
  int32_t* out = nullptr;   // [1]: the token, or -1 when every token is banned
  const SampleAdjust* adjust = nullptr;  // [n_adjust] device copy, ids unique
  int n_adjust = 0;
  SampleScalars p;
};
// Device scratch launch_sample needs for these arguments (greedy without adjustments runs over
// many blocks, which leave their partial results there); 0 for none.
int64_t sample_scratch_bytes(const SampleArgs& args);
cudaError_t launch_sample(const SampleArgs& args, void* scratch, cudaStream_t stream);
// One token per row, one block each: rows [n_rows] is a device copy of each row's arguments (the
// host checked every row's vocab as launch_sample does).
cudaError_t launch_sample_rows(const SampleArgs* rows, int64_t n_rows, cudaStream_t stream);

}  // namespace fl::cuda
