// Data-frame header codec: layout on the wire, every DecodeStatus, chunk
// validation against a layout, and round-counter wrap-around.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

DataHeader RandomHeader(Rng& rng) {
  DataHeader h;
  h.type = rng.Bernoulli(0.5) ? FrameType::kPush : FrameType::kBroadcast;
  h.session = static_cast<uint32_t>(rng.Next());
  h.sender_rank = static_cast<uint16_t>(rng.Next());
  h.payload_len = static_cast<uint16_t>(rng.Next());
  h.round = static_cast<uint32_t>(rng.Next());
  h.seq = static_cast<uint32_t>(rng.Next());
  return h;
}

// A valid frame for chunk `seq` of `layout`, payload bytes = seq pattern.
std::vector<uint8_t> FrameFor(uint32_t seq, uint16_t payload_len) {
  DataHeader h;
  h.type = FrameType::kPush;
  h.session = 7;
  h.sender_rank = 1;
  h.payload_len = payload_len;
  h.round = 3;
  h.seq = seq;
  // Never empty: memcpy from a null pointer is UB even for 0 bytes.
  std::vector<uint8_t> payload(std::max<size_t>(payload_len, 1));
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<uint8_t>(i * 31 + seq);
  }
  std::vector<uint8_t> frame(kDataHeaderBytes + payload_len);
  EXPECT_EQ(BuildDataFrame(h, payload.data(), frame.data()), frame.size());
  return frame;
}

std::vector<uint8_t> WithByte(std::vector<uint8_t> frame, size_t index,
                              uint8_t value) {
  frame.at(index) = value;
  return frame;
}

TEST(WireHeader, RandomHeadersRoundTrip) {
  Rng rng(42);
  for (int i = 0; i < 10000; ++i) {
    const DataHeader h = RandomHeader(rng);
    std::vector<uint8_t> buf(kDataHeaderBytes + h.payload_len, 0xEE);
    EncodeDataHeader(h, buf.data());
    DataHeader got;
    ASSERT_EQ(DecodeDataHeader(buf.data(), buf.size(), &got), DecodeStatus::kOk)
        << "iteration " << i;
    EXPECT_EQ(got, h) << "iteration " << i;
  }
}

TEST(WireHeader, GoldenBytesAreBigEndianAtDocumentedOffsets) {
  DataHeader h;
  h.type = FrameType::kBroadcast;
  h.session = 0x01020304u;
  h.sender_rank = 0x0506u;
  h.payload_len = 0x0003u;
  h.round = 0x0708090Au;
  h.seq = 0x0B0C0D0Eu;
  const uint8_t payload[3] = {0xAA, 0xBB, 0xCC};
  std::array<uint8_t, 24> out;
  out.fill(0x55);
  ASSERT_EQ(BuildDataFrame(h, payload, out.data()), 23u);
  const std::array<uint8_t, 24> want = {
      0xDB, 0x1F,              // magic at 0
      0x01,                    // version at 2
      0x02,                    // type at 3 (broadcast)
      0x01, 0x02, 0x03, 0x04,  // session at 4
      0x05, 0x06,              // rank at 8
      0x00, 0x03,              // payload len at 10
      0x07, 0x08, 0x09, 0x0A,  // round at 12
      0x0B, 0x0C, 0x0D, 0x0E,  // seq at 16
      0xAA, 0xBB, 0xCC,        // payload at 20
      0x55,                    // untouched
  };
  EXPECT_EQ(out, want);
  EXPECT_EQ(kDataHeaderBytes, 20u);
}

TEST(WireHeader, PushTypeByteIsOne) {
  DataHeader h;
  h.type = FrameType::kPush;
  uint8_t out[kDataHeaderBytes];
  EncodeDataHeader(h, out);
  EXPECT_EQ(out[3], 1);
  EXPECT_EQ(out[0], 0xDB);
  EXPECT_EQ(out[1], 0x1F);
  EXPECT_EQ(out[2], kWireVersion);
}

