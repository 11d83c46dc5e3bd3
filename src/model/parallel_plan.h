#pragma once
// How one model's weights split over the GPUs of a host (issue 10: --tp N tensor parallelism,
// --ep expert parallelism), decided before anything is loaded. Megatron's scheme for the dense
// parts: each rank owns whole attention heads (q/k/v rows, o_proj columns) and a slice of every
// MLP's intermediate (gate/up rows, down columns); o_proj and down_proj outputs are partial sums
// that one all-reduce per block adds up. With --ep the MoE experts are dealt out whole, in
// contiguous blocks, and the expert block's output is all-reduced too. Embeddings, the LM head,
// norms and routers are replicated.
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
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/hf_config.h"

namespace fl {

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

// The bytes of rank `rank`'s part of a packed tensor `data` (the layout of core/dtype.h: rows of
// ceil(K / block) blocks), as a contiguous tensor of the shard's shape.
std::vector<uint8_t> extract_shard(const TensorShard& shard, int rank, const uint8_t* data);

// The shard's shape on `rank`.
std::vector<int64_t> shard_shape(const TensorShard& shard, int rank);

}  // namespace fl
