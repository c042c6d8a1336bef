// Per-frame tags (lib/dblp/security/frame_auth.h) and the receiver that checks
// them.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <vector>

#include "dblp/round/receiver_round.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

FrameKey Key(FrameAuthMode mode, uint8_t fill = 7) {
  FrameKey k;
  k.mode = mode;
  k.key.fill(fill);
  return k;
}

// Header + payload + room for a tag, the payload a recognisable pattern.
std::vector<uint8_t> Frame(uint32_t round, uint32_t seq, uint16_t len,
                           uint32_t session = 42) {
  DataHeader h{FrameType::kPush, session, 1, len, round, seq};
  std::vector<uint8_t> payload(len);
  for (size_t i = 0; i < len; ++i)
    payload[i] = static_cast<uint8_t>(i * 3 + seq);
  std::vector<uint8_t> f(kDataHeaderBytes + len + kFrameTagBytes);
  BuildDataFrame(h, payload.data(), f.data());
  return f;
}

class FrameAuthModes : public ::testing::TestWithParam<FrameAuthMode> {};

TEST_P(FrameAuthModes, SealedFrameVerifiesAndAnyHeaderBitBreaksIt) {
  FrameAuth a(Key(GetParam()));
  std::vector<uint8_t> f = Frame(6, 3, 64);
  const size_t body = kDataHeaderBytes + 64;
  a.Seal(f.data(), body, f.data() + body);
  EXPECT_TRUE(a.Verify(f.data(), body, f.data() + body));
  for (size_t byte = 0; byte < kDataHeaderBytes; ++byte) {
    std::vector<uint8_t> g = f;
    g[byte] ^= 0x01;
    EXPECT_FALSE(a.Verify(g.data(), body, g.data() + body)) << "byte " << byte;
  }
  std::vector<uint8_t> g = f;
  ASSERT_NE(g.data(), nullptr);
  g.data()[body + 5] ^= 0x80;  // the tag itself
  EXPECT_FALSE(a.Verify(g.data(), body, g.data() + body));
}

TEST_P(FrameAuthModes, AnotherKeyDoesNotVerify) {
  FrameAuth a(Key(GetParam(), 7)), b(Key(GetParam(), 8));
  std::vector<uint8_t> f = Frame(6, 3, 64);
  const size_t body = kDataHeaderBytes + 64;
  a.Seal(f.data(), body, f.data() + body);
  EXPECT_FALSE(b.Verify(f.data(), body, f.data() + body));
}

TEST_P(FrameAuthModes, CopiesSealAlike) {
  FrameAuth a(Key(GetParam()));
  FrameAuth b = a;  // its own context
  FrameAuth c;
  c = a;
  std::vector<uint8_t> f = Frame(2, 9, 32), g = f, h = f;
  const size_t body = kDataHeaderBytes + 32;
  a.Seal(f.data(), body, f.data() + body);
  b.Seal(g.data(), body, g.data() + body);
  c.Seal(h.data(), body, h.data() + body);
  EXPECT_EQ(f, g);
  EXPECT_EQ(f, h);
}

INSTANTIATE_TEST_SUITE_P(Modes, FrameAuthModes,
                         ::testing::Values(FrameAuthMode::kHeader,
                                           FrameAuthMode::kFull));

TEST(FrameAuth, OnlyFullModeCoversThePayload) {
  std::vector<uint8_t> f = Frame(6, 3, 64);
  const size_t body = kDataHeaderBytes + 64;
  FrameAuth header(Key(FrameAuthMode::kHeader)),
      full(Key(FrameAuthMode::kFull));
  std::vector<uint8_t> fh = f, ff = f;
  ASSERT_NE(fh.data(), nullptr);
  ASSERT_NE(ff.data(), nullptr);
  header.Seal(fh.data(), body, fh.data() + body);
  full.Seal(ff.data(), body, ff.data() + body);
  fh[kDataHeaderBytes + 10] ^= 0xFF;
  ff[kDataHeaderBytes + 10] ^= 0xFF;
  EXPECT_TRUE(header.Verify(fh.data(), body, fh.data() + body));
  EXPECT_FALSE(full.Verify(ff.data(), body, ff.data() + body));
}

// The full tag is AES-128-GCM's with the frame as additional data and the
// header's (type, 0, sender, round, seq) as nonce: the one libcrypto gives,
// whatever computes it (intel-ipsec-mb), for every length a frame may have.
TEST(FrameAuth, FullTagIsLibcryptoAesGcmOverTheFrame) {
  const FrameKey key = Key(FrameAuthMode::kFull, 9);
  FrameAuth full(key);
  for (uint16_t len : {0, 4, 60, 1436, 1456, 8940}) {
    std::vector<uint8_t> f = Frame(0x01020304, 0x0A0B0C0D, len);
    const size_t body = kDataHeaderBytes + len;
    full.Seal(f.data(), body, f.data() + body);
    const uint8_t nonce[12] = {f[3], 0, 0,    1,    1,    2,
                               3,    4, 0x0A, 0x0B, 0x0C, 0x0D};
    ASSERT_EQ(f[3], static_cast<uint8_t>(FrameType::kPush));
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    uint8_t want[16];
    int n = 0;
    ASSERT_EQ(EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr,
                                 key.key.data(), nonce),
              1);
    ASSERT_EQ(
        EVP_EncryptUpdate(ctx, nullptr, &n, f.data(), static_cast<int>(body)),
        1);
    ASSERT_EQ(EVP_EncryptFinal_ex(ctx, want, &n), 1);
    ASSERT_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, want), 1);
    EVP_CIPHER_CTX_free(ctx);
    EXPECT_EQ(std::memcmp(want, f.data() + body, 16), 0) << "len " << len;
  }
  EXPECT_NE(FullTagImplementation().find("intel-ipsec-mb"), std::string::npos);
}

