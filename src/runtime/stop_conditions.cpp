#include "runtime/stop_conditions.h"

#include <algorithm>

#include "core/error.h"

namespace fl {

const char* stop_cause_name(StopCause cause) {
  switch (cause) {
    case StopCause::none: return "none";
    case StopCause::eos_token: return "eos_token";
    case StopCause::stop_string: return "stop_string";
    case StopCause::max_tokens: return "max_tokens";
    case StopCause::context_full: return "context_full";
    case StopCause::cancelled: return "cancelled";
  }
  return "none";
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::tool_calls: return "tool_calls";
    case FinishReason::cancelled: return "cancelled";
  }
  return "stop";
}

FinishReason finish_reason_of(StopCause cause, bool made_tool_calls) {
  switch (cause) {
    case StopCause::max_tokens:
    case StopCause::context_full: return FinishReason::length;
    case StopCause::cancelled: return FinishReason::cancelled;
    default: return made_tool_calls ? FinishReason::tool_calls : FinishReason::stop;
  }
}

TokenStopChecker::TokenStopChecker(TokenStopPolicy policy) : policy_(std::move(policy)) {
  if (policy_.max_tokens < 0) fail("max_tokens must be 0 (no limit) or more, not {}", policy_.max_tokens);
  if (policy_.context <= 0) fail("the context must hold at least one position, not {}", policy_.context);
}

bool TokenStopChecker::is_eos(int32_t id) const {
  return std::find(policy_.eos_ids.begin(), policy_.eos_ids.end(), id) != policy_.eos_ids.end();
}

StopCause TokenStopChecker::check(int32_t token, int64_t n_generated, int64_t n_past) const {
  if (is_eos(token)) return StopCause::eos_token;
  if (policy_.max_tokens > 0 && n_generated >= policy_.max_tokens) return StopCause::max_tokens;
  if (n_past >= policy_.context) return StopCause::context_full;
  return StopCause::none;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_)
    if (s.empty()) fail("a stop string may not be empty");
}

const std::string& StopStringMatcher::matched_string() const {
  static const std::string kNone;
  return matched_ >= 0 ? stops_[static_cast<size_t>(matched_)] : kNone;
}

std::string StopStringMatcher::feed(std::string_view text) {
  if (matched()) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);

  // The stop string that is complete first (smallest end; on a tie the longer one, which starts
  // first) wins. Generation cannot wait for later text, and this rule gives the same answer
  // however the text is cut into pieces.
  size_t best_start = std::string::npos, best_end = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t p = held_.find(stops_[i]);
    if (p == std::string::npos) continue;
    const size_t end = p + stops_[i].size();
    if (end < best_end || (end == best_end && p < best_start)) {
      best_start = p;
      best_end = end;
      matched_ = static_cast<int>(i);
    }
  }
  if (best_start != std::string::npos) {
    std::string out = held_.substr(0, best_start);
    held_.clear();
    return out;
  }

  // Hold the longest suffix that some stop string starts with (and does not yet complete: a
  // complete one would have been found above).
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace fl
