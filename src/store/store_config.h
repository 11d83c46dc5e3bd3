#pragma once
// Where the model store lives. The one place that reads the environment for it (DESIGN §2: every
// environment knob is a typed config field with a documented default):
//
//   FIRELINE_HOME   fireline's data directory; default $HOME/.fireline (HOME, else the passwd
//                   entry of the current user). The store is its `models` folder.
#include <filesystem>
#include <string>

namespace fl {

struct StoreConfig {
  std::filesystem::path home;         // absolute
  std::string home_from;              // where `home` came from: "FIRELINE_HOME" or "HOME"
  std::filesystem::path models_dir() const { return home / "models"; }
};

// Reads FIRELINE_HOME / HOME once per call; throws fl::Error when neither gives a directory.
StoreConfig store_config_from_environment();

}  // namespace fl
