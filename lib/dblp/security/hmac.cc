#include "dblp/security/hmac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>
#include <vector>

namespace dblp {
namespace {

void AppendPart(std::vector<uint8_t>& out, std::span<const uint8_t> part) {
  const auto n = static_cast<uint32_t>(part.size());
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<uint8_t>(n >> shift));
  }
  out.insert(out.end(), part.begin(), part.end());
}

}  // namespace

AuthBytes HmacSha256(std::span<const uint8_t> key, std::string_view label,
                     std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> msg;
  AppendPart(msg,
             {reinterpret_cast<const uint8_t*>(label.data()), label.size()});
  for (std::span<const uint8_t> p : parts) AppendPart(msg, p);
  AuthBytes out{};
  unsigned int len = 0;
  static const uint8_t kNoKey = 0;  // HMAC wants a pointer even for no key
  if (HMAC(EVP_sha256(), key.empty() ? &kNoKey : key.data(),
           static_cast<int>(key.size()), msg.data(), msg.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    throw std::runtime_error("HMAC-SHA256 failed in libcrypto");
  }
  return out;
}

}  // namespace dblp
