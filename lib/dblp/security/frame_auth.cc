#include "dblp/security/frame_auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

// intel-ipsec-mb's header is C and names its own types; nothing else here
// sees it.
#include <intel-ipsec-mb.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "dblp/wire/wire.h"

namespace dblp {
namespace {

EVP_MAC_CTX* MacCtx(void* p) { return static_cast<EVP_MAC_CTX*>(p); }
gcm_key_data* GcmKey(void* p) { return static_cast<gcm_key_data*>(p); }
constexpr std::align_val_t kGcmKeyAlign{64};

[[noreturn]] void Fail(const char* what) {
  throw std::runtime_error(std::string("frame authentication: ") + what +
                           " failed in libcrypto (is OpenSSL 3 installed "
                           "with its default provider?)");
}

struct ImbArch {
  IMB_MGR* mgr = nullptr;  // only its function table is used: read-only
  IMB_ARCH arch = IMB_ARCH_NONE;
};

// One manager for the process, set up once (thread-safe static): the
// direct GCM calls keep their state in the caller's gcm_context_data, so
// any thread may call through its table.
const ImbArch& Imb() {
  static const ImbArch imb = [] {
    ImbArch a;
    a.mgr = alloc_mb_mgr(0);
    if (a.mgr != nullptr) init_mb_mgr_auto(a.mgr, &a.arch);
    if (a.mgr != nullptr && imb_get_errno(a.mgr) != 0) {
      free_mb_mgr(a.mgr);
      a.mgr = nullptr;
    }
    return a;
  }();
  return imb;
}

const char* ArchName(IMB_ARCH a) {
  switch (a) {
    case IMB_ARCH_NOAESNI:
      return "no-AESNI";
    case IMB_ARCH_SSE:
      return "SSE";
    case IMB_ARCH_AVX:
      return "AVX";
    case IMB_ARCH_AVX2:
      return "AVX2";
    case IMB_ARCH_AVX512:
      return "AVX512";
    default:
      return "none";
  }
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

std::string FullTagImplementation() {
  const ImbArch& imb = Imb();
  if (imb.mgr == nullptr) return "none (intel-ipsec-mb failed to start)";
  return std::string("intel-ipsec-mb ") + imb_get_version_str() + " " +
         ArchName(imb.arch);
}

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
    const ImbArch& imb = Imb();
    if (imb.mgr == nullptr) {
      throw std::runtime_error(
          "frame authentication: intel-ipsec-mb could not start (is "
          "libipsec-mb installed? tools/install-deps.sh); --frame_auth=header "
          "runs without it but does not protect the payload");
    }
    // The key schedule and GHASH powers once; each frame only its nonce.
    gcm_key_ = ::operator new(sizeof(gcm_key_data), kGcmKeyAlign);
    IMB_AES128_GCM_PRE(imb.mgr, key_.key.data(), GcmKey(gcm_key_));
  }
}

FrameAuth::~FrameAuth() { Release(); }

FrameAuth::FrameAuth(FrameAuth&& other) noexcept
    : key_(other.key_),
      failures_(other.failures_),
      mac_ctx_(other.mac_ctx_),
      gcm_key_(other.gcm_key_) {
  other.mac_ctx_ = other.gcm_key_ = nullptr;
  other.key_.mode = FrameAuthMode::kNone;
}

FrameAuth& FrameAuth::operator=(FrameAuth&& other) noexcept {
  if (this != &other) {
    Release();
    key_ = other.key_;
    failures_ = other.failures_;
    mac_ctx_ = other.mac_ctx_;
    gcm_key_ = other.gcm_key_;
    other.mac_ctx_ = other.gcm_key_ = nullptr;
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
    gcm_key_ = fresh.gcm_key_;
    fresh.mac_ctx_ = fresh.gcm_key_ = nullptr;
  }
  return *this;
}

void FrameAuth::Release() {
  EVP_MAC_CTX_free(MacCtx(mac_ctx_));
  if (gcm_key_ != nullptr) {
    OPENSSL_cleanse(gcm_key_, sizeof(gcm_key_data));
    ::operator delete(gcm_key_, kGcmKeyAlign);
  }
  mac_ctx_ = gcm_key_ = nullptr;
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
    uint8_t nonce[12];
    NonceOf(frame, nonce);
    // All of the frame is additional data (authenticated, not encrypted):
    // one call, nothing to encrypt. It cannot fail with these arguments.
    gcm_context_data ctx;
    IMB_AES128_GCM_ENC(Imb().mgr, GcmKey(gcm_key_), &ctx, nullptr, nullptr, 0,
                       nonce, frame, len, tag, kFrameTagBytes);
    return true;
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

// GMAC (GCM with the frame as additional data and nothing encrypted) fed
// in pieces. GHASH consumes 16-byte blocks, so the head and the first bytes
// of `rest` are gathered into whole blocks on the stack first: every update
// but the last then starts at a block boundary of the stream, and the tag
// equals the one-shot IMB_AES128_GCM_ENC over the concatenation.
void FrameAuth::GmacParts(const uint8_t* head, size_t head_len,
                          const uint8_t* rest, size_t rest_len,
                          uint8_t* tag) noexcept {
  constexpr size_t kBlock = 16, kGather = 64;
  uint8_t nonce[12];
  NonceOf(head, nonce);
  const ImbArch& imb = Imb();
  gcm_context_data ctx;
  IMB_AES128_GMAC_INIT(imb.mgr, GcmKey(gcm_key_), &ctx, nonce, sizeof nonce);
  uint8_t gather[kGather];
  size_t first = head_len;
  if (head_len % kBlock != 0 && head_len < kGather) {
    const size_t fill =
        std::min(rest_len, (kBlock - head_len % kBlock) % kBlock);
    std::memcpy(gather, head, head_len);
    std::memcpy(gather + head_len, rest, fill);
    IMB_AES128_GMAC_UPDATE(imb.mgr, GcmKey(gcm_key_), &ctx, gather,
                           head_len + fill);
    rest += fill;
    rest_len -= fill;
    first = 0;
  }
  if (first != 0) {
    IMB_AES128_GMAC_UPDATE(imb.mgr, GcmKey(gcm_key_), &ctx, head, head_len);
  }
  if (rest_len != 0) {
    IMB_AES128_GMAC_UPDATE(imb.mgr, GcmKey(gcm_key_), &ctx, rest, rest_len);
  }
  IMB_AES128_GMAC_FINALIZE(imb.mgr, GcmKey(gcm_key_), &ctx, tag,
                           kFrameTagBytes);
}

void FrameAuth::SealParts(const uint8_t* head, size_t head_len,
                          const uint8_t* rest, size_t rest_len,
                          uint8_t* tag) noexcept {
  if (key_.mode == FrameAuthMode::kNone) return;
  if (key_.mode == FrameAuthMode::kFull) {
    GmacParts(head, head_len, rest, rest_len, tag);
    return;
  }
  // Header mode tags the DBLP header only, which `head` holds.
  Seal(head, head_len, tag);
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
