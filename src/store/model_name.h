#pragma once
// Model names in the store: FAMILY[:TAG], e.g. `gemma4:26b-a4b`; the tag defaults to `latest`.
//
// A name becomes file names inside the store (store/model_store.h), so it is validated strictly
// rather than sanitised: lowercase letters, digits, '.', '-' and '_', at most one ':', each part
// starting with a letter or digit, no "..", at most kMaxModelNameLength characters. Everything
// else (a '/', an absolute path, a NUL, uppercase, spaces) is rejected with a message that says
// which rule was broken, so a name can never reach outside the store or hide as a dot-file.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fl {

inline constexpr size_t kMaxModelNameLength = 128;
inline constexpr std::string_view kDefaultModelTag = "latest";

struct ModelName {
  std::string family;
  std::string tag;
  std::string str() const { return family + ":" + tag; }
  bool operator==(const ModelName&) const = default;
  auto operator<=>(const ModelName&) const = default;
};

// Throws fl::Error: "invalid model name '...': <which rule>; a name is ...".
ModelName parse_model_name(std::string_view text);
// The same without throwing: nullopt and the reason in *why (when given).
std::optional<ModelName> try_parse_model_name(std::string_view text, std::string* why = nullptr);

// `text` made safe to quote in a one-line message: control bytes and non-ASCII escaped as \xNN,
// cut to `max_chars` with "..." appended.
std::string printable_name(std::string_view text, size_t max_chars = 80);

}  // namespace fl
