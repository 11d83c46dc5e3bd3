#pragma once
// Entry points of the CUDA backend. This header has no CUDA includes, so code outside
// src/backend/cuda (the model, the CLI) can create the backend without seeing CUDA types.
#include <memory>

#include "backend/backend.h"

namespace fl {

// Creates the backend on GPU `device_index`; throws fl::Error when there is no such device.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);
// True when at least one CUDA device is usable (a driver and a GPU are present).
bool cuda_device_available();

}  // namespace fl
