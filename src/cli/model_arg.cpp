#include "cli/model_arg.h"

#include <filesystem>

#include "core/error.h"

namespace fl::cli {

std::string resolve_model_arg(const std::string& arg) {
  std::error_code ec;
  if (!arg.empty() && std::filesystem::exists(arg, ec)) return arg;
  fail("unknown model '{}' (see `fireline list`)", arg);
}

std::string default_model_path() {
  fail("no default model is built in yet: give a MODEL (a Hugging Face directory or a .fire file)");
}

}  // namespace fl::cli
