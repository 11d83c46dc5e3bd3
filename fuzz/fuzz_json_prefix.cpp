// Fuzzes JSON mode's prefix check with arbitrary bytes. Checked on every input: the whole input
// is accepted and complete exactly when nlohmann parses it as one object (inputs are only fed,
// not compared, when their whitespace runs or nesting exceed JsonPrefix's caps, when they hold
// NUL or non-ASCII bytes or \u escapes, or hold a number too large for a double, all of which
// nlohmann judges beyond the grammar); a refused byte is refused again by a fresh check.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/json_prefix.h"

namespace {

// Within the caps JsonPrefix adds on top of RFC 8259.
bool within_caps(std::string_view s) {
  // \u escapes: nlohmann also checks surrogate pairs, which JsonPrefix (like a byte-level
  // grammar) leaves to the consumer.
  if (s.find("\\u") != std::string_view::npos) return false;
  // nlohmann's lexer takes a NUL byte for the end of the input.
  if (s.find('\0') != std::string_view::npos) return false;
  int run = 0, depth = 0;
  bool in_string = false, escape = false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;  // nlohmann checks UTF-8, JsonPrefix does not
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (++run > fl::JsonPrefix::kMaxWhitespaceRun) return false;
      continue;
    }
    run = 0;
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    if (depth > fl::JsonPrefix::kMaxDepth) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  fl::JsonPrefix p;
  size_t accepted = 0;
  while (accepted < in.size() && p.feed(in[accepted])) ++accepted;
  const bool whole = accepted == in.size() && p.complete();
  if (within_caps(in)) {
    bool object = false;
    try {
      object = nlohmann::json::parse(in.begin(), in.end()).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      return 0;  // the grammar allows it; the number does not fit a double
    } catch (const nlohmann::json::parse_error&) {
      object = false;
    }
    if (whole != object) std::abort();
  }
  if (accepted < in.size()) {
    fl::JsonPrefix again;
    if (again.feed(in.substr(0, accepted + 1))) std::abort();  // the same byte is refused again
  }
  return 0;
}
