#pragma once
// Safetensors reader: an 8-byte little-endian header length, a JSON header mapping tensor names
// to {dtype, shape, data_offsets}, then the raw little-endian data. The whole header is checked
// against the file before any tensor is handed out: length sane, offsets inside the data
// section, byte counts equal to dtype x shape, no two tensors overlapping. A violation is an
// fl::Error naming the file and the tensor.
//
// A sharded checkpoint (model.safetensors.index.json + shards) is opened as one set; every
// name in the index's weight_map must exist in the shard it points to. Tensors of more than
// kMaxDims (4) dimensions are validated but left out of the set: only vision towers have them
// (Qwen3.5's Conv3d patch embedding), and a text decoder never reads them.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace fl {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t data_begin;  // byte offset inside the file (header included)
  uint64_t data_end;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;
  Tensor tensor(const SafetensorsEntry& entry) const;  // a view into the mapped file

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;  // in header order
  std::map<std::string, size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
};

// The largest header we accept. Real headers are at most a few MB (thousands of tensors).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// All tensors of a checkpoint: one file, or the shards named by an index file.
class SafetensorsSet {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding
  // model.safetensors or model.safetensors.index.json.
  explicit SafetensorsSet(const std::string& path);

  std::optional<Tensor> find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return index_.size(); }

 private:
  void add_file(const std::string& path, const std::vector<std::string>* expected_names);
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsEntry*>, std::less<>> index_;
};

}  // namespace fl
