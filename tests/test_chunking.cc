// Chunking: MTU -> chunk payload, and the buffer <-> seq layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

// The message of the std::invalid_argument that `f` throws ("" if none).
template <class F>
std::string InvalidArgumentMessage(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ChunkPayload, StandardAndJumboMtu) {
  // 1500 - 20 (IPv4) - 8 (UDP) = 1472 bytes of UDP payload, minus the header.
  EXPECT_EQ(ChunkPayloadForMtu(1500), 1452u);
  EXPECT_EQ(ChunkPayloadForMtu(1500) + kDataHeaderBytes + kIpv4HeaderBytes +
                kUdpHeaderBytes,
            1500u);
  EXPECT_EQ(ChunkPayloadForMtu(9000), 8952u);
  EXPECT_EQ(ChunkPayloadForMtu(kMinMtu), 528u);
  EXPECT_EQ(ChunkPayloadForMtu(kMaxMtu), 9168u);
}

TEST(ChunkPayload, AlwaysMultipleOfFourAndFitsTheMtu) {
  for (uint32_t mtu = kMinMtu; mtu <= kMaxMtu; ++mtu) {
    const uint32_t c = ChunkPayloadForMtu(mtu);
    ASSERT_EQ(c % 4, 0u) << "mtu " << mtu;
    ASSERT_LE(c + kDataHeaderBytes + kIpv4HeaderBytes + kUdpHeaderBytes, mtu)
        << "mtu " << mtu;
    // Rounded down by less than one float: no wasted float slot.
    ASSERT_GT(c + 4 + kDataHeaderBytes + kIpv4HeaderBytes + kUdpHeaderBytes,
              mtu)
        << "mtu " << mtu;
  }
  EXPECT_EQ(ChunkPayloadForMtu(1501), 1452u);
  EXPECT_EQ(ChunkPayloadForMtu(1503), 1452u);
  EXPECT_EQ(ChunkPayloadForMtu(1504), 1456u);
}

