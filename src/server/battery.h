#pragma once
// The serve battery (`fireline battery URL`): fixed conversations sent to a running
// OpenAI-compatible server, each answer checked for the ways a served model goes wrong:
//   runaway         finish_reason "length": it hit max_tokens instead of stopping
//   empty           no visible answer (no content and no tool calls), e.g. all spent thinking
//   attractor       a degenerate loop: too few distinct words, one word dominating, or repeated
//                   word trigrams (is_attractor below)
//   retrieval_miss  an expected substring is missing from the answer (case-insensitive)
// The default cases: five single prompts (code, arithmetic reasoning, factual, prose
// continuation, instruction following), a two-turn recall, and a needle in a haystack longer
// than a sliding-attention window. Each runs with thinking on and off.
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fl::server {

struct BatteryCase {
  std::string name;
  std::vector<std::string> turns;   // user messages, sent one after another; earlier answers stay in the history
  std::vector<std::string> expect;  // substrings the last answer must contain (empty: no retrieval check)
};

// The built-in cases; the haystack holds `needle_words` words of filler around its needle.
std::vector<BatteryCase> default_battery_cases(int needle_words);
// Cases from a JSON file: [{"name": ..., "prompt": "..." | "turns": ["...", ...], "expect": ["..."]}].
std::vector<BatteryCase> load_battery_cases(const std::string& path);

struct BatteryOptions {
  std::string url;      // server base URL, e.g. http://127.0.0.1:11435 (a trailing /v1 is accepted)
  std::string model;    // empty: the first model /v1/models lists
  std::string api_key;  // sent as a Bearer token when set
  std::vector<bool> thinking = {false, true};
  int64_t max_tokens = 4096;
  std::chrono::seconds timeout{600};  // per request
};

struct BatteryRow {
  std::string name;
  bool thinking = false;
  std::string finish_reason;
  int64_t completion_tokens = 0;
  double ms = 0;       // whole conversation
  double ttft_ms = 0;  // last turn: request -> first reasoning or answer text
  bool runaway = false, empty = false, attractor = false, retrieval_miss = false;
  int found = 0, expected = 0;
  std::string error;   // the request failed (HTTP error, bad stream); the counters are then unset
  std::string answer;  // the last answer's visible text
};

// Runs every case in every thinking mode; `on_row` sees each row as it completes. Throws
// fl::Error when the server cannot be reached at all.
std::vector<BatteryRow> run_battery(const BatteryOptions& options, const std::vector<BatteryCase>& cases,
                                    const std::function<void(const BatteryRow&)>& on_row = {});

// The degenerate-loop test over the whitespace-separated words of `text`: with at least 16
// words, the first 128 have fewer than 15 % distinct or one word over half of them, or the last
// 128 have fewer than 30 % distinct or one word over half; or, with at least 6 words, more than
// half of the word trigrams in the second half occur more than once.
bool is_attractor(std::string_view text);

}  // namespace fl::server
