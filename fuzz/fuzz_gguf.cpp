// Fuzzes the GGUF reader and the .fire checks on top of it (and the HFQM reader, for inputs that
// start with its magic), and the tokenizer built from a file's tokenizer.ggml.* metadata: any byte
// string must either load, with every tensor's bytes inside the file, or fail with fl::Error;
// never crash, hang or read out of bounds. Seeds include small SentencePiece and byte-level
// tokenizer files (corpus/gguf/tokenizer_*.gguf).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "io/fire_file.h"
#include "io/gguf.h"
#include "io/hfqm.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fireline-fuzz-gguf-" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  volatile uint8_t sink = 0;
  try {
    if (size >= 4 && std::memcmp(data, "HFQM", 4) == 0) {
      fl::HfqmFile hfqm(path);
      for (const auto& t : hfqm.tensors())
        if (t.nbytes() > 0) sink = sink + hfqm.tensor_data(t)[t.nbytes() - 1];
      return 0;
    }
    fl::GgufFile gguf(path);
    for (const auto& t : gguf.tensors())
      if (t.nbytes() > 0) sink = sink + gguf.tensor_data(t)[t.nbytes() - 1];
    for (const auto& e : gguf.metadata()) sink = sink + static_cast<uint8_t>(e.value.describe().size());
    if (fl::has_gguf_tokenizer(gguf)) {
      try {
        const fl::Tokenizer tok = fl::tokenizer_from_gguf(gguf);
        const std::vector<int32_t> ids = tok.encode("ab a! <s>hi!</s>  \xE2\x96\x81x\n\xF0\x9F\x98\x80 c");
        sink = sink + static_cast<uint8_t>(tok.decode(ids).size() + ids.size());
      } catch (const fl::Error&) {
      }
    }
    fl::FireFile fire(path);  // the .fire checks: config, architecture, runnable types
    for (const std::string& name : fire.tensor_names()) {
      fl::Tensor t = *fire.find(name);
      if (t.nbytes() > 0) sink = sink + static_cast<const uint8_t*>(t.data)[t.nbytes() - 1];
    }
  } catch (const fl::Error&) {
  }
  return 0;
}
