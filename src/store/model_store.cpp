#include "store/model_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/fire_file.h"
#include "io/gguf.h"

namespace fl {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kModelSuffix = ".fire";
constexpr std::string_view kManifestSuffix = ".json";
constexpr std::string_view kPartialSuffix = ".fire.partial";
constexpr std::string_view kPartialSourceSuffix = ".fire.partial.source";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Architecture and quantizer preset from the GGUF header; the header parse validates the layout
// but reads no tensor data.
void describe_model_file(StoredModel& model) {
  try {
    GgufFile file(model.path.string());
    model.architecture = file.metadata_string(fire_key::kArchitecture).value_or("");
    model.format = "-";
    if (std::optional<std::string> quantizer = file.metadata_string(fire_key::kQuantizer)) {
      nlohmann::json j = nlohmann::json::parse(*quantizer, nullptr, false);
      if (j.is_object() && j.contains("preset") && j["preset"].is_string()) model.format = j["preset"].get<std::string>();
    }
  } catch (const Error& e) {
    model.problem = e.what();
  }
}

}  // namespace

// ---- manifest ----

std::string ModelManifest::to_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["url"] = url;
  j["sha256"] = sha256;
  j["size"] = size;
  j["pulled_at"] = pulled_at;
  return j.dump(2) + "\n";
}

ModelManifest ModelManifest::parse(const std::string& json_text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object()) fail("{}: not a model manifest (expected a JSON object)", where);
  auto text = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_string()) fail("{}: manifest field '{}' is missing or not a string", where, key);
    return j[key].get<std::string>();
  };
  ModelManifest m;
  m.name = text("name");
  m.url = text("url");
  m.sha256 = text("sha256");
  m.pulled_at = text("pulled_at");
  if (!j.contains("size") || !j["size"].is_number_unsigned())
    fail("{}: manifest field 'size' is missing or not a byte count", where);
  m.size = j["size"].get<uint64_t>();
  return m;
}

// ---- the store ----

ModelStore::ModelStore(fs::path models_dir) : dir_(std::move(models_dir)) {}

ModelStore ModelStore::from_environment() { return ModelStore(store_config_from_environment().models_dir()); }

fs::path ModelStore::model_path(const ModelName& name) const { return family_dir(name) / (name.tag + std::string(kModelSuffix)); }
fs::path ModelStore::manifest_path(const ModelName& name) const {
  return family_dir(name) / (name.tag + std::string(kManifestSuffix));
}
fs::path ModelStore::partial_path(const ModelName& name) const {
  return family_dir(name) / (name.tag + std::string(kPartialSuffix));
}
fs::path ModelStore::partial_source_path(const ModelName& name) const {
  return family_dir(name) / (name.tag + std::string(kPartialSourceSuffix));
}

bool ModelStore::contains(const ModelName& name) const {
  std::error_code ec;
  return fs::is_regular_file(model_path(name), ec);
}

std::optional<ModelManifest> ModelStore::read_manifest(const ModelName& name) const {
  const fs::path path = manifest_path(name);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  return ModelManifest::parse(read_text_file(path.string()), path.string());
}

void ModelStore::ensure_family_dir(const ModelName& name) const {
  const fs::path dir = family_dir(name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail("cannot create the model folder {}: {}", dir.string(), ec ? ec.message() : "a file with that name is in the way");
}

std::vector<StoredModel> ModelStore::list() const {
  std::vector<StoredModel> models;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return models;
  for (const fs::directory_entry& family : fs::directory_iterator(dir_, ec)) {
    const std::string family_name = family.path().filename().string();
    if (!family.is_directory(ec) || family_name.find(':') != std::string::npos || !try_parse_model_name(family_name))
      continue;
    for (const fs::directory_entry& file : fs::directory_iterator(family.path(), ec)) {
      const std::string file_name = file.path().filename().string();
      if (!file.is_regular_file(ec) || !ends_with(file_name, kModelSuffix)) continue;
      const std::string tag = file_name.substr(0, file_name.size() - kModelSuffix.size());
      std::optional<ModelName> name = try_parse_model_name(family_name + ":" + tag);
      if (!name) continue;
      StoredModel model;
      model.name = *name;
      model.path = file.path();
      model.size = file.file_size(ec);
      model.modified = file.last_write_time(ec);
      try {
        model.manifest = read_manifest(*name);
      } catch (const Error& e) {
        model.problem = e.what();
      }
      describe_model_file(model);
      models.push_back(std::move(model));
    }
  }
  std::sort(models.begin(), models.end(), [](const StoredModel& a, const StoredModel& b) { return a.name < b.name; });
  return models;
}

void ModelStore::remove(const ModelName& name) const {
  const fs::path paths[] = {model_path(name), manifest_path(name), partial_path(name), partial_source_path(name)};
  bool removed_any = false;
  for (const fs::path& path : paths) {
    std::error_code ec;
    if (fs::remove(path, ec)) removed_any = true;
    else if (ec) fail("cannot remove {}: {}", path.string(), ec.message());
  }
  if (!removed_any) fail("unknown model '{}' in {} (see `fireline list`)", name.str(), dir_.string());
  std::error_code ec;
  fs::remove(family_dir(name), ec);  // only succeeds when the folder is now empty
}

// ---- helpers ----

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself already happened
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path temp = path.string() + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write {}: {}", temp.string(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      fail("cannot write {}: {}", temp.string(), std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail("cannot write {}: {}", temp.string(), std::strerror(err));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail("cannot rename {} to {}: {}", temp.string(), path.string(), std::strerror(err));
  }
  sync_directory(path.parent_path());
}

std::string resolve_model_arg(const std::string& arg, const ModelStore& store) {
  std::error_code ec;
  if (!arg.empty() && fs::exists(arg, ec)) return arg;
  if (std::optional<ModelName> name = try_parse_model_name(arg); name && store.contains(*name))
    return store.model_path(*name).string();
  fail("unknown model '{}' (see `fireline list`, or `fireline pull`)", printable_name(arg));
}

std::string resolve_model_arg(const std::string& arg) {
  std::error_code ec;
  if (!arg.empty() && fs::exists(arg, ec)) return arg;
  // Only a valid name needs the store (and so the environment).
  if (!try_parse_model_name(arg)) fail("unknown model '{}' (see `fireline list`, or `fireline pull`)", printable_name(arg));
  return resolve_model_arg(arg, ModelStore::from_environment());
}

std::string utc_timestamp(std::chrono::system_clock::time_point when) {
  const std::time_t t = std::chrono::system_clock::to_time_t(when);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fl
