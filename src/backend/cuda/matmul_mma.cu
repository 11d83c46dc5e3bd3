// Tensor-core GEMM on HFQ4 weights for many inputs: out[t, n] = sum_k x[t, k] * W[n, k].
//
// Hopper and Ampere run bf16 mma.sync (m16n8k16, f32 accumulators). The weights enter the tensor
// cores as their 4-bit codes, which bf16 holds exactly; the group's affine map w = code * scale +
// min is applied afterwards in f32, per group of 128 or 256 k:
//   sum_k x_k w_k = scale * sum_k x_k code_k + min * sum_k x_k.
// The activations are split into `kParts` bf16 pieces (matmul_mma.cuh: 3 pieces are exact), each
// multiplied by the same code fragment, so that with 3 pieces the result is the f32 dot product up
// to summation order and the op harness's 1e-5 budget holds for prefill as for decode.
//
// Block tile: 64 inputs x 128 weight rows, 64 k per stage; 8 warps as 2 (inputs) x 4 (rows), each
// owning 32 x 32 outputs (2 x 4 mma tiles). A stage's global loads go to registers while the
// previous stage's shared-memory tiles feed the tensor cores (one shared buffer, register
// prefetch). The 16 code bytes of a row's 32 k are stored transposed (byte q of each word goes to
// word q), so that one 32-bit shared load gives a lane the four code pairs it needs for two mma
// k-steps, and a warp's 32 loads hit 32 banks.
//
// Grouped (mixture of experts): the block's 64 inputs are routed pairs of one expert, gathered by
// index (MmaWorkItem); the routed pairs are sorted by expert on the device first.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/matmul_mma.cuh"

#if !defined(FIRELINE_GPU_HIP)
#define FIRELINE_MMA_BUILT 1
#else
#define FIRELINE_MMA_BUILT 0
#endif

namespace fl::cuda {

#if FIRELINE_MMA_BUILT
namespace {

constexpr int kTileT = 64;                // inputs per block
constexpr int kTileN = 128;               // weight rows per block
constexpr int kTileK = 64;                // k per stage
constexpr int kThreads = 256;             // 8 warps
constexpr int kAStride = kTileK + 8;      // bf16 per shared A row: 144 bytes keeps ldmatrix conflict-free

template <int kParts>
struct MmaShared {
  uint16_t a[kParts][kTileT][kAStride];  // bf16 pieces of the inputs      [part][t][k]
  uint4 b[2][kTileN];                    // transposed code bytes          [k32 half][n] (16 B)
  float scale[kTileN], min[kTileN];      // the current group's affine map [n]
  float xsum[kTileT];                    // sum of the group's inputs      [t]
};

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher never runs this GEMM below sm_80
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// Bytes (b0 b1 b2 b3) of four words -> word q holds byte q of each: a 4x4 byte transpose.
__device__ __forceinline__ uint4 transpose_bytes(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w2, w3, 0x5140);  // bytes 0, 1
  const uint32_t hi01 = __byte_perm(w0, w1, 0x7362), hi23 = __byte_perm(w2, w3, 0x7362);  // bytes 2, 3
  return make_uint4(__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632), __byte_perm(hi01, hi23, 0x5410),
                    __byte_perm(hi01, hi23, 0x7632));
}

// Byte j of w (two 4-bit codes: the even k in the low nibble) as a bf16 pair (even k in the low
// half), exactly: 0x43 in the high byte makes bf16 128 + code, and 128 is then subtracted.
template <int j>
__device__ __forceinline__ uint32_t codes_to_bf16x2(uint32_t low_nibbles, uint32_t high_nibbles) {
  constexpr uint32_t sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12);
  const uint32_t biased = (__byte_perm(low_nibbles, high_nibbles, sel) & 0x00ff00ffu) | 0x43004300u;
  const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// f32 -> kParts bf16 pieces summing to it (3 pieces: exactly, for normal values).
template <int kParts>
__device__ __forceinline__ void split_bf16(float v, uint16_t out[kParts]) {
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    const __nv_bfloat16 piece = __float2bfloat16_rn(v);
    out[p] = __bfloat16_as_ushort(piece);
    v -= __bfloat162float(piece);  // exact: the residual of a round to nearest
  }
}