TEST(ChunkPayload, MtuOutOfBoundsThrowsWithFix) {
  for (uint32_t mtu : {0u, 1u, kMinMtu - 1, kMaxMtu + 1, 65535u, 0xFFFFFFFFu}) {
    const std::string msg =
        InvalidArgumentMessage([&] { ChunkPayloadForMtu(mtu); });
    ASSERT_FALSE(msg.empty()) << "mtu " << mtu << " did not throw";
    EXPECT_NE(msg.find(std::to_string(mtu)), std::string::npos) << msg;
    EXPECT_NE(msg.find("1500"), std::string::npos) << msg;  // the fix
    EXPECT_NE(msg.find("9000"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(ChunkPayloadForMtu(kMinMtu));
  EXPECT_NO_THROW(ChunkPayloadForMtu(kMaxMtu));
  EXPECT_THROW(ChunkLayout::ForMtu(1000, 100), std::invalid_argument);
}

TEST(ChunkLayoutTest, LastChunkShort) {
  const ChunkLayout l(10000, 1452);
  EXPECT_EQ(l.num_chunks(), 7u);  // 6 * 1452 = 8712, remainder 1288
  EXPECT_EQ(l.total_bytes(), 10000u);
  EXPECT_EQ(l.chunk_payload(), 1452u);
  for (uint32_t s = 0; s < 6; ++s) EXPECT_EQ(l.Length(s), 1452u) << s;
  EXPECT_EQ(l.Length(6), 1288u);
  EXPECT_EQ(l.Offset(6), 8712u);
  EXPECT_EQ(l.ChunkOf(9999), 6u);
  EXPECT_EQ(l.ChunkOf(8712), 6u);
  EXPECT_EQ(l.ChunkOf(8711), 5u);
}

TEST(ChunkLayoutTest, ExactMultipleHasFullLastChunk) {
  const ChunkLayout l(1452 * 5, 1452);
  EXPECT_EQ(l.num_chunks(), 5u);
  EXPECT_EQ(l.Length(4), 1452u);
  EXPECT_EQ(l.Offset(4) + l.Length(4), l.total_bytes());
  EXPECT_EQ(l.ChunkOf(l.total_bytes() - 1), 4u);
}

TEST(ChunkLayoutTest, OneByteBuffer) {
  const ChunkLayout l(1, 1452);
  EXPECT_EQ(l.num_chunks(), 1u);
  EXPECT_EQ(l.Length(0), 1u);
  EXPECT_EQ(l.Offset(0), 0u);
  EXPECT_EQ(l.ChunkOf(0), 0u);
}

TEST(ChunkLayoutTest, ForMtuMatchesExplicitPayload) {
  // ResNet-ish: 25.6M floats.
  const uint64_t bytes = 25'557'032ull * 4;
  const ChunkLayout a = ChunkLayout::ForMtu(bytes, 1500);
  EXPECT_EQ(a, ChunkLayout(bytes, 1452));
  EXPECT_EQ(a.num_chunks(), (bytes + 1451) / 1452);
  const ChunkLayout j = ChunkLayout::ForMtu(bytes, 9000);
  EXPECT_EQ(j.chunk_payload(), 8952u);
  EXPECT_LT(j.num_chunks(), a.num_chunks() / 6);
}

TEST(ChunkLayoutTest, OffsetLengthChunkOfConsistentOverAllChunks) {
  const uint64_t sizes[] = {1, 3, 4, 1451, 1452, 1453, 2904, 100000, 1234567};
  const uint32_t payloads[] = {4, 8, 1452, 8952};
  for (uint64_t total : sizes) {
    for (uint32_t cp : payloads) {
      const ChunkLayout l(total, cp);
      SCOPED_TRACE("total=" + std::to_string(total) +
                   " cp=" + std::to_string(cp));
      ASSERT_GE(l.num_chunks(), 1u);
      uint64_t sum = 0;
      for (uint32_t s = 0; s < l.num_chunks(); ++s) {
        ASSERT_EQ(l.Offset(s), sum);
        const uint32_t len = l.Length(s);
        ASSERT_GE(len, 1u);
        ASSERT_LE(len, cp);
        if (s + 1 < l.num_chunks()) {
          ASSERT_EQ(len, cp);
        }
        ASSERT_EQ(l.ChunkOf(l.Offset(s)), s);
        ASSERT_EQ(l.ChunkOf(l.Offset(s) + len - 1), s);
        sum += len;
      }
      EXPECT_EQ(sum, total);
    }
  }
}

TEST(ChunkLayoutTest, InvalidArgumentsThrow) {
  EXPECT_THROW(ChunkLayout(0, 1452), std::invalid_argument);
  EXPECT_THROW(ChunkLayout(1000, 0), std::invalid_argument);
  for (uint32_t cp : {1u, 2u, 3u, 5u, 1450u + 1, 1453u, 8950u + 1}) {
    EXPECT_THROW(ChunkLayout(1000, cp), std::invalid_argument) << cp;
  }
  const std::string msg = InvalidArgumentMessage([] { ChunkLayout(1000, 6); });
  EXPECT_NE(msg.find("multiple of 4"), std::string::npos) << msg;
}

TEST(ChunkLayoutTest, ChunkCountLimit) {
  // 2^31 chunks of 4 bytes is the most a round may have; one more byte is not.
  const uint64_t max_bytes = (1ull << 31) * 4;
  const ChunkLayout l(max_bytes, 4);
  EXPECT_EQ(l.num_chunks(), 1u << 31);
  EXPECT_EQ(l.Length(l.num_chunks() - 1), 4u);
  const std::string msg =
      InvalidArgumentMessage([&] { ChunkLayout(max_bytes + 1, 4); });
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find("MTU"), std::string::npos) << msg;
}

TEST(ChunkLayoutTest, DefaultAndEquality) {
  const ChunkLayout d;
  EXPECT_EQ(d.num_chunks(), 0u);
  EXPECT_EQ(d.total_bytes(), 0u);
  EXPECT_EQ(ChunkLayout(1000, 400), ChunkLayout(1000, 400));
  EXPECT_NE(ChunkLayout(1000, 400), ChunkLayout(1001, 400));
  EXPECT_NE(ChunkLayout(1000, 400), ChunkLayout(1000, 500));
}

}  // namespace
}  // namespace dblp
