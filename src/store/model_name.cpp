#include "store/model_name.h"

#include <fmt/format.h>

#include "core/error.h"

namespace fl {
namespace {

bool is_lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool is_name_char(char c) { return is_lower_alnum(c) || c == '.' || c == '-' || c == '_'; }

std::string describe_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u == 0) return "a NUL byte";
  if (u < 0x20 || u >= 0x7f) return fmt::format("byte \\x{:02x}", u);
  if (c == ' ') return "a space";
  return fmt::format("'{}'", c);
}

// Empty when `part` is a valid family or tag, else the reason.
std::string check_part(std::string_view part, std::string_view what) {
  if (part.empty()) return fmt::format("the {} is empty", what);
  if (!is_lower_alnum(part.front())) return fmt::format("the {} must start with a lowercase letter or digit", what);
  return {};
}

std::string check_name(std::string_view text, ModelName& out) {
  if (text.empty()) return "it is empty";
  if (text.size() > kMaxModelNameLength)
    return fmt::format("it is {} characters long, the limit is {}", text.size(), kMaxModelNameLength);
  size_t colon = std::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ':') {
      if (colon != std::string_view::npos) return "it has more than one ':'";
      colon = i;
    } else if (c == '/' || c == '\\') {
      return fmt::format("{} is not allowed (a name is not a path; give a path to a file directly)", describe_char(c));
    } else if (c >= 'A' && c <= 'Z') {
      return "uppercase letters are not allowed (names are lowercase)";
    } else if (!is_name_char(c)) {
      return fmt::format("{} is not allowed", describe_char(c));
    }
  }
  if (text.find("..") != std::string_view::npos) return "'..' is not allowed";
  const std::string_view family = text.substr(0, colon);
  const std::string_view tag = colon == std::string_view::npos ? kDefaultModelTag : text.substr(colon + 1);
  if (std::string why = check_part(family, "family (before ':')"); !why.empty()) return why;
  if (std::string why = check_part(tag, "tag (after ':')"); !why.empty()) return why;
  out.family = std::string(family);
  out.tag = std::string(tag);
  return {};
}

}  // namespace

std::optional<ModelName> try_parse_model_name(std::string_view text, std::string* why) {
  ModelName name;
  std::string reason = check_name(text, name);
  if (reason.empty()) return name;
  if (why) *why = std::move(reason);
  return std::nullopt;
}

ModelName parse_model_name(std::string_view text) {
  std::string why;
  std::optional<ModelName> name = try_parse_model_name(text, &why);
  if (!name)
    fail("invalid model name '{}': {}; a name is FAMILY[:TAG] of lowercase letters, digits, '.', '-' and '_', "
         "e.g. gemma4:26b-a4b",
         printable_name(text), why);
  return *name;
}

std::string printable_name(std::string_view text, size_t max_chars) {
  std::string out;
  size_t shown = 0;
  for (char c : text) {
    if (shown == max_chars) return out + "...";
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '\\') {
      out += c == '\\' ? std::string("\\\\") : fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
    ++shown;
  }
  return out;
}

}  // namespace fl