template <DType F, int kParts>
__global__ void __launch_bounds__(kThreads, 2) matmul_mma_kernel(MatvecArgs a, MmaGroupedRows grouped, bool vector_x) {
  constexpr int kGroup = F == DType::hfq4_g256 ? 256 : 128;
  constexpr int kBlockBytes = 8 + kGroup / 2;
  __shared__ MmaShared<kParts> s;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_t = warp / 4, warp_n = warp % 4;  // 2 x 4 warps
  const int g = lane / 4, q = lane % 4;            // mma fragment coordinates

  // This block's inputs: rows [t0, t0 + 64) of x, or one work item's routed pairs.
  const uint8_t* matrix = a.weight;
  int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileT;
  int t_count = static_cast<int>(a.n_inputs - t0 < kTileT ? a.n_inputs - t0 : kTileT);
  const int32_t* pairs = nullptr;
  if (grouped.items) {
    if (static_cast<int32_t>(blockIdx.y) >= *grouped.n_items) return;
    const MmaWorkItem item = grouped.items[blockIdx.y];
    matrix += static_cast<int64_t>(item.expert) * a.expert_bytes;
    pairs = grouped.pair_ids + item.first;
    t_count = item.count;
    t0 = 0;
  }
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;

  // Loader roles. Inputs: thread -> row tid / 4, 16 consecutive k at (tid % 4) * 16. Codes:
  // thread -> weight row tid % 128, k32 half tid / 128 (16 bytes). Affine map: threads < 128.
  const int load_t = tid / 4, load_k = (tid % 4) * 16;
  const float* x_row = nullptr;
  if (load_t < t_count) {
    const int64_t row = pairs ? pairs[load_t] / a.x_row_div : t0 + load_t;
    x_row = a.x + row * a.x_stride;
  }
  const int load_n = tid % kTileN, load_half = tid / kTileN;
  const uint8_t* w_row = matrix + (n0 + load_n < a.M ? n0 + load_n : a.M - 1) * a.row_bytes;

  float x_next[16];
  uint32_t code_next[4];
  float2 affine_next = make_float2(0.0f, 0.0f);
  auto load_stage = [&](int64_t k0) {
    const int64_t kx = k0 + load_k;
    if (x_row && vector_x && kx + 16 <= a.K) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(x_row + kx) + i);
        x_next[4 * i] = v.x, x_next[4 * i + 1] = v.y, x_next[4 * i + 2] = v.z, x_next[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) x_next[i] = x_row && kx + i < a.K ? x_row[kx + i] : 0.0f;
    }
    const int64_t kc = k0 + load_half * 32;  // within the row's padded blocks (kGroup % 64 == 0)
    const uint8_t* block = w_row + (kc / kGroup) * kBlockBytes;
    const uint2* codes = reinterpret_cast<const uint2*>(block + 8 + (kc % kGroup) / 2);  // 8-byte aligned
    const uint2 c0 = __ldg(codes), c1 = __ldg(codes + 1);
    code_next[0] = c0.x, code_next[1] = c0.y, code_next[2] = c1.x, code_next[3] = c1.y;
    if (tid < kTileN && k0 % kGroup == 0) {
      const uint8_t* own = matrix + (n0 + tid < a.M ? n0 + tid : a.M - 1) * a.row_bytes + (k0 / kGroup) * kBlockBytes;
      affine_next = __ldg(reinterpret_cast<const float2*>(own));  // scale, min
    }
  };

  float acc[2][4][4], part[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = part[i][j][c] = 0.0f;
  float xsum = 0.0f;  // this loader row's sum over the current group

  const int64_t n_stages = (a.K + kTileK - 1) / kTileK;
  load_stage(0);
  for (int64_t stage = 0; stage < n_stages; ++stage) {
    const int64_t k0 = stage * kTileK;
    const bool group_first = k0 % kGroup == 0;
    const bool group_last = (k0 + kTileK) % kGroup == 0 || stage + 1 == n_stages;
    // Registers -> shared: the inputs as bf16 pieces, the codes transposed, the group's map.
    {
      float sum = 0.0f;
      uint32_t words[kParts][8];  // bf16 pairs, the even k in the low half
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sum += x_next[2 * i] + x_next[2 * i + 1];
        uint16_t even[kParts], odd[kParts];
        split_bf16<kParts>(x_next[2 * i], even);
        split_bf16<kParts>(x_next[2 * i + 1], odd);
#pragma unroll
        for (int j = 0; j < kParts; ++j) words[j][i] = static_cast<uint32_t>(even[j]) | static_cast<uint32_t>(odd[j]) << 16;
      }
#pragma unroll
      for (int j = 0; j < kParts; ++j) {
        uint4* dst = reinterpret_cast<uint4*>(&s.a[j][load_t][load_k]);
        dst[0] = make_uint4(words[j][0], words[j][1], words[j][2], words[j][3]);
        dst[1] = make_uint4(words[j][4], words[j][5], words[j][6], words[j][7]);
      }
      sum += gpu::shfl_xor(sum, 1);
      sum += gpu::shfl_xor(sum, 2);
      xsum = group_first ? sum : xsum + sum;
      if (group_last && tid % 4 == 0) s.xsum[load_t] = xsum;
      s.b[load_half][load_n] = transpose_bytes(code_next[0], code_next[1], code_next[2], code_next[3]);
      if (tid < kTileN && group_first) s.scale[tid] = affine_next.x, s.min[tid] = affine_next.y;
    }
    __syncthreads();
    if (stage + 1 < n_stages) load_stage(k0 + kTileK);  // in flight during the products below

#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 32 k: two mma k-steps share one code word per tile
      uint32_t b[4][4];                     // [n tile][k-step 0 reg 0, reg 1, k-step 1 reg 0, reg 1]
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t word = reinterpret_cast<const uint32_t*>(&s.b[half][warp_n * 32 + j * 8 + g])[q];
        const uint32_t low = word & 0x0f0f0f0fu, high = (word >> 4) & 0x0f0f0f0fu;
        b[j][0] = codes_to_bf16x2<0>(low, high);
        b[j][1] = codes_to_bf16x2<1>(low, high);
        b[j][2] = codes_to_bf16x2<2>(low, high);
        b[j][3] = codes_to_bf16x2<3>(low, high);
      }
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const int kk = half * 32 + step * 16;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int p = 0; p < kParts; ++p) {
            uint32_t frag[4];
            ldmatrix_x4(frag, &s.a[p][warp_t * 32 + i * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_bf16(part[i][j], frag, b[j][2 * step], b[j][2 * step + 1]);
          }
        }
      }
    }
    if (group_last) {  // acc += scale * sum(x code) + min * sum(x), per output
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int t = warp_t * 32 + i * 16 + g + (c >= 2 ? 8 : 0);
            const int n = warp_n * 32 + j * 8 + 2 * q + (c & 1);
            acc[i][j][c] += s.scale[n] * part[i][j][c] + s.min[n] * s.xsum[t];
            part[i][j][c] = 0.0f;
          }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = warp_t * 32 + i * 16 + g + (c >= 2 ? 8 : 0);
      if (t >= t_count) continue;
      const int64_t row = pairs ? pairs[t] : t0 + t;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + warp_n * 32 + j * 8 + 2 * q + (c & 1);
        if (n < a.M) a.out[row * a.out_stride + n] = acc[i][j][c];
      }
    }
}

