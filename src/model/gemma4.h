#pragma once
// Gemma 4 (dense, 26B-A4B MoE, E2B/E4B): see gemma4.cpp.
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace fl {

std::unique_ptr<Model> make_gemma4_model(const ModelSource& source, Backend& backend);

// What a tensor is for; the quantizer's default policy and the synthetic models key on it.
enum class WeightKind {
  vector,      // 1-D: norm gains, scales, layer scalars
  embedding,   // token embedding tables (and the tied LM head)
  matrix,      // 2-D projection [out, in]
  experts,     // 3-D fused expert stack [experts, out, in]
};

struct WeightSpec {
  std::string name;  // HF name without the model prefix ("layers.0.self_attn.q_proj.weight")
  std::vector<int64_t> shape;
  WeightKind kind;
};

// Every tensor the Gemma 4 model reads, with the shape the config implies.
std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& config);

// Weights (as stored in `source`), KV cache at options.max_seq, and scratch for
// options.max_tokens tokens per forward (the model's arena plus the backend's workspace).
MemoryPlan gemma4_memory_plan(const ModelSource& source, const LoadOptions& options);

}  // namespace fl
