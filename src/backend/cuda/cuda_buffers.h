#pragma once
// The CUDA backend's device memory and captured graphs (cuda_backend.cpp hands them out as
// DeviceBuffer and CapturedSteps), and the error check every host-side launch goes through.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gpu_runtime.h"

namespace fl::cuda {

// Turns a CUDA error into an fl::Error naming the op.
void check(cudaError_t err, const char* op);

// NOTE: every memory operation goes through the backend's stream. The stream is non-blocking,
// so a cudaMemset or cudaMemcpy on the legacy default stream is not ordered with its kernels: a
// zero-fill of a new KV cache could land after the first kv_write (seen as intermittent golden
// failures on the H200).
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(size_t bytes, cudaStream_t stream);  // zero-filled on `stream`
  ~CudaBuffer() override;
  void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_;
};

// A captured graph's kernels keep the addresses they were captured with, the backend's
// workspaces among them: the graph holds those buffers, so that a workspace that grows later
// (another sequence's longer prompt on the same backend) is not freed under the graph's replays.
// The backend moves on to the larger buffer; the graph keeps using its own.
class CudaGraph final : public CapturedSteps {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, std::vector<std::shared_ptr<CudaBuffer>> buffers,
            std::shared_ptr<uint64_t> ops)
      : exec_(exec), stream_(stream), buffers_(std::move(buffers)), ops_(std::move(ops)) {}
  ~CudaGraph() override;
  void replay() override;

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::vector<std::shared_ptr<CudaBuffer>> buffers_;
  std::shared_ptr<uint64_t> ops_;  // the backend's op count (CudaBackend::ops_)
};

}  // namespace fl::cuda
