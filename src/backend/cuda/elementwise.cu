// Element-wise and row-wise kernels: embedding gather, add, scale, soft-cap, gated activations,
// RoPE, argmax. Each is memory-bound and trivially parallel; rows may have strides wider than
// the row (narrow() views), so kernels index [row * stride + col].
#include <cfloat>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/elementwise.cuh"

namespace fl::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

__global__ void embed_kernel(float* out, int64_t out_stride, const uint8_t* table, DType table_type, int64_t row_bytes,
                             int64_t vocab, const int32_t* ids, int64_t cols, float scale, int32_t* error_flag) {
  enter_kernel();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* dst = out + t * out_stride;
  if (id < 0 || id >= vocab) {  // reported to the host; the row is filled with NaN so nothing silently passes
    if (threadIdx.x == 0 && error_flag) atomicExch(error_flag, 1);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* row = table + static_cast<int64_t>(id) * row_bytes;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = load_weight(row, i, table_type) * scale;
}

__global__ void add_kernel(float* out, int64_t os, const float* a, int64_t as, const float* b, int64_t bs, int64_t rows,
                           int64_t cols) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[r * os + c] = a[r * as + c] + b[r * bs + c];
  }
}

__global__ void scale_kernel(float* x, int64_t stride, int64_t rows, int64_t cols, float s, const uint8_t* scalar,
                             DType scalar_type) {
  enter_kernel();
  const float factor = scalar ? load_weight(scalar, 0, scalar_type) : s;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    x[r * stride + c] *= factor;
  }
}

__global__ void softcap_kernel(float* x, int64_t stride, int64_t rows, int64_t cols, float cap) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    x[r * stride + c] = tanhf(x[r * stride + c] / cap) * cap;
  }
}

__global__ void gated_activation_kernel(float* out, int64_t os, const float* gate, int64_t gs, const float* up,
                                        int64_t us, int64_t rows, int64_t cols, Act act) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[r * os + c] = gated_value(gate[r * gs + c], up[r * us + c], act);
  }
}

// One block per (token, head); thread i rotates the pair (i, i + half).
__global__ void rope_kernel(float* x, int64_t heads, int64_t head_dim, const int32_t* positions, const float* inv_freq,
                            int64_t half) {
  enter_kernel();
  const int64_t t = blockIdx.x / heads;
  float* v = x + blockIdx.x * head_dim;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(inv_freq[i] * pos, &s, &c);  // f32 angle, as transformers computes it
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

__global__ void argmax_kernel(int32_t* out, const float* x, int64_t stride, int64_t cols) {
  enter_kernel();
  const float* row = x + blockIdx.x * stride;
  float best = -FLT_MAX;
  int64_t best_i = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    if (row[i] > best) best = row[i], best_i = i;  // strided scan: first hit is the lowest index
  __shared__ float s_val[kThreads];
  __shared__ int64_t s_idx[kThreads];
  s_val[threadIdx.x] = best;
  s_idx[threadIdx.x] = best_i;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) {
      const float ov = s_val[threadIdx.x + step];
      const int64_t oi = s_idx[threadIdx.x + step];
      if (ov > s_val[threadIdx.x] || (ov == s_val[threadIdx.x] && oi < s_idx[threadIdx.x]))
        s_val[threadIdx.x] = ov, s_idx[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(s_idx[0]);
}

}  // namespace

cudaError_t launch_embed(float* out, int64_t out_stride, const void* table, DType table_type, int64_t table_row_bytes,
                         int64_t vocab, const int32_t* ids, int64_t n_tokens, int64_t cols, float scale,
                         int32_t* error_flag, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  return launch_kernel(embed_kernel, static_cast<unsigned>(n_tokens), kThreads, 0, stream, out, out_stride,
                       static_cast<const uint8_t*>(table), table_type, table_row_bytes, vocab, ids, cols, scale,
                       error_flag);
}

cudaError_t launch_add(float* out, int64_t out_stride, const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                       int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_kernel(add_kernel, blocks_for(rows * cols), kThreads, 0, stream, out, out_stride, a, a_stride, b,
                       b_stride, rows, cols);
}

cudaError_t launch_scale(float* x, int64_t stride, int64_t rows, int64_t cols, float s, const void* scalar,
                         DType scalar_type, cudaStream_t stream) {
  return launch_kernel(scale_kernel, blocks_for(rows * cols), kThreads, 0, stream, x, stride, rows, cols, s,
                       static_cast<const uint8_t*>(scalar), scalar_type);
}

cudaError_t launch_softcap(float* x, int64_t stride, int64_t rows, int64_t cols, float cap, cudaStream_t stream) {
  return launch_kernel(softcap_kernel, blocks_for(rows * cols), kThreads, 0, stream, x, stride, rows, cols, cap);
}

cudaError_t launch_gated_activation(float* out, int64_t out_stride, const float* gate, int64_t gate_stride,
                                    const float* up, int64_t up_stride, int64_t rows, int64_t cols, Act act,
                                    cudaStream_t stream) {
  return launch_kernel(gated_activation_kernel, blocks_for(rows * cols), kThreads, 0, stream, out, out_stride, gate,
                       gate_stride, up, up_stride, rows, cols, act);
}

cudaError_t launch_rope(float* x, int64_t n_tokens, int64_t heads, int64_t head_dim, const int32_t* positions,
                        const float* inv_freq, int64_t half, cudaStream_t stream) {
  if (n_tokens * heads == 0) return cudaSuccess;
  return launch_kernel(rope_kernel, static_cast<unsigned>(n_tokens * heads), 128, 0, stream, x, heads, head_dim,
                       positions, inv_freq, half);
}

cudaError_t launch_argmax(int32_t* out, const float* x, int64_t stride, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(argmax_kernel, static_cast<unsigned>(rows), kThreads, 0, stream, out, x, stride, cols);
}

}  // namespace fl::cuda
