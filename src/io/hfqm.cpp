#include "io/hfqm.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"

namespace fl {
namespace {

// hipfire's QuantType ids (hipfire-system.md §2.6), for naming what we cannot import.
constexpr std::pair<uint8_t, std::string_view> kHipfireTypes[] = {
    {0, "Q4F16G64"},   {1, "F16"},          {2, "F32"},          {3, "Q8F16"},        {4, "Q4K"},
    {5, "Q8HFQ"},      {6, "HFQ4G256"},     {7, "HFQ4G128"},     {8, "HFQ6G256"},     {9, "HFQ2G256"},
    {10, "HFQ2G128"},  {11, "HFQ3G256"},    {12, "HFQ3G128"},    {13, "MQ4G256"},     {14, "MQ8G256"},
    {15, "MQ6G256"},   {16, "BF16"},        {17, "MQ3G256"},     {18, "MQ2G256"},     {19, "MQ2G256Lloyd"},
    {20, "MQ3G256Lloyd"}, {21, "HFP4G32"},  {22, "TidI32"},      {24, "MFP4G32"},     {28, "PARO4G128"},
    {29, "PARO4G128T"},   {30, "MQ4G256Lloyd"}, {31, "MQ5G256"}, {44, "MQ4G256V2"},   {45, "MQ4CG256"},
    {47, "MQ6G256V2"},    {48, "MQ5G256V2"},    {49, "MQ3G256V2"}, {50, "MQ2G256V2"}, {52, "MQ4G256V2Lloyd"},
};

std::optional<DType> dtype_for_hipfire_type(uint8_t qt) {
  switch (qt) {
    case 1: return DType::f16;
    case 2: return DType::f32;
    case 3: return DType::q8_0;
    case 6: return DType::hfq4_g256;
    case 7: return DType::hfq4_g128;
    case 8: return DType::hfq6_g256;
    case 16: return DType::bf16;
    default: return std::nullopt;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The end (one past the closing brace) of the JSON object starting at `begin`, or 0 when the
// object does not close before `end`.
uint64_t json_object_end(const uint8_t* data, uint64_t begin, uint64_t end) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (uint64_t i = begin; i < end; ++i) {
    const char c = static_cast<char>(data[i]);
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{') ++depth;
    else if (c == '}' && --depth == 0) return i + 1;
  }
  return 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string hfqm_quant_type_name(uint8_t quant_type) {
  for (auto& [id, name] : kHipfireTypes)
    if (id == quant_type) return std::string(name);
  return "type " + std::to_string(quant_type);
}

HfqmFile::HfqmFile(const std::string& path) : file_(path) {
  const uint8_t* d = file_.data();
  const uint64_t size = file_.size();
  if (size < 32) fail("{}: not an HFQM file ({} bytes, shorter than the 32-byte header)", path, size);
  if (std::memcmp(d, "HFQM", 4) != 0) fail("{}: not an HFQM file (bad magic)", path);
  const uint32_t version = load<uint32_t>(d + 4);
  if (version != 1) fail("{}: HFQM version {} is not supported (1 is)", path, version);
  arch_id_ = load<uint32_t>(d + 8);
  const uint32_t n_tensors = load<uint32_t>(d + 12);
  const uint64_t metadata_offset = load<uint64_t>(d + 16);
  const uint64_t data_offset = load<uint64_t>(d + 24);
  if (metadata_offset < 32 || metadata_offset >= size)
    fail("{}: HFQM metadata offset {} lies outside the {}-byte file", path, metadata_offset, size);
  if (data_offset < metadata_offset || data_offset > size)
    fail("{}: HFQM data offset {} lies outside the {}-byte file (truncated?)", path, data_offset, size);
  if (d[metadata_offset] != '{') fail("{}: HFQM metadata at byte {} is not a JSON object", path, metadata_offset);
  const uint64_t json_end = json_object_end(d, metadata_offset, data_offset);
  if (json_end == 0) fail("{}: HFQM metadata JSON does not end before the data section", path);
  try {
    metadata_ = nlohmann::json::parse(d + metadata_offset, d + json_end);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: HFQM metadata is not valid JSON: {}", path, e.what());
  }

  // The tensor index lies between the JSON and the data section.
  uint64_t pos = json_end;
  auto need = [&](uint64_t n, std::string_view what) {
    if (n > data_offset - pos) fail("{}: truncated HFQM tensor index: {} at byte {}", path, what, pos);
  };
  need(4, "tensor count");
  const uint32_t index_count = load<uint32_t>(d + pos);
  pos += 4;
  if (index_count != n_tensors)
    fail("{}: HFQM header says {} tensors but the index lists {}", path, n_tensors, index_count);
  // Each entry takes at least 2 + 1 + 1 + 1 + 4 + 8 bytes.
  if (index_count > (data_offset - pos) / 17) fail("{}: HFQM index of {} tensors does not fit", path, index_count);

  uint64_t data_pos = data_offset;
  std::set<std::string> seen;
  tensors_.reserve(index_count);
  for (uint32_t i = 0; i < index_count; ++i) {
    HfqmTensor t;
    need(2, "name length");
    const uint16_t name_len = load<uint16_t>(d + pos);
    pos += 2;
    need(name_len, "tensor name");
    t.name.assign(reinterpret_cast<const char*>(d + pos), name_len);
    pos += name_len;
    if (t.name.empty()) fail("{}: HFQM tensor {} has an empty name", path, i);
    need(2, "tensor type");
    t.quant_type = d[pos];
    const uint8_t n_dims = d[pos + 1];
    pos += 2;
    if (n_dims == 0 || n_dims > 4) fail("{}: HFQM tensor '{}' has {} dimensions (1 to 4 supported)", path, t.name, n_dims);
    need(4ull * n_dims + 12, "tensor shape");
    for (uint8_t k = 0; k < n_dims; ++k) t.shape.push_back(load<uint32_t>(d + pos + 4ull * k));
    pos += 4ull * n_dims;
    t.group_size = load<uint32_t>(d + pos);
    const uint64_t data_size = load<uint64_t>(d + pos + 4);
    pos += 12;
    if (!seen.insert(t.name).second) fail("{}: HFQM tensor '{}' appears twice", path, t.name);

    auto dtype = dtype_for_hipfire_type(t.quant_type);
    if (!dtype)
      fail("{}: tensor '{}' has hipfire quant type {} ({}), which fireline cannot import (supported: F32, F16, "
           "BF16, Q8F16, HFQ4G256, HFQ4G128, HFQ6G256)",
           path, t.name, hfqm_quant_type_name(t.quant_type), t.quant_type);
    t.dtype = *dtype;
    const DTypeTraits& traits = dtype_traits(t.dtype);
    if (traits.quantized && t.group_size != static_cast<uint32_t>(traits.block_elems))
      fail("{}: tensor '{}' is {} with group size {} (expected {})", path, t.name, hfqm_quant_type_name(t.quant_type),
           t.group_size, traits.block_elems);
    // Dims are u32, so 128-bit products cannot overflow; a size beyond the file is rejected below.
    unsigned __int128 rows = 1;
    for (size_t k = 0; k + 1 < t.shape.size(); ++k) rows *= static_cast<uint64_t>(t.shape[k]);
    const int64_t k_extent = t.shape.back();
    const unsigned __int128 row_safe = rows * static_cast<uint64_t>(row_bytes(t.dtype, k_extent));
    if (row_safe > size) fail("{}: tensor '{}' has an absurd shape {}", path, t.name, shape_string(t.shape));
    if (data_size != row_safe) {
      const unsigned __int128 numel = rows * static_cast<uint64_t>(k_extent);
      const unsigned __int128 flat = (numel + traits.block_elems - 1) / traits.block_elems * traits.block_bytes;
      if (traits.quantized && data_size == flat)
        fail("{}: tensor '{}' ({} {}) was packed before row-safe packing (its groups run across rows); re-quantize "
             "it from the Hugging Face checkpoint",
             path, t.name, hfqm_quant_type_name(t.quant_type), shape_string(t.shape));
      fail("{}: tensor '{}' ({} {}) has {} bytes but its shape needs {}", path, t.name,
           hfqm_quant_type_name(t.quant_type), shape_string(t.shape), data_size, static_cast<uint64_t>(row_safe));
    }
    if (data_size > size - data_pos)
      fail("{}: tensor '{}' data [{}, {}) lies past the end of the {}-byte file (truncated?)", path, t.name, data_pos,
           data_pos + data_size, size);
    t.data_begin = data_pos;
    t.data_end = data_pos + data_size;
    data_pos = t.data_end;
    tensors_.push_back(std::move(t));
  }
}

std::string HfqmFile::config_json() const {
  auto it = metadata_.find("config");
  if (it == metadata_.end()) fail("{}: HFQM metadata has no 'config' (the model's config.json)", path());
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_object()) fail("{}: HFQM metadata 'config' is not an object", path());
  return it->dump(2);
}

std::string HfqmFile::tokenizer_json() const {
  auto it = metadata_.find("tokenizer");
  if (it == metadata_.end() || it->is_null()) return {};
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::string HfqmFile::generation_config_json() const {
  auto it = metadata_.find("generation_config");
  if (it == metadata_.end() || it->is_null()) return {};
  return it->is_string() ? it->get<std::string>() : it->dump(2);
}

std::string HfqmFile::tokenizer_config_json() const {
  auto it = metadata_.find("tokenizer_config");
  if (it == metadata_.end() || !it->is_object()) return {};
  return it->dump();
}

std::string HfqmFile::chat_template() const {
  auto it = metadata_.find("tokenizer_config");
  if (it == metadata_.end() || !it->is_object()) return {};
  auto tpl = it->find("chat_template");
  if (tpl == it->end()) return {};
  if (tpl->is_string()) return tpl->get<std::string>();
  // transformers also allows a list of named templates; the default one is what chat uses.
  if (tpl->is_array())
    for (const auto& entry : *tpl)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  return {};
}

}  // namespace fl
