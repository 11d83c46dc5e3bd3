#include "text/tokenizer/byte_level.h"

#include <array>

#include "text/tokenizer/utf8.h"

namespace fl {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 324> to_byte{};  // characters used are all below U+0144
  Tables() {
    to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      to_char[b] = c;
      to_byte[c] = static_cast<int16_t>(b);
      utf8::append(to_utf8[b], c);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_level_char(uint8_t b) { return tables().to_char[b]; }

int byte_level_byte(char32_t c) { return c < tables().to_byte.size() ? tables().to_byte[c] : -1; }

std::string byte_level_encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.to_utf8[b];
  return out;
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const size_t mark = out.size();
  char32_t cp;
  bool valid;
  for (size_t i = 0; i < token.size();) {
    i += utf8::decode(token, i, cp, valid);
    const int b = valid ? byte_level_byte(cp) : -1;
    if (b < 0) {
      out.resize(mark);
      return false;
    }
    out += static_cast<char>(b);
  }
  return true;
}

}  // namespace fl
