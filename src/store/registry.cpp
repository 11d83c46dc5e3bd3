#include "store/registry.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "store/http_client.h"

namespace fl {

const RegistryEntry* Registry::find(const ModelName& name) const {
  auto it = entries.find(name);
  return it == entries.end() ? nullptr : &it->second;
}

bool is_sha256_hex(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  return true;
}

std::string normalize_sha256(const std::string& text, const std::string& what) {
  if (!is_sha256_hex(text))
    fail("{}: '{}' is not a sha256 (64 hex digits)", what, printable_name(text, 80));
  std::string out = text;
  for (char& c : out)
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

Registry parse_registry(const std::string& json_text, const std::string& origin) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded()) fail("registry {}: not valid JSON", origin);
  if (!j.is_object()) fail("registry {}: expected a JSON object of model names to entries", origin);
  Registry registry;
  registry.origin = origin;
  for (auto& [key, value] : j.items()) {
    std::string why;
    std::optional<ModelName> name = try_parse_model_name(key, &why);
    if (!name) fail("registry {}: entry '{}': invalid model name: {}", origin, printable_name(key), why);
    const std::string where = "registry " + origin + ": entry '" + key + "'";
    if (!value.is_object()) fail("{}: expected an object with url, size and sha256", where);
    if (!value.contains("url") || !value["url"].is_string()) fail("{}: 'url' is missing or not a string", where);
    if (!value.contains("size") || !value["size"].is_number_unsigned())
      fail("{}: 'size' is missing or not a byte count", where);
    if (!value.contains("sha256") || !value["sha256"].is_string()) fail("{}: 'sha256' is missing or not a string", where);
    RegistryEntry entry;
    entry.url = value["url"].get<std::string>();
    if (!is_http_url(entry.url)) fail("{}: url '{}' is not an http(s) URL", where, printable_name(entry.url, 200));
    parse_http_url(entry.url);  // reject a malformed URL now, not at download time
    entry.size = value["size"].get<uint64_t>();
    entry.sha256 = normalize_sha256(value["sha256"].get<std::string>(), where + ": sha256");
    if (!registry.entries.emplace(*name, std::move(entry)).second)
      fail("{}: the name {} is listed twice", where, name->str());
  }
  return registry;
}

Registry load_registry(const std::string& file_or_url) {
  if (is_http_url(file_or_url)) return parse_registry(http_get_text(file_or_url, kMaxRegistryBytes), file_or_url);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file_or_url, ec)) fail("registry {}: no such file", file_or_url);
  if (std::filesystem::file_size(file_or_url, ec) > kMaxRegistryBytes)
    fail("registry {}: larger than {} bytes", file_or_url, kMaxRegistryBytes);
  return parse_registry(read_text_file(file_or_url), file_or_url);
}

}  // namespace fl
