#pragma once
// The environment variables fireline reads, all in one place and typed. Nothing else calls
// getenv: a new knob is a field here, with its default documented (docs/cli.md "Environment").
#include <filesystem>

namespace fl {

struct Environment {
  // FIRELINE_HOME: where fireline keeps its state (the serve daemon's pid file and log).
  // Default: $HOME/.fireline, or ./.fireline when HOME is unset.
  std::filesystem::path home;

  static Environment from_process();  // reads the variables now
};

}  // namespace fl
