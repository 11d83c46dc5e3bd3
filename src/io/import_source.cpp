#include "io/import_source.h"

#include "core/error.h"
#include "io/fire_file.h"
#include "io/ggml_kquants.h"
#include "io/gguf.h"
#include "io/hfqm.h"
#include "io/model_source.h"
#include "quant/quant.h"

namespace fl {
namespace {

using DecodeRow = void (*)(const void*, float*, int64_t);

DecodeRow decoder_for(DType dtype) { return has_quant_format(dtype) ? quant_format(dtype).dequantize_row : nullptr; }

std::vector<GgufMetadataEntry> gguf_tokenizer_entries(const GgufFile& file) {
  std::vector<GgufMetadataEntry> out;
  for (const GgufMetadataEntry& e : file.metadata())
    if (e.key.starts_with(fire_key::kGgufTokenizerPrefix)) out.push_back(e);
  return out;
}

// Fills the layout fields every input shares once name, shape, dtype/decoder and data are set.
void finish_tensor(ImportTensor& t, std::optional<DType> dtype, DecodeRow decode, const uint8_t* data, uint64_t nbytes) {
  t.dtype = dtype;
  t.decode_row = decode;
  t.data = data;
  t.nbytes = nbytes;
  const int64_t rows = t.rows();
  t.row_bytes = rows > 0 ? static_cast<int64_t>(nbytes / static_cast<uint64_t>(rows)) : 0;
}

class HfImport final : public ImportSource {
 public:
  explicit HfImport(const std::string& path) {
    path_ = path;
    model_ = open_hf_directory(path);
    hf_config_json_ = model_->hf_config_json();
    tokenizer_json_ = model_->tokenizer_json();
    tokenizer_config_json_ = model_->tokenizer_config_json();
    generation_config_json_ = model_->generation_config_json();
    chat_template_ = model_->chat_template();
    for (const std::string& name : model_->tensor_names()) {
      Tensor view = *model_->find(name);
      ImportTensor t;
      t.name = name;
      t.shape.assign(view.shape.begin(), view.shape.begin() + view.ndim);
      t.type_name = std::string(dtype_name(view.dtype));
      if (view.dtype == DType::u8)
        fail("{}: tensor '{}' is u8, which a .fire file cannot hold", path, name);
      finish_tensor(t, view.dtype, decoder_for(view.dtype), static_cast<const uint8_t*>(view.data),
                    static_cast<uint64_t>(view.nbytes()));
      tensors_.push_back(std::move(t));
    }
  }
  std::string kind() const override { return "safetensors"; }

 private:
  std::unique_ptr<ModelSource> model_;
};

class GgufImport final : public ImportSource {
 public:
  GgufImport(const std::string& path, const std::string& hf_config_dir) : file_(path) {
    path_ = path;
    fire_ = file_.find_metadata(fire_key::kHfConfig) != nullptr;
    if (fire_) {
      if (!hf_config_dir.empty())
        fail("{}: is a .fire file with its own config; --hf-config is only for other GGUF files", path);
      hf_config_json_ = *file_.metadata_string(fire_key::kHfConfig);
      tokenizer_json_ = file_.metadata_string(fire_key::kTokenizerJson).value_or("");
      tokenizer_config_json_ = file_.metadata_string(fire_key::kTokenizerConfig).value_or("");
      generation_config_json_ = file_.metadata_string(fire_key::kGenerationConfig).value_or("");
      chat_template_ = file_.metadata_string(fire_key::kChatTemplate).value_or("");
    } else {
      if (hf_config_dir.empty())
        fail("{}: this GGUF file carries no Hugging Face config.json; pass --hf-config DIR with the model's "
             "config.json (and tokenizer files)",
             path);
      HfSideFiles side = read_hf_side_files(hf_config_dir);
      hf_config_json_ = side.config_json;
      tokenizer_json_ = side.tokenizer_json;
      tokenizer_config_json_ = side.tokenizer_config_json;
      generation_config_json_ = side.generation_config_json;
      chat_template_ = side.chat_template.empty() ? file_.metadata_string(fire_key::kChatTemplate).value_or("")
                                                  : side.chat_template;
    }
    gguf_tokenizer_metadata_ = gguf_tokenizer_entries(file_);
    for (const GgufTensorInfo& info : file_.tensors()) {
      if (!fire_ && (info.name.starts_with("blk.") || info.name == "token_embd.weight" || info.name == "output.weight"))
        fail("{}: tensor '{}' has a llama.cpp name; fireline imports GGUF files whose tensors keep their Hugging "
             "Face names (translating llama.cpp names is not implemented)",
             path, info.name);
      const GgufTypeInfo* type = gguf_type_info(info.type_id);  // validated by GgufFile
      ImportTensor t;
      t.name = info.name;
      t.shape = info.shape;
      t.type_name = std::string(type->name);
      DecodeRow decode = nullptr;
      if (type->dtype) {
        decode = decoder_for(*type->dtype);
      } else if (info.type_id == 12) {
        decode = dequantize_row_q4_k;
      } else if (info.type_id == 14) {
        decode = dequantize_row_q6_k;
      } else {
        fail("{}: tensor '{}' has GGUF type {}, which fireline cannot import (supported: F32, F16, BF16, Q8_0, Q4_K, "
             "Q6_K, I32, I64 and fireline's HFQ types)",
             path, info.name, type->name);
      }
      finish_tensor(t, type->dtype, decode, file_.tensor_data(info), info.nbytes());
      tensors_.push_back(std::move(t));
    }
  }
  std::string kind() const override { return fire_ ? "fire" : "gguf"; }

