#pragma once
// Where a model's weights and metadata come from: a Hugging Face directory (config.json +
// safetensors, single or sharded) or a .fire file (io/fire_file.h). Model
// code asks a ModelSource for tensors by their HF names and never knows which one it has.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"

namespace fl {

class GgufFile;

class ModelSource {
 public:
  virtual ~ModelSource() = default;
  virtual const std::string& path() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const std::string& hf_config_json() const = 0;  // config.json as written
  virtual std::optional<Tensor> find(std::string_view name) const = 0;  // a host view, valid while this lives
  virtual std::vector<std::string> tensor_names() const = 0;
  // Optional side files (empty when the model has none).
  virtual std::string tokenizer_json() const = 0;
  virtual std::string generation_config_json() const = 0;
  virtual std::string chat_template() const = 0;
  // tokenizer_config.json, or what a .fire keeps of it (bos_token, eos_token); empty when absent.
  virtual std::string tokenizer_config_json() const { return {}; }
  // The GGUF file a .fire source reads, for metadata beyond the above (e.g. a tokenizer given as
  // tokenizer.ggml.* keys instead of tokenizer.json); null for other sources.
  virtual const GgufFile* gguf_file() const { return nullptr; }
};

// The optional text-side files of a Hugging Face directory: tokenizer.json,
// tokenizer_config.json, generation_config.json, and the chat template (chat_template.jinja, or
// the chat_template entry of tokenizer_config.json); empty strings for those it lacks. Throws
// when `dir` is not a directory.
struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
  std::string chat_template;
};
TokenizerFiles read_tokenizer_files(const std::string& dir);

// config.json and the side files above (no weights needed). Throws when config.json is missing.
struct HfSideFiles : TokenizerFiles {
  std::string config_json;
};
HfSideFiles read_hf_side_files(const std::string& dir);

// A directory holding config.json and model.safetensors(.index.json); throws fl::Error with what
// is missing or wrong.
std::unique_ptr<ModelSource> open_hf_directory(const std::string& path);

// Any model path a command accepts: a HF directory, a .fire file (recognised by its GGUF magic,
// not its name), or "embedded:NAME" for a .fire image linked into the binary. Defined in
// fire_file.cpp.
std::unique_ptr<ModelSource> open_model_source(const std::string& path);

// .fire images linked into the executable (the default model): registered once at start-up, then
// opened as "embedded:NAME" without touching the file system. The bytes must outlive every use.
inline constexpr std::string_view kEmbeddedPrefix = "embedded:";
void register_embedded_model(std::string name, std::span<const uint8_t> bytes);
std::vector<std::string> embedded_model_names();  // "embedded:NAME" each

}  // namespace fl
