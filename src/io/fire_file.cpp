#include "io/fire_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <span>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/sha256.h"

namespace fl {

std::string gguf_tensor_sha256(const GgufFile& file, const ByteProgress& progress) {
  std::vector<const GgufTensorInfo*> order;
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    order.push_back(&t);
    total += t.nbytes();
  }
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
  Sha256 hash;
  uint64_t done = 0;
  constexpr uint64_t kChunk = 64ull << 20;  // report progress every 64 MB
  for (const GgufTensorInfo* t : order) {
    const uint8_t* p = file.tensor_data(*t);
    for (uint64_t at = 0; at < t->nbytes(); at += kChunk) {
      const uint64_t n = std::min(kChunk, t->nbytes() - at);
      hash.update(p + at, n);
      release_mapped_pages(p + at, n);  // one pass over a file larger than memory stays small
      done += n;
      if (progress) progress(done, total);
    }
  }
  return hash.hex_digest();
}

FireFile::FireFile(const std::string& path) : FireFile(MappedFile(path)) {}

FireFile::FireFile(MappedFile file) : gguf_(std::move(file)) {
  const std::string& path = gguf_.path();
  auto hf_config = gguf_.metadata_string(fire_key::kHfConfig);
  if (!hf_config)
    fail("{}: GGUF file without {} (not a .fire file; convert it with `fireline quantize`)", path,
         fire_key::kHfConfig);
  hf_config_ = std::move(*hf_config);
  config_ = parse_hf_config_text(hf_config_, path + " (" + std::string(fire_key::kHfConfig) + ")");

  auto architecture = gguf_.metadata_string(fire_key::kArchitecture);
  if (!architecture) fail("{}: no {} in the metadata", path, fire_key::kArchitecture);
  if (*architecture != config_.architecture)
    fail("{}: {} is '{}' but the embedded config.json describes '{}'", path, fire_key::kArchitecture, *architecture,
         config_.architecture);

  tokenizer_json_ = gguf_.metadata_string(fire_key::kTokenizerJson).value_or("");
  tokenizer_config_ = gguf_.metadata_string(fire_key::kTokenizerConfig).value_or("");
  generation_config_ = gguf_.metadata_string(fire_key::kGenerationConfig).value_or("");
  chat_template_ = gguf_.metadata_string(fire_key::kChatTemplate).value_or("");
  quantizer_ = gguf_.metadata_string(fire_key::kQuantizer).value_or("");
  recorded_sha256_ = gguf_.metadata_string(fire_key::kTensorSha256).value_or("");
  if (!recorded_sha256_.empty()) {
    bool hex = recorded_sha256_.size() == 64 &&
               std::all_of(recorded_sha256_.begin(), recorded_sha256_.end(),
                           [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    if (!hex) fail("{}: {} is not 64 lowercase hex digits", path, fire_key::kTensorSha256);
  }

  for (const GgufTensorInfo& t : gguf_.tensors()) {
    const GgufTypeInfo* type = gguf_type_info(t.type_id);  // known: GgufFile checked every id
    FL_ASSERT(type != nullptr);
    if (!type->dtype)
      fail("{}: tensor '{}' has type {}, which fireline cannot run; convert the file with `fireline quantize`", path,
           t.name, type->name);
  }
}

DType FireFile::tensor_dtype(const GgufTensorInfo& info) const { return *gguf_type_info(info.type_id)->dtype; }

std::optional<Tensor> FireFile::find(std::string_view name) const {
  const GgufTensorInfo* info = gguf_.find_tensor(name);
  if (!info) return std::nullopt;
  void* p = const_cast<uint8_t*>(gguf_.tensor_data(*info));
  return make_tensor(p, tensor_dtype(*info), info->shape.data(), static_cast<int>(info->shape.size()));
}

std::vector<std::string> FireFile::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(gguf_.tensors().size());
  for (const GgufTensorInfo& t : gguf_.tensors()) names.push_back(t.name);
  return names;
}

std::unique_ptr<FireFile> open_fire_file(const std::string& path) { return std::make_unique<FireFile>(path); }

ModelFileKind detect_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ModelFileKind::hf_directory;
  if (!fs::exists(path, ec)) fail("{}: no such file or directory", path);
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  if (!in.read(magic, 4)) return ModelFileKind::unknown;
  if (std::string_view(magic, 4) == "GGUF") return ModelFileKind::gguf;
  if (std::string_view(magic, 4) == "HFQM") return ModelFileKind::hfqm;
  return ModelFileKind::unknown;
}

namespace {

struct EmbeddedModel {
  std::string name;
  std::span<const uint8_t> bytes;
};

std::vector<EmbeddedModel>& embedded_models() {
  static std::vector<EmbeddedModel> models;
  return models;
}

}  // namespace

void register_embedded_model(std::string name, std::span<const uint8_t> bytes) {
  embedded_models().push_back({std::move(name), bytes});
}

std::vector<std::string> embedded_model_names() {
  std::vector<std::string> names;
  for (const EmbeddedModel& m : embedded_models()) names.push_back(std::string(kEmbeddedPrefix) + m.name);
  return names;
}

std::unique_ptr<ModelSource> open_model_source(const std::string& path) {
  if (path.starts_with(kEmbeddedPrefix)) {
    const std::string_view name = std::string_view(path).substr(kEmbeddedPrefix.size());
    for (const EmbeddedModel& m : embedded_models())
      if (m.name == name) return std::make_unique<FireFile>(MappedFile::borrow(m.bytes.data(), m.bytes.size(), path));
    fail("{}: no such model is built into this binary", path);
  }
  switch (detect_model_file(path)) {
    case ModelFileKind::hf_directory: return open_hf_directory(path);
    case ModelFileKind::gguf: return open_fire_file(path);
    case ModelFileKind::hfqm:
      fail("{}: a hipfire HFQM file; convert it with `fireline quantize {} -o MODEL.fire`", path, path);
    case ModelFileKind::unknown: break;
  }
  fail("{}: not a model (expected a Hugging Face directory or a .fire file)", path);
}

}  // namespace fl
