#pragma once
// SHA-256 through OpenSSL's EVP interface, fed incrementally so that a multi-GB tensor section can
// be hashed while it is written or read, without holding it in memory.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fl {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  // The digest as 64 lowercase hex characters; the object cannot be updated afterwards.
  std::string hex_digest();

 private:
  void* context_ = nullptr;  // EVP_MD_CTX, kept opaque so that callers need no OpenSSL headers
  bool finished_ = false;
};

// sha256 of one buffer, as lowercase hex.
std::string sha256_hex(const void* data, size_t size);
inline std::string sha256_hex(std::string_view bytes) { return sha256_hex(bytes.data(), bytes.size()); }

}  // namespace fl
