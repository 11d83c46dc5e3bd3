// A Hugging Face checkpoint directory as a ModelSource.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/model_source.h"
#include "io/safetensors.h"

namespace fl {
namespace {

namespace fs = std::filesystem;

std::string read_if_exists(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? read_text_file(p.string()) : std::string();
}

std::string read_chat_template(const fs::path& dir) {
  // Newer checkpoints ship chat_template.jinja; older ones embed it in tokenizer_config.json.
  std::string jinja = read_if_exists(dir / "chat_template.jinja");
  if (!jinja.empty()) return jinja;
  std::string tokenizer_config = read_if_exists(dir / "tokenizer_config.json");
  if (tokenizer_config.empty()) return {};
  auto parsed = nlohmann::json::parse(tokenizer_config, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("chat_template") && parsed["chat_template"].is_string())
    return parsed["chat_template"].get<std::string>();
  return {};
}

std::string read_config_json(const std::string& path) {
  fs::path dir(path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a directory", path);
  fs::path config_path = dir / "config.json";
  if (!fs::is_regular_file(config_path, ec)) fail("{}: no config.json (not a Hugging Face model directory)", path);
  return read_text_file(config_path.string());
}

class HfDirectory final : public ModelSource {
 public:
  explicit HfDirectory(const std::string& path) : path_(path), dir_(path) {
    config_json_ = read_config_json(path);
    config_ = parse_hf_config_text(config_json_, (dir_ / "config.json").string());
    tensors_ = std::make_unique<SafetensorsSet>(path);
  }

  const std::string& path() const override { return path_; }
  const ModelConfig& config() const override { return config_; }
  const std::string& hf_config_json() const override { return config_json_; }
  std::optional<Tensor> find(std::string_view name) const override { return tensors_->find(name); }
  std::vector<std::string> tensor_names() const override { return tensors_->names(); }
  std::string tokenizer_json() const override { return read_if_exists(dir_ / "tokenizer.json"); }
  std::string generation_config_json() const override { return read_if_exists(dir_ / "generation_config.json"); }
  std::string chat_template() const override { return read_chat_template(dir_); }
  std::string tokenizer_config_json() const override { return read_if_exists(dir_ / "tokenizer_config.json"); }

 private:
  std::string path_;
  fs::path dir_;
  std::string config_json_;
  ModelConfig config_;
  std::unique_ptr<SafetensorsSet> tensors_;
};

}  // namespace

TokenizerFiles read_tokenizer_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a directory", dir);
  TokenizerFiles files;
  files.tokenizer_json = read_if_exists(fs::path(dir) / "tokenizer.json");
  files.tokenizer_config_json = read_if_exists(fs::path(dir) / "tokenizer_config.json");
  files.generation_config_json = read_if_exists(fs::path(dir) / "generation_config.json");
  files.chat_template = read_chat_template(dir);
  return files;
}

HfSideFiles read_hf_side_files(const std::string& dir) {
  HfSideFiles files;
  files.config_json = read_config_json(dir);
  static_cast<TokenizerFiles&>(files) = read_tokenizer_files(dir);
  return files;
}

std::unique_ptr<ModelSource> open_hf_directory(const std::string& path) { return std::make_unique<HfDirectory>(path); }

}  // namespace fl
