// The routed experts of a few decode tokens in one launch (BackendOptions::fused_experts):
// gate_up, the gated activation, down and the weighted sum over each token's experts, on HFQ4
// stacks. Separately these are four dependent kernels; on the 26B-A4B at batch 1 that chain took
// ~33 us per layer from the route's end for ~27 MB of expert rows (~8 us of bytes on an H100),
// mostly each kernel's ramp and tail and the down rows loaded only after the activations existed.
//
// One grid of at most two resident blocks per SM takes work items in ticket order: first every
// (pair, tile of activations) item, then every (token, tile of output columns) item. An up item
// computes its gate and up rows and stores act(gate) * up; a down item pulls its down rows into
// L2 (the experts are known), waits until every up item has counted itself done, copies the
// token's activations into shared memory and sums its columns over the token's experts. Every
// item comes from a ticket counter, in order, so by the time a block holds a down item every up
// item is held by a running block, which never waits: no wait depends on which blocks are
// resident (other streams' kernels, fewer SMs than reported), only the speed does. The last block
// out zeroes the counters for the next launch.
//
// Same bits as the separate kernels: every row is summed through accumulate_hfq4_rows (the rows
// kernels' lane order, hfq4_rows.cuh), the activation through gated_value, and each column's
// sum over experts in ascending id order with one FMA per expert, as moe_combine_kernel does.
//
// Measured slower (H100, 26B-A4B, thirty-sixth session; BackendOptions::fused_experts stays off):
// 55 us a launch with the router, 50 us from the route's end without it, against ~33 us for the
// four kernels. The phases (router, route, up, down) follow one another, each a few dependent
// rounds of loads per warp, and at 16 warps per SM (128 registers) the per-lane f32 arithmetic
// issued an instruction every ~2.8 cycles per scheduler (ncu): the separate kernels run the same
// arithmetic with more warps per SM.
#include <atomic>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/hfq4_rows.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_route.cuh"

