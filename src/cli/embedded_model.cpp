// The default model, linked into the executable: models/tiny/fireline-tiny.fire (a small Gemma 4
// trained by scripts/train_tiny.py), so that `fireline run` works on a fresh machine with no
// download. The assembler copies the file's bytes into .rodata; CMake passes its path and its
// sha256 (the hash changes the preprocessed source, so ccache never serves a stale object).
#include <cstdint>
#include <span>

#include "cli/embedded_model.h"
#include "io/model_source.h"

#ifdef FIRELINE_TINY_MODEL_PATH
// GGUF tensor data is aligned to 64 bytes within the file: keep that true in memory.
__asm__(".section .rodata\n"
        ".balign 64\n"
        ".global fireline_tiny_model_begin\n"
        "fireline_tiny_model_begin:\n"
        ".incbin \"" FIRELINE_TINY_MODEL_PATH "\"\n"
        ".global fireline_tiny_model_end\n"
        "fireline_tiny_model_end:\n"
        ".previous\n");
extern "C" const uint8_t fireline_tiny_model_begin[];
extern "C" const uint8_t fireline_tiny_model_end[];
static_assert(sizeof(FIRELINE_TINY_MODEL_SHA256) == 65, "the model's sha256 comes from CMake");
#endif

namespace fl::cli {

void register_builtin_models() {
#ifdef FIRELINE_TINY_MODEL_PATH
  register_embedded_model(
      std::string(kDefaultModelName),
      std::span<const uint8_t>(fireline_tiny_model_begin, static_cast<size_t>(fireline_tiny_model_end - fireline_tiny_model_begin)));
#endif
}

bool has_builtin_default_model() {
#ifdef FIRELINE_TINY_MODEL_PATH
  return true;
#else
  return false;
#endif
}

}  // namespace fl::cli
