// Fuzzes the safetensors reader: any byte string must either load (and every tensor view must
// lie inside the file) or fail with fl::Error; never crash, hang or read out of bounds.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fireline-fuzz-safetensors-" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    fl::SafetensorsFile file(path);
    volatile uint8_t sink = 0;
    for (const auto& e : file.entries()) {
      fl::Tensor t = file.tensor(e);
      if (t.nbytes() > 0) sink = sink + static_cast<const uint8_t*>(t.data)[t.nbytes() - 1];
    }
  } catch (const fl::Error&) {
  }
  return 0;
}
