// fireline battery URL : the serve battery against a running OpenAI-compatible server. Prints one
// row per case and thinking mode, then the counter totals; exits 1 when a counted counter is
// non-zero or a request failed (src/server/battery.h describes the cases and counters).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "server/battery.h"

namespace fl::cli {
namespace {

const char* kCounters[] = {"runaway", "empty", "attractor", "retrieval_miss"};

struct BatteryCliOptions {
  std::string url;
  std::string model;
  std::string api_key;
  std::string thinking = "both";
  int64_t max_tokens = 4096;
  int needle_words = 3000;
  std::string prompts;
  std::string count = "runaway,empty,attractor,retrieval_miss";
  double timeout_s = 600;
};

std::set<std::string> parse_count(const std::string& list) {
  std::set<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    if (!item.empty()) {
      bool known = false;
      for (const char* c : kCounters) known = known || item == c;
      if (!known) fail("--count: {:?} is not a counter (runaway, empty, attractor, retrieval_miss)", item);
      out.insert(item);
    }
    pos = end + 1;
  }
  return out;
}

void run_battery_command(const BatteryCliOptions& opt) {
  server::BatteryOptions options;
  options.url = opt.url;
  options.model = opt.model;
  options.api_key = opt.api_key;
  options.max_tokens = opt.max_tokens;
  if (opt.max_tokens < 1) fail("--max-tokens {} must be at least 1", opt.max_tokens);
  if (opt.needle_words < 0 || opt.needle_words > 1000000)
    fail("--needle-words {} is outside 0..1000000", opt.needle_words);
  if (!(opt.timeout_s > 0 && opt.timeout_s <= 86400)) fail("--timeout {} is outside (0, 86400] seconds", opt.timeout_s);
  options.timeout = std::chrono::seconds(static_cast<int64_t>(opt.timeout_s + 0.999));
  if (opt.thinking == "on")
    options.thinking = {true};
  else if (opt.thinking == "off")
    options.thinking = {false};
  else if (opt.thinking == "both")
    options.thinking = {false, true};
  else
    fail("--thinking {:?} is not one of on, off, both", opt.thinking);
  const std::set<std::string> counted = parse_count(opt.count);
  const auto cases =
      opt.prompts.empty() ? server::default_battery_cases(opt.needle_words) : server::load_battery_cases(opt.prompts);

  std::printf("%-14s %-8s %-10s %7s %9s %9s  %-7s %-5s %-9s %s\n", "case", "thinking", "finish", "tokens", "ttft_ms",
              "total_ms", "runaway", "empty", "attractor", "retrieval_miss");
  std::fflush(stdout);
  auto mark = [](bool flag) { return flag ? "YES" : "."; };
  const auto rows = server::run_battery(options, cases, [&](const server::BatteryRow& r) {
    if (!r.error.empty()) {
      std::printf("%-14s %-8s ERROR: %s\n", r.name.c_str(), r.thinking ? "on" : "off", r.error.c_str());
    } else {
      const std::string recall =
          r.expected ? fmt::format("{} ({}/{})", mark(r.retrieval_miss), r.found, r.expected) : "-";
      std::printf("%-14s %-8s %-10s %7lld %9.0f %9.0f  %-7s %-5s %-9s %s\n", r.name.c_str(), r.thinking ? "on" : "off",
                  r.finish_reason.c_str(), static_cast<long long>(r.completion_tokens), r.ttft_ms, r.ms,
                  mark(r.runaway), mark(r.empty), mark(r.attractor), recall.c_str());
    }
    std::fflush(stdout);
  });

  auto counts = [&](const std::string& counter, bool flag) { return flag && counted.count(counter) > 0; };
  int runaway = 0, empty = 0, attractor = 0, miss = 0, errors = 0, failed_rows = 0;
  for (const auto& r : rows) {
    runaway += r.runaway;
    empty += r.empty;
    attractor += r.attractor;
    miss += r.retrieval_miss;
    errors += !r.error.empty();
    failed_rows += !r.error.empty() || counts("runaway", r.runaway) || counts("empty", r.empty) ||
                   counts("attractor", r.attractor) || counts("retrieval_miss", r.retrieval_miss);
  }
  std::string counted_list;
  for (const auto& c : counted) counted_list += (counted_list.empty() ? "" : ",") + c;
  std::printf("turns=%zu runaway=%d empty=%d attractor=%d retrieval_miss=%d errors=%d (failing on: %s)\n", rows.size(),
              runaway, empty, attractor, miss, errors, counted_list.empty() ? "errors only" : counted_list.c_str());
  std::fflush(stdout);
  if (failed_rows > 0) fail("battery: {} of {} rows failed a counted check", failed_rows, rows.size());
}

}  // namespace

void add_battery_command(CLI::App& app) {
  auto opt = std::make_shared<BatteryCliOptions>();
  CLI::App* cmd = app.add_subcommand("battery", "Run the serve battery against a running server and count failures");
  cmd->add_option("url", opt->url, "The server, e.g. http://127.0.0.1:11435")->required();
  cmd->add_option("--model", opt->model, "Model name to request (default: the first one /v1/models lists)");
  cmd->add_option("--api-key", opt->api_key, "Bearer token for a server started with --api-key");
  cmd->add_option("--thinking", opt->thinking, "on, off, or both (default both: every case twice)");
  cmd->add_option("--max-tokens", opt->max_tokens, "max_tokens per turn (default 4096)");
  cmd->add_option("--needle-words", opt->needle_words, "Filler words around the needle (default 3000)");
  cmd->add_option("--prompts", opt->prompts, "A JSON file of cases to run instead of the built-in ones");
  cmd->add_option("--count", opt->count,
                  "Counters that fail the run, comma-separated (default all: runaway,empty,attractor,retrieval_miss)");
  cmd->add_option("--timeout", opt->timeout_s, "Seconds one request may take (default 600)");
  cmd->callback([opt] { run_battery_command(*opt); });
}

}  // namespace fl::cli
