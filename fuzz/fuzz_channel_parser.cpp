// Fuzzes the streaming reasoning-channel parser and the tool-call extractor with random text cut
// into random pieces. Checked on every input:
//   - the concatenation of everything emitted equals the input with the markers removed
//     (computed here by a plain leftmost-longest scan over the whole text);
//   - how text is routed (reasoning vs answer) does not depend on the cutting;
//   - the tool-call extractor never crashes and never loses text outside tool calls.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "text/chat/reasoning_parser.h"
#include "text/chat/tool_calls.h"

namespace {

using fl::chat::ChannelEvent;
using fl::chat::ReasoningParser;
using fl::chat::ReasoningSyntax;

std::string remove_markers(std::string_view text, const ReasoningSyntax& s) {
  std::vector<std::string> markers = s.open;
  markers.insert(markers.end(), s.close.begin(), s.close.end());
  markers.insert(markers.end(), s.drop.begin(), s.drop.end());
  std::string out;
  size_t p = 0;
  while (p < text.size()) {
    size_t best = 0;
    for (const auto& m : markers)
      if (m.size() > best && text.compare(p, m.size(), m) == 0) best = m.size();
    if (best) {
      p += best;
    } else {
      out += text[p++];
    }
  }
  return out;
}

struct Routed {
  std::string reasoning, answer, all;
};

Routed route(const ReasoningSyntax& syntax, bool start, std::string_view text, const std::vector<size_t>& cuts) {
  ReasoningParser parser(syntax, start);
  std::vector<ChannelEvent> events;
  size_t from = 0;
  for (size_t cut : cuts) {
    parser.feed(text.substr(from, cut - from), events);
    from = cut;
  }
  parser.feed(text.substr(from), events);
  parser.finish(events);
  Routed r;
  for (const auto& e : events) {
    (e.kind == ChannelEvent::Kind::reasoning ? r.reasoning : r.answer) += e.text;
    r.all += e.text;
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  uint32_t seed = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const ReasoningSyntax syntax = (mode & 1) ? ReasoningSyntax::gemma4() : ReasoningSyntax::think_tags();
  const bool start = mode & 2;

  std::vector<size_t> cuts;
  for (size_t p = 0; p < text.size();) {
    seed = seed * 1103515245u + 12345u;
    p += 1 + (seed >> 16) % 7;
    if (p < text.size()) cuts.push_back(p);
  }
  const Routed whole = route(syntax, start, text, {});
  const Routed pieces = route(syntax, start, text, cuts);
  if (whole.all != remove_markers(text, syntax)) std::abort();
  if (pieces.reasoning != whole.reasoning || pieces.answer != whole.answer) std::abort();

  fl::chat::ToolCallExtractor extractor((mode & 4) ? fl::chat::ToolCallFormat::gemma4 : fl::chat::ToolCallFormat::qwen);
  std::vector<fl::chat::ToolCallEvent> events;
  size_t from = 0;
  for (size_t cut : cuts) {
    extractor.feed(text.substr(from, cut - from), events);
    from = cut;
  }
  extractor.feed(text.substr(from), events);
  extractor.finish(events);
  size_t out_bytes = 0;
  for (const auto& e : events) out_bytes += e.text.size();
  if (out_bytes > text.size()) std::abort();  // text is only ever removed, never invented
  return 0;
}
