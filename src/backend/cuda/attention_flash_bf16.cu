// Prompt attention on the tensor cores with bf16 operands (TensorCorePrecision::bf16), in the
// FlashAttention-2 shape: a block owns 64 query rows of one head and walks the keys they see in
// tiles, keeping the online softmax's running max, sum and output in registers.
//
// Why a second kernel beside attention_mma.cu's: that one keeps f32 tiles in shared memory so
// that it can cut every value into pieces (the f32 path), 16-32 query rows per block. With one
// piece its time went to loading and converting f32 values per use and to re-reading each K/V
// tile for every 16-32 queries (26B-A4B, 4096 tokens: 128 ms of attention, ~23 TFLOPS). Here:
// - the keys a step sees (cached rows decoded from the cache's format, then the step's own) are
//   gathered once into bf16 scratch, [n_kv_heads][keys][D] (gather_keys_bf16_kernel), so that
//   the attention kernel copies its tiles with cp.async, two stages deep, no conversion;
// - operands reach the tensor cores through ldmatrix: Q and K row-major, V transposed
//   (ldmatrix.trans), and P straight from the S accumulators (their layout is the A fragment's);
// - 64 query rows per block share every K/V tile (4 row groups of 16: one warp each at D <= 256,
//   two at D = 512).
// A warp's output is 16 rows x its head-dim slice in registers: D <= 256 fits one warp (128
// floats per thread at 256), D = 512 (Gemma 4's global layers) takes a pair of warps per row
// group, each owning half of O. The pair splits each tile's keys for S = QK^T and the softmax (16
// each) and trades the row maxima and its P fragments through shared memory (PairExchange), so
// that each multiplies all of P by its half of V. (Computing the whole S in both warps, as this
// kernel first did, spent 1.5x the mma and twice the exponentials.)
//
// Precision: Q, K, V and P rounded to bf16 once each; S, the softmax and O in f32. The softmax
// sum l adds the unrounded P, so |O - exact O of the rounded Q, K, V| <= 2^-9 max |V| (the op
// harness's budget).
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/flash_softmax.cuh"
#if !defined(FIRELINE_GPU_HIP)
#include "backend/cuda/mma_sync.cuh"
#endif

