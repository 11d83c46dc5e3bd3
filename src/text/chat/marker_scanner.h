#pragma once
// Finds marker strings (<think>, <channel|>, <|tool_call>, ...) in text that arrives in pieces,
// with the least possible hold-back. It is the one place the streaming parsers decide what text
// can be released, so the rules are stated once:
//   - a marker is found leftmost-first, and the longest marker wins at a position;
//   - text is held back only while it could still turn into a marker: a suffix of the buffer that
//     is a proper prefix of some marker, or a complete marker that a longer one could extend;
//     text that merely starts like a marker and then goes on ("<|chat") is released;
//   - so at most (longest marker length - 1) bytes of plain text are ever held;
//   - finish() resolves the held suffix with no more input to come: a complete marker is a
//     marker, anything else is released as text, never dropped.
// Pieces should be whole UTF-8 characters (as the streaming detokenizer produces); markers are
// ASCII, so cuts only ever happen in front of a marker's first byte.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fl::chat {

class MarkerScanner {
 public:
  using TextFn = std::function<void(std::string_view text)>;
  using MarkerFn = std::function<void(size_t marker_index)>;

  explicit MarkerScanner(std::vector<std::string> markers);

  // Appends `text`; calls on_text for released text and on_marker for each complete marker, in
  // input order. Callbacks may change the caller's state between calls.
  void feed(std::string_view text, const TextFn& on_text, const MarkerFn& on_marker);
  // End of input: releases the held suffix (as a marker if it is one, else as text).
  void finish(const TextFn& on_text, const MarkerFn& on_marker);
  // Releases the held suffix as text now (used when a caller forces a state change).
  void release_held(const TextFn& on_text);

  const std::string& held() const { return buf_; }
  const std::vector<std::string>& markers() const { return markers_; }

 private:
  void process(bool final, const TextFn& on_text, const MarkerFn& on_marker);

  std::vector<std::string> markers_;
  std::string first_bytes_;  // the distinct first bytes of the markers
  std::string buf_;
};

}  // namespace fl::chat
