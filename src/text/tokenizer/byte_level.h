#pragma once
// The GPT-2 byte-to-character table of byte-level BPE: every byte maps to one printable code point
// (printable Latin-1 bytes to themselves, the rest to U+0100 and up), so any byte string becomes a
// string of vocabulary characters and back.
#include <cstdint>
#include <string>
#include <string_view>

namespace fl {

// The code point that stands for byte b.
char32_t byte_level_char(uint8_t b);
// The byte that code point c stands for, or -1 when c is not in the table.
int byte_level_byte(char32_t c);
// Maps every byte of `bytes` to its character (UTF-8 encoded).
std::string byte_level_encode(std::string_view bytes);
// Inverse of byte_level_encode for one token: appends the bytes to `out` and returns true, or
// returns false (appending nothing) when some character is not in the table.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace fl
