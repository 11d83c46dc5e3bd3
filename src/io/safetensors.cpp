#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fl {
namespace {

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::f32;
  if (name == "F16") return DType::f16;
  if (name == "BF16") return DType::bf16;
  if (name == "I32") return DType::i32;
  if (name == "I64") return DType::i64;
  if (name == "U8") return DType::u8;
  return std::nullopt;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const uint64_t file_size = file_.size();
  if (file_size < 8) fail("{}: not a safetensors file ({} bytes, shorter than the 8-byte header length)", path, file_size);
  const uint64_t header_len = read_u64_le(file_.data());
  if (header_len < 2 || header_len > kMaxSafetensorsHeaderBytes)
    fail("{}: implausible safetensors header length {} (corrupt or not a safetensors file)", path, header_len);
  if (8 + header_len > file_size)
    fail("{}: truncated: header claims {} bytes but the file has {}", path, header_len, file_size - 8);
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(file_.data()) + 8,
                                   reinterpret_cast<const char*>(file_.data()) + data_start);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", path);

  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("{}: __metadata__.{} is not a string", path, k);
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) fail("{}: entry for tensor '{}' is not an object", path, name);
    auto dtype_it = value.find("dtype");
    auto shape_it = value.find("shape");
    auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string())
      fail("{}: tensor '{}' has no dtype string", path, name);
    if (shape_it == value.end() || !shape_it->is_array()) fail("{}: tensor '{}' has no shape array", path, name);
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      fail("{}: tensor '{}' has no data_offsets pair", path, name);

    SafetensorsEntry entry;
    entry.name = name;
    std::string dtype_name = dtype_it->get<std::string>();
    auto dtype = dtype_from_safetensors(dtype_name);
    if (!dtype) fail("{}: tensor '{}' has unsupported dtype {} (supported: F32, F16, BF16, I32, I64, U8)", path, name, dtype_name);
    entry.dtype = *dtype;
    // More than kMaxDims dimensions is valid safetensors (a vision Conv3d [out, in, t, h, w] in
    // the released Qwen3.5 files): such an entry is validated like any other, but cannot be
    // viewed as a Tensor (tensor() refuses it) and a SafetensorsSet leaves it out.
    if (shape_it->size() > 8) fail("{}: tensor '{}' has {} dimensions", path, name, shape_it->size());
    // Count elements with an overflow check: a hostile header can claim absurd shapes.
    uint64_t numel = 1;
    for (auto& d : *shape_it) {
      if (!d.is_number_unsigned()) fail("{}: tensor '{}' has a shape entry that is not a non-negative integer", path, name);
      uint64_t extent = d.get<uint64_t>();
      if (extent > 0 && numel > (1ull << 62) / extent) fail("{}: tensor '{}' has an absurd shape", path, name);
      numel *= extent;
      entry.shape.push_back(static_cast<int64_t>(extent));
    }
    for (auto& o : *offsets_it)
      if (!o.is_number_unsigned()) fail("{}: tensor '{}' has a data offset that is not a non-negative integer", path, name);
    uint64_t begin = (*offsets_it)[0].get<uint64_t>(), end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail("{}: tensor '{}' data [{}, {}) lies outside the {}-byte data section (truncated file?)", path, name, begin,
           end, data_size);
    uint64_t expected = numel * static_cast<uint64_t>(dtype_traits(entry.dtype).block_bytes);
    if (end - begin != expected)
      fail("{}: tensor '{}' has {} bytes but {} x {} needs {}", path, name, end - begin, dtype_name,
           nlohmann::json(entry.shape).dump(), expected);
    entry.data_begin = data_start + begin;
    entry.data_end = data_start + end;
    if (by_name_.count(name)) fail("{}: tensor '{}' appears twice", path, name);
    by_name_.emplace(name, entries_.size());
    entries_.push_back(std::move(entry));
  }

  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> sorted;
  for (auto& e : entries_)
    if (e.data_end > e.data_begin) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->data_begin < sorted[i - 1]->data_end)
      fail("{}: tensors '{}' and '{}' overlap", path, sorted[i - 1]->name, sorted[i]->name);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& entry) const {
  if (entry.shape.size() > static_cast<size_t>(kMaxDims))
    fail("{}: tensor '{}' has {} dimensions (at most {} supported)", path(), entry.name, entry.shape.size(), kMaxDims);
  void* p = const_cast<uint8_t*>(file_.data() + entry.data_begin);
  return make_tensor(p, entry.dtype, entry.shape.data(), static_cast<int>(entry.shape.size()));
}

SafetensorsSet::SafetensorsSet(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json")) {
      p = p / "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors")) {
      p = p / "model.safetensors";
    } else {
      fail("{}: no model.safetensors or model.safetensors.index.json in this directory", path);
    }
  }
  if (p.filename().string().ends_with(".index.json")) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_text_file(p.string()));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", p.string(), e.what());
    }
    auto map_it = index.find("weight_map");
    if (!index.is_object() || map_it == index.end() || !map_it->is_object())
      fail("{}: no weight_map object", p.string());
    std::map<std::string, std::vector<std::string>> names_by_shard;
    for (auto& [name, shard] : map_it->items()) {
      if (!shard.is_string()) fail("{}: weight_map entry '{}' is not a file name", p.string(), name);
      std::string shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name == "..")
        fail("{}: shard name '{}' must be a plain file name", p.string(), shard_name);
      names_by_shard[shard_name].push_back(name);
    }
    if (names_by_shard.empty()) fail("{}: weight_map is empty", p.string());
    for (auto& [shard, names] : names_by_shard) add_file((p.parent_path() / shard).string(), &names);
  } else {
    add_file(p.string(), nullptr);
  }
}

void SafetensorsSet::add_file(const std::string& path, const std::vector<std::string>* expected_names) {
  auto file = std::make_unique<SafetensorsFile>(path);
  std::set<std::string_view> assigned;
  if (expected_names) assigned.insert(expected_names->begin(), expected_names->end());
  if (expected_names) {
    for (auto& name : *expected_names)
      if (!file->find(name)) fail("{}: tensor '{}' is listed in the index but missing from this shard", path, name);
  }
  for (auto& entry : file->entries()) {
    // With an index, only the tensors it assigns to this shard count.
    if (expected_names && !assigned.count(entry.name)) continue;
    // Tensors fireline cannot view (more than kMaxDims dims) are not part of the model it sees:
    // only multimodal towers have them, and no text decoder reads them.
    if (entry.shape.size() > static_cast<size_t>(kMaxDims)) continue;
    if (index_.count(entry.name)) fail("{}: tensor '{}' is also present in another shard", path, entry.name);
    index_.emplace(entry.name, std::make_pair(file.get(), &entry));
  }
  files_.push_back(std::move(file));
}

std::optional<Tensor> SafetensorsSet::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second.first->tensor(*it->second.second);
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (auto& [name, _] : index_) out.push_back(name);
  return out;
}

}  // namespace fl
