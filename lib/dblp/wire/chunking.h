// Chunking: a round's gradient buffer (bytes) <-> chunk sequence numbers.
//
// A chunk plus the DBLP header exactly fills the UDP payload of an MTU-sized
// IPv4 frame, so every data frame is MTU-sized except the round's last one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dblp {

inline constexpr uint32_t kIpv4HeaderBytes = 20;
inline constexpr uint32_t kUdpHeaderBytes = 8;
inline constexpr uint32_t kEthernetHeaderBytes = 14;
inline constexpr uint32_t kMinMtu = 576;   // IPv4 minimum reassembly size
inline constexpr uint32_t kMaxMtu = 9216;  // common jumbo ceiling

// Chunk payload bytes for a given IP MTU: MTU - IPv4 - UDP - DBLP header,
// rounded down to a multiple of 4 so a chunk never splits a float32, less
// `tag_bytes` (an authenticated job's frame tag, a multiple of 4).
// Throws std::invalid_argument if the MTU is outside [kMinMtu, kMaxMtu].
uint32_t ChunkPayloadForMtu(uint32_t mtu, uint32_t tag_bytes = 0);

class ChunkLayout {
 public:
  ChunkLayout() = default;
  // `total_bytes` of gradient cut into chunks of `chunk_payload` bytes; the
  // last chunk holds the remainder. Throws std::invalid_argument on an empty
  // buffer, a chunk size that is zero or not a multiple of 4, or a buffer
  // that needs more than 2^31 chunks.
  ChunkLayout(uint64_t total_bytes, uint32_t chunk_payload);

  // Convenience: layout for `total_bytes` at IP MTU `mtu`.
  static ChunkLayout ForMtu(uint64_t total_bytes, uint32_t mtu);

  uint64_t total_bytes() const { return total_bytes_; }
  uint32_t chunk_payload() const { return chunk_payload_; }
  uint32_t num_chunks() const { return num_chunks_; }

  // Byte offset of chunk `seq` in the buffer. Precondition: seq < num_chunks.
  uint64_t Offset(uint32_t seq) const {
    return static_cast<uint64_t>(seq) * chunk_payload_;
  }
  // Payload bytes of chunk `seq`: chunk_payload except for the last chunk.
  uint32_t Length(uint32_t seq) const {
    return seq + 1 == num_chunks_ ? last_length_ : chunk_payload_;
  }
  // The chunk that holds byte `offset`. Precondition: offset < total_bytes.
  uint32_t ChunkOf(uint64_t offset) const {
    return static_cast<uint32_t>(offset / chunk_payload_);
  }

  bool operator==(const ChunkLayout&) const = default;

 private:
  uint64_t total_bytes_ = 0;
  uint32_t chunk_payload_ = 0;
  uint32_t num_chunks_ = 0;
  uint32_t last_length_ = 0;
};

}  // namespace dblp