// The broadcast's shared-payload frames seal header and payload from two
// places; the tag must be the one-buffer tag, for every length (GMAC's
// partial blocks carried across the two calls) and mode.
TEST_P(FrameAuthModes, SealPartsEqualsSealOverTheWholeFrame) {
  FrameAuth auth(Key(GetParam(), 5));
  for (uint16_t len : {0, 4, 12, 16, 60, 1436, 1452, 8940}) {
    std::vector<uint8_t> f = Frame(3, 0x1000 + len, len);
    const size_t body = kDataHeaderBytes + len;
    auth.Seal(f.data(), body, f.data() + body);
    // The payload elsewhere, at an odd address.
    std::vector<uint8_t> apart(len + 1);
    if (len != 0)
      std::memcpy(apart.data() + 1, f.data() + kDataHeaderBytes, len);
    uint8_t tag[kFrameTagBytes];
    std::memset(tag, 0xEE, sizeof(tag));
    auth.SealParts(f.data(), kDataHeaderBytes, apart.data() + 1, len, tag);
    EXPECT_EQ(std::memcmp(tag, f.data() + body, kFrameTagBytes), 0)
        << "len " << len;
    EXPECT_TRUE(auth.Verify(f.data(), body, tag));
  }
}

TEST(FrameAuth, NoneTagsNothing) {
  FrameAuth none;
  EXPECT_EQ(none.tag_bytes(), 0u);
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(ChunkPayloadForMtu(1500, FrameTagBytes(FrameAuthMode::kHeader)),
            ChunkPayloadForMtu(1500) - 16);
}

TEST(FrameAuth, ModeNamesRoundTrip) {
  for (FrameAuthMode m :
       {FrameAuthMode::kNone, FrameAuthMode::kHeader, FrameAuthMode::kFull}) {
    FrameAuthMode back;
    ASSERT_TRUE(ParseFrameAuthMode(FrameAuthModeName(m), &back));
    EXPECT_EQ(back, m);
  }
  FrameAuthMode x;
  EXPECT_FALSE(ParseFrameAuthMode("gmac", &x));
}

// The receiver: a tagged job accepts only frames whose tag verifies, counts
// the rest as bad_tag, and never lets a forged frame set a bit.
class TaggedReceiver : public ::testing::TestWithParam<FrameAuthMode> {
 protected:
  static constexpr uint32_t kPayload = 64;
  ChunkLayout layout_{10 * kPayload, kPayload};
  FrameKey key_ = Key(GetParam());
  ReceiverRound rx_{
      ReceiverConfig{42, FrameType::kPush, 1, layout_, 0, UINT32_MAX, key_}};

  std::vector<uint8_t> Sealed(uint32_t round, uint32_t seq,
                              const FrameKey& key) {
    std::vector<uint8_t> f = Frame(round, seq, kPayload);
    FrameAuth a(key);
    a.Seal(f.data(), kDataHeaderBytes + kPayload,
           f.data() + kDataHeaderBytes + kPayload);
    return f;
  }
  Verdict Offer(const std::vector<uint8_t>& f, size_t len = 0) {
    DataHeader h;
    const uint8_t* payload = nullptr;
    return rx_.OnFrame(f.data(), len ? len : f.size(), &h, &payload);
  }
};

TEST_P(TaggedReceiver, AcceptsGoodTagsAndCountsForgedOnes) {
  rx_.Begin(4, 0.0);
  EXPECT_EQ(Offer(Sealed(4, 0, Key(GetParam(), 99))), Verdict::kBadTag);
  EXPECT_FALSE(rx_.Has(0));  // the forgery set no bit
  EXPECT_EQ(Offer(Sealed(4, 0, key_)), Verdict::kAccepted);
  EXPECT_EQ(Offer(Sealed(4, 0, key_)), Verdict::kDuplicate);
  // A forgery of a chunk already held is a duplicate: no MAC spent on it.
  EXPECT_EQ(Offer(Sealed(4, 0, Key(GetParam(), 99))), Verdict::kDuplicate);
  // No room for a tag: truncated frames are bad tags, not accepted.
  EXPECT_EQ(Offer(Sealed(4, 1, key_), kDataHeaderBytes + kPayload + 3),
            Verdict::kBadTag);
  std::vector<uint8_t> moved = Sealed(4, 2, key_);
  moved[offsetof(DataHeaderWire, seq_be) + 3] = 5;  // replayed as seq 5
  EXPECT_EQ(Offer(moved), Verdict::kBadTag);
  EXPECT_EQ(rx_.verdict_count(Verdict::kBadTag), 3u);
  EXPECT_EQ(rx_.verdict_count(Verdict::kAccepted), 1u);
  EXPECT_EQ(rx_.received(), 1u);
}

TEST_P(TaggedReceiver, AnOldRoundsGenuineFrameStaysStale) {
  rx_.Begin(4, 0.0);
  const std::vector<uint8_t> old = Sealed(4, 3, key_);
  EXPECT_EQ(Offer(old), Verdict::kAccepted);
  rx_.Close();
  rx_.Begin(6, 0.0);
  EXPECT_EQ(Offer(old), Verdict::kStaleRound);  // a replay, tag and all
  EXPECT_EQ(rx_.received(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, TaggedReceiver,
                         ::testing::Values(FrameAuthMode::kHeader,
                                           FrameAuthMode::kFull));

}  // namespace
}  // namespace dblp
