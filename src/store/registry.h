#pragma once
// A registry: where `fireline pull NAME` finds a model. A JSON object from model names to
// entries, each with the file's http(s) URL, its size in bytes and its sha256:
//
//   { "gemma4:e2b": { "url": "https://host/gemma4-e2b.fire", "size": 1234567,
//                     "sha256": "9f86d0...64 hex" } }
//
// All three fields are required, so a model pulled by name is always verified. Names follow
// store/model_name.h (a name without a tag means `:latest`); other fields in an entry are ignored.
// The registry is a file or an http(s) URL (`pull --registry`); by default the store's
// registry.json, or an empty built-in one when there is none.
#include <cstdint>
#include <map>
#include <string>

#include "store/model_name.h"

namespace fl {

inline constexpr size_t kMaxRegistryBytes = 16u << 20;

struct RegistryEntry {
  std::string url;
  uint64_t size = 0;
  std::string sha256;  // lowercase hex
};

struct Registry {
  std::string origin;  // the file or URL it came from, for messages; "built-in" for the default
  std::map<ModelName, RegistryEntry> entries;
  const RegistryEntry* find(const ModelName& name) const;
};

// Parses registry JSON; fl::Error naming `origin` and the entry for anything malformed.
Registry parse_registry(const std::string& json_text, const std::string& origin);
// Reads a registry from a file path or an http(s) URL.
Registry load_registry(const std::string& file_or_url);

// True when `text` is 64 hex digits (either case).
bool is_sha256_hex(const std::string& text);
// `text` as 64 lowercase hex digits; fl::Error naming `what` otherwise.
std::string normalize_sha256(const std::string& text, const std::string& what);

}  // namespace fl
