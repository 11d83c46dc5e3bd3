#pragma once
// Helpers for the .fire / GGUF tests: a byte-level GGUF builder that can write files no correct
// writer would (wrong counts, bad offsets, unknown types), and small Hugging Face directories.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "util/test_util.h"

namespace fl::test {

// Appends little-endian values and GGUF strings to a byte string.
struct Bytes {
  std::string data;
  template <typename T>
  Bytes& put(T v) {
    data.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    data += s;
    return *this;
  }
};

struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;  // GGUF order: innermost first
  uint32_t type = 0;
  uint64_t offset = 0;
};

// A GGUF file spelled out field by field. `metadata` holds pre-encoded (key, type, value) bytes.
struct RawGguf {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::string metadata;
  uint64_t n_metadata = 0;
  std::vector<RawTensor> tensors;
  int64_t n_tensors_override = -1;
  uint64_t alignment = 32;
  std::string data;  // the data section

  RawGguf& string_kv(const std::string& key, const std::string& value) {
    Bytes b;
    b.str(key).put<uint32_t>(8).str(value);
    metadata += b.data;
    ++n_metadata;
    return *this;
  }
  RawGguf& u32_kv(const std::string& key, uint32_t value) {
    Bytes b;
    b.str(key).put<uint32_t>(4).put<uint32_t>(value);
    metadata += b.data;
    ++n_metadata;
    return *this;
  }
  RawGguf& raw_kv(const std::string& encoded) {
    metadata += encoded;
    ++n_metadata;
    return *this;
  }

  std::string bytes() const {
    Bytes b;
    b.put<uint32_t>(magic).put<uint32_t>(version);
    b.put<uint64_t>(n_tensors_override >= 0 ? static_cast<uint64_t>(n_tensors_override) : tensors.size());
    b.put<uint64_t>(n_metadata);
    b.data += metadata;
    for (const RawTensor& t : tensors) {
      b.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) b.put<uint64_t>(d);
      b.put<uint32_t>(t.type).put<uint64_t>(t.offset);
    }
    b.data.resize((b.data.size() + alignment - 1) / alignment * alignment, '\0');
    return b.data + data;
  }
};

inline StTensor st_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<uint16_t>& bits) {
  StTensor t{name, "BF16", std::move(shape), {}};
  t.bytes.resize(bits.size() * 2);
  std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

// A Hugging Face directory holding `config.json` of fixture `config_from` and the given tensors.
inline void write_hf_dir(const TempDir& dir, const std::vector<StTensor>& tensors,
                         const std::string& config_from = "gemma4-moe") {
  std::filesystem::copy_file(fixtures_dir() + "/" + config_from + "/config.json", dir.file("config.json"));
  write_file(dir.file("model.safetensors"), safetensors_bytes(tensors));
}

// Deterministic pseudo-random floats in [-1, 1).
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

}  // namespace fl::test
