#include "model/weight_loader.h"

#include "core/error.h"

namespace fl {

std::optional<std::string> find_weight_prefix(const ModelSource& source, std::string_view probe) {
  for (const char* prefix : {"model.language_model.", "model.", ""})
    if (source.find(std::string(prefix) + std::string(probe))) return prefix;
  return std::nullopt;
}

WeightLoader::WeightLoader(const ModelSource& source, Backend& backend, std::string_view probe)
    : source_(source), backend_(backend) {
  std::optional<std::string> prefix = find_weight_prefix(source, probe);
  if (!prefix)
    fail("{}: tensor '{}' not found under any known prefix (model.language_model., model., none)", source.path(),
         probe);
  prefix_ = std::move(*prefix);
}

Tensor WeightLoader::check_and_upload(const std::string& full_name, const Tensor& t,
                                      std::initializer_list<int64_t> shape) {
  bool ok = t.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) ok = ok && t.shape[i++] == d;
  if (!ok) {
    std::string want;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    fail("{}: tensor '{}' is {} but the config implies [{}]", source_.path(), full_name, t.describe(), want);
  }
  if (!is_weight_type(t.dtype))
    fail("{}: tensor '{}' has type {}, which cannot be used as a weight", source_.path(), full_name, dtype_name(t.dtype));
  return backend_.upload_weight(t);
}

Tensor WeightLoader::get(const std::string& name, std::initializer_list<int64_t> shape) {
  Tensor t = get_optional(name, shape);
  if (!t.data) fail("{}: missing tensor '{}{}'", source_.path(), prefix_, name);
  return t;
}

Tensor WeightLoader::get_optional(const std::string& name, std::initializer_list<int64_t> shape) {
  auto t = source_.find(prefix_ + name);
  if (!t) return Tensor{};
  return check_and_upload(prefix_ + name, *t, shape);
}

Tensor WeightLoader::get_unprefixed_optional(const std::string& name, std::initializer_list<int64_t> shape) {
  auto t = source_.find(name);
  if (!t) return Tensor{};
  return check_and_upload(name, *t, shape);
}

}  // namespace fl
