#pragma once
// Synthetic models: the exact tensor names, shapes and weight formats of a published model, with
// random weights, built in memory. They let `fireline bench` measure speed on the real shapes
// without downloading tens of gigabytes (and `fireline synth` will write them as .fire files).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_source.h"

namespace fl {

struct SyntheticOptions {
  std::string like;              // one of synthetic_model_names()
  std::string format = "hf4";    // weight policy: hf4, hf6, q8, bf16, f32 (DESIGN §4)
  uint64_t seed = 1;
  TokenizerFiles tokenizer;      // carried as they are (none by default: bench needs no text)
};

std::vector<std::string> synthetic_model_names();

// Weights are generated when first asked for and live as long as the source.
std::unique_ptr<ModelSource> make_synthetic_source(const SyntheticOptions& options);

}  // namespace fl
