#include "dblp/wire/chunking.h"

#include <stdexcept>
#include <string>

#include "dblp/wire/wire.h"

namespace dblp {

uint32_t ChunkPayloadForMtu(uint32_t mtu, uint32_t tag_bytes) {
  if (mtu < kMinMtu || mtu > kMaxMtu) {
    throw std::invalid_argument(
        "MTU " + std::to_string(mtu) + " is outside [" +
        std::to_string(kMinMtu) + ", " + std::to_string(kMaxMtu) +
        "]: use 1500 for standard Ethernet or up to 9000 for jumbo frames");
  }
  const uint32_t room =
      mtu - kIpv4HeaderBytes - kUdpHeaderBytes - kDataHeaderBytes;
  return (room & ~3u) - tag_bytes;
}

ChunkLayout::ChunkLayout(uint64_t total_bytes, uint32_t chunk_payload)
    : total_bytes_(total_bytes), chunk_payload_(chunk_payload) {
  if (total_bytes == 0) {
    throw std::invalid_argument(
        "gradient buffer is empty: a round needs at least one byte");
  }
  if (chunk_payload == 0 || chunk_payload % 4 != 0) {
    throw std::invalid_argument("chunk payload " +
                                std::to_string(chunk_payload) +
                                " must be a positive multiple of 4 bytes");
  }
  const uint64_t chunks = (total_bytes + chunk_payload - 1) / chunk_payload;
  if (chunks > (1ull << 31)) {
    throw std::invalid_argument(
        "gradient of " + std::to_string(total_bytes) + " bytes needs " +
        std::to_string(chunks) +
        " chunks, more than 2^31: raise the MTU or split the model");
  }
  num_chunks_ = static_cast<uint32_t>(chunks);
  last_length_ = static_cast<uint32_t>(
      total_bytes - static_cast<uint64_t>(num_chunks_ - 1) * chunk_payload);
}

ChunkLayout ChunkLayout::ForMtu(uint64_t total_bytes, uint32_t mtu) {
  return ChunkLayout(total_bytes, ChunkPayloadForMtu(mtu));
}

}  // namespace dblp
