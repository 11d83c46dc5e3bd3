// fireline stop : ends the server that `fireline serve -d` started (the one whose pid file is in
// the fireline home), letting it drain the requests in flight first.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/environment.h"
#include "core/error.h"
#include "server/daemon.h"

namespace fl::cli {
namespace {

struct StopOptions {
  double timeout_s = 60;
};

void run_stop(const StopOptions& opt) {
  if (!(opt.timeout_s > 0 && opt.timeout_s <= 86400)) fail("--timeout {} is outside (0, 86400] seconds", opt.timeout_s);
  const auto paths = server::DaemonPaths::under(Environment::from_process().home);
  const auto result = server::stop_daemon(paths, std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000)));
  if (!result.was_running) {
    std::printf("no fireline server is running (%s)\n", paths.pid_file.c_str());
    return;
  }
  std::printf("stopped the fireline server (pid %d)\n", result.pid);
}

}  // namespace

void add_stop_command(CLI::App& app) {
  auto opt = std::make_shared<StopOptions>();
  CLI::App* cmd = app.add_subcommand("stop", "Stop the background server started by `serve -d`");
  cmd->add_option("--timeout", opt->timeout_s, "Seconds to wait for it to drain and exit (default 60)");
  cmd->callback([opt] { run_stop(*opt); });
}

}  // namespace fl::cli