TEST(WireDecode, ShortBuffers) {
  DataHeader h;
  EXPECT_EQ(DecodeDataHeader(nullptr, 0, &h), DecodeStatus::kShortBuffer);
  EXPECT_EQ(DecodeDataHeader(nullptr, 100, &h), DecodeStatus::kShortBuffer);
  DataHeader valid;
  uint8_t buf[kDataHeaderBytes];
  EncodeDataHeader(valid, buf);
  EXPECT_EQ(DecodeDataHeader(buf, 0, &h), DecodeStatus::kShortBuffer);
  EXPECT_EQ(DecodeDataHeader(buf, 19, &h), DecodeStatus::kShortBuffer);
  EXPECT_EQ(DecodeDataHeader(buf, 20, &h), DecodeStatus::kOk);
}

TEST(WireDecode, BadMagicVersionAndType) {
  DataHeader valid;
  uint8_t good[kDataHeaderBytes];
  EncodeDataHeader(valid, good);
  DataHeader h;
  for (int byte : {0, 1}) {
    uint8_t buf[kDataHeaderBytes];
    std::memcpy(buf, good, sizeof(buf));
    buf[byte] ^= 0x01;
    EXPECT_EQ(DecodeDataHeader(buf, sizeof(buf), &h), DecodeStatus::kBadMagic)
        << "byte " << byte;
  }
  {
    // Byte-swapped magic (a little-endian encoder) is foreign too.
    uint8_t buf[kDataHeaderBytes];
    std::memcpy(buf, good, sizeof(buf));
    std::swap(buf[0], buf[1]);
    EXPECT_EQ(DecodeDataHeader(buf, sizeof(buf), &h), DecodeStatus::kBadMagic);
  }
  for (uint8_t version : {0, 2, 255}) {
    uint8_t buf[kDataHeaderBytes];
    std::memcpy(buf, good, sizeof(buf));
    buf[2] = version;
    EXPECT_EQ(DecodeDataHeader(buf, sizeof(buf), &h), DecodeStatus::kBadVersion)
        << "version " << int{version};
  }
  for (uint8_t type : {0, 3, 255}) {
    uint8_t buf[kDataHeaderBytes];
    std::memcpy(buf, good, sizeof(buf));
    buf[3] = type;
    EXPECT_EQ(DecodeDataHeader(buf, sizeof(buf), &h), DecodeStatus::kBadType)
        << "type " << int{type};
  }
  // Magic is checked before version, version before type.
  uint8_t all_bad[kDataHeaderBytes] = {};
  EXPECT_EQ(DecodeDataHeader(all_bad, sizeof(all_bad), &h),
            DecodeStatus::kBadMagic);
  all_bad[0] = 0xDB;
  all_bad[1] = 0x1F;
  EXPECT_EQ(DecodeDataHeader(all_bad, sizeof(all_bad), &h),
            DecodeStatus::kBadVersion);
  all_bad[2] = kWireVersion;
  EXPECT_EQ(DecodeDataHeader(all_bad, sizeof(all_bad), &h),
            DecodeStatus::kBadType);
}

TEST(WireDecode, LengthBeyondBufferAndPadding) {
  DataHeader h;
  h.payload_len = 100;
  std::vector<uint8_t> buf(kDataHeaderBytes + 100 + 30, 0);
  EncodeDataHeader(h, buf.data());
  DataHeader got;
  EXPECT_EQ(DecodeDataHeader(buf.data(), kDataHeaderBytes + 99, &got),
            DecodeStatus::kLengthBeyondBuffer);
  EXPECT_EQ(DecodeDataHeader(buf.data(), kDataHeaderBytes, &got),
            DecodeStatus::kLengthBeyondBuffer);
  EXPECT_EQ(DecodeDataHeader(buf.data(), kDataHeaderBytes + 100, &got),
            DecodeStatus::kOk);
  // Trailing bytes (Ethernet padding) are accepted and not counted.
  got = DataHeader{};
  EXPECT_EQ(DecodeDataHeader(buf.data(), buf.size(), &got), DecodeStatus::kOk);
  EXPECT_EQ(got.payload_len, 100);
}

TEST(WireDecode, MaxPayloadLengthBeyondBuffer) {
  DataHeader h;
  h.payload_len = 0xFFFF;
  uint8_t buf[kDataHeaderBytes + 64] = {};
  EncodeDataHeader(h, buf);
  DataHeader got;
  EXPECT_EQ(DecodeDataHeader(buf, sizeof(buf), &got),
            DecodeStatus::kLengthBeyondBuffer);
}

