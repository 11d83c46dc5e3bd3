#pragma once
// How one model's weights split over the GPUs of a host (issue 10: --tp N tensor parallelism,
// --ep expert parallelism), decided before anything is loaded. Megatron's scheme for the dense
// parts: each rank owns whole attention heads (q/k/v rows, o_proj columns) and a slice of every
// MLP's intermediate (gate/up rows, down columns); o_proj and down_proj outputs are partial sums
// that one all-reduce per block adds up. With --ep the MoE experts are dealt out whole, in
// contiguous blocks, and the expert block's output is all-reduced too. Embeddings, the LM head,
// norms and routers are replicated.
//
// Qwen3.5's Gated DeltaNet layers split the same way by head: a rank owns whole value heads (their
// rows of in_proj_z/b/a, A_log, dt_bias, out_proj's columns) and the key heads those read; its
// rows of the fused in_proj_qkv (and the conv taps of those channels) are three runs, its Q, K and
// V heads. Its MoE block (routed experts and the shared expert) stays whole on every rank unless
// --ep deals the routed experts out: a split shared expert would save each rank a few hundred KB
// per layer but cost an all-reduce per layer, which at decode takes longer than reading them.
//
// Quantized rows are packed in blocks along K (HFQ4: 256 or 128 weights per block), so a column
// split of o_proj / down_proj can only cut at block boundaries: the plan splits the MLP
// intermediate in units of the down projection's block, which makes shards unequal when I / N is
// not a whole number of blocks (26B-A4B: I = 2112 = 16.5 blocks of 128), and the last rank takes
// the padded tail block. Heads are 256 or 512 wide, whole blocks in every format.
//
// When there are fewer KV heads than ranks (Gemma 4's global layers: 2 or 4), each KV head is
// replicated on the ranks whose query heads read it.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "io/hf_config.h"
namespace fl {

class ModelSource;

enum class ShardSplit {
  replicated,  // every rank holds the whole tensor
  rows,        // dim 0 of a matrix (expert stacks [E, out, in] split only by whole experts)
  columns,     // dim 1 (the K of a [out, in] matrix), at block boundaries
  experts,     // dim 0 of an expert stack
};

struct TensorShard {
  std::string name;             // as in the architecture's weight specs
  std::vector<int64_t> shape;   // the whole tensor's
  DType dtype = DType::f32;     // the format the split was planned for
  ShardSplit split = ShardSplit::replicated;
  std::vector<int64_t> begin, end;  // per rank: the [begin, end) range along the split dim
  // A rows split whose rank part is several runs of the split dim, in order (Qwen3.5's fused
  // in_proj_qkv and conv taps: the rank's Q, K and V heads); empty when the part is [begin, end),
  // else begin/end are the first run's start and the last run's end.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs;
};

struct ParallelOptions {
  int tensor_parallel = 1;  // --tp: ranks
  bool expert_parallel = false;  // --ep: deal the experts out over the same ranks
};

struct ParallelPlan {
  int ranks = 1;
  std::vector<TensorShard> tensors;
  int all_reduces_per_layer = 0;  // o_proj, the MLP, and the expert block when --ep
  std::vector<int64_t> rank_bytes;  // weight bytes each rank holds
};

// The weight format each tensor will have (the quant policy's choice, or the .fire file's).
using WeightFormatOf = std::function<DType(const std::string& name, const std::vector<int64_t>& shape)>;

// Throws fl::Error naming the reason when the model cannot be split that way (query or KV heads
// not divisible by the ranks, an intermediate of less than one block per rank, fewer experts
// than ranks).
ParallelPlan plan_gemma4_parallel(const Gemma4Config& config, const ParallelOptions& options,
                                  const WeightFormatOf& format_of);
// Likewise for Qwen3.5 (value heads or linear key heads that do not split evenly are errors too).
ParallelPlan plan_qwen35_parallel(const Qwen35Config& config, const ParallelOptions& options,
                                  const WeightFormatOf& format_of);
// The plan for whichever architecture `config` is.
ParallelPlan plan_model_parallel(const ModelConfig& config, const ParallelOptions& options,
                                 const WeightFormatOf& format_of);
// Whether the architecture has routed experts for --ep to deal out.
bool has_routed_experts(const ModelConfig& config);

// Each tensor's format as `source` stores it, by weight-spec name (under the source's model
// prefix; lm_head.weight outside it). A fused expert stack the source holds per expert
// (mlp.experts.{e}.{gate,up,down}_proj.weight) has expert 0's format. Fails naming a missing tensor.
WeightFormatOf source_weight_formats(const ModelSource& source);

// Rank `rank`'s [begin, end) runs along the split dim: `runs[rank]`, or the one range.
std::vector<std::pair<int64_t, int64_t>> shard_runs(const TensorShard& shard, int rank);

// The bytes of rank `rank`'s part of a packed tensor `data` (the layout of core/dtype.h: rows of
// ceil(K / block) blocks), as a contiguous tensor of the shard's shape.
std::vector<uint8_t> extract_shard(const TensorShard& shard, int rank, const uint8_t* data);

// The shard's shape on `rank`.
std::vector<int64_t> shard_shape(const TensorShard& shard, int rank);

// Where rank `rank`'s part starts in the packed tensor, when it is one contiguous run of it (a
// replicated tensor, or whole rows / experts in one run): the part can then be a view of the
// tensor instead of a copy. Nothing for column splits and several runs.
std::optional<int64_t> shard_byte_offset(const TensorShard& shard, int rank);

}  // namespace fl
