#include "core/sha256.h"

#include <openssl/evp.h>

#include "core/error.h"

namespace fl {

Sha256::Sha256() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    fail("sha256: OpenSSL could not initialise a digest context");
  }
  context_ = ctx;
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(context_)); }

void Sha256::update(const void* data, size_t size) {
  FL_ASSERT(!finished_);
  if (size == 0) return;
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(context_), data, size) != 1) fail("sha256: digest update failed");
}

std::string Sha256::hex_digest() {
  FL_ASSERT(!finished_);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(context_), digest, &length) != 1) fail("sha256: digest final failed");
  finished_ = true;
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.hex_digest();
}

}  // namespace fl
