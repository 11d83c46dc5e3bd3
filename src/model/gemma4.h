#pragma once
// Gemma 4 (dense, 26B-A4B MoE, E2B/E4B): see gemma4.cpp.
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weight_spec.h"

namespace fl {

class Communicator;

std::unique_ptr<Model> make_gemma4_model(const ModelSource& source, Backend& backend);

// One rank of a model split with --tp (issue 10): built from the rank's source
// (model/rank_source.h), which it keeps, on that rank's backend; `comm` (one per rank, living as
// long as the model) adds up the ranks' partial outputs of o_proj and down_proj, and with --ep
// of the expert block: the plan's all-reduces per layer. Every rank's logits are the same bits.
std::unique_ptr<Model> make_gemma4_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend,
                                              Communicator& comm);

// Every tensor the Gemma 4 model reads, with the shape the config implies.
std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& config);

// Weights (as stored in `source`), KV cache at options.max_seq, and scratch for
// options.max_tokens tokens per forward (the model's arena plus the backend's workspace).
MemoryPlan gemma4_memory_plan(const ModelSource& source, const LoadOptions& options);

}  // namespace fl
