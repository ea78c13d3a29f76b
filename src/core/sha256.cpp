#include "core/sha256.h"

#include <openssl/evp.h>

#include <fmt/format.h>

namespace anvil {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr); }

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t bytes) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, bytes); }

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  std::string out;
  for (unsigned int i = 0; i < len; i++) out += fmt::format("{:02x}", digest[i]);
  return out;
}

}  // namespace anvil
