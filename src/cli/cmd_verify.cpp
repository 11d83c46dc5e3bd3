// fireline verify MODEL: recomputes a .fire file's tensor sha256 and compares it with the one
// recorded when the file was written. Opening the file already validates its whole layout, so a
// file that verifies is structurally sound and bit-identical to what the quantizer wrote.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_arg.h"
#include "cli/progress.h"
#include "core/error.h"
#include "io/fire_file.h"

namespace fl::cli {
namespace {

void run_verify(const std::string& arg) {
  const std::string path = resolve_model_arg(arg);
  switch (detect_model_file(path)) {
    case ModelFileKind::gguf: break;
    case ModelFileKind::hf_directory:
      fail("{}: verify checks .fire files (a Hugging Face directory carries no recorded checksum)", path);
    case ModelFileKind::hfqm:
      fail("{}: verify checks .fire files (an HFQM file carries no recorded checksum)", path);
    case ModelFileKind::unknown:
      fail("{}: not a .fire file (it does not start with the GGUF magic), so there is nothing to verify", path);
  }
  FireFile fire(path);
  if (fire.recorded_sha256().empty())
    fail("{}: no {} recorded in the file, nothing to verify against", path, fire_key::kTensorSha256);
  ProgressBar bar("verify");
  const std::string computed = fire.compute_sha256([&](uint64_t done, uint64_t total) { bar.update(done, total); });
  bar.finish();
  if (computed != fire.recorded_sha256())
    fail("{}: tensor data sha256 mismatch: recorded {}, computed {} (the file is corrupt or was modified)", path,
         fire.recorded_sha256(), computed);
  std::string out = fmt::format("{}: OK, tensor sha256 {} matches ({} tensors)\n", path, computed,
                                fire.gguf().tensors().size());
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("verify", "Check a .fire file's tensor data against its recorded sha256");
  cmd->add_option("model", *path, "A .fire file")->required();
  cmd->callback([path] { run_verify(*path); });
}

}  // namespace fl::cli
