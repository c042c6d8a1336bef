// DBLP data-frame header: the bytes that follow the UDP header.
//
//   0      2   3   4          8     10    12         16         20
//   +------+---+---+----------+-----+-----+----------+----------+---------
//   |magic |ver|typ| session  |rank | len |  round   |   seq    | payload
//   +------+---+---+----------+-----+-----+----------+----------+---------
//
// All fields are big-endian (network order). `len` is the payload length, so
// the last, short chunk of a round and Ethernet padding are both handled. The
// payload itself is float32 in the sender's byte order (little-endian on every
// platform DPDK supports); the header never is.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dblp/wire/chunking.h"

namespace dblp {

inline constexpr uint16_t kDataMagic = 0xDB1Fu;
inline constexpr uint8_t kWireVersion = 1;

// Direction of a data frame: worker -> server (push) or server -> worker
// (broadcast of the mean). A receiver accepts only the type it expects.
enum class FrameType : uint8_t { kPush = 1, kBroadcast = 2 };

// The on-wire layout. Only ever accessed through Encode/Decode below, which
// copy field by field, so alignment of the underlying buffer never matters.
struct __attribute__((packed)) DataHeaderWire {
  uint16_t magic_be;
  uint8_t version;
  uint8_t type;
  uint32_t session_be;
  uint16_t sender_rank_be;
  uint16_t payload_len_be;
  uint32_t round_be;
  uint32_t seq_be;
};
static_assert(sizeof(DataHeaderWire) == 20, "DBLP header must be 20 bytes");
inline constexpr uint32_t kDataHeaderBytes = sizeof(DataHeaderWire);

// The sender rank of a DBLP header, read without decoding the rest, to pick
// the receiver that validates everything; 0xFFFF if `len` is too short.
inline uint16_t PeekSenderRank(const uint8_t* dblp, size_t len) {
  if (len < kDataHeaderBytes) return 0xFFFF;
  const uint8_t* p = dblp + offsetof(DataHeaderWire, sender_rank_be);
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}

// Host-order view of the header.
struct DataHeader {
  FrameType type = FrameType::kPush;
  uint32_t session = 0;
  uint16_t sender_rank = 0;
  uint16_t payload_len = 0;
  uint32_t round = 0;
  uint32_t seq = 0;
  bool operator==(const DataHeader&) const = default;
};

// Every way a frame can be malformed, so each is counted separately.
enum class DecodeStatus : uint8_t {
  kOk = 0,
  kShortBuffer,         // fewer bytes than a header
  kBadMagic,            // not a DBLP frame
  kBadVersion,          // a DBLP frame of another protocol version
  kBadType,             // unknown frame type
  kLengthBeyondBuffer,  // payload_len says more bytes than arrived
  kSeqOutOfRange,       // seq >= the round's chunk count
  kLengthMismatch,      // payload_len differs from the chunk's length
};
inline constexpr int kNumDecodeStatus = 8;
const char* DecodeStatusName(DecodeStatus s);

// Writes kDataHeaderBytes bytes at `out`.
void EncodeDataHeader(const DataHeader& h, uint8_t* out);

// Writes header + `h.payload_len` bytes of `payload` at `out` and returns
// the frame length. `out` needs kDataHeaderBytes + payload_len bytes.
size_t BuildDataFrame(const DataHeader& h, const uint8_t* payload,
                      uint8_t* out);

// Network to host order (ntohs / ntohl without <arpa/inet.h>).
constexpr uint16_t FromBe16(uint16_t v) {
  return std::endian::native == std::endian::little ? __builtin_bswap16(v) : v;
}
constexpr uint32_t FromBe32(uint32_t v) {
  return std::endian::native == std::endian::little ? __builtin_bswap32(v) : v;
}

// Structural decode: checks everything that needs no session knowledge.
// Bytes past header + payload_len (e.g. Ethernet padding) are allowed.
// Inline, as ValidateChunk: a receiver runs both once per frame.
inline DecodeStatus DecodeDataHeader(const uint8_t* buf, size_t len,
                                     DataHeader* out) {
  if (buf == nullptr || len < kDataHeaderBytes) {
    return DecodeStatus::kShortBuffer;
  }
  DataHeaderWire w;
  std::memcpy(&w, buf, sizeof(w));
  if (FromBe16(w.magic_be) != kDataMagic) {
    return DecodeStatus::kBadMagic;
  }
  if (w.version != kWireVersion) return DecodeStatus::kBadVersion;
  if (w.type != static_cast<uint8_t>(FrameType::kPush) &&
      w.type != static_cast<uint8_t>(FrameType::kBroadcast)) {
    return DecodeStatus::kBadType;
  }
  const uint16_t payload_len = FromBe16(w.payload_len_be);
  if (payload_len > len - kDataHeaderBytes) {
    return DecodeStatus::kLengthBeyondBuffer;
  }
  out->type = static_cast<FrameType>(w.type);
  out->session = FromBe32(w.session_be);
  out->sender_rank = FromBe16(w.sender_rank_be);
  out->payload_len = payload_len;
  out->round = FromBe32(w.round_be);
  out->seq = FromBe32(w.seq_be);
  return DecodeStatus::kOk;
}

// Checks a structurally valid header against the round's chunk layout.
inline DecodeStatus ValidateChunk(const DataHeader& h,
                                  const ChunkLayout& layout) {
  if (h.seq >= layout.num_chunks()) return DecodeStatus::kSeqOutOfRange;
  if (h.payload_len != layout.Length(h.seq)) {
    return DecodeStatus::kLengthMismatch;
  }
  return DecodeStatus::kOk;
}

// Both of the above; on kOk `*payload` points at the chunk bytes in `buf`.
DecodeStatus DecodeDataFrame(const uint8_t* buf, size_t len,
                             const ChunkLayout& layout, DataHeader* out,
                             const uint8_t** payload);

// Round counters are u32 and wrap. `RoundDistance(a, b)` is how many rounds
// `a` is ahead of `b` (negative: behind), correct across the wrap as long as
// the two are within 2^31 rounds of each other.
// The sender rank the server puts in its broadcast frames.
inline constexpr uint16_t kServerRank = 0xFFFF;

// Round counters: iteration i pushes in round 2i and broadcasts in 2i + 1,
// on both sides, so no message is needed to agree on them.
constexpr uint32_t PushRound(uint64_t it) {
  return static_cast<uint32_t>(2 * it);
}
constexpr uint32_t BroadcastRound(uint64_t it) { return PushRound(it) + 1; }

constexpr int32_t RoundDistance(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b);
}
constexpr bool RoundIsOlder(uint32_t a, uint32_t b) {
  return RoundDistance(a, b) < 0;
}

}  // namespace dblp
