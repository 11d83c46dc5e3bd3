#pragma once
// Gemma 4 (dense, 26B-A4B MoE, E2B/E4B): see gemma4.cpp.
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weight_spec.h"

namespace fl {

std::unique_ptr<Model> make_gemma4_model(const ModelSource& source, Backend& backend);

// Every tensor the Gemma 4 model reads, with the shape the config implies.
std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& config);

// Weights (as stored in `source`), KV cache at options.max_seq, and scratch for
// options.max_tokens tokens per forward (the model's arena plus the backend's workspace).
MemoryPlan gemma4_memory_plan(const ModelSource& source, const LoadOptions& options);

}  // namespace fl
