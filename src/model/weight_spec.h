#pragma once
// The tensors an architecture reads, by HF name and the shape its config implies: the memory
// plan, the synthetic models and the quantizer's default policy key on these.
#include <cstdint>
#include <string>
#include <vector>

namespace fl {

// What a tensor is for.
enum class WeightKind {
  vector,      // 1-D: norm gains, scales, layer scalars
  embedding,   // token embedding tables (and the tied LM head)
  matrix,      // 2-D projection [out, in] (and small per-channel filters such as conv taps)
  experts,     // 3-D fused expert stack [experts, out, in]
};

struct WeightSpec {
  std::string name;  // HF name without the model prefix ("layers.0.self_attn.q_proj.weight")
  std::vector<int64_t> shape;
  WeightKind kind;
};

}  // namespace fl
