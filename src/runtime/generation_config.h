#pragma once
// What a model's generation_config.json says about generating: the end-of-sequence ids (Gemma 4:
// [1, 106, 50] = <eos>, <turn|>, <|tool_response>) and the sampling defaults its authors chose
// (Gemma 4: temperature 1.0, top_k 64, top_p 0.95). Command-line flags and request fields
// override the sampling values.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"

namespace fl {

struct GenerationDefaults {
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
  SamplingParams sampling;  // SamplingParams' own defaults where the file says nothing
};

// `json_text` may be empty (no generation_config.json). eos_token_id there may be one id or a
// list; without it, `fallback_eos` (config.json's eos_token_id) is used. do_sample: false means
// greedy (temperature 0); suppress_tokens become a -inf logit bias. Values of the wrong type or
// out of range throw fl::Error naming `source` and the key.
GenerationDefaults parse_generation_config(std::string_view json_text, const std::vector<int32_t>& fallback_eos,
                                           std::string_view source);

}  // namespace fl
