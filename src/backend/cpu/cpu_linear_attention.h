#pragma once
// The CPU oracle's linear-attention ops (Gated DeltaNet, Qwen3.5): see the contracts on the
// Backend entries of the same names in backend/backend.h. Plain loops in f32, mirroring
// transformers 5.17's torch fallbacks (torch_recurrent_gated_delta_rule,
// torch_chunk_gated_delta_rule, causal_conv1d_fn/_update). Value heads are independent, so
// threads split heads and results do not depend on the thread count.
#include "backend/backend.h"

namespace fl::cpu {

void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act);
void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                      const Tensor& dt_bias);
void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const Tensor& beta, Tensor state, const DeltaRuleParams& params);
void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, Tensor state, const DeltaRuleParams& params);
void sigmoid_gate(Tensor x, const Tensor& gate);

}  // namespace fl::cpu
