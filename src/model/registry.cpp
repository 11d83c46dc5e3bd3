// The architecture registry: the one place that maps a config's architecture to its model code.
#include <functional>
#include <map>

#include "core/error.h"
#include "model/gemma4.h"
#include "model/model.h"

namespace fl {

std::unique_ptr<Model> load_model(const ModelSource& source, Backend& backend, const LoadOptions&) {
  using Factory = std::function<std::unique_ptr<Model>(const ModelSource&, Backend&)>;
  static const std::map<std::string, Factory> kArchitectures = {
      {"gemma4", make_gemma4_model},
  };
  const std::string& arch = source.config().architecture;
  auto it = kArchitectures.find(arch);
  if (it == kArchitectures.end()) fail("{}: no model code for architecture '{}'", source.path(), arch);
  return it->second(source, backend);
}

}  // namespace fl