// One block: count the pairs per expert, cut each expert's pairs into work items of <= 64, and
// list the pairs by expert (the order within an expert is whatever the atomics give: each pair's
// output is computed on its own, so the result does not depend on it).
__global__ void moe_sort_pairs_kernel(MmaWorkItem* items, int32_t* n_items, int32_t* pair_ids,
                                      const int32_t* ids, int64_t n_pairs, int64_t n_experts) {
  extern __shared__ int32_t cursor[];  // [n_experts]
  for (int64_t e = threadIdx.x; e < n_experts; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < n_experts) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // a few hundred experts: a serial scan is shorter than a parallel one
    int32_t offset = 0, n = 0;
    for (int64_t e = 0; e < n_experts; ++e) {
      const int32_t count = cursor[e];
      for (int32_t first = 0; first < count; first += kTileT)
        items[n++] = MmaWorkItem{static_cast<int32_t>(e), offset + first, count - first < kTileT ? count - first : kTileT, 0};
      cursor[e] = offset;
      offset += count;
    }
    *n_items = n;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < n_experts) pair_ids[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(p);
  }
}

template <DType F>
cudaError_t launch_format(const MatvecArgs& a, int parts, const MmaGroupedRows* grouped, cudaStream_t stream) {
  const unsigned n_tiles = static_cast<unsigned>((a.M + kTileN - 1) / kTileN);
  const int64_t t_tiles = grouped ? grouped->max_items : (a.n_inputs + kTileT - 1) / kTileT;
  if (t_tiles > 65535) return cudaErrorInvalidValue;  // 4M inputs: the caller splits first
  const dim3 grid(n_tiles, static_cast<unsigned>(t_tiles));
  const bool vector_x = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0;
  const MmaGroupedRows rows = grouped ? *grouped : MmaGroupedRows{};
  switch (parts) {
    case 1: matmul_mma_kernel<F, 1><<<grid, kThreads, 0, stream>>>(a, rows, vector_x); break;
    case 2: matmul_mma_kernel<F, 2><<<grid, kThreads, 0, stream>>>(a, rows, vector_x); break;
    case 3: matmul_mma_kernel<F, 3><<<grid, kThreads, 0, stream>>>(a, rows, vector_x); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

bool matmul_mma_supports(DType type) { return type == DType::hfq4_g256 || type == DType::hfq4_g128; }

cudaError_t launch_matmul_mma(const MatvecArgs& a, int parts, cudaStream_t stream, const MmaGroupedRows* grouped) {
  if (a.n_segments != 0 || (a.expert_ids && !grouped) || a.M <= 0 || a.K <= 0) return cudaErrorInvalidValue;
  if (!grouped && a.n_inputs == 0) return cudaSuccess;
  if (grouped && grouped->max_items == 0) return cudaSuccess;
  switch (a.weight_type) {
    case DType::hfq4_g256: return launch_format<DType::hfq4_g256>(a, parts, grouped, stream);
    case DType::hfq4_g128: return launch_format<DType::hfq4_g128>(a, parts, grouped, stream);
    default: return cudaErrorInvalidValue;
  }
}

int64_t max_work_items(int64_t n_pairs, int64_t n_experts) {
  return n_pairs / kTileT + (n_experts < n_pairs ? n_experts : n_pairs);
}

cudaError_t launch_moe_sort_pairs(MmaGroupedRows& out, MmaWorkItem* items, int32_t* n_items, int32_t* pair_ids,
                                  const int32_t* ids, int64_t n_pairs, int64_t n_experts, cudaStream_t stream) {
  if (n_experts <= 0 || n_experts > 8192) return cudaErrorInvalidValue;
  moe_sort_pairs_kernel<<<1, 1024, static_cast<size_t>(n_experts) * sizeof(int32_t), stream>>>(
      items, n_items, pair_ids, ids, n_pairs, n_experts);
  out.items = items;
  out.n_items = n_items;
  out.pair_ids = pair_ids;
  out.max_items = max_work_items(n_pairs, n_experts);
  return cudaGetLastError();
}

#else  // HIP: no mma.sync; launch_matvec keeps its several-input kernel

bool matmul_mma_supports(DType) { return false; }
cudaError_t launch_matmul_mma(const MatvecArgs&, int, cudaStream_t, const MmaGroupedRows*) {
  return cudaErrorInvalidValue;
}
int64_t max_work_items(int64_t n_pairs, int64_t n_experts) { return n_pairs / 64 + (n_experts < n_pairs ? n_experts : n_pairs); }
cudaError_t launch_moe_sort_pairs(MmaGroupedRows&, MmaWorkItem*, int32_t*, int32_t*, const int32_t*, int64_t, int64_t,
                                  cudaStream_t) {
  return cudaErrorInvalidValue;
}

#endif

}  // namespace fl::cuda
