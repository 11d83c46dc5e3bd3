#pragma once
// What a MODEL argument on the command line names: a path (a Hugging Face directory or a .fire
// file), a model in the store (`gemma4:26b-a4b`, see store/model_store.h), or a model built into
// the executable (`embedded:fireline-tiny`, or just `fireline-tiny`).
#include <string>

namespace fl::cli {

// The source to open for `arg` (a path or "embedded:NAME"); throws fl::Error when it names
// nothing: "PATH: no such file or directory" for what looks like a path (a '/', or a .fire,
// .gguf or .safetensors suffix), else "unknown model 'X' (see `fireline list`, or `fireline pull`)".
std::string resolve_model_arg(const std::string& arg);

// The model `run` uses when none is given: the built-in default model; throws fl::Error when the
// executable was built without one (FIRELINE_EMBED_DEFAULT_MODEL=OFF).
std::string default_model_path();

}  // namespace fl::cli
