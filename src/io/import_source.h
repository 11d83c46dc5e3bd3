#pragma once
// What `fireline quantize` reads: a checkpoint in any input format, seen as a list of tensors it
// can either copy byte for byte or decode row by row to f32, plus the side files a .fire embeds.
//
// Inputs:
//   - a Hugging Face directory (config.json + safetensors, single or sharded);
//   - a GGUF file: a .fire (fireline metadata inside), or another GGUF whose tensors carry Hugging
//     Face names, with the side files taken from `hf_config_dir` (a directory with config.json and
//     optionally tokenizer.json, tokenizer_config.json, generation_config.json, chat template).
//     Either kind's tokenizer.ggml.* metadata is kept, so a file without tokenizer.json still has
//     a tokenizer. Tensor types F32, F16, BF16, Q8_0, I32, I64 and fireline's HFQ ids are read as
//     they are; Q4_K and Q6_K are decoded.
//   - a hipfire HFQM file (io/hfqm.h).
// All data stays in the memory-mapped input; nothing is loaded whole.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"

namespace fl {

struct ImportTensor {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order
  std::string type_name;       // as the input calls it, for messages ("BF16", "Q4_K", "HFQ4G256")
  // The fireline type with exactly this byte layout, when there is one: such a tensor can be
  // copied as is. Absent for types fireline only decodes (Q4_K, Q6_K).
  std::optional<DType> dtype;
  // Decodes one row of k values to f32; null for integer tensors, which are only ever copied.
  void (*decode_row)(const void* src, float* dst, int64_t k) = nullptr;
  int64_t row_bytes = 0;        // bytes per row in the input
  const uint8_t* data = nullptr;  // the input's bytes, rows back to back
  uint64_t nbytes = 0;

  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const;
  int64_t numel() const { return rows() * cols(); }
};

class ImportSource {
 public:
  virtual ~ImportSource() = default;
  virtual std::string kind() const = 0;  // "safetensors", "gguf", "fire", "hfqm"
  const std::string& path() const { return path_; }
  const std::vector<ImportTensor>& tensors() const { return tensors_; }

  const std::string& hf_config_json() const { return hf_config_json_; }
  const std::string& tokenizer_json() const { return tokenizer_json_; }
  const std::string& tokenizer_config_json() const { return tokenizer_config_json_; }
  // A GGUF input's tokenizer.ggml.* metadata (its tokenizer when it has no tokenizer.json),
  // carried into the .fire as it is.
  const std::vector<GgufMetadataEntry>& gguf_tokenizer_metadata() const { return gguf_tokenizer_metadata_; }
  const std::string& generation_config_json() const { return generation_config_json_; }
  const std::string& chat_template() const { return chat_template_; }

 protected:
  std::string path_;
  std::vector<ImportTensor> tensors_;
  std::string hf_config_json_;
  std::string tokenizer_json_;
  std::string tokenizer_config_json_;
  std::vector<GgufMetadataEntry> gguf_tokenizer_metadata_;
  std::string generation_config_json_;
  std::string chat_template_;
};

// Opens `path` by what it holds (directory, GGUF magic, HFQM magic). `hf_config_dir` supplies
// config.json and the tokenizer files for a GGUF input that does not embed them; it is an error
// for other inputs.
std::unique_ptr<ImportSource> open_import_source(const std::string& path, const std::string& hf_config_dir = {});

// Any ModelSource as an import source (every tensor is fetched now; `source` must outlive it).
class ModelSource;
std::unique_ptr<ImportSource> import_model_source(const ModelSource& source);

}  // namespace fl
