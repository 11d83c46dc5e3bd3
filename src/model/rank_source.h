#pragma once
// One rank's view of a model split by a ParallelPlan (issue 10, model/parallel_plan.h): a
// ModelSource whose tensors are that rank's shards and whose config counts the rank's own query
// and KV heads (Qwen3.5: also its value and key heads of the DeltaNet layers) and MLP width, so
// that the ordinary model code builds the rank's part of the model from it. What the split leaves
// to the model is adding up the partial sums (the all-reduces after o_proj / out_proj, the dense
// MLP and, with --ep, the experts: make_rank_model).
#include <memory>

#include "io/model_source.h"
#include "model/parallel_plan.h"

namespace fl {

// Shards are cut (or, when contiguous, viewed) when this is called, from `whole`'s tensors, which
// must outlive the result, so the rank sources of several ranks can be made on one thread and then
// used by one thread each. With --ep the config names the rank's experts (expert_first /
// expert_count of Gemma4Config or Qwen35Config), and per-expert tensors (mlp.experts.{e}.*) are
// the rank's own, renumbered from 0.
// Throws when a tensor's format is not the one the plan was made for.
std::unique_ptr<ModelSource> make_rank_source(const ModelSource& whole, const ParallelPlan& plan, int rank);

}  // namespace fl