namespace fl::cuda {

#if !defined(FIRELINE_GPU_HIP)
namespace {

constexpr int kRowGroups = 4;  // warps along the queries
constexpr int kBlockRows = 16 * kRowGroups;
constexpr int kRowPad = 8;  // bf16 past D per shared row: rows 16 bytes apart mod 128 (ldmatrix without conflicts)

// The keys of a step: [key0, p0 + T), key0 the first any of its queries sees.
__device__ __forceinline__ int64_t first_gathered_key(const AttentionArgs& a, int64_t p0) {
  return a.window > 0 ? max(int64_t{0}, p0 - a.window + 1) : 0;
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Thread: 8 consecutive elements of one key's K and V row -> two 16-byte bf16 stores.
template <DType C>
__global__ void gather_keys_bf16_kernel(AttentionArgs a, uint16_t* k_out, uint16_t* v_out, int64_t rows_per_head) {
  enter_kernel();
  const int64_t p0 = a.positions[0];
  const int64_t key0 = first_gathered_key(a, p0);
  const int64_t n_keys = min(p0 + a.n_tokens - key0, rows_per_head);
  const int D = a.head_dim, chunks = D / 8, kv = blockIdx.y;
  const int64_t cache_stride = static_cast<int64_t>(a.n_kv_heads) * a.cache_row_bytes;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_keys * chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks;
    const int c = static_cast<int>(i % chunks) * 8;
    const int64_t j = key0 + r;
    float k8[8], v8[8];
    if (j < p0) {
      const int64_t row = (j % a.cache_rows) * cache_stride + kv * a.cache_row_bytes;
      decode8<C>(a.k_cache + row, c, D, k8);
      decode8<C>(a.v_cache + row, c, D, v8);
    } else {
      const int64_t row = ((j - p0) * a.n_kv_heads + kv) * D + c;
#pragma unroll
      for (int e = 0; e < 8; ++e) k8[e] = a.k_new[row + e], v8[e] = a.v_new[row + e];
    }
    const int64_t at = (kv * rows_per_head + r) * D + c;
    *reinterpret_cast<uint4*>(k_out + at) =
        make_uint4(bf16x2(k8[0], k8[1]), bf16x2(k8[2], k8[3]), bf16x2(k8[4], k8[5]), bf16x2(k8[6], k8[7]));
    *reinterpret_cast<uint4*>(v_out + at) =
        make_uint4(bf16x2(v8[0], v8[1]), bf16x2(v8[2], v8[3]), bf16x2(v8[4], v8[5]), bf16x2(v8[6], v8[7]));
  }
}

// Warps per row group: one output slice per warp of at most 256 columns.
__host__ __device__ constexpr int slice_warps(int D) { return D > 256 ? 2 : 1; }

// Keys per tile: 64 up to a 128-column slice, then 32: 85 KiB of shared memory at D = 128, 99 KiB
// at 256 (two blocks per SM), 201 KiB at 512 (one, with the pairs' exchange).
__host__ __device__ constexpr int tile_keys_for(int slice) { return slice <= 128 ? 64 : 32; }

// What the two warps of a row group trade per tile (D > 256): a lane's two row maxima, then its A
// fragment of P over its warp's 16 keys; at the end, the rows' partial sums l.
struct PairExchange {
  float2 row_stat[kRowGroups][2][32];  // a lane's two rows' max, then l [row group][warp of the pair][lane]
  uint4 p[kRowGroups][2][32];
};

// Q, then two stages of K and V tiles, bf16 rows of D + kRowPad; then the pairs' exchange.
__host__ __device__ size_t flash_bf16_smem_bytes(int D, int keys) {
  return sizeof(uint16_t) * static_cast<size_t>(kBlockRows + 2 * 2 * keys) * (D + kRowPad) +
         (slice_warps(D) == 2 ? sizeof(PairExchange) : 0);
}

// Waits for both warps of row group `rg` (named barrier 1 + rg, 0 being __syncthreads'; the ids
// as immediates, so that ptxas counts the barriers the kernel uses).
__device__ __forceinline__ void pair_barrier(int rg) {
  static_assert(kRowGroups == 4, "one named barrier per row group");
  switch (rg) {
    case 0: asm volatile("bar.sync 1, 64;" ::: "memory"); break;
    case 1: asm volatile("bar.sync 2, 64;" ::: "memory"); break;
    case 2: asm volatile("bar.sync 3, 64;" ::: "memory"); break;
    default: asm volatile("bar.sync 4, 64;" ::: "memory"); break;
  }
}

// A lane's two row values (maxima or sums) to its partner warp of row group `rg`, and the
// partner's back: the same lane of the other warp holds the same rows.
__device__ __forceinline__ float2 trade_row_stat(PairExchange* pair, int rg, int dw, int lane, const float (&v)[2]) {
  pair->row_stat[rg][dw][lane] = make_float2(v[0], v[1]);
  pair_barrier(rg);
  return pair->row_stat[rg][dw ^ 1][lane];
}

// kSliceTiles: the most 8-column output tiles a warp holds (its slice / 8, rounded up to a
// power of two so that few instances serve every head dim). kPairs: two warps per row group (D >
// 256), splitting each tile's keys.
template <int kSliceTiles, int kKeys, bool kPairs>
__global__ void __launch_bounds__(kRowGroups * 32 * (kPairs ? 2 : 1))
    flash_bf16_kernel(AttentionArgs a, const uint16_t* k_rows, const uint16_t* v_rows, int64_t rows_per_head) {
  enter_kernel();
  constexpr int kPairWarps = kPairs ? 2 : 1;
  constexpr int kKeyTiles = kKeys / 8 / kPairWarps;  // this warp's 8-key tiles of S
  extern __shared__ __align__(16) uint16_t smem[];
  const int D = a.head_dim, slice = D / kPairWarps, stride = D + kRowPad;
  uint16_t* s_q = smem;                        // [64 rows][stride]
  uint16_t* s_kv = s_q + kBlockRows * stride;  // [stage][K, V][kKeys][stride]
  PairExchange* pair = reinterpret_cast<PairExchange*>(s_kv + 2 * 2 * kKeys * stride);  // (kPairs only)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_threads = blockDim.x;
  const int rg = warp % kRowGroups, dw = warp / kRowGroups;
  const int g = lane / 4, q = lane % 4;
  const int h = blockIdx.y, kv = h / (a.n_heads / a.n_kv_heads);
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;  // the blocks with the most keys first
  const int n_rows = min(kBlockRows, a.n_tokens - t0);
  const int64_t p0 = a.positions[0];
  const int64_t key0 = first_gathered_key(a, p0);
  const int64_t last_pos = p0 + t0 + n_rows - 1;
  const int64_t key_begin = a.window > 0 ? max(key0, p0 + t0 - a.window + 1) : 0;
  const int64_t key_end = last_pos + 1;
  const int64_t n_tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  const uint16_t* k_head = k_rows + kv * rows_per_head * D;
  const uint16_t* v_head = v_rows + kv * rows_per_head * D;

  // Tile `tile` of K and V -> stage `stage` (keys past the end: zeros, masked below).
  auto load_tile = [&](int64_t tile, int stage) {
    uint16_t* sk = s_kv + stage * 2 * kKeys * stride;
    uint16_t* sv = sk + kKeys * stride;
    const int64_t kb = key_begin + tile * kKeys;
    const int chunks = D / 8;
    for (int i = tid; i < kKeys * chunks; i += n_threads) {
      const int r = i / chunks, c = (i % chunks) * 8;
      // (rows_per_head bounds what the gather wrote: a key beyond it, which the host's bound rules
      // out, reads zeros rather than past the scratch)
      const bool valid = kb + r < key_end && kb + r - key0 < rows_per_head;
      const int64_t row = valid ? kb + r - key0 : 0;
      cp_async_16(sk + r * stride + c, k_head + row * D + c, valid);
      cp_async_16(sv + r * stride + c, v_head + row * D + c, valid);
    }
    cp_async_commit();
  };
  if (n_tiles > 0) load_tile(0, 0);
  // Queries -> shared bf16 while the first tile is in flight (rows past the block's: zero).
  for (int i = tid; i < kBlockRows * (D / 2); i += n_threads) {
    const int r = i / (D / 2), c = (i % (D / 2)) * 2;
    const float* src = a.q + (static_cast<int64_t>(t0 + r) * a.n_heads + h) * D + c;
    *reinterpret_cast<uint32_t*>(s_q + r * stride + c) = r < n_rows ? bf16x2(src[0], src[1]) : 0u;
  }

  const int row0 = rg * 16, d0 = dw * slice, out_tiles = slice / 8;
  const int own_keys = kPairs ? dw * (kKeys / 2) : 0;  // this warp's first key of each tile (for S)
  const int64_t pos[2] = {p0 + t0 + row0 + g, p0 + t0 + row0 + g + 8};
  const float scale_log2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  float o[kSliceTiles][4];
#pragma unroll
  for (int j = 0; j < kSliceTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
  // ldmatrix row addresses of this lane: A (Q) and B-from-rows (K) take matrices (rows 0-7 |
  // 8-15) x (k 0-7 | 8-15) in the fragment's register order; V's transposed B likewise.
  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);
  const int k_row = (lane % 8) + 8 * (lane / 16), k_col = 8 * ((lane / 8) % 2);

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    const int stage = static_cast<int>(tile & 1);
    if (tile + 1 < n_tiles) {
      load_tile(tile + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* sk = s_kv + stage * 2 * kKeys * stride;
    const uint16_t* sv = sk + kKeys * stride;

    // S = Q K^T over the whole head dim: [16 rows, this warp's keys].
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    for (int kk = 0; kk < D; kk += 16) {
      uint32_t qa[4];
      ldmatrix_x4(qa, s_q + (row0 + a_row) * stride + kk + a_col);
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, sk + (own_keys + np * 16 + k_row) * stride + kk + k_col);
        mma_bf16(s[2 * np], qa, kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qa, kf[2], kf[3]);
      }
    }

    // Online softmax in base 2: scale, mask (causal and sliding window), running max and sum; a
    // pair takes the larger of its two warps' row maxima.
    float corr[2];
    auto pair_max = [&](float(&tile_max)[2]) {
      const float2 other = trade_row_stat(pair, rg, dw, lane, tile_max);
      tile_max[0] = fmaxf(tile_max[0], other.x);
      tile_max[1] = fmaxf(tile_max[1], other.y);
    };
    if constexpr (kPairs)
      online_softmax_tile<kKeyTiles, true>(s, key_begin + tile * kKeys + own_keys, key_end, pos, a.window, scale_log2,
                                           q, m, l, corr, pair_max);
    else
      online_softmax_tile<kKeyTiles, true>(s, key_begin + tile * kKeys, key_end, pos, a.window, scale_log2, q, m, l,
                                           corr);
#pragma unroll
    for (int j = 0; j < kSliceTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[j][c] *= corr[c / 2];

    // P as A fragments, 16 keys each: the S accumulators' layout. A pair trades its halves (the
    // partner's stored as its lane computed it: the same lane reads it back).
    uint32_t p_frags[kKeys / 16][4];
#pragma unroll
    for (int ks = 0; ks < kKeyTiles / 2; ++ks) {
      p_frags[ks][0] = bf16x2(s[2 * ks][0], s[2 * ks][1]);
      p_frags[ks][1] = bf16x2(s[2 * ks][2], s[2 * ks][3]);
      p_frags[ks][2] = bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      p_frags[ks][3] = bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    if constexpr (kPairs) {
      static_assert(kKeys == 32, "a pair's warps hold one 16-key fragment of P each");
      pair->p[rg][dw][lane] = make_uint4(p_frags[0][0], p_frags[0][1], p_frags[0][2], p_frags[0][3]);
      pair_barrier(rg);
      const uint4 other = pair->p[rg][dw ^ 1][lane];
      const uint32_t mine[4] = {p_frags[0][0], p_frags[0][1], p_frags[0][2], p_frags[0][3]};
      const uint32_t theirs[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        p_frags[0][c] = dw == 0 ? mine[c] : theirs[c];
        p_frags[1][c] = dw == 0 ? theirs[c] : mine[c];
      }
    }

    // O += P V over this warp's slice, 16 keys per step.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const uint32_t(&pa)[4] = p_frags[ks];
      const uint16_t* v_base = sv + (ks * 16 + a_row) * stride + d0 + a_col;
#pragma unroll
      for (int jp = 0; jp < kSliceTiles / 2; ++jp) {
        if (2 * jp >= out_tiles) break;
        uint32_t vf[4];
        ldmatrix_x4<true>(vf, v_base + jp * 16);
        mma_bf16(o[2 * jp], pa, vf[0], vf[1]);
        mma_bf16(o[2 * jp + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }

  // The quad's partial sums (and a pair's two warps') make the row's sum; normalise and store
  // this warp's slice.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += gpu::shfl_xor(l[r], 1);
    l[r] += gpu::shfl_xor(l[r], 2);
  }
  if constexpr (kPairs) {  // (the loop's last barrier has passed every read of row_stat)
    const float2 other = trade_row_stat(pair, rg, dw, lane, l);
    l[0] += other.x;  // the same sum in both warps: a + b == b + a
    l[1] += other.y;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= n_rows) continue;
    const float inv = 1.0f / l[r];
    float* out = a.out + (static_cast<int64_t>(t0 + row) * a.n_heads + h) * D + d0;
#pragma unroll
    for (int j = 0; j < kSliceTiles; ++j) {
      if (j >= out_tiles) break;
      out[j * 8 + 2 * q] = o[j][2 * r] * inv;
      out[j * 8 + 2 * q + 1] = o[j][2 * r + 1] * inv;
    }
  }
}

template <int kSliceTiles, bool kPairs = false>
cudaError_t launch_flash_bf16_tiles(const AttentionArgs& a, const uint16_t* k_rows, const uint16_t* v_rows,
                                    int64_t rows_per_head, cudaStream_t stream) {
  constexpr int kKeys = tile_keys_for(8 * kSliceTiles);
  const size_t smem = flash_bf16_smem_bytes(a.head_dim, kKeys);
  auto kernel = flash_bf16_kernel<kSliceTiles, kKeys, kPairs>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((a.n_tokens + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(a.n_heads));
  return launch_kernel(kernel, grid, kRowGroups * 32 * slice_warps(a.head_dim), smem, stream, a, k_rows, v_rows,
                       rows_per_head);
}

}  // namespace

// The prompt shapes of the tensor-core kernel (flash_attention_applies: launch_attention's test)
// whose head dims split into whole 16-column steps per warp, where the block's shared memory fits
// the device (D = 512 needs 201 KiB: Hopper; an A100's 163 KiB falls back to the one-piece
// attention_mma.cu kernel).
bool flash_bf16_applies(const AttentionArgs& a) {
  const int D = a.head_dim;
  if (a.pieces != 1 || a.group_queries || a.k_row_caches || a.n_splits != 1 ||
      !flash_attention_applies(a.n_tokens, D) || D % (16 * slice_warps(D)) != 0)
    return false;
  const size_t smem = flash_bf16_smem_bytes(D, tile_keys_for(D / slice_warps(D)));
  return smem <= static_cast<size_t>(current_device_traits().max_block_smem);
}

// Keys a step can see, an upper bound known on the host (positions are on the device): a window
// sees at most window - 1 earlier keys, a linear cache at most its rows; plus the step's own.
int64_t flash_bf16_rows_per_head(const AttentionArgs& a) {
  return (a.window > 0 ? std::min<int64_t>(a.window - 1, a.cache_rows) : a.cache_rows) + a.n_tokens;
}

size_t flash_bf16_scratch_bytes(const AttentionArgs& a) {
  return 2 * sizeof(uint16_t) * static_cast<size_t>(a.n_kv_heads) * flash_bf16_rows_per_head(a) * a.head_dim;
}

cudaError_t launch_flash_bf16(const AttentionArgs& a, cudaStream_t stream) {
  if (!a.scratch || a.scratch_bytes < flash_bf16_scratch_bytes(a)) return cudaErrorInvalidValue;
  const int64_t rows = flash_bf16_rows_per_head(a);
  auto* k_rows = static_cast<uint16_t*>(a.scratch);
  uint16_t* v_rows = k_rows + static_cast<size_t>(a.n_kv_heads) * rows * a.head_dim;
  // One thread per 8 elements; the grid covers the bound, threads past the step's keys idle.
  const int64_t work = rows * (a.head_dim / 8);
  const dim3 gather_grid(static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 65535)),
                         static_cast<unsigned>(a.n_kv_heads));
  cudaError_t err = cudaErrorInvalidValue;
  switch (a.cache_type) {
    case DType::f32:
      err = launch_kernel(gather_keys_bf16_kernel<DType::f32>, gather_grid, 256, 0, stream, a, k_rows, v_rows, rows);
      break;
    case DType::bf16:
      err = launch_kernel(gather_keys_bf16_kernel<DType::bf16>, gather_grid, 256, 0, stream, a, k_rows, v_rows, rows);
      break;
    case DType::q8_0:
      err = launch_kernel(gather_keys_bf16_kernel<DType::q8_0>, gather_grid, 256, 0, stream, a, k_rows, v_rows, rows);
      break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess) return err;
  if (slice_warps(a.head_dim) == 2) return launch_flash_bf16_tiles<32, true>(a, k_rows, v_rows, rows, stream);
  const int slice = a.head_dim;
  if (slice <= 64) return launch_flash_bf16_tiles<8>(a, k_rows, v_rows, rows, stream);
  if (slice <= 128) return launch_flash_bf16_tiles<16>(a, k_rows, v_rows, rows, stream);
  return launch_flash_bf16_tiles<32>(a, k_rows, v_rows, rows, stream);
}

#else  // HIP: no mma.sync

bool flash_bf16_applies(const AttentionArgs&) { return false; }
size_t flash_bf16_scratch_bytes(const AttentionArgs&) { return 0; }
cudaError_t launch_flash_bf16(const AttentionArgs&, cudaStream_t) { return cudaErrorInvalidValue; }

#endif

}  // namespace fl::cuda
