// The frame builder: Ethernet / IPv4 / UDP / DBLP header / payload, written
// straight into an mbuf from a per-peer template precomputed at setup and
// patched per packet (lengths, IP id, checksums).
//
// RX side: ParseFrame validates the L2-L4 headers of a received mbuf and
// returns where the DBLP bytes are, or why the frame is dropped.
#pragma once

#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dblp/security/frame_auth.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "port.h"

namespace dblp {

struct Endpoint {
  rte_ether_addr mac{};
  uint32_t ipv4 = 0;  // host order
  uint16_t udp_port = 0;
};

inline constexpr uint32_t kL2L3L4Bytes =
    sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr);
static_assert(kL2L3L4Bytes == 42, "Ethernet + IPv4 + UDP headers");

class FrameTemplate {
 public:
  FrameTemplate() = default;
  FrameTemplate(const Endpoint& src, const Endpoint& dst, const PortCaps& caps);

  // Appends a complete frame for chunk `h` (payload `h.payload_len` bytes
  // from `payload`) to an empty mbuf. Returns false (mbuf untouched) if the
  // mbuf is not empty or lacks room. No allocation, no syscalls.
  // IPv4: DF, TTL 64. With offloads (PortCaps from SetupPortOrDie) it sets
  // RTE_MBUF_F_TX_IPV4 | _IP_CKSUM / _UDP_CKSUM, l2_len, l3_len and seeds
  // the UDP checksum with the pseudo-header sum; otherwise it computes the
  // checksums in software (UDP 0 for checksum=none).
  // Same as Prime(h) then BuildChunk(m, h.seq, h.payload_len, payload).
  bool Build(rte_mbuf* m, const DataHeader& h, const uint8_t* payload) {
    Prime(h);
    return BuildChunk(m, h.seq, h.payload_len, payload);
  }
  // The hot path, in two steps: Prime writes the DBLP header fields that
  // are the same for every frame of a burst (type, session, rank, round)
  // into the 64-byte header template, once per burst; BuildChunk then
  // writes the whole template with four 16-byte stores (or two 32-byte)
  // and patches what differs per frame: lengths, IP id and checksum, seq.
  void Prime(const DataHeader& proto);
  bool BuildChunk(rte_mbuf* m, uint32_t seq, uint16_t payload_len,
                  const uint8_t* payload);
  // BuildChunk for a whole burst: frame i carries chunk seqs[i] of
  // `buffer` (layout's offsets and lengths) in mbufs[i], all empty
  // one-segment mbufs of one pool (fresh from rte_pktmbuf_alloc_bulk). The
  // checks and the checksum mode are decided once per burst. Returns false,
  // building nothing, if the longest chunk's frame does not fit an mbuf.
  bool BuildBurst(rte_mbuf* const* mbufs, const uint32_t* seqs, uint32_t k,
                  const uint8_t* buffer, const ChunkLayout& layout);
  // External-buffer TX (--tx_payload=extbuf): the headers (and the tag, if
  // any) go into `m`, an empty mbuf; `seg` (an empty mbuf from any pool) is
  // attached to the `payload_len` payload bytes at `payload` in place
  // (rte_pktmbuf_attach_extbuf with `shinfo`, whose refcnt the caller
  // manages, see ExtbufRegion) and chained after the headers; a tag goes
  // into `tag_seg` (a third empty mbuf, chained last; null when untagged).
  // The linearised frame is byte-identical to BuildChunk's. `payload_iova`:
  // the payload's IO address. Returns false (nothing chained) if an mbuf
  // is not empty or lacks room, or a tag needs a `tag_seg`.
  bool BuildChunkExtbuf(rte_mbuf* m, rte_mbuf* seg, rte_mbuf* tag_seg,
                        uint32_t seq, uint16_t payload_len,
                        const uint8_t* payload, rte_iova_t payload_iova,
                        rte_mbuf_ext_shared_info* shinfo);
  uint32_t tag_bytes() const { return auth_.tag_bytes(); }
  // The same framing around arbitrary UDP payload bytes (hostile-input
  // tests: truncated or garbled DBLP headers with valid L2-L4).
  bool BuildRaw(rte_mbuf* m, const uint8_t* udp_payload, uint16_t len);

  // Steering (steering.h): the UDP destination port of the frames built
  // from now on (a worker sends lcore-shard k's chunks to the server's
  // base port + k). A 2-byte store; dst() keeps the template's own port.
  void set_dst_port(uint16_t port) {
    const uint16_t be = rte_cpu_to_be_16(port);
    std::memcpy(hdr_ + kL2L3L4Bytes - sizeof(rte_udp_hdr) +
                    offsetof(rte_udp_hdr, dst_port),
                &be, sizeof(be));
  }