TEST(WireValidate, SeqOutOfRangeAndLengthMismatch) {
  const ChunkLayout layout(1000, 400);  // chunks 400, 400, 200
  ASSERT_EQ(layout.num_chunks(), 3u);
  DataHeader h;
  h.seq = 0;
  h.payload_len = 400;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kOk);
  h.seq = 2;
  h.payload_len = 200;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kOk);
  // The short last chunk sent with the full length.
  h.payload_len = 400;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kLengthMismatch);
  // A full chunk sent short.
  h.seq = 1;
  h.payload_len = 200;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kLengthMismatch);
  h.payload_len = 0;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kLengthMismatch);
  h.seq = 3;
  h.payload_len = 400;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kSeqOutOfRange);
  h.seq = 0xFFFFFFFFu;
  EXPECT_EQ(ValidateChunk(h, layout), DecodeStatus::kSeqOutOfRange);
}

TEST(WireDecodeFrame, ValidFramesPointAtPayload) {
  const ChunkLayout layout(1000, 400);
  for (uint32_t seq = 0; seq < layout.num_chunks(); ++seq) {
    const auto len = static_cast<uint16_t>(layout.Length(seq));
    std::vector<uint8_t> frame = FrameFor(seq, len);
    frame.resize(frame.size() + 7, 0);  // padding
    DataHeader h;
    const uint8_t* payload = nullptr;
    ASSERT_EQ(DecodeDataFrame(frame.data(), frame.size(), layout, &h, &payload),
              DecodeStatus::kOk);
    EXPECT_EQ(h.seq, seq);
    EXPECT_EQ(h.payload_len, len);
    ASSERT_EQ(payload, frame.data() + kDataHeaderBytes);
    for (uint32_t i = 0; i < len; ++i) {
      ASSERT_EQ(payload[i], static_cast<uint8_t>(i * 31 + seq));
    }
  }
}

TEST(WireDecodeFrame, EveryStatusReachable) {
  const ChunkLayout layout(1000, 400);
  std::array<bool, kNumDecodeStatus> seen{};
  auto check = [&](std::vector<uint8_t> frame, size_t len, DecodeStatus want) {
    DataHeader h;
    const uint8_t* payload = nullptr;
    const DecodeStatus got = DecodeDataFrame(
        frame.empty() ? nullptr : frame.data(), len, layout, &h, &payload);
    EXPECT_EQ(got, want) << DecodeStatusName(got) << " vs "
                         << DecodeStatusName(want);
    if (want != DecodeStatus::kOk) {
      EXPECT_EQ(payload, nullptr);
    }
    seen[static_cast<int>(got)] = true;
  };
  const std::vector<uint8_t> good = FrameFor(1, 400);
  check(good, good.size(), DecodeStatus::kOk);
  check({}, 0, DecodeStatus::kShortBuffer);
  check(WithByte(good, 0, 0), good.size(), DecodeStatus::kBadMagic);
  check(WithByte(good, 2, 9), good.size(), DecodeStatus::kBadVersion);
  check(WithByte(good, 3, 3), good.size(), DecodeStatus::kBadType);
  check(good, good.size() - 1, DecodeStatus::kLengthBeyondBuffer);
  check(FrameFor(3, 200), kDataHeaderBytes + 200, DecodeStatus::kSeqOutOfRange);
  check(FrameFor(2, 400), kDataHeaderBytes + 400,
        DecodeStatus::kLengthMismatch);
  for (int s = 0; s < kNumDecodeStatus; ++s) {
    EXPECT_TRUE(seen[s]) << DecodeStatusName(static_cast<DecodeStatus>(s));
  }
}

TEST(WireDecodeFrame, StatusNamesAreDistinct) {
  for (int a = 0; a < kNumDecodeStatus; ++a) {
    const std::string name_a = DecodeStatusName(static_cast<DecodeStatus>(a));
    EXPECT_NE(name_a, "unknown");
    for (int b = a + 1; b < kNumDecodeStatus; ++b) {
      EXPECT_NE(name_a, DecodeStatusName(static_cast<DecodeStatus>(b)));
    }
  }
}

