#pragma once
// The tokenizer of a model, wherever the model keeps it: a Hugging Face directory's tokenizer.json
// (with tokenizer_config.json's bos/eos), a .fire file's embedded copy of those, or, for a .fire or
// other GGUF file without tokenizer.json, its tokenizer.ggml.* metadata (tokenizer_gguf.h).
#include "text/tokenizer/tokenizer.h"

namespace fl {

class GgufFile;
class ModelSource;

// A GGUF file's tokenizer: fireline.tokenizer_json (with fireline.tokenizer_config) when present,
// else the tokenizer.ggml.* metadata; an fl::Error when it has neither.
Tokenizer load_gguf_tokenizer(const GgufFile& file);

// A model's tokenizer: its tokenizer.json, else (a .fire) its GGUF tokenizer metadata; an
// fl::Error naming the model when it has neither.
Tokenizer load_model_tokenizer(const ModelSource& source);

}  // namespace fl