  const Endpoint& src() const { return src_; }
  const Endpoint& dst() const { return dst_; }
  // An authenticated job: Build appends the frame's tag after the payload
  // (frame_auth.h). The template then owns its own MAC context: one lcore
  // builds with it.
  void set_auth(const FrameKey& key) { auth_ = FrameAuth(key); }
  // New endpoints, the same authenticator (moved, not rebuilt: a datapath
  // lcore may call it).
  void Retarget(const Endpoint& src, const Endpoint& dst,
                const PortCaps& caps) {
    FrameAuth auth = std::move(auth_);
    *this = FrameTemplate(src, dst, caps);
    auth_ = std::move(auth);
  }

 private:
  // Bytes of the L2-L4 + DBLP header template, rounded up to a cache line
  // so that it is copied with fixed-size stores (the last two bytes are
  // overwritten by the payload).
  static constexpr uint32_t kTemplateBytes = 64;
  static_assert(kL2L3L4Bytes + kDataHeaderBytes <= kTemplateBytes);

  // Appends the patched L2-L4 template; returns where the UDP payload goes.
  uint8_t* Begin(rte_mbuf* m, uint32_t udp_payload_len);
  // The whole template at the start of empty `m` (its first segment needs
  // room for all 64 bytes), with the frame's lengths and IP id patched in;
  // data_len = `data_len` (the frame length for one segment, the headers
  // for an extbuf frame), pkt_len = the frame length. Returns the frame
  // start or null if `m` is not empty or lacks room (or lengths overflow).
  uint8_t* WriteHeaders(rte_mbuf* m, uint32_t udp_payload_len,
                        uint32_t data_len);
  // Checksums (software or offload flags) once the payload is in place.
  // `payload_sum`: the UDP payload's OnesSum16 when the caller already has
  // it (fused copy), else Finish sums the datagram itself (one segment).
  void Finish(rte_mbuf* m, const uint16_t* payload_sum = nullptr);
  void FinishAt(rte_mbuf* m, uint8_t* p, const uint16_t* payload_sum);

  alignas(64) uint8_t hdr_[kTemplateBytes]{};  // template, network order
  Endpoint src_, dst_;
  uint16_t ip_id_ = 0;
  uint16_t ip_template_sum_ = 0;  // ones' sum of the IPv4 template header
  bool ip_offload_ = false, udp_offload_ = false, udp_zero_ = false;
  bool fused_ = true;  // software UDP checksum summed during the copy
  FrameAuth auth_;     // kNone: no tag
};

// A frame from `a` comes from where a worker was pinned at JOIN (`pin`):
// same IPv4 and UDP port, and same MAC unless the pin has none (a worker
// behind a router: frames arrive from the router's MAC).
inline bool SameSource(const Endpoint& a, const Endpoint& pin) {
  return a.ipv4 == pin.ipv4 && a.udp_port == pin.udp_port &&
         (rte_is_zero_ether_addr(&pin.mac) ||
          rte_is_same_ether_addr(&a.mac, &pin.mac));
}

enum class FrameStatus : uint8_t {
  kOk = 0,
  kTooShort,     // shorter than Ethernet + IPv4 + UDP
  kNotIpv4,      // other ethertype (ARP, IPv6, VLAN...)
  kBadIpHeader,  // version/IHL/total length inconsistent
  kFragment,     // IPv4 fragment: DBLP frames are never fragmented
  kNotUdp,
  kBadUdpLength,
  kBadIpChecksum,
  kBadUdpChecksum,
  kWrongPort,  // UDP destination is not ours
};
inline constexpr int kNumFrameStatus = 10;
const char* FrameStatusName(FrameStatus s);

struct ParsedFrame {
  const uint8_t* dblp = nullptr;  // bytes after the UDP header
  uint16_t dblp_len = 0;
  Endpoint src;  // sender's MAC, IP and UDP port
  uint16_t dst_port = 0;
};

// Validates a received frame. Checksums are verified in software unless the
// device already flagged them good (or bad) in ol_flags; a UDP checksum of 0
// means "none" and is accepted. `port_lo..port_hi` is the UDP destination
// range we own. Only the first segment is read (never past data_len):
// a datagram that runs past it is kBadIpHeader. Ethernet padding and IPv4
// options are fine. Checks run in this order: length, ethertype, IP header,
// IP checksum, fragment, protocol, UDP length, port, UDP checksum.
FrameStatus ParseFrame(const rte_mbuf* m, uint16_t port_lo, uint16_t port_hi,
                       ParsedFrame* out);

}  // namespace dblp
