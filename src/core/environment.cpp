#include "core/environment.h"

#include <cstdlib>

namespace fl {
namespace {

const char* non_empty_env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

}  // namespace

Environment Environment::from_process() {
  Environment env;
  if (const char* home = non_empty_env("FIRELINE_HOME")) {
    env.home = home;
  } else if (const char* user_home = non_empty_env("HOME")) {
    env.home = std::filesystem::path(user_home) / ".fireline";
  } else {
    env.home = ".fireline";
  }
  return env;
}

}  // namespace fl
