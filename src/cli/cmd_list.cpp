// fireline list [--json]: the models in the local store, with size, format, architecture and when
// they were pulled (or last modified, for a file copied in by hand).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "store/model_store.h"

namespace fl::cli {
namespace {

using SystemClock = std::chrono::system_clock;

SystemClock::time_point to_system_time(std::filesystem::file_time_type t) {
  return std::chrono::time_point_cast<SystemClock::duration>(t - std::filesystem::file_time_type::clock::now() +
                                                            SystemClock::now());
}

// "just now", "5 minutes ago", "3 days ago", ...
std::string time_ago(SystemClock::time_point when) {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(SystemClock::now() - when).count();
  if (seconds < 60) return "just now";
  struct Unit {
    long long seconds;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{365LL * 86400, "year"}, {30LL * 86400, "month"}, {7LL * 86400, "week"},
                                    {86400, "day"},          {3600, "hour"},          {60, "minute"}};
  for (const Unit& unit : kUnits)
    if (seconds >= unit.seconds) {
      const long long n = seconds / unit.seconds;
      return fmt::format("{} {}{} ago", n, unit.name, n == 1 ? "" : "s");
    }
  return "just now";
}

void run_list(bool json) {
  const ModelStore store = ModelStore::from_environment();
  const std::vector<StoredModel> models = store.list();
  std::string out;
  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const StoredModel& m : models) {
      nlohmann::ordered_json entry;
      entry["name"] = m.name.str();
      entry["path"] = m.path.string();
      entry["size"] = m.size;
      entry["architecture"] = m.architecture;
      entry["format"] = m.format;
      entry["modified"] = utc_timestamp(to_system_time(m.modified));
      entry["url"] = m.manifest ? nlohmann::ordered_json(m.manifest->url) : nlohmann::ordered_json();
      entry["sha256"] = m.manifest ? nlohmann::ordered_json(m.manifest->sha256) : nlohmann::ordered_json();
      entry["problem"] = m.problem.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(m.problem);
      j.push_back(std::move(entry));
    }
    out = j.dump(2) + "\n";
  } else if (models.empty()) {
    out = fmt::format("no models in {} (get one with `fireline pull`)\n", store.dir().string());
  } else {
    size_t width = 4;
    for (const StoredModel& m : models) width = std::max(width, m.name.str().size());
    out = fmt::format("{:<{}}  {:>9}  {:<6}  {:<12}  {}\n", "NAME", width, "SIZE", "FORMAT", "ARCHITECTURE", "MODIFIED");
    for (const StoredModel& m : models) {
      const std::string arch = !m.problem.empty() ? "(unreadable)" : m.architecture.empty() ? "-" : m.architecture;
      out += fmt::format("{:<{}}  {:>9}  {:<6}  {:<12}  {}\n", m.name.str(), width, human_bytes(m.size),
                         m.format.empty() ? "-" : m.format, arch, time_ago(to_system_time(m.modified)));
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_list_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("list", "List the models in the local store");
  cmd->alias("ls");
  cmd->add_flag("--json", *json, "Print JSON instead of a table");
  cmd->callback([json] { run_list(*json); });
}

}  // namespace fl::cli
