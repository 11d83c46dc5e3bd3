// The CUDA backend's buffers and graphs (cuda_buffers.h).
#include "backend/cuda/cuda_buffers.h"

#include "core/error.h"

namespace fl::cuda {

void check(cudaError_t err, const char* op) {
  if (err != cudaSuccess)
    fail("{} {} failed: {} ({})", gpu::kRuntimeName, op, cudaGetErrorString(err), cudaGetErrorName(err));
}

CudaBuffer::CudaBuffer(size_t bytes, cudaStream_t stream) : size_(bytes) {
  cudaError_t err = cudaMalloc(&data_, bytes == 0 ? 256 : bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail("out of GPU memory allocating {:.1f} MiB ({:.1f} MiB free of {:.1f} MiB)", bytes / 1048576.0,
         free_bytes / 1048576.0, total / 1048576.0);
  }
  check(cudaMemsetAsync(data_, 0, bytes == 0 ? 256 : bytes, stream), "memset");
}

CudaBuffer::~CudaBuffer() { cudaFree(data_); }

CudaGraph::~CudaGraph() { cudaGraphExecDestroy(exec_); }

void CudaGraph::replay() {
  ++*ops_;  // (its kernels rewrite the workspace: no eager op's pieces survive a replay)
  check(cudaGraphLaunch(exec_, stream_), "graph replay");
}

}  // namespace fl::cuda
