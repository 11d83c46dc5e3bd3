// Fuzzes structured output's two halves with one input: a JSON Schema text, a 0x01 byte, then
// document bytes. The schema either compiles or is refused with fl::Error (never a crash, a hang
// on recursive $refs, or another exception); a compiled one then checks the document byte by byte.
// Checked: a document accepted whole and complete is one JSON object by nlohmann too (within the
// caps fuzz_json_prefix states), and a refused byte is refused again by a fresh check.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/json_prefix.h"
#include "runtime/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\x01');
  const std::string_view schema_text = in.substr(0, cut), doc = cut == std::string_view::npos ? "" : in.substr(cut + 1);
  const nlohmann::json schema = nlohmann::json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return 0;
  fl::JsonSchema compiled;
  try {
    compiled = fl::JsonSchema::compile(schema);
  } catch (const fl::Error&) {
    return 0;
  }
  fl::JsonPrefix p(&compiled);
  size_t accepted = 0;
  while (accepted < doc.size() && p.feed(doc[accepted])) ++accepted;
  if (accepted == doc.size() && p.complete() && doc.find("\\u") == std::string_view::npos &&
      doc.find('\0') == std::string_view::npos) {
    try {
      if (!nlohmann::json::parse(doc.begin(), doc.end()).is_object()) std::abort();
    } catch (const nlohmann::json::out_of_range&) {
      // the grammar allows it; the number does not fit a double
    } catch (const nlohmann::json::parse_error&) {
      // non-ASCII bytes that are not UTF-8: JsonPrefix (like a byte-level grammar) lets them through
      for (char c : doc)
        if (static_cast<unsigned char>(c) >= 0x80) return 0;
      std::abort();
    }
  }
  if (accepted < doc.size()) {
    fl::JsonPrefix again(&compiled);
    if (again.feed(doc.substr(0, accepted + 1))) std::abort();
  }
  return 0;
}
