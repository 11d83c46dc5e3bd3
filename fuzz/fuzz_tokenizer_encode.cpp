// Fuzzes encode/decode/streaming on the small committed byte-level fixture
// (tests/text/tokenizer/fixtures/tiny_bytelevel): any input bytes must encode without crashing,
// decode back to the same text with invalid UTF-8 replaced by U+FFFD (a byte-level tokenizer
// without a normalizer loses nothing else, apart from whitespace that lstrip/rstrip tokens take),
// and the bytes read as token ids must stream to exactly
// what decode() gives.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/utf8.h"

namespace {

const fl::Tokenizer& tokenizer() {
  static const fl::Tokenizer tok = fl::Tokenizer::load(FIRELINE_TOKENIZER_FIXTURES "/tiny_bytelevel");
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fl::Tokenizer& tok = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto ids = tok.encode(text, /*add_special_tokens=*/false);
    // The fixture's [L] and [R] tokens swallow neighbouring whitespace (lstrip/rstrip); every
    // other text must come back unchanged.
    const bool strips = text.find("[L]") != std::string_view::npos || text.find("[R]") != std::string_view::npos;
    if (!strips && tok.decode(ids) != fl::utf8::sanitize(text)) std::abort();
    (void)tok.encode(text, true);

    // The same bytes as 16-bit token ids (many out of range, which decode skips).
    std::vector<int32_t> raw;
    for (size_t i = 0; i + 1 < size; i += 2) raw.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % 400);
    for (bool skip : {false, true}) {
      fl::StreamingDetokenizer stream(tok, skip);
      std::string streamed;
      for (int32_t id : raw) {
        const std::string piece = stream.push(id);
        if (!fl::utf8::is_valid(piece)) std::abort();
        streamed += piece;
      }
      streamed += stream.finish();
      if (streamed != tok.decode(raw, skip)) std::abort();
    }
  } catch (const fl::Error&) {
  }
  return 0;
}
