#include "dblp/security/frame_auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cstring>
#include <stdexcept>

#include "dblp/wire/wire.h"

namespace dblp {
namespace {

EVP_MAC_CTX* MacCtx(void* p) { return static_cast<EVP_MAC_CTX*>(p); }
EVP_CIPHER_CTX* CipherCtx(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }

[[noreturn]] void Fail(const char* what) {
  throw std::runtime_error(std::string("frame authentication: ") + what +
                           " failed in libcrypto (is OpenSSL 3 installed "
                           "with its default provider?)");
}

// GMAC's nonce: the header's type, sender, round and seq (12 bytes), so
// each (sender, round, seq) has its own.
void NonceOf(const uint8_t* header, uint8_t nonce[12]) {
  nonce[0] = header[offsetof(DataHeaderWire, type)];
  nonce[1] = 0;
  std::memcpy(nonce + 2, header + offsetof(DataHeaderWire, sender_rank_be), 2);
  std::memcpy(nonce + 4, header + offsetof(DataHeaderWire, round_be), 4);
  std::memcpy(nonce + 8, header + offsetof(DataHeaderWire, seq_be), 4);
}

}  // namespace

const char* FrameAuthModeName(FrameAuthMode m) {
  switch (m) {
    case FrameAuthMode::kNone:
      return "none";
    case FrameAuthMode::kHeader:
      return "header";
    case FrameAuthMode::kFull:
      return "full";
  }
  return "unknown";
}

bool ParseFrameAuthMode(const std::string& s, FrameAuthMode* out) {
  for (FrameAuthMode m :
       {FrameAuthMode::kNone, FrameAuthMode::kHeader, FrameAuthMode::kFull}) {
    if (s == FrameAuthModeName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

FrameAuth::FrameAuth(const FrameKey& key) : key_(key) {
  if (key_.mode == FrameAuthMode::kHeader) {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "SIPHASH", nullptr);
    if (mac == nullptr) Fail("fetching SIPHASH");
    EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);  // the context keeps its own reference
    if (ctx == nullptr) Fail("EVP_MAC_CTX_new");
    mac_ctx_ = ctx;
    size_t size = kFrameTagBytes;
    const OSSL_PARAM params[] = {
        OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size),
        OSSL_PARAM_END};
    if (EVP_MAC_init(ctx, key_.key.data(), key_.key.size(), params) != 1) {
      Release();
      Fail("SipHash key setup");
    }
  } else if (key_.mode == FrameAuthMode::kFull) {
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    if (ctx == nullptr) Fail("EVP_CIPHER_CTX_new");
    cipher_ctx_ = ctx;
    // The key schedule once; each frame only sets its nonce.
    if (EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key_.key.data(),
                           nullptr) != 1) {
      Release();
      Fail("AES-128-GCM key setup");
    }
  }
}

FrameAuth::~FrameAuth() { Release(); }

FrameAuth::FrameAuth(FrameAuth&& other) noexcept
    : key_(other.key_),
      failures_(other.failures_),
      mac_ctx_(other.mac_ctx_),
      cipher_ctx_(other.cipher_ctx_) {
  other.mac_ctx_ = other.cipher_ctx_ = nullptr;
  other.key_.mode = FrameAuthMode::kNone;
}

FrameAuth& FrameAuth::operator=(FrameAuth&& other) noexcept {
  if (this != &other) {
    Release();
    key_ = other.key_;
    failures_ = other.failures_;
    mac_ctx_ = other.mac_ctx_;
    cipher_ctx_ = other.cipher_ctx_;
    other.mac_ctx_ = other.cipher_ctx_ = nullptr;
    other.key_.mode = FrameAuthMode::kNone;
  }
  return *this;
}

FrameAuth& FrameAuth::operator=(const FrameAuth& other) {
  if (this != &other) {
    FrameAuth fresh(other.key_);
    Release();
    key_ = fresh.key_;
    mac_ctx_ = fresh.mac_ctx_;
    cipher_ctx_ = fresh.cipher_ctx_;
    fresh.mac_ctx_ = fresh.cipher_ctx_ = nullptr;
  }
  return *this;
}

void FrameAuth::Release() {
  EVP_MAC_CTX_free(MacCtx(mac_ctx_));
  EVP_CIPHER_CTX_free(CipherCtx(cipher_ctx_));
  mac_ctx_ = cipher_ctx_ = nullptr;
}

bool FrameAuth::Compute(const uint8_t* frame, size_t len,
                        uint8_t* tag) noexcept {
  if (key_.mode == FrameAuthMode::kHeader) {
    // Re-keying resets SipHash's state; no allocation per frame.
    EVP_MAC_CTX* ctx = MacCtx(mac_ctx_);
    size_t out = 0;
    return EVP_MAC_init(ctx, key_.key.data(), key_.key.size(), nullptr) == 1 &&
           EVP_MAC_update(ctx, frame, kDataHeaderBytes) == 1 &&
           EVP_MAC_final(ctx, tag, &out, kFrameTagBytes) == 1;
  }
  if (key_.mode == FrameAuthMode::kFull) {
    EVP_CIPHER_CTX* ctx = CipherCtx(cipher_ctx_);
    uint8_t nonce[12];
    NonceOf(frame, nonce);
    int n = 0;
    // All of the frame is additional data: authenticated, not encrypted.
    return EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) == 1 &&
           EVP_EncryptUpdate(ctx, nullptr, &n, frame, static_cast<int>(len)) ==
               1 &&
           EVP_EncryptFinal_ex(ctx, tag, &n) == 1 &&
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kFrameTagBytes,
                               tag) == 1;
  }
  return true;
}

void FrameAuth::Seal(const uint8_t* frame, size_t len, uint8_t* tag) noexcept {
  if (key_.mode == FrameAuthMode::kNone) return;
  if (!Compute(frame, len, tag)) {
    ++failures_;
    std::memset(tag, 0, kFrameTagBytes);
  }
}

bool FrameAuth::Verify(const uint8_t* frame, size_t len,
                       const uint8_t* tag) noexcept {
  if (key_.mode == FrameAuthMode::kNone) return true;
  uint8_t want[kFrameTagBytes];
  if (!Compute(frame, len, want)) {
    ++failures_;
    return false;
  }
  return CRYPTO_memcmp(want, tag, kFrameTagBytes) == 0;
}

}  // namespace dblp