TEST(WireRound, DistanceAndOlderAcrossWrap) {
  EXPECT_EQ(RoundDistance(0, 0xFFFFFFFFu), 1);
  EXPECT_EQ(RoundDistance(0xFFFFFFFFu, 0), -1);
  EXPECT_EQ(RoundDistance(5, 0xFFFFFFFEu), 7);
  EXPECT_EQ(RoundDistance(0xFFFFFFFEu, 5), -7);
  EXPECT_EQ(RoundDistance(10, 3), 7);
  EXPECT_EQ(RoundDistance(3, 10), -7);
  EXPECT_EQ(RoundDistance(123, 123), 0);
  EXPECT_TRUE(RoundIsOlder(0xFFFFFFFFu, 0));
  EXPECT_FALSE(RoundIsOlder(0, 0xFFFFFFFFu));
  EXPECT_TRUE(RoundIsOlder(0xFFFFFFF0u, 2));
  EXPECT_FALSE(RoundIsOlder(2, 0xFFFFFFF0u));
  EXPECT_FALSE(RoundIsOlder(7, 7));
  EXPECT_TRUE(RoundIsOlder(6, 7));
  // Largest representable distances on either side.
  EXPECT_EQ(RoundDistance(0x7FFFFFFFu, 0), 0x7FFFFFFF);
  EXPECT_EQ(RoundDistance(0, 0x7FFFFFFFu), -0x7FFFFFFF);
  static_assert(RoundIsOlder(0xFFFFFFFFu, 0));  // usable at compile time
  // Sweep: for any base, base+d is ahead by d and base-d is older.
  Rng rng(9);
  for (int i = 0; i < 10000; ++i) {
    const auto base = static_cast<uint32_t>(rng.Next());
    const uint32_t d = 1 + rng.NextBelow(0x7FFFFFFEu);
    EXPECT_EQ(RoundDistance(base + d, base), static_cast<int32_t>(d));
    EXPECT_TRUE(RoundIsOlder(base - d, base));
    EXPECT_FALSE(RoundIsOlder(base + d, base));
  }
}

TEST(WireFuzz, RandomBytesNeverCrashOrLie) {
  const ChunkLayout layout(1010, 40);  // 26 chunks, the last of 10 bytes
  Rng rng(20240601);
  std::vector<uint8_t> buf(1600);
  int ok = 0;
  for (int i = 0; i < 100000; ++i) {
    const size_t len = rng.NextBelow(static_cast<uint32_t>(buf.size() + 1));
    for (size_t j = 0; j < len; ++j) buf[j] = static_cast<uint8_t>(rng.Next());
    // Half the time plant a valid prefix so the deeper checks get exercised.
    if (len >= 4 && rng.Bernoulli(0.5)) {
      buf[0] = 0xDB;
      buf[1] = 0x1F;
      buf[2] = kWireVersion;
      buf[3] = static_cast<uint8_t>(1 + rng.NextBelow(2));
      if (len >= 20 && rng.Bernoulli(0.5)) {
        buf[10] = 0;  // payload_len: often right, sometimes not
        buf[11] = rng.Bernoulli(0.5) ? 40 : static_cast<uint8_t>(rng.Next());
        buf[16] = buf[17] = buf[18] = 0;  // seq in [0, 31]: 26..31 invalid
        buf[19] = static_cast<uint8_t>(rng.NextBelow(32));
      }
    }
    DataHeader h;
    const DecodeStatus hs = DecodeDataHeader(buf.data(), len, &h);
    if (hs == DecodeStatus::kOk) {
      ASSERT_GE(len, kDataHeaderBytes);
      ASSERT_LE(kDataHeaderBytes + h.payload_len, len);
      ASSERT_TRUE(h.type == FrameType::kPush ||
                  h.type == FrameType::kBroadcast);
    }
    const uint8_t* payload = nullptr;
    const DecodeStatus fs =
        DecodeDataFrame(buf.data(), len, layout, &h, &payload);
    if (hs != DecodeStatus::kOk) {
      ASSERT_EQ(fs, hs);
    }
    if (fs == DecodeStatus::kOk) {
      ++ok;
      ASSERT_LT(h.seq, layout.num_chunks());
      ASSERT_EQ(h.payload_len, layout.Length(h.seq));
      ASSERT_LE(kDataHeaderBytes + h.payload_len, len);
      ASSERT_EQ(payload, buf.data() + kDataHeaderBytes);
    }
  }
  // The planted prefixes must have produced frames that passed everything,
  // else the loop never exercised the post-decode invariants above.
  EXPECT_GT(ok, 1000);
}

}  // namespace
}  // namespace dblp