namespace fl::cuda {
namespace {

constexpr int kWarps = 8;
// Two blocks per SM at <= 128 registers (ptxas, sm_90a): 2 activations per warp (2 gate and 2 up
// rows) with 2 warp steps of loads in flight kept every register in place; 3 steps spilled. Every
// item kind shares the kernel's registers: 3 activations per warp, 2 down columns, or a router
// row a warp with its 6 steps in flight each spilled (thirty-sixth session).
constexpr int kUpOuts = 2;      // activations per warp in an up item
constexpr int kUpUnroll = 2;    // warp steps of loads in flight (G256, 2816 columns: 3 rounds)
constexpr int kDownOuts = 1;    // output columns per warp in a down item
constexpr int kDownPairs = 4;   // experts whose rows one pass loads together, each on its activations
constexpr int kDownUnroll = 2;  // (G128, 704 columns: a whole row in one round)
constexpr int kRouterOuts = 4;  // router rows (logits) per warp in a router item (2 spilled a register)
constexpr int kMaxBlocksPerSm = 2;
constexpr int kRoutePerLane = 16;  // experts per lane in the routing (up to 512; fewer give the same bits)

enum Counter : int { kTicket = 0, kUpDone = 1, kBlocksOut = 2, kRouterDone = 3 };
// A counter's word: each on its own 128-byte line (kMoeDecodeCounterStride).
__device__ __forceinline__ int32_t* counter(const MoeDecodeArgs& a, Counter c) {
  return a.counters + static_cast<int>(c) * kMoeDecodeCounterStride;
}

// A launch's work items in ticket order: router items [0, router_items) (with MoeDecodeArgs::
// route), up items [router_items, first_down), down items [first_down, items). The kernel and
// the launcher's grid both read these.
struct WorkItems {
  int64_t router_tiles, router_items, up_tiles, down_tiles, first_down, items;
};
__host__ __device__ inline WorkItems work_items(const MoeDecodeArgs& a) {
  const int64_t router_tiles = a.route.router ? (a.route.E + kWarps * kRouterOuts - 1) / (kWarps * kRouterOuts) : 0;
  const int64_t up_tiles = (a.I + kWarps * kUpOuts - 1) / (kWarps * kUpOuts);
  const int64_t down_tiles = (a.H + kWarps * kDownOuts - 1) / (kWarps * kDownOuts);
  const int64_t router_items = a.T * router_tiles, first_down = router_items + a.T * a.K * up_tiles;
  return {router_tiles, router_items, up_tiles, down_tiles, first_down, first_down + a.T * down_tiles};
}

// The (token, router tile) item: logits [e0, e0 + kRouterOuts) of each warp for the token, summed
// as the f32 rows kernels sum a row (hfq4_rows.cuh), into a.route.logits.
template <int kGroup>
__device__ void run_router_item(const MoeDecodeArgs& a, int64_t token, int64_t tile, bool vector_x) {
  using L = Hfq4Lanes<kGroup>;
  const MoeDecodeArgs::Route& r = a.route;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int64_t e0 = (tile * kWarps + warp) * kRouterOuts;
  if (e0 >= r.E) return;  // (warp-uniform)
  const uint8_t* rows[kRouterOuts];
#pragma unroll
  for (int i = 0; i < kRouterOuts; ++i)  // past E: the last row again, not stored
    rows[i] = r.router + (e0 + i < r.E ? e0 + i : r.E - 1) * r.row_bytes + 8 * sub;
  const GlobalInputRow input[1] = {{r.x + token * r.x_stride, a.H, vector_x}};
  float acc[kRouterOuts];
  accumulate_hfq4_rows<kGroup, kRouterOuts, kUpUnroll, 1>(acc, rows, input, lane_block, (a.H + kGroup - 1) / kGroup);
#pragma unroll
  for (int i = 0; i < kRouterOuts; ++i) {
    const float logit = warp_sum(acc[i]);
    if (lane == 0 && e0 + i < r.E) r.logits[token * r.E + e0 + i] = logit;
  }
}

// The (pair, activation tile) item: rows of expert ids[pair] (a.ids, or the launch's routing)
// for activations [i0, i0 + kUpOuts) of each warp, act(gate) * up into a.activated [pairs, I].
template <int kGroup>
__device__ void run_up_item(const MoeDecodeArgs& a, const int32_t* ids, int64_t pair, int64_t tile, bool vector_x) {
  using L = Hfq4Lanes<kGroup>;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int32_t expert = ids[pair];
  const int64_t i0 = (tile * kWarps + warp) * kUpOuts;
  if (expert < 0 || i0 >= a.I) return;  // (warp-uniform) another rank's pair, or past the last row
  const uint8_t* stack = a.gate_up.data + static_cast<int64_t>(expert) * a.gate_up.expert_bytes;
  constexpr int kRows = 2 * kUpOuts;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {  // gate rows, then the same up rows; past I: the last one, not stored
    const int64_t i = i0 + r % kUpOuts < a.I ? i0 + r % kUpOuts : a.I - 1;
    rows[r] = stack + (r < kUpOuts ? i : a.I + i) * a.gate_up.row_bytes + 8 * sub;
  }
  const GlobalInputRow input[1] = {{a.x + (pair / a.K) * a.x_stride, a.H, vector_x}};
  float acc[kRows];
  accumulate_hfq4_rows<kGroup, kRows, kUpUnroll, 1>(acc, rows, input, lane_block, (a.H + kGroup - 1) / kGroup);
#pragma unroll
  for (int r = 0; r < kUpOuts; ++r) {
    const float value = gated_value(warp_sum(acc[r]), warp_sum(acc[r + kUpOuts]), a.act);
    if (lane == 0 && i0 + r < a.I) a.activated[pair * a.I + i0 + r] = value;
  }
}

// The token's experts in ascending id order (moe_combine_kernel's order; top_k is small), with
// their weights; ids of -1 (another rank's) are kept in place and skipped by the sums.
struct TokenExperts {
  int32_t id[kMaxMoeDecodeTopK];
  float weight[kMaxMoeDecodeTopK];
  int pair[kMaxMoeDecodeTopK];  // the pair's index within the token
};

// The (token, column tile) item's sums, once the token's activations are in `act` [K, I] (shared
// memory): each warp's kDownOuts columns over the token's experts, kDownPairs at a time.
template <int kGroup>
__device__ void run_down_item(const MoeDecodeArgs& a, const TokenExperts& experts, const float* act, int64_t token,
                              int64_t tile) {
  using L = Hfq4Lanes<kGroup>;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int sub = lane % L::kLanesPerBlock, lane_block = lane / L::kLanesPerBlock;
  const int64_t c0 = (tile * kWarps + warp) * kDownOuts;
  if (c0 >= a.H) return;  // (warp-uniform)
  constexpr int kRows = kDownPairs * kDownOuts;
  float sum[kDownOuts];
#pragma unroll
  for (int c = 0; c < kDownOuts; ++c) sum[c] = 0.0f;
  for (int64_t j0 = 0; j0 < a.K; j0 += kDownPairs) {
    const uint8_t* rows[kRows];
    SharedInputRow inputs[kDownPairs];
#pragma unroll
    for (int q = 0; q < kDownPairs; ++q) {
      // pairs past K or of another rank: the last (largest-id) pair's rows and inputs, which a pass
      // loads anyway (no bytes of their own; expert 0 if the token has no expert here), sums unused
      const int64_t j = j0 + q < a.K && experts.id[j0 + q] >= 0 ? j0 + q : a.K - 1;
      const int64_t expert = experts.id[j] >= 0 ? experts.id[j] : 0;
      inputs[q] = {act + experts.pair[j] * shared_row_floats(a.I), a.I};
#pragma unroll
      for (int c = 0; c < kDownOuts; ++c) {
        const int64_t col = c0 + c < a.H ? c0 + c : a.H - 1;
        rows[q * kDownOuts + c] = a.down.data + expert * a.down.expert_bytes + col * a.down.row_bytes + 8 * sub;
      }
    }
    float acc[kRows];
    accumulate_hfq4_rows<kGroup, kRows, kDownUnroll, 1>(acc, rows, inputs, lane_block, (a.I + kGroup - 1) / kGroup);
#pragma unroll
    for (int q = 0; q < kDownPairs; ++q) {
      if (j0 + q >= a.K || experts.id[j0 + q] < 0) continue;  // (warp-uniform)
#pragma unroll
      for (int c = 0; c < kDownOuts; ++c) sum[c] = fmaf(warp_sum(acc[q * kDownOuts + c]), experts.weight[j0 + q], sum[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < kDownOuts; ++c)
    if (lane == 0 && c0 + c < a.H) a.out[token * a.out_stride + c0 + c] = sum[c];
}

// The token's activations [K, I] (written by other blocks in this launch, after their release and
// this block's acquire) into shared memory, padded (shared_row_index): four floats a load where I
// allows, no 64-bit division per element (the copy's volatile loads, one float each with a
// division, were ~8 % of the launch's warp time on the H100; thirty-sixth session).
__device__ __forceinline__ void stage_token_activations(const MoeDecodeArgs& a, int64_t token, float* token_act) {
  const float* src = a.activated + token * a.K * a.I;
  const int64_t row_floats = shared_row_floats(a.I);
  if (a.I % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int quads = static_cast<int>(a.I / 4), n = static_cast<int>(a.K) * quads;  // (within shared memory)
    for (int q = threadIdx.x; q < n; q += blockDim.x) {
      const int j = q / quads, k = 4 * (q - j * quads);  // (k .. k + 3: within one padded run of 16)
      const float4 v = gpu::load_other_blocks(reinterpret_cast<const float4*>(src + j * a.I + k));
      float* dst = token_act + j * row_floats + shared_row_index(k);
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
  } else {
    for (int64_t j = 0; j < a.K; ++j)
      for (int64_t k = threadIdx.x; k < a.I; k += blockDim.x)
        token_act[j * row_floats + shared_row_index(k)] = gpu::load_other_blocks(src + j * a.I + k);
  }
}

template <int kGroupUp, int kGroupDown>
__global__ void __launch_bounds__(kWarps* kWarp, kMaxBlocksPerSm)
    moe_experts_decode_kernel(MoeDecodeArgs a, bool vector_x, bool vector_route_x) {
  extern __shared__ float token_act[];  // [K, I] padded (shared_row_index): the staged token's activations
  __shared__ TokenExperts experts;
  __shared__ int32_t routed_id[kMaxMoeDecodeTopK];  // the staged token's routing, in routing order
  __shared__ float routed_weight[kMaxMoeDecodeTopK];
  // With a.route: every token's routing [T, K], made by this block from the launch's logits
  __shared__ int32_t route_ids[kMaxMoeDecodeTokens * kMaxMoeDecodeTopK];
  __shared__ float route_weights[kMaxMoeDecodeTokens * kMaxMoeDecodeTopK];
  __shared__ int64_t next_item;
  enter_kernel();
  const auto [router_tiles, router_items, up_tiles, down_tiles, first_down, items] = work_items(a);
  const bool routes = a.route.router != nullptr;
  bool routed = !routes;  // whether ids and weights hold the routing yet (block-uniform)
  int64_t staged_token = -1;  // whose activations token_act holds
  if (threadIdx.x == 0) next_item = atomicAdd(counter(a, kTicket), 1);
  __syncthreads();
  for (int64_t item = next_item; item < items;) {
    // The next ticket, asked for now so that its round trip overlaps this item's work (a block
    // holding a router or up ticket never waits for a later item: its current item is earlier).
    int64_t ticket = 0;
    if (threadIdx.x == 0) ticket = atomicAdd(counter(a, kTicket), 1);
    if (item >= router_items && !routed) {
      // Every router item is held by a running block, which does not wait: wait for their count,
      // then route every token here, a warp per token (the logits: volatile, written in this launch).
      if (threadIdx.x == 0) {
        while (*reinterpret_cast<volatile int32_t*>(counter(a, kRouterDone)) < router_items) gpu::pause_between_polls();
        __threadfence();
      }
      __syncthreads();
      const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
      if (warp < a.T) {
        const volatile float* logits = a.route.logits + warp * a.route.E;
        route_token_in_warp<kRoutePerLane>(logits, a.route.E, a.K, a.route.per_expert_scale, a.route.scale_type,
                                           &route_ids[warp * a.K + lane], &route_weights[warp * a.K + lane]);
      }
      __syncthreads();
      routed = true;
      if (item == router_items && threadIdx.x < a.T * a.K) {  // the first up item's block writes the routing out
        a.route.ids[threadIdx.x] = route_ids[threadIdx.x];
        a.route.weights[threadIdx.x] = route_weights[threadIdx.x];
      }
    }
    if (item < router_items) {
      run_router_item<kGroupUp>(a, item / router_tiles, item % router_tiles, vector_route_x);
      __syncthreads();  // every warp's stores, then one release
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter(a, kRouterDone), 1);
      }
    } else if (item < first_down) {
      const int64_t up_item = item - router_items;
      run_up_item<kGroupUp>(a, routes ? route_ids : a.ids, up_item / up_tiles, up_item % up_tiles, vector_x);
      __syncthreads();  // every warp's stores, then one release: the fence, then the count
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter(a, kUpDone), 1);
      }
    } else {
      const int64_t token = (item - first_down) / down_tiles, tile = (item - first_down) % down_tiles;
      if (token != staged_token) {
        __syncthreads();  // the previous token's experts and activations are no longer read
        if (threadIdx.x < a.K) {  // (one load each, at once: not K round trips in thread 0's sort)
          routed_id[threadIdx.x] = (routes ? route_ids : a.ids)[token * a.K + threadIdx.x];
          routed_weight[threadIdx.x] = (routes ? route_weights : a.weights)[token * a.K + threadIdx.x];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          for (int j = 0; j < a.K; ++j) {  // insertion sort by id, as moe_combine_kernel orders
            const int32_t id = routed_id[j];
            int at = j;
            for (; at > 0 && experts.id[at - 1] > id; --at) {
              experts.id[at] = experts.id[at - 1];
              experts.weight[at] = experts.weight[at - 1];
              experts.pair[at] = experts.pair[at - 1];
            }
            experts.id[at] = id;
            experts.weight[at] = routed_weight[j];
            experts.pair[at] = j;
          }
        }
        __syncthreads();
      }
      // This item's down rows into L2 while the up items finish (weights: no ordering needed).
      const int64_t c0 = tile * kWarps * kDownOuts;
      const int64_t cols = c0 + kWarps * kDownOuts <= a.H ? kWarps * kDownOuts : a.H - c0;
      const int64_t lines = (cols * a.down.row_bytes + 127) / 128;
      for (int64_t i = threadIdx.x; i < a.K * lines; i += blockDim.x) {
        const int32_t id = experts.id[i / lines];
        if (id >= 0) prefetch_l2(a.down.data + id * a.down.expert_bytes + c0 * a.down.row_bytes + (i % lines) * 128);
      }
      if (token != staged_token) {
        if (threadIdx.x == 0) {
          while (*reinterpret_cast<volatile int32_t*>(counter(a, kUpDone)) < first_down - router_items)
            gpu::pause_between_polls();
          __threadfence();
        }
        __syncthreads();
        stage_token_activations(a, token, token_act);
        __syncthreads();
        staged_token = token;
      }
      run_down_item<kGroupDown>(a, experts, token_act, token, tile);
    }
    __syncthreads();  // (next_item's previous value read by every thread)
    if (threadIdx.x == 0) next_item = ticket;
    __syncthreads();
    item = next_item;
  }
  if (threadIdx.x == 0) __threadfence();  // (this block's last ticket and waits before its count out)
  if (threadIdx.x == 0 && atomicAdd(counter(a, kBlocksOut), 1) == static_cast<int>(gridDim.x) - 1) {
    // every block has taken its last ticket and passed its waits: ready for the next launch
    *counter(a, kTicket) = 0;
    *counter(a, kUpDone) = 0;
    *counter(a, kBlocksOut) = 0;
    *counter(a, kRouterDone) = 0;
    __threadfence();
  }
}

template <int kGroupUp, int kGroupDown>
cudaError_t launch_groups(const MoeDecodeArgs& a, cudaStream_t stream) {
  auto kernel = moe_experts_decode_kernel<kGroupUp, kGroupDown>;
  const size_t smem = moe_experts_decode_shared_bytes(a.K, a.I);
  // Blocks per SM that fit at once (the grid may not exceed them: see above), asked once per
  // device, instance and shared size: eager decode launches this every layer.
  struct Resident {
    int device = -1;
    size_t smem = 0;
    int blocks = 0;
  };
  thread_local Resident known;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (known.device != device || known.smem != smem) {
    int resident = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kWarps * kWarp, smem);
    if (err != cudaSuccess) return err;
    known = Resident{device, smem, resident};
  }
  const int resident = known.blocks;
  if (resident < 1) return cudaErrorInvalidValue;
  const int64_t items = work_items(a).items;
  const int per_sm = a.blocks_per_sm < resident ? a.blocks_per_sm : resident;
  const int64_t slots = static_cast<int64_t>(current_device_traits().sm_count) * (per_sm > 1 ? per_sm : 1);
  auto vector_ok = [&](const float* x, int64_t stride) {  // 16-byte loads of every token's row
    return reinterpret_cast<uintptr_t>(x) % 16 == 0 && (stride % 4 == 0 || a.T == 1);
  };
  return launch_kernel(kernel, static_cast<unsigned>(items < slots ? items : slots), kWarps * kWarp, smem, stream, a,
                       vector_ok(a.x, a.x_stride), a.route.router && vector_ok(a.route.x, a.route.x_stride));
}

std::atomic<int64_t> g_launches{0};  // moe_experts_decode_launches

}  // namespace

