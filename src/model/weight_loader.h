#pragma once
// Finds a model's tensors by their HF names, whatever prefix the checkpoint uses
// (model.language_model.* for the multimodal wrapper, model.* for text-only *ForCausalLM, or
// none), checks each shape against what the config implies, and hands the backend's copy to the
// model.
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "io/model_source.h"

namespace fl {

// The prefix under which the checkpoint holds `probe` ("model.language_model.", "model." or ""),
// or nullopt when it holds it under none.
std::optional<std::string> find_weight_prefix(const ModelSource& source, std::string_view probe);

class WeightLoader {
 public:
  // `probe` is a tensor every checkpoint of the architecture has (e.g. "embed_tokens.weight").
  WeightLoader(const ModelSource& source, Backend& backend, std::string_view probe);

  // The tensor `name` (without prefix) with exactly `shape`; throws naming the tensor otherwise.
  Tensor get(const std::string& name, std::initializer_list<int64_t> shape);
  // Same, or an empty tensor (data == nullptr) when the checkpoint lacks it.
  Tensor get_optional(const std::string& name, std::initializer_list<int64_t> shape);
  // A tensor looked up without the model prefix (lm_head.weight sits outside model.*).
  Tensor get_unprefixed_optional(const std::string& name, std::initializer_list<int64_t> shape);

  const std::string& prefix() const { return prefix_; }

 private:
  Tensor check_and_upload(const std::string& full_name, const Tensor& t, std::initializer_list<int64_t> shape);
  const ModelSource& source_;
  Backend& backend_;
  std::string prefix_;
};

}  // namespace fl
