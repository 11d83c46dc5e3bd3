#pragma once
// Qwen3.5 (Gated DeltaNet hybrid; dense 0.8B-27B and the 35B-A3B / 397B-A17B mixtures of
// experts): see qwen35.cpp.
#include <memory>
#include <vector>

#include "model/model.h"
#include "model/weight_spec.h"

namespace fl {

class Communicator;

std::unique_ptr<Model> make_qwen35_model(const ModelSource& source, Backend& backend);

// One rank of a model split with --tp (issue 10): built from the rank's source
// (model/rank_source.h), which it keeps, on that rank's backend; `comm` (one per rank, living as
// long as the model) adds up the ranks' partial outputs of each mixer, the dense MLP and, with
// --ep, the routed experts: the plan's all-reduces per layer. Every rank's logits are the same bits.
std::unique_ptr<Model> make_qwen35_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend,
                                              Communicator& comm);

// Every tensor the Qwen3.5 model reads, with the shape the config implies; experts in the fused
// form (mlp.experts.gate_up_proj [E, 2 I, H], mlp.experts.down_proj [E, H, I]). Checkpoints that
// store them per expert (mlp.experts.{e}.{gate,up,down}_proj.weight) load too.
std::vector<WeightSpec> qwen35_weight_specs(const Qwen35Config& config);

// Weights (as stored in `source`), KV cache of the full-attention layers at options.max_seq,
// recurrent state of the linear-attention layers, and scratch for options.max_tokens tokens per
// forward (the model's arena plus the backend's workspace).
MemoryPlan qwen35_memory_plan(const ModelSource& source, const LoadOptions& options);

}  // namespace fl
