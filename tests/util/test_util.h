#pragma once
// Helpers shared by the tests: a temporary directory that cleans up after itself, and a small
// safetensors writer for building (good and deliberately broken) checkpoints.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fl::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void write_file(const std::string& path, const std::string& bytes);

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

StTensor st_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);

// Serialises tensors back to back; `edit` may rewrite the header JSON before it is written.
std::string safetensors_bytes(const std::vector<StTensor>& tensors, nlohmann::json* header_out = nullptr);
std::string safetensors_from_header(const nlohmann::json& header, const std::string& data);

// Directory of the committed fixtures (tests/fixtures).
std::string fixtures_dir();

// The message of the fl::Error that f() throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace fl::test

// Expects `expr` to throw an fl::Error whose message contains `needle`.
#define EXPECT_ERROR_HAS(expr, needle)                                                                    \
  do {                                                                                                    \
    const std::string message_ = ::fl::test::error_of([&] { (void)(expr); });                             \
    EXPECT_NE(message_.find(needle), std::string::npos) << "error: " << message_ << "\nwanted: " << (needle); \
  } while (0)
