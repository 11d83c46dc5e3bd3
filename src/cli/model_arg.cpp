#include "cli/model_arg.h"

#include <algorithm>
#include <filesystem>

#include "cli/embedded_model.h"
#include "core/error.h"
#include "io/model_source.h"
#include "model/synthetic.h"
#include "store/model_store.h"

namespace fl::cli {

std::string resolve_model_arg(const std::string& arg) {
  // A file or folder of that name wins over a built-in model of the same name.
  std::error_code ec;
  if (!arg.empty() && std::filesystem::exists(arg, ec)) return arg;
  const std::vector<std::string> builtin = embedded_model_names();
  const std::string as_embedded =
      arg.starts_with(kEmbeddedPrefix) ? arg : std::string(kEmbeddedPrefix) + arg;
  if (std::find(builtin.begin(), builtin.end(), as_embedded) != builtin.end()) return as_embedded;
  // What can only be a path (a name has no '/' and no file suffix) is a missing file, not an
  // unknown name.
  if (arg.find('/') != std::string::npos || arg.ends_with(".fire") || arg.ends_with(".gguf") ||
      arg.ends_with(".safetensors"))
    fail("{}: no such file or directory", arg);
  return fl::resolve_model_arg(arg);  // the store, or the error that names `list` and `pull`
}

std::unique_ptr<ModelSource> open_model_or_synthetic(std::string_view command, const std::string& model,
                                                     const std::string& like, const std::string& format) {
  if (model.empty() == like.empty()) fail("{} needs a MODEL or --like NAME (not both)", command);
  if (!format.empty() && like.empty()) fail("--format applies to a --like model; MODEL has its own formats");
  if (like.empty()) return open_model_source(resolve_model_arg(model));
  return make_synthetic_source({like, format.empty() ? "hf4" : format, 1, {}});
}

std::string synthetic_model_list() {
  std::string names;
  for (const auto& n : synthetic_model_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

std::string default_model_path() {
  if (!has_builtin_default_model())
    fail("this fireline was built without the default model: give a MODEL (a .fire file, a Hugging Face "
         "directory, or a name from `fireline list`)");
  return std::string(kEmbeddedPrefix) + std::string(kDefaultModelName);
}

}  // namespace fl::cli
