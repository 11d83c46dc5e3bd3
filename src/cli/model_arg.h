#pragma once
// What a MODEL argument on the command line names. Today: a path (a Hugging Face directory or a
// .fire file). The model store (`pull`, `list`) will add names like `gemma4:26b-a4b`; it replaces
// the body of resolve_model_arg, and the embedded default model the body of default_model_path,
// without changing any caller.
#include <string>

namespace fl::cli {

// The path to load for `arg`; throws fl::Error "unknown model 'X' (see `fireline list`)" when
// it names nothing.
std::string resolve_model_arg(const std::string& arg);

// The model `run` uses when none is given; throws fl::Error when there is none.
std::string default_model_path();

}  // namespace fl::cli
