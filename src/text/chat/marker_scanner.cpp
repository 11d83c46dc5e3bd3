#include "text/chat/marker_scanner.h"

#include "core/error.h"

namespace fl::chat {

MarkerScanner::MarkerScanner(std::vector<std::string> markers) : markers_(std::move(markers)) {
  for (const auto& m : markers_) {
    FL_ASSERT(!m.empty());
    if (first_bytes_.find(m[0]) == std::string::npos) first_bytes_ += m[0];
  }
}

void MarkerScanner::feed(std::string_view text, const TextFn& on_text, const MarkerFn& on_marker) {
  buf_.append(text);
  process(false, on_text, on_marker);
}

void MarkerScanner::finish(const TextFn& on_text, const MarkerFn& on_marker) { process(true, on_text, on_marker); }

void MarkerScanner::release_held(const TextFn& on_text) {
  if (!buf_.empty()) {
    std::string held = std::move(buf_);
    buf_.clear();
    on_text(held);
  }
}

void MarkerScanner::process(bool final, const TextFn& on_text, const MarkerFn& on_marker) {
  // Work on a local copy so that callbacks may call back into this object safely.
  std::string buf = std::move(buf_);
  buf_.clear();
  const std::string_view view(buf);
  size_t start = 0;  // first byte not yet released
  size_t p = start;
  while (true) {
    p = view.find_first_of(first_bytes_, p);
    if (p == std::string_view::npos) break;
    const std::string_view rest = view.substr(p);
    size_t best = SIZE_MAX;
    bool could_grow = false;
    for (size_t k = 0; k < markers_.size(); ++k) {
      const std::string& m = markers_[k];
      if (rest.size() >= m.size()) {
        if (rest.compare(0, m.size(), m) == 0 && (best == SIZE_MAX || m.size() > markers_[best].size())) best = k;
      } else if (!final && m.compare(0, rest.size(), rest) == 0) {
        could_grow = true;  // the buffer ends inside what may become this marker
      }
    }
    if (could_grow) {
      if (p > start) on_text(view.substr(start, p - start));
      buf_ = std::string(rest);
      return;
    }
    if (best == SIZE_MAX) {
      ++p;
      continue;
    }
    if (p > start) on_text(view.substr(start, p - start));
    on_marker(best);
    start = p + markers_[best].size();
    p = start;
  }
  if (start < view.size()) on_text(view.substr(start));
}

}  // namespace fl::chat
