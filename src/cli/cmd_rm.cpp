// fireline rm NAME...: removes models from the local store (file, manifest and any partial download).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "store/model_store.h"

namespace fl::cli {
namespace {

void run_rm(const std::vector<std::string>& names) {
  const ModelStore store = ModelStore::from_environment();
  std::vector<ModelName> parsed;
  for (const std::string& name : names) parsed.push_back(parse_model_name(name));  // all valid before removing any
  for (const ModelName& name : parsed) {
    store.remove(name);
    const std::string out = fmt::format("removed {}\n", name.str());
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
}

}  // namespace

void add_rm_command(CLI::App& app) {
  auto names = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("rm", "Remove models from the local store");
  cmd->add_option("names", *names, "Model names (see `fireline list`)")->required();
  cmd->callback([names] { run_rm(*names); });
}

}  // namespace fl::cli
