// Per-frame authentication tags: every data frame of an authenticated job
// ends with a tag over its DBLP header (and, in full mode, its payload),
// keyed by a key only the job's members can derive (job_auth.h). A frame
// whose tag does not verify is dropped and counted (Verdict::kBadTag), so
// whoever can reach the data port but was not admitted cannot move the
// mean.
//
//   +--------+-----------------+-----+
//   | header | payload (len B) | tag |   tag: kFrameTagBytes
//   +--------+-----------------+-----+
//
// Modes (WELCOME announces the job's, dblp-server --frame_auth):
//   full:   (the default) AES-128-GMAC over header + payload, its 96-bit
//           nonce taken from the header (type, sender, round, seq). A
//           (key, sender, round, seq) is sealed with one content (a
//           retransmission repeats the bytes), which is what GMAC's nonce
//           rule asks; keys are per job and per member (job_auth.h), so a
//           new job or another member never meets an old nonce.
//   header: SipHash-2-4 (128-bit) over the 20-byte header. It binds the
//           session, sender, round, seq and length to the key; it does NOT
//           cover the payload, so whoever can see a frame can send its
//           header and tag again with other floats and move the mean
//           (docs/SECURITY.md). Cheaper; only for a trusted network.
// GMAC comes from intel-ipsec-mb's AES-GCM (the library under DPDK's
// crypto_ipsec_mb PMDs; its VAES/VPCLMULQDQ code runs it in a quarter of
// libcrypto 3.0's time, docs/BENCHMARKS.md), called directly: no queue,
// no mbuf per tag, and the UDP transport has no EAL. The tags are the ones
// libcrypto's AES-128-GCM gives with the frame as additional data (a test
// checks it). SipHash, the key derivations and the compare are libcrypto's.
// Nothing here is a hand-rolled primitive.
//
// A FrameAuth owns its key schedule; one thread uses it at a time: every
// sender and receiver holds its own (copying makes a fresh one).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dblp {

enum class FrameAuthMode : uint8_t { kNone = 0, kHeader = 1, kFull = 2 };
inline constexpr uint8_t kMaxFrameAuthMode = 2;
inline constexpr uint32_t kFrameTagBytes = 16;

const char* FrameAuthModeName(FrameAuthMode m);  // "none", "header", "full"
// Parses a flag value; false for anything else.
bool ParseFrameAuthMode(const std::string& s, FrameAuthMode* out);
// What computes full-mode tags here, e.g. "intel-ipsec-mb 1.3.0 AVX512"
// (for reports and benchmarks).
std::string FullTagImplementation();

inline uint32_t FrameTagBytes(FrameAuthMode m) {
  return m == FrameAuthMode::kNone ? 0 : kFrameTagBytes;
}

struct FrameKey {
  FrameAuthMode mode = FrameAuthMode::kNone;
  std::array<uint8_t, 16> key{};
  bool operator==(const FrameKey&) const = default;
};

class FrameAuth {
 public:
  // A kNone key makes an authenticator that seals nothing and accepts all.
  // Throws std::runtime_error if libcrypto or intel-ipsec-mb cannot set up
  // the MAC.
  explicit FrameAuth(const FrameKey& key = FrameKey{});
  ~FrameAuth();
  FrameAuth(const FrameAuth& other) : FrameAuth(other.key_) {}
  FrameAuth& operator=(const FrameAuth& other);
  // Moves take the contexts: no allocation (what a datapath lcore may do).
  FrameAuth(FrameAuth&& other) noexcept;
  FrameAuth& operator=(FrameAuth&& other) noexcept;

  FrameAuthMode mode() const { return key_.mode; }
  uint32_t tag_bytes() const { return FrameTagBytes(key_.mode); }
  bool enabled() const { return key_.mode != FrameAuthMode::kNone; }

  // `frame` is a DBLP header followed by `len` - header bytes of payload;
  // writes tag_bytes() bytes at `tag`. Nothing in kNone mode. Never throws
  // (it runs on datapath lcores): if the MAC fails the tag is zeros,
  // which no receiver accepts, and failures() counts it.
  void Seal(const uint8_t* frame, size_t len, uint8_t* tag) noexcept;
  // Seal over a frame in two pieces: `head` (the DBLP header, at least
  // kDataHeaderBytes) followed by `rest` (the payload, wherever it lives:
  // external-buffer TX tags the gradient in place). The same tag as Seal
  // over the concatenation.
  void SealParts(const uint8_t* head, size_t head_len, const uint8_t* rest,
                 size_t rest_len, uint8_t* tag) noexcept;
  // Constant-time compare of the expected tag with `tag`; false if the MAC
  // fails.
  bool Verify(const uint8_t* frame, size_t len, const uint8_t* tag) noexcept;
  uint64_t failures() const { return failures_; }

 private:
  void Release();
  bool Compute(const uint8_t* frame, size_t len, uint8_t* tag) noexcept;
  void GmacParts(const uint8_t* head, size_t head_len, const uint8_t* rest,
                 size_t rest_len, uint8_t* tag) noexcept;

  FrameKey key_;
  uint64_t failures_ = 0;       // owner thread only
  void* mac_ctx_ = nullptr;     // EVP_MAC_CTX (header mode)
  void* gcm_key_ = nullptr;     // intel-ipsec-mb gcm_key_data (full mode)
};

}  // namespace dblp
