// Fuzzes the stop-string matcher with random stop strings and text cut into random pieces.
// Checked on every input: what is released equals the text before the stop string occurrence
// that ends first (on a tie, the one starting first; the whole text when there is none), whatever
// the cutting; a match is reported exactly when a stop string occurs; nothing after a match is
// released.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "runtime/stop_conditions.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.empty()) return 0;
  // Layout: n_stops (low 2 bits), then per stop a length byte (1..8) and its bytes, then a byte
  // that seeds the cut points, then the text.
  size_t p = 0;
  const int n_stops = static_cast<uint8_t>(in[p++]) & 3;
  std::vector<std::string> stops;
  for (int i = 0; i < n_stops && p < in.size(); ++i) {
    size_t len = 1 + (static_cast<uint8_t>(in[p++]) & 7);
    if (p + len > in.size()) return 0;
    stops.emplace_back(in.substr(p, len));
    p += len;
  }
  if (p >= in.size()) return 0;
  uint32_t cut_seed = static_cast<uint8_t>(in[p++]);
  const std::string text(in.substr(p));

  size_t first = std::string::npos, first_end = std::string::npos;
  for (const auto& s : stops) {
    const size_t at = text.find(s);
    if (at == std::string::npos) continue;
    if (at + s.size() < first_end || (at + s.size() == first_end && at < first)) {
      first = at;
      first_end = at + s.size();
    }
  }
  const std::string want = text.substr(0, first);

  fl::StopStringMatcher m(stops);
  std::string got;
  for (size_t at = 0; at < text.size();) {
    cut_seed = cut_seed * 1103515245u + 12345u;
    size_t len = 1 + (cut_seed >> 16) % 7;
    got += m.feed(std::string_view(text).substr(at, len));
    at += len;
  }
  const bool matched = m.matched();
  if (!matched) got += m.flush();
  if (got != want) std::abort();
  if (matched != (first != std::string::npos)) std::abort();
  if (matched && !m.feed("more").empty()) std::abort();
  return 0;
}
