#pragma once
// What a MODEL argument on the command line names: a path (a Hugging Face directory or a .fire
// file), a model in the store (`gemma4:26b-a4b`, see store/model_store.h), or a model built into
// the executable (`embedded:fireline-tiny`, or just `fireline-tiny`).
#include <memory>
#include <string>
#include <string_view>

#include "io/model_source.h"

namespace fl::cli {

// The source to open for `arg` (a path or "embedded:NAME"); throws fl::Error when it names
// nothing: "PATH: no such file or directory" for what looks like a path (a '/', or a .fire,
// .gguf or .safetensors suffix), else "unknown model 'X' (see `fireline list`, or `fireline pull`)".
std::string resolve_model_arg(const std::string& arg);

// The model `run` uses when none is given: the built-in default model; throws fl::Error when the
// executable was built without one (FIRELINE_EMBED_DEFAULT_MODEL=OFF).
std::string default_model_path();

// A MODEL argument or `--like NAME [--format F]` (bench, logits): the model's source, or a
// synthetic one of a published shape (seed 1; `format` hf4 when empty). Throws fl::Error naming
// `command` for both or neither, and for a --format given with a MODEL (it has its own formats).
std::unique_ptr<ModelSource> open_model_or_synthetic(std::string_view command, const std::string& model,
                                                     const std::string& like, const std::string& format);
// The names --like takes, "a, b, c", for help texts.
std::string synthetic_model_list();

}  // namespace fl::cli
