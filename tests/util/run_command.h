#pragma once
// Runs a command line through /bin/sh and captures stdout, stderr and the exit status, for tests
// that drive the fireline binary the way a user does.
#include <string>

namespace fl::test {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

CommandResult run_command(const std::string& command_line);

// Single-quotes `s` for the shell.
std::string shell_quote(const std::string& s);

// Path of the built fireline binary.
std::string fireline_binary();

}  // namespace fl::test