size_t moe_experts_decode_shared_bytes(int64_t K, int64_t I) {
  return static_cast<size_t>(K * shared_row_floats(I)) * sizeof(float);
}

bool moe_experts_decode_supports(DType gate_up, DType down, int64_t T, int64_t K, int64_t I) {
  return hfq4_group_size(gate_up) > 0 && hfq4_group_size(down) > 0 && T >= 1 && T <= kMaxMoeDecodeTokens && K >= 1 &&
         K <= kMaxMoeDecodeTopK && moe_experts_decode_shared_bytes(K, I) <= kMoeDecodeMaxSharedBytes;
}

bool moe_experts_decode_routes(DType router, DType gate_up, int64_t E, int64_t K) {
  return router == gate_up && hfq4_group_size(router) > 0 && E >= K && E <= kRoutePerLane * kWarp;
}

cudaError_t launch_moe_experts_decode(const MoeDecodeArgs& a, cudaStream_t stream) {
  if (!moe_experts_decode_supports(a.gate_up.type, a.down.type, a.T, a.K, a.I) || a.H < 1 || a.blocks_per_sm < 1 ||
      a.blocks_per_sm > kMaxBlocksPerSm)
    return cudaErrorInvalidValue;
  if (a.route.router && (!moe_experts_decode_routes(a.route.type, a.gate_up.type, a.route.E, a.K) || !a.route.x ||
                         !a.route.logits || !a.route.ids || !a.route.weights))
    return cudaErrorInvalidValue;
  const int up = hfq4_group_size(a.gate_up.type), down = hfq4_group_size(a.down.type);
  const cudaError_t err = up == 256 ? (down == 256 ? launch_groups<256, 256>(a, stream) : launch_groups<256, 128>(a, stream))
                                    : (down == 256 ? launch_groups<128, 256>(a, stream) : launch_groups<128, 128>(a, stream));
  if (err == cudaSuccess) g_launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

int64_t moe_experts_decode_launches() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace fl::cuda
