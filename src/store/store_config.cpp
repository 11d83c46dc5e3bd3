#include "store/store_config.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace fl {
namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

// The home directory of the current user from the passwd database, for processes started without
// HOME (systemd units, some containers).
std::string passwd_home() {
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found || !found->pw_dir)
    return {};
  return found->pw_dir;
}

}  // namespace

StoreConfig store_config_from_environment() {
  StoreConfig config;
  std::string home = environment("FIRELINE_HOME");
  if (!home.empty()) {
    config.home_from = "FIRELINE_HOME";
    config.home = std::filesystem::absolute(home).lexically_normal();
    return config;
  }
  home = environment("HOME");
  if (home.empty()) home = passwd_home();
  if (home.empty()) fail("cannot find the model store: set FIRELINE_HOME (or HOME) to a directory");
  config.home_from = "HOME";
  config.home = (std::filesystem::absolute(home) / ".fireline").lexically_normal();
  return config;
}

}  // namespace fl
