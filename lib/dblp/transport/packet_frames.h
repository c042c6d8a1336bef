// The send side's frames over a burst transport of in-memory packets (kernel
// UDP sockets, the loopback fabric): each chunk becomes a Packet holding the
// DBLP header and the chunk's bytes, sent in one TxBurst.
#pragma once

#include <cstdint>
#include <vector>

#include "dblp/security/frame_auth.h"
#include "dblp/transport/transport.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {

template <BurstTransport Transport>
class PacketFrames {
 public:
  // Chunks come from `buffer` (layout.total_bytes() bytes); frames go to
  // endpoint `dst` of `transport`. All three must outlive this object.
  PacketFrames(Transport* transport, uint32_t dst, const uint8_t* buffer,
               const ChunkLayout* layout, uint32_t max_burst)
      : transport_(transport),
        buffer_(buffer),
        layout_(layout),
        packets_(max_burst) {
    for (Packet& p : packets_) {
      p.dst = dst;
      p.bytes.reserve(kDataHeaderBytes + layout->chunk_payload() +
                      kFrameTagBytes);
    }
  }

  // Builds `n` (at most max_burst) chunks `seqs` into frames of `proto` and
  // sends them; returns how many the transport took.
  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    DataHeader h = proto;
    for (uint32_t i = 0; i < n; ++i) {
      h.seq = seqs[i];
      h.payload_len = static_cast<uint16_t>(layout_->Length(h.seq));
      Packet& p = packets_[i];
      // No allocation: the capacity of a full chunk was reserved.
      const size_t body = kDataHeaderBytes + h.payload_len;
      p.bytes.resize(body + auth_.tag_bytes());
      BuildDataFrame(h, buffer_ + layout_->Offset(h.seq), p.bytes.data());
      if (auth_.enabled()) auth_.Seal(p.bytes.data(), body, &p.bytes[body]);
    }
    return transport_->TxBurst(packets_.data(), static_cast<uint16_t>(n));
  }
  void set_buffer(const uint8_t* buffer) { buffer_ = buffer; }
  // An authenticated job: every frame ends with its tag (frame_auth.h).
  void set_auth(const FrameKey& key) { auth_ = FrameAuth(key); }

 private:
  Transport* transport_;
  const uint8_t* buffer_;
  const ChunkLayout* layout_;
  std::vector<Packet> packets_;
  FrameAuth auth_;
};

}  // namespace dblp
