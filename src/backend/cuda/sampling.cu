// Sampling one token on the device, bit for bit the chain of backend/sampling.h (the host
// reference sorts; here nothing is sorted). One block of 1024 threads walks the vocabulary
// (262k logits, 1 MB, L2-resident right after the LM head) a few times:
//   - greedy: one argmax pass;
//   - top-k and the top-p cut are radix selects over 64-bit keys, (order-preserving logit bits
//     << 32) | (~id), whose descending order is exactly the reference's (logit descending, id
//     ascending) order: 8 passes of 8-bit digits each, counting elements (top-k) or summing
//     their integer masses (top-p) per digit in shared memory. Integer atomics are exact in any
//     order, so the result does not depend on scheduling;
//   - the draw: per-thread sums of the kept masses over contiguous id ranges, a block scan, and
//     the one thread whose range holds r walks it.
// About 20 passes at batch 1: tens of microseconds, against copying the logits to the host and
// sorting them there. One block is plenty for one row; batched rows (sample_rows_kernel) take one
// block each, each with its own chain parameters.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/sampling.cuh"

namespace fl::cuda {
namespace {

constexpr int kSampleThreads = 1024;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kSampleWarps = kSampleThreads / kWarp;

// Order-preserving map of a float (no NaN) to uint32: larger float, larger integer.
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t order_key(float l, int64_t id) {
  return (static_cast<uint64_t>(ordered_bits(l)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

__device__ __forceinline__ uint64_t block_sum_u64(uint64_t v, uint64_t* scratch) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += gpu::shfl_xor(v, offset);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kSampleWarps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Radix select from the top: the key at which the running total (of counts, or of masses) over
// keys in descending order first reaches `need`, among elements with `counted(i)`. `weight(i)`
// is 1 for a count, the mass for top-p.
template <class Counted, class Weight>
__device__ uint64_t select_key(const float* l, int64_t V, uint64_t need, Counted counted, Weight weight,
                               uint64_t* hist, uint64_t* shared_word) {
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const uint64_t key = order_key(l[i], i);
      if ((shift == 56 || (key >> (shift + 8)) == prefix) && counted(i)) {
        const uint64_t w = weight(i);
        if (w) atomicAdd(reinterpret_cast<unsigned long long*>(&hist[(key >> shift) & 255u]), static_cast<unsigned long long>(w));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t above = 0;
      int digit = 0;
      for (int b = 255; b >= 0; --b) {
        if (above + hist[b] >= need) {
          digit = b;
          break;
        }
        above += hist[b];
      }
      need -= above;
      shared_word[0] = (prefix << 8) | static_cast<uint64_t>(digit);
      shared_word[1] = need;
    }
    __syncthreads();
    prefix = shared_word[0];
    need = shared_word[1];
    __syncthreads();
  }
  return prefix;
}

// One row, by one block of kSampleThreads.
__device__ void sample_row(const SampleArgs& a) {
  __shared__ uint64_t hist[256];
  __shared__ uint64_t word[2];
  __shared__ uint64_t u64_scratch[kSampleWarps];
  __shared__ float f_scratch[kSampleWarps];
  float* l = a.logits;
  const int64_t V = a.vocab;
  if (threadIdx.x == 0) *a.out = -1;  // overwritten by the chosen token

  for (int i = threadIdx.x; i < a.n_adjust; i += blockDim.x) {  // 1 (ids unique: no races)
    const SampleAdjust adj = a.adjust[i];
    if (adj.id >= 0 && adj.id < V)
      l[adj.id] = adjusted_logit(l[adj.id], adj.bias, adj.count, a.p.repetition_penalty, a.p.presence_penalty,
                                 a.p.frequency_penalty);
  }
  __syncthreads();

  if (a.p.temperature == 0.0f) {  // 2: greedy, lowest id among the best, NaN never chosen
    float best = kNegInf;
    int64_t best_i = V;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
      if (l[i] > best) best = l[i], best_i = i;  // strided: the first hit is this thread's lowest
    const float m = block_max(best, f_scratch);
    uint64_t* first = &word[0];
    if (threadIdx.x == 0) *first = static_cast<uint64_t>(V);
    __syncthreads();
    if (best == m && m != kNegInf) atomicMin(reinterpret_cast<unsigned long long*>(first), static_cast<unsigned long long>(best_i));
    __syncthreads();
    if (threadIdx.x == 0) *a.out = m == kNegInf ? -1 : static_cast<int32_t>(*first);
    return;
  }

  float local_max = kNegInf;  // 3
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    float v = l[i] / a.p.temperature;
    if (v != v) v = kNegInf;
    if (v > 3.40282347e38f) v = 3.40282347e38f;  // +inf (an overflowing divide or bias): FLT_MAX
    if (v == 0.0f) v = 0.0f;
    l[i] = v;
    local_max = fmaxf(local_max, v);
  }
  const float m = block_max(local_max, f_scratch);  // (its barriers also publish l[])
  if (m == kNegInf) {
    if (threadIdx.x == 0) *a.out = -1;
    return;
  }
  auto mass = [&](int64_t i) { return sample_mass(exp_exact(add_rn(l[i], -m))); };

  uint64_t kth = 0;  // 4: every key >= 0 when top-k is off
  if (a.p.top_k > 0 && a.p.top_k < V)
    kth = select_key(l, V, static_cast<uint64_t>(a.p.top_k), [](int64_t) { return true; }, [](int64_t) { return uint64_t{1}; },
                     hist, word);
  auto in_top_k = [&](int64_t i) { return order_key(l[i], i) >= kth; };

  uint64_t local = 0;  // 5
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    if (in_top_k(i)) local += mass(i);
  const uint64_t total = block_sum_u64(local, u64_scratch);

  uint64_t cut = 0;  // 6
  if (a.p.top_p < 1.0f) {
    const auto need = static_cast<uint64_t>(ceil(static_cast<double>(a.p.top_p) * static_cast<double>(total)));
    cut = select_key(l, V, need, in_top_k, mass, hist, word);
  }
  auto kept = [&](int64_t i) {
    const float x = l[i];
    return order_key(x, i) >= (kth > cut ? kth : cut) && (a.p.min_p <= 0.0f || exp_exact(add_rn(x, -m)) >= a.p.min_p);  // 7
  };

  // 8: contiguous id ranges per thread, their kept masses scanned in thread order.
  const int64_t per_thread = (V + blockDim.x - 1) / blockDim.x;
  const int64_t begin = threadIdx.x * per_thread, end = begin + per_thread < V ? begin + per_thread : V;
  uint64_t mine = 0;
  for (int64_t i = begin; i < end; ++i)
    if (kept(i)) mine += mass(i);
  // Inclusive scan within the warp, then across warps.
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  uint64_t inclusive = mine;
  for (int offset = 1; offset < kWarp; offset *= 2) {
    const uint64_t other = gpu::shfl_up(inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncthreads();
  if (lane == kWarp - 1) u64_scratch[warp] = inclusive;
  __syncthreads();
  uint64_t warps_before = 0, kept_total = 0;
  for (int w = 0; w < kSampleWarps; ++w) {
    if (w < warp) warps_before += u64_scratch[w];
    kept_total += u64_scratch[w];
  }
  const uint64_t before = warps_before + inclusive - mine;
  const uint64_t r = sample_draw_point(a.p.uniform, kept_total);
  if (before <= r && r < before + mine) {
    uint64_t running = before;
    for (int64_t i = begin; i < end; ++i)
      if (kept(i) && (running += mass(i)) > r) {
        *a.out = static_cast<int32_t>(i);
        break;
      }
  }
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleArgs a) {
  enter_kernel();
  sample_row(a);
}

__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(const SampleArgs* rows) {
  enter_kernel();
  const SampleArgs a = rows[blockIdx.x];
  sample_row(a);
}

// Greedy without adjustments, over many blocks: sample_row's greedy pass is one block walking
// the whole vocabulary (55 us for Gemma's 262144 logits on the H200, ncu). Here block b takes
// kGreedyChunk logits at a time (8 independent loads per thread) and keeps the largest
// order_key; greedy_pick_kernel takes the largest of the blocks'. The largest key is the largest
// logit at its lowest id, which is what the one-block pass picks; NaN is skipped and -0 keyed as
// +0 (they compare equal there), and a largest logit of -inf (every token banned) gives -1.
constexpr int kGreedyThreads = 256, kGreedyPerThread = 8, kGreedyMaxBlocks = 1024;
constexpr int64_t kGreedyChunk = int64_t{kGreedyThreads} * kGreedyPerThread;

__device__ __forceinline__ uint64_t block_max_u64(uint64_t v) {
  __shared__ uint64_t warp_best[kGreedyThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const uint64_t o = gpu::shfl_xor(v, offset);
    v = o > v ? o : v;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warp_best[warp] = v;
  __syncthreads();
  uint64_t best = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) best = warp_best[w] > best ? warp_best[w] : best;
  return best;
}

__global__ void __launch_bounds__(kGreedyThreads) greedy_partial_kernel(const float* l, int64_t V, uint64_t* partial) {
  enter_kernel();
  uint64_t best = 0;  // below every real key: ordered_bits(-inf) > 0
  for (int64_t chunk = blockIdx.x * kGreedyChunk; chunk < V; chunk += gridDim.x * kGreedyChunk) {
    float v[kGreedyPerThread];
#pragma unroll
    for (int j = 0; j < kGreedyPerThread; ++j) {
      const int64_t i = chunk + j * kGreedyThreads + threadIdx.x;
      v[j] = i < V ? l[i] : NAN;
    }
#pragma unroll
    for (int j = 0; j < kGreedyPerThread; ++j) {
      if (v[j] != v[j]) continue;
      const uint64_t key = order_key(v[j] == 0.0f ? 0.0f : v[j], chunk + j * kGreedyThreads + threadIdx.x);
      best = key > best ? key : best;
    }
  }
  best = block_max_u64(best);
  if (threadIdx.x == 0) partial[blockIdx.x] = best;
}

__global__ void __launch_bounds__(kGreedyThreads) greedy_pick_kernel(const uint64_t* partial, int n, int32_t* out) {
  enter_kernel();
  uint64_t best = 0;
  for (int b = threadIdx.x; b < n; b += blockDim.x) best = partial[b] > best ? partial[b] : best;
  best = block_max_u64(best);
  if (threadIdx.x == 0)
    *out = best <= order_key(kNegInf, 0) ? -1 : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
}

}  // namespace

int64_t sample_scratch_bytes(const SampleArgs& args) {
  const bool greedy_blocks = args.p.temperature == 0.0f && args.n_adjust == 0;
  return greedy_blocks ? kGreedyMaxBlocks * static_cast<int64_t>(sizeof(uint64_t)) : 0;
}

cudaError_t launch_sample(const SampleArgs& args, void* scratch, cudaStream_t stream) {
  if (args.vocab <= 0 || args.vocab > 0x7fffffff) return cudaErrorInvalidValue;
  if (sample_scratch_bytes(args) > 0) {
    if (!scratch) return cudaErrorInvalidValue;
    const int64_t chunks = (args.vocab + kGreedyChunk - 1) / kGreedyChunk;
    const int blocks = static_cast<int>(chunks < kGreedyMaxBlocks ? chunks : kGreedyMaxBlocks);
    auto* partial = static_cast<uint64_t*>(scratch);
    const cudaError_t err =
        launch_kernel(greedy_partial_kernel, blocks, kGreedyThreads, 0, stream, args.logits, args.vocab, partial);
    if (err != cudaSuccess) return err;
    return launch_kernel(greedy_pick_kernel, 1, kGreedyThreads, 0, stream, partial, blocks, args.out);
  }
  return launch_kernel(sample_kernel, 1, kSampleThreads, 0, stream, args);
}

cudaError_t launch_sample_rows(const SampleArgs* rows, int64_t n_rows, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  if (n_rows < 0 || n_rows > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_kernel(sample_rows_kernel, static_cast<unsigned>(n_rows), kSampleThreads, 0, stream, rows);
}

}  // namespace fl::cuda
