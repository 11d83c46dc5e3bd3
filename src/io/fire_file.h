#pragma once
// The .fire model file (DESIGN §4, docs/formats.md "The .fire file"): a GGUF v3 container whose
// tensors keep their Hugging Face names and PyTorch shapes, with the checkpoint's config.json,
// tokenizer.json, generation config and chat template embedded as metadata strings, fireline's
// type ids for the HFQ formats, the quantizer's version and policy, and a sha256 of the tensor data.
//
// FireFile is a ModelSource: every command that takes a model accepts one. Opening validates the
// whole GGUF layout (io/gguf.h) and the fireline metadata before any tensor is handed out; it does
// not hash the tensor data (that reads the whole file): `fireline verify` does.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "io/gguf.h"
#include "io/model_source.h"

namespace fl {

namespace fire_key {
inline constexpr std::string_view kArchitecture = "general.architecture";
inline constexpr std::string_view kAlignment = "general.alignment";
inline constexpr std::string_view kName = "general.name";
inline constexpr std::string_view kHfConfig = "fireline.hf_config";
inline constexpr std::string_view kTokenizerJson = "fireline.tokenizer_json";
// tokenizer_config.json reduced to what fireline reads from it: {"bos_token": ..., "eos_token": ...}.
inline constexpr std::string_view kTokenizerConfig = "fireline.tokenizer_config";
// Keys with this prefix (a GGUF input's tokenizer.ggml.* metadata) are carried into a .fire as they are.
inline constexpr std::string_view kGgufTokenizerPrefix = "tokenizer.ggml.";
inline constexpr std::string_view kGenerationConfig = "fireline.generation_config";
inline constexpr std::string_view kQuantizer = "fireline.quantizer";
inline constexpr std::string_view kTensorSha256 = "fireline.tensor_sha256";
inline constexpr std::string_view kChatTemplate = "tokenizer.chat_template";
}  // namespace fire_key

constexpr uint64_t kFireAlignment = 64;

// Progress of a long pass over the tensor data: bytes done out of total.
using ByteProgress = std::function<void(uint64_t done, uint64_t total)>;

// sha256 over every tensor's bytes in file order (padding excluded), as lowercase hex.
std::string gguf_tensor_sha256(const GgufFile& file, const ByteProgress& progress = {});

class FireFile final : public ModelSource {
 public:
  explicit FireFile(const std::string& path);  // maps and validates; throws fl::Error
  explicit FireFile(MappedFile file);          // validates bytes already in memory

  // ModelSource
  const std::string& path() const override { return gguf_.path(); }
  const ModelConfig& config() const override { return config_; }
  const std::string& hf_config_json() const override { return hf_config_; }
  std::optional<Tensor> find(std::string_view name) const override;
  std::vector<std::string> tensor_names() const override;  // in file order
  std::string tokenizer_json() const override { return tokenizer_json_; }
  std::string generation_config_json() const override { return generation_config_; }
  std::string chat_template() const override { return chat_template_; }
  std::string tokenizer_config_json() const override { return tokenizer_config_; }
  const GgufFile* gguf_file() const override { return &gguf_; }

  const GgufFile& gguf() const { return gguf_; }
  DType tensor_dtype(const GgufTensorInfo& info) const;
  const std::string& quantizer_json() const { return quantizer_; }  // empty when absent
  const std::string& recorded_sha256() const { return recorded_sha256_; }  // empty when absent
  std::string compute_sha256(const ByteProgress& progress = {}) const { return gguf_tensor_sha256(gguf_, progress); }

 private:
  GgufFile gguf_;
  ModelConfig config_;
  std::string hf_config_;
  std::string tokenizer_json_;
  std::string tokenizer_config_;
  std::string generation_config_;
  std::string chat_template_;
  std::string quantizer_;
  std::string recorded_sha256_;
};

std::unique_ptr<FireFile> open_fire_file(const std::string& path);

// What a model path holds, judged by the first bytes of a file.
enum class ModelFileKind { hf_directory, gguf, hfqm, unknown };
ModelFileKind detect_model_file(const std::string& path);  // throws when the path does not exist

}  // namespace fl
