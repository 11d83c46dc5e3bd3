// Fuzzes what the model store accepts from users and registries: model names, URLs and registry
// JSON. Any input must be accepted or fail with fl::Error; a name that is accepted must map to
// files directly inside its family folder of the store (no traversal, no hidden files).
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "store/http_client.h"
#include "store/model_store.h"
#include "store/pull.h"
#include "store/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const fl::ModelStore store("/store/models");
  try {
    const fl::ModelName name = fl::parse_model_name(text);
    for (const std::filesystem::path& p : {store.model_path(name), store.manifest_path(name), store.partial_path(name)}) {
      if (p.lexically_normal() != p || p.parent_path() != store.dir() / name.family || name.family.empty() ||
          name.family.front() == '.' || name.tag.front() == '.')
        __builtin_trap();
    }
  } catch (const fl::Error&) {
  }
  try {
    fl::parse_http_url(text);
    fl::model_name_from_url(text);
  } catch (const fl::Error&) {
  }
  try {
    fl::parse_registry(text, "fuzz");
  } catch (const fl::Error&) {
  }
  return 0;
}
