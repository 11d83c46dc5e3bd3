// Fuzzes the tokenizer.json loader: any byte string must either load or fail with fl::Error;
// never crash, hang or read out of bounds. What loads must then encode, decode and stream a fixed
// text without crashing, and streaming must agree with decode.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const fl::Tokenizer tok = fl::Tokenizer::from_json(json);
    const std::string text = "Hello, world! 12345 <s> <bos>\n\t caf\xC3\xA9 \xF0\x9F\x99\x82 \xE2\x96\x81x \xFF";
    for (bool special : {true, false}) {
      const auto ids = tok.encode(text, special);
      const std::string decoded = tok.decode(ids);
      fl::StreamingDetokenizer stream(tok);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.finish();
      if (streamed != decoded) std::abort();
      for (int32_t id : ids) (void)tok.id_to_token(id);
    }
  } catch (const fl::Error&) {
  }
  return 0;
}
