// SHA-256, fed piece by piece (OpenSSL's EVP digest): checkpoints' weight digests.
#pragma once
#include <cstddef>
#include <string>

namespace anvil {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  // The digest as lowercase hex; ends the computation.
  std::string hex();

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace anvil
