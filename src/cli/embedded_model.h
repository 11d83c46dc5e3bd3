#pragma once
// Models built into the executable (see embedded_model.cpp).
#include <string_view>

namespace fl::cli {

inline constexpr std::string_view kDefaultModelName = "fireline-tiny";  // opened as "embedded:fireline-tiny"

void register_builtin_models();   // call once at start-up, before any command runs
bool has_builtin_default_model();  // false when built with FIRELINE_EMBED_DEFAULT_MODEL=OFF

}  // namespace fl::cli
