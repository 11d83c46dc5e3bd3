// fireline pull NAME_OR_URL [--name NAME] [--sha256 HEX] [--registry FILE_OR_URL]: downloads a model
// into the store, resuming an interrupted download, verifying size and sha256 and that the file
// opens as a model before it appears under its name (store/pull.h).
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "core/log.h"
#include "store/pull.h"

namespace fl::cli {
namespace {

struct PullCommandOptions {
  std::string source;
  PullRequest request;
};

void run_pull_command(PullCommandOptions& opt) {
  opt.request.source = opt.source;
  const ModelStore store = ModelStore::from_environment();
  const PullPlan plan = plan_pull(store, opt.request);
  log_info("pulling {} from {}", plan.name.str(), plan.url);
  ProgressBar bar("pull");
  PullOptions options;
  options.progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
  const PullResult result = run_pull(store, plan, options);
  bar.finish();
  std::string out;
  if (result.already_present) {
    out = fmt::format("{} is up to date ({}, sha256 {})\n", result.name.str(), human_bytes(result.size), result.sha256);
  } else {
    out = fmt::format("pulled {} ({}, sha256 {}{})\n", result.name.str(), human_bytes(result.size), result.sha256,
                      plan.sha256.empty() ? ", not checked: no expected sha256 given" : ", verified");
  }
  out += fmt::format("{}\n", result.path);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_pull_command(CLI::App& app) {
  auto opt = std::make_shared<PullCommandOptions>();
  CLI::App* cmd = app.add_subcommand("pull", "Download a model into the local store (~/.fireline/models)");
  cmd->add_option("model", opt->source, "A model name from the registry (e.g. gemma4:e2b) or an http(s) URL of a .fire file")
      ->required();
  cmd->add_option("--name", opt->request.name, "Store it under this name (default: the registry name or the URL's file name)");
  cmd->add_option("--sha256", opt->request.sha256, "Expected sha256 of the file (64 hex digits)");
  cmd->add_option("--registry", opt->request.registry,
                  "Registry JSON file or URL (default: registry.json in the store, else none)");
  cmd->callback([opt] { run_pull_command(*opt); });
}

}  // namespace fl::cli
