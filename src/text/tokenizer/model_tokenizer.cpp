#include "text/tokenizer/model_tokenizer.h"

#include "core/error.h"
#include "io/fire_file.h"
#include "io/gguf.h"
#include "io/model_source.h"
#include "text/tokenizer/tokenizer_gguf.h"

namespace fl {

Tokenizer load_gguf_tokenizer(const GgufFile& file) {
  if (auto json = file.metadata_string(fire_key::kTokenizerJson))
    return Tokenizer::from_json(*json, file.metadata_string(fire_key::kTokenizerConfig).value_or(""),
                                fmt::format("{} ({})", file.path(), fire_key::kTokenizerJson));
  if (has_gguf_tokenizer(file)) return tokenizer_from_gguf(file);
  fail("{}: no tokenizer in this file (neither {} nor {}* metadata)", file.path(), fire_key::kTokenizerJson,
       fire_key::kGgufTokenizerPrefix);
}

Tokenizer load_model_tokenizer(const ModelSource& source) {
  const std::string json = source.tokenizer_json();
  if (!json.empty())
    return Tokenizer::from_json(json, source.tokenizer_config_json(), fmt::format("{} (tokenizer.json)", source.path()));
  const GgufFile* gguf = source.gguf_file();
  if (gguf && has_gguf_tokenizer(*gguf)) return tokenizer_from_gguf(*gguf);
  fail("{}: the model has no tokenizer (no tokenizer.json{})", source.path(),
       gguf ? fmt::format(" and no {}* metadata", fire_key::kGgufTokenizerPrefix) : std::string());
}

}  // namespace fl
