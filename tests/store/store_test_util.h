#pragma once
// Shared by the store tests and the store CLI tests: the model file they serve and pull.
#include <string>

#include "core/mapped_file.h"
#include "core/sha256.h"
#include "io/quantize_model.h"
#include "util/test_util.h"

namespace fl::test {

// The committed 26B-A4B-shaped fixture (tests/fixtures/gemma4-moe) quantized to a .fire with the
// default policy, made once per test process (a few hundred KB).
inline const std::string& fixture_fire_bytes() {
  static const std::string bytes = [] {
    TempDir dir;
    quantize_model(fixtures_dir() + "/gemma4-moe", dir.file("m.fire"), QuantizeOptions{});
    return read_text_file(dir.file("m.fire"));
  }();
  return bytes;
}

inline std::string fixture_fire_sha256() { return sha256_hex(fixture_fire_bytes()); }

}  // namespace fl::test