 private:
  GgufFile file_;
  bool fire_ = false;
};

class HfqmImport final : public ImportSource {
 public:
  HfqmImport(const std::string& path) : file_(path) {
    path_ = path;
    hf_config_json_ = file_.config_json();
    tokenizer_json_ = file_.tokenizer_json();
    tokenizer_config_json_ = file_.tokenizer_config_json();
    generation_config_json_ = file_.generation_config_json();
    chat_template_ = file_.chat_template();
    for (const HfqmTensor& h : file_.tensors()) {
      ImportTensor t;
      t.name = h.name;
      t.shape = h.shape;
      t.type_name = hfqm_quant_type_name(h.quant_type);
      finish_tensor(t, h.dtype, decoder_for(h.dtype), file_.tensor_data(h), h.nbytes());
      tensors_.push_back(std::move(t));
    }
  }
  std::string kind() const override { return "hfqm"; }

 private:
  HfqmFile file_;
};

}  // namespace

int64_t ImportTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

std::unique_ptr<ImportSource> open_import_source(const std::string& path, const std::string& hf_config_dir) {
  const ModelFileKind kind = detect_model_file(path);
  if (!hf_config_dir.empty() && kind != ModelFileKind::gguf)
    fail("--hf-config is only for GGUF inputs; {} is not a GGUF file", path);
  switch (kind) {
    case ModelFileKind::hf_directory: return std::make_unique<HfImport>(path);
    case ModelFileKind::gguf: return std::make_unique<GgufImport>(path, hf_config_dir);
    case ModelFileKind::hfqm: return std::make_unique<HfqmImport>(path);
    case ModelFileKind::unknown: break;
  }
  fail("{}: not a checkpoint (expected a Hugging Face directory, a GGUF/.fire file or a hipfire HFQM file)", path);
}

}  // namespace fl

namespace fl {
namespace {

class ModelSourceImport final : public ImportSource {
 public:
  explicit ModelSourceImport(const ModelSource& source) {
    path_ = source.path();
    hf_config_json_ = source.hf_config_json();
    tokenizer_json_ = source.tokenizer_json();
    tokenizer_config_json_ = source.tokenizer_config_json();
    if (const GgufFile* gguf = source.gguf_file()) gguf_tokenizer_metadata_ = gguf_tokenizer_entries(*gguf);
    generation_config_json_ = source.generation_config_json();
    chat_template_ = source.chat_template();
    for (const std::string& name : source.tensor_names()) {
      Tensor t = *source.find(name);
      if (!t.is_contiguous()) fail("{}: tensor '{}' is not contiguous", path_, name);
      ImportTensor it;
      it.name = name;
      it.shape.assign(t.shape.begin(), t.shape.begin() + t.ndim);
      it.type_name = std::string(dtype_name(t.dtype));
      it.dtype = t.dtype;
      if (has_quant_format(t.dtype)) it.decode_row = quant_format(t.dtype).dequantize_row;
      it.row_bytes = t.row_bytes();
      it.data = static_cast<const uint8_t*>(t.data);
      it.nbytes = static_cast<uint64_t>(t.nbytes());
      tensors_.push_back(std::move(it));
    }
  }
  std::string kind() const override { return "model"; }
};

}  // namespace

std::unique_ptr<ImportSource> import_model_source(const ModelSource& source) {
  return std::make_unique<ModelSourceImport>(source);
}

}  // namespace fl
