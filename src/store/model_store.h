#pragma once
// The local model store (`fireline pull / list / rm`, and model names in every command that takes
// a MODEL). Layout, under the models directory (store/store_config.h; ~/.fireline/models):
//
//   FAMILY/TAG.fire                  the model, exactly as downloaded and verified
//   FAMILY/TAG.json                  its manifest: name, source url, sha256, size, pulled time
//   FAMILY/TAG.fire.partial          a download in progress (store/pull.h); never opened as a model
//   FAMILY/TAG.fire.partial.source   where that download comes from, so that a resume never mixes
//                                    the bytes of two different sources
//   registry.json                    optional: the default registry for `pull NAME` (store/registry.h)
//
// Every file kind has its own final suffix and names are validated (store/model_name.h), so two
// names never share a file and no name reaches outside its family folder. A model appears under
// TAG.fire only by an atomic rename of a complete, verified file; the manifest is written after
// it (also by rename), so a crash leaves at worst a model without a manifest, which `list` still
// shows, or a partial download that the next `pull` resumes.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "store/model_name.h"
#include "store/store_config.h"

namespace fl {

struct ModelManifest {
  std::string name;       // FAMILY:TAG
  std::string url;        // where it was pulled from
  std::string sha256;     // of the whole file, lowercase hex
  uint64_t size = 0;      // bytes
  std::string pulled_at;  // UTC, ISO 8601: 2025-12-02T21:20:00Z

  std::string to_json() const;
  // Throws fl::Error naming `where` when the text is not a manifest.
  static ModelManifest parse(const std::string& json_text, const std::string& where);
};

// One model as `list` shows it.
struct StoredModel {
  ModelName name;
  std::filesystem::path path;
  uint64_t size = 0;
  std::filesystem::file_time_type modified;  // of the model file
  std::optional<ModelManifest> manifest;     // absent for a model copied in by hand
  // From the .fire metadata when the file opens (empty otherwise, with the reason in `problem`).
  std::string architecture;  // general.architecture
  std::string format;        // the quantizer preset (hf4, q8, ...) or "-" when not recorded
  std::string problem;
};

class ModelStore {
 public:
  explicit ModelStore(std::filesystem::path models_dir);
  static ModelStore from_environment();  // store_config_from_environment().models_dir()

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path family_dir(const ModelName& name) const { return dir_ / name.family; }
  std::filesystem::path model_path(const ModelName& name) const;     // FAMILY/TAG.fire
  std::filesystem::path manifest_path(const ModelName& name) const;  // FAMILY/TAG.json
  std::filesystem::path partial_path(const ModelName& name) const;   // FAMILY/TAG.fire.partial
  std::filesystem::path partial_source_path(const ModelName& name) const;
  std::filesystem::path default_registry_path() const { return dir_ / "registry.json"; }

  bool contains(const ModelName& name) const;  // the model file exists
  std::optional<ModelManifest> read_manifest(const ModelName& name) const;  // nullopt when absent
  // Creates the family folder (and the store) when missing; throws fl::Error when it cannot.
  void ensure_family_dir(const ModelName& name) const;

  // Every model in the store, sorted by name; files that are not models of valid names are
  // skipped. Opening each .fire reads only its header (a few MB at most).
  std::vector<StoredModel> list() const;
  // Removes the model, its manifest and any partial download; throws fl::Error (suggesting
  // `fireline list`) when the store holds none of them.
  void remove(const ModelName& name) const;

 private:
  std::filesystem::path dir_;
};

// Writes `text` to `path` atomically: a temporary file in the same folder, fsync, rename, and an
// fsync of the folder.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);
// fsync of a directory, so that a rename in it survives a crash.
void sync_directory(const std::filesystem::path& dir);

// The model a command's MODEL argument means: an existing path is itself; a valid name of a model
// in the store is the path of its file; anything else is an fl::Error ("unknown model '...' (see
// `fireline list`, or `fireline pull`)").
std::string resolve_model_arg(const std::string& arg);
std::string resolve_model_arg(const std::string& arg, const ModelStore& store);

// "2025-12-02T21:20:00Z".
std::string utc_timestamp(std::chrono::system_clock::time_point when);

}  // namespace fl
