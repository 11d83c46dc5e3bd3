#pragma once
// When generation ends. Two independent checks, both pure bookkeeping so that they can be tested
// on crafted token streams and reused by the server for many sequences:
//   - TokenStopChecker looks at token ids and counts: an end-of-sequence id (generation_config's
//     eos_token_id set, e.g. Gemma 4's {1, 106, 50}), the max_tokens budget, a full context;
//   - StopStringMatcher looks at the text: user stop strings, matched across token boundaries and
//     never emitted. Text that could still become the start of a stop string is held back until
//     the next piece decides it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fl {

// Why generation ended, in more detail than the OpenAI finish_reason.
enum class StopCause {
  none,
  eos_token,     // the model produced an end-of-sequence id (not emitted as text)
  stop_string,   // the text reached a stop string (not emitted)
  max_tokens,    // the max_tokens budget is spent
  context_full,  // the sequence holds as many positions as its context
  cancelled,     // the caller's cancel flag
};

// The OpenAI finish_reason: stop (eos or stop string), length (max tokens or context full),
// tool_calls (stopped after a tool call), cancelled (fireline's own: the caller cancelled).
enum class FinishReason { stop, length, tool_calls, cancelled };

const char* stop_cause_name(StopCause cause);
const char* finish_reason_name(FinishReason reason);
FinishReason finish_reason_of(StopCause cause, bool made_tool_calls);

struct TokenStopPolicy {
  std::vector<int32_t> eos_ids;
  int64_t max_tokens = 0;  // generated tokens allowed; 0: no limit but the context
  int64_t context = 0;     // positions the sequence can hold
};

class TokenStopChecker {
 public:
  explicit TokenStopChecker(TokenStopPolicy policy);

  bool is_eos(int32_t id) const;
  // After `token` was produced as the `n_generated`-th generated token, with `n_past` positions
  // already in the sequence (the token itself not yet among them): eos_token when it ends the
  // sequence (checked first: such a token is never emitted); else max_tokens when the budget is
  // spent; else context_full when there is no position left to feed the token at; else none.
  // In the last two cases the token is emitted but never fed to the model.
  StopCause check(int32_t token, int64_t n_generated, int64_t n_past) const;

  const TokenStopPolicy& policy() const { return policy_; }

 private:
  TokenStopPolicy policy_;
};

class StopStringMatcher {
 public:
  // Empty stop strings are refused (they would match before any text).
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text` and returns what can be released now. When a stop string is complete,
  // returns the text before it, matched() becomes true and the rest, and any later input, is
  // dropped. Of several, the one that is complete first wins (the earliest end in the text; on a
  // tie the one starting first), so the result does not depend on how the text is cut. Otherwise
  // the longest suffix that is a proper prefix of a stop string is held back.
  std::string feed(std::string_view text);
  // End of the stream: releases the held suffix (it can no longer become a stop string).
  std::string flush();

  bool matched() const { return matched_ >= 0; }
  const std::string& matched_string() const;  // the stop string found (empty when none)
  size_t held_bytes() const { return held_.size(); }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  int matched_ = -1;
};

}  // namespace fl
