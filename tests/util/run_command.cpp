#include "util/run_command.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "util/test_util.h"

namespace fl::test {

CommandResult run_command(const std::string& command_line) {
  TempDir dir;
  std::string err_path = dir.file("stderr");
  std::string full = command_line + " 2>" + shell_quote(err_path);
  CommandResult result;
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return result;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.out.append(buf, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  result.err = ss.str();
  return result;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string fireline_binary() {
  const char* env = std::getenv("FIRELINE_BINARY");
  return env && *env ? env : FIRELINE_BINARY;
}

}  // namespace fl::test
