// The fused copy + ones'-complement sum against a plain 16-bit reference,
// over every length and both alignments a frame can hand it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dblp/wire/checksum.h"

namespace dblp {
namespace {

// RFC 1071 the slow way: 16-bit words in memory order, end-around carry.
uint16_t Reference(const uint8_t* p, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i + 1 < n; i += 2) {
    uint16_t w;
    std::memcpy(&w, p + i, 2);
    s += w;
    s = (s & 0xFFFF) + (s >> 16);
  }
  if (n % 2 == 1) {
    uint8_t pad[2] = {p[n - 1], 0};
    uint16_t w;
    std::memcpy(&w, pad, 2);
    s += w;
    s = (s & 0xFFFF) + (s >> 16);
  }
  return static_cast<uint16_t>(s);
}

TEST(Checksum, MatchesReferenceForEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(9100 + 8), dst(9100 + 8);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0u, 1u, 2u, 3u}) {
    for (size_t n = 0; n <= 1600; ++n) {
      std::fill(dst.begin(), dst.end(), 0xAB);
      const uint16_t want = Reference(src.data() + offset, n);
      ASSERT_EQ(OnesSum16(src.data() + offset, n), want) << n << " " << offset;
      ASSERT_EQ(CopyAndSum16(dst.data() + offset, src.data() + offset, n), want)
          << n << " " << offset;
      ASSERT_TRUE(std::equal(src.begin() + offset, src.begin() + offset + n,
                             dst.begin() + offset));
      // Nothing written past the end.
      ASSERT_EQ(dst[offset + n], 0xAB);
    }
  }
  // A jumbo chunk.
  EXPECT_EQ(CopyAndSum16(dst.data(), src.data(), 9100),
            Reference(src.data(), 9100));
}

TEST(Checksum, AllOnesAndCarries) {
  // 0xFFFF words sum to 0xFFFF (negative zero), never 0: the carry folds.
  std::vector<uint8_t> ones(4096, 0xFF), dst(4096);
  EXPECT_EQ(CopyAndSum16(dst.data(), ones.data(), ones.size()), 0xFFFF);
  EXPECT_EQ(OnesSum16(ones.data(), 3), Reference(ones.data(), 3));
  EXPECT_EQ(AddSum16(0xFFFF, 0x0001), 0x0001);
  EXPECT_EQ(AddSum16(0x8000, 0x8000), 0x0001);
  EXPECT_EQ(AddSum16(0x1234, 0), 0x1234);
}

}  // namespace
}  // namespace dblp
