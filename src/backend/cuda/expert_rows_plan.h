#pragma once
// Which shape of the HFQ4 rows kernel decode's routed expert pairs take (matmul.cu,
// BackendOptions::expert_matvec): plain host arithmetic, without the GPU runtime's headers, so
// that host-only tests check the choice.
#include <cstdint>
#include <functional>

namespace fl::cuda {

// Rows per warp and warp steps of loads in flight per lane; {0, 0}: the plain products' choice.
struct ExpertRowsShape {
  int rows = 0, steps = 0;
  constexpr bool operator==(const ExpertRowsShape& o) const { return rows == o.rows && steps == o.steps; }
};  // (no defaulted ==: .cu files build as C++17)
// The shapes built for expert pairs, in the order auto prefers on a tie (fewer registers first).
inline constexpr ExpertRowsShape kExpertRowsShapes[] = {{4, 2}, {2, 4}, {4, 3}, {4, 4}, {8, 2}, {8, 3}};

// The shape the plain products' rule (launch_hfq4) gives n_pairs routed pairs of M rows of K
// weights in `group`-weight blocks on sm_count SMs (one of the above, or {1, 4}).
ExpertRowsShape plain_expert_rows_shape(int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count);

// How many latency rounds the slowest warps of that launch wait: its waves (4-warp blocks,
// blocks_per_sm resident on each SM) times its rounds of loads (a row's warp steps over `steps`).
int64_t expert_rows_cost(ExpertRowsShape shape, int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count,
                         int blocks_per_sm);

// The most pairs auto moves off the plain shape: one token's top 8 (both models it was timed on).
inline constexpr int64_t kExpertRowsAutoMaxPairs = 8;

// BackendOptions::expert_matvec's automatic choice: {0, 0} (keep the plain shape) unless the
// launch has at most kExpertRowsAutoMaxPairs pairs and the plain shape's cost is 3 or more, else
// the built shape of least cost (ties: the earlier one). The threshold keeps what was measured
// (H200, one token, thirty-eighth session): the 26B-A4B's gate_up (plain cost 6) and down (3)
// gained together (decode +2.2 %), the Qwen3.5-35B-A3B's (2 and 2) lost 0.6 % when moved.
// Several tokens' launches (batched decode's per-pair path) were not timed and stay plain.
// blocks_per_sm: the SM's resident 4-warp blocks of a shape's kernel. Counts every pair, --ep's
// dropped ones (id -1, whose blocks return at once) too, and 32-lane warps.
ExpertRowsShape auto_expert_rows_shape(int64_t M, int64_t K, int group, int64_t n_pairs, int sm_count,
                                       const std::function<int(ExpertRowsShape)>& blocks_per_sm);

}  // namespace fl::cuda
