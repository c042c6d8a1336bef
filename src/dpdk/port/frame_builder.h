// The frame builder: Ethernet / IPv4 / UDP / DBLP header / payload, written
// straight into an mbuf from a per-peer template precomputed at setup and
// patched per packet (lengths, IP id, checksums).
//
// RX side: ParseFrame validates the L2-L4 headers of a received mbuf and
// returns where the DBLP bytes are, or why the frame is dropped.
#pragma once

#include <rte_byteorder.h>
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
#include "port/port.h"

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
  // The headers of a frame whose payload is not copied (bcast_frames.h):
  // appends L2-L4 + the DBLP header of `h` (kL2L3L4Bytes +
  // kDataHeaderBytes) to the empty mbuf `m`, with the IP and UDP lengths
  // of the whole frame, whose payload (`h.payload_len` bytes at `payload`)
  // and tag (tag_bytes(), written to `tag`, sealed over header + payload)
  // the caller chains after `m`. Checksums as Build's, the software UDP
  // checksum summed over the three parts. False (mbuf untouched) as Build,
  // or for an odd payload length under a software UDP checksum.
  bool BuildHead(rte_mbuf* m, const DataHeader& h, const uint8_t* payload,
                 uint8_t* tag);
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

// True if the UDP checksum over `ulen` bytes at `udp`, with the IPv4
// pseudo-header of `ip` (length = ulen), verifies.
bool UdpChecksumOk(const rte_ipv4_hdr* ip, const uint8_t* udp, uint16_t ulen);

// rte_raw_cksum(ip, ihl) == 0xFFFF: the header's checksum verifies. An
// option-less header (every DBLP frame's) is summed as five 32-bit words
// folded to 16 bits, the same ones' complement sum as rte_raw_cksum's
// 16-bit words at a fifth of its instructions (a folded ones' sum is
// 0xFFFF in both or in neither: only all-zero words fold to 0).
inline bool IpHeaderSumOk(const rte_ipv4_hdr* ip, uint32_t ihl) {
  if (ihl != sizeof(rte_ipv4_hdr)) return rte_raw_cksum(ip, ihl) == 0xFFFFu;
  uint32_t w[5];
  std::memcpy(w, ip, sizeof(w));
  uint64_t sum = uint64_t{w[0]} + w[1] + w[2] + w[3] + w[4];
  sum = (sum & 0xFFFFFFFFu) + (sum >> 32);  // < 2^32 + 5
  sum = (sum & 0xFFFFFFFFu) + (sum >> 32);  // < 2^32
  sum = (sum & 0xFFFFu) + (sum >> 16);
  sum = (sum & 0xFFFFu) + (sum >> 16);
  return sum == 0xFFFFu;
}

// Validates a received frame. Checksums are verified in software unless the
// device already flagged them good (or bad) in ol_flags; a UDP checksum of 0
// means "none" and is accepted. `port_lo..port_hi` is the UDP destination
// range we own. Only the first segment is read (never past data_len):
// a datagram that runs past it is kBadIpHeader. Ethernet padding and IPv4
// options are fine. Checks run in this order: length, ethertype, IP header,
// IP checksum, fragment, protocol, UDP length, port, UDP checksum.
// Inline: both apps run it once per received frame.
[[gnu::always_inline]] inline FrameStatus ParseFrame(const rte_mbuf* m,
                                                     uint16_t port_lo,
                                                     uint16_t port_hi,
                                                     ParsedFrame* out) {
  // Only the first segment is looked at: DBLP frames always fit one mbuf
  // (CreatePoolOrDie sizes them), so a frame whose IP datagram runs past the
  // first segment is rejected as kBadIpHeader instead of being gathered.
  constexpr uint32_t kEth = sizeof(rte_ether_hdr);
  constexpr uint32_t kIp = sizeof(rte_ipv4_hdr);
  constexpr uint32_t kUdp = sizeof(rte_udp_hdr);
  const uint32_t len = rte_pktmbuf_data_len(m);
  if (len < kL2L3L4Bytes) return FrameStatus::kTooShort;
  const uint8_t* p = rte_pktmbuf_mtod(m, const uint8_t*);

  const auto* eth = reinterpret_cast<const rte_ether_hdr*>(p);
  if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4)) {
    return FrameStatus::kNotIpv4;
  }

  const auto* ip = reinterpret_cast<const rte_ipv4_hdr*>(p + kEth);
  if ((ip->version_ihl >> 4) != 4) return FrameStatus::kBadIpHeader;
  const uint32_t ihl =
      (ip->version_ihl & RTE_IPV4_HDR_IHL_MASK) * RTE_IPV4_IHL_MULTIPLIER;
  const uint32_t ip_len = rte_be_to_cpu_16(ip->total_length);
  if (ihl < kIp || kEth + ihl + kUdp > len || ip_len < ihl + kUdp ||
      kEth + ip_len > len) {
    return FrameStatus::kBadIpHeader;
  }

  const uint64_t ip_flag = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
  if (ip_flag == RTE_MBUF_F_RX_IP_CKSUM_BAD) {
    return FrameStatus::kBadIpChecksum;
  }
  if (ip_flag == RTE_MBUF_F_RX_IP_CKSUM_UNKNOWN && !IpHeaderSumOk(ip, ihl)) {
    return FrameStatus::kBadIpChecksum;
  }

  const uint16_t frag = rte_be_to_cpu_16(ip->fragment_offset);
  if ((frag & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK)) != 0) {
    return FrameStatus::kFragment;
  }
  if (ip->next_proto_id != IPPROTO_UDP) return FrameStatus::kNotUdp;

  const uint8_t* l4 = p + kEth + ihl;
  const rte_udp_hdr* udp = reinterpret_cast<const rte_udp_hdr*>(l4);
  const uint32_t ulen = rte_be_to_cpu_16(udp->dgram_len);
  if (ulen < kUdp || ulen > ip_len - ihl) {
    return FrameStatus::kBadUdpLength;
  }
  const uint16_t dst_port = rte_be_to_cpu_16(udp->dst_port);
  if (dst_port < port_lo || dst_port > port_hi) return FrameStatus::kWrongPort;

  const uint64_t l4_flag = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
  if (l4_flag == RTE_MBUF_F_RX_L4_CKSUM_BAD) {
    return FrameStatus::kBadUdpChecksum;
  }
  if (l4_flag == RTE_MBUF_F_RX_L4_CKSUM_UNKNOWN && udp->dgram_cksum != 0 &&
      !UdpChecksumOk(ip, l4, static_cast<uint16_t>(ulen))) {
    return FrameStatus::kBadUdpChecksum;
  }

  out->dblp = l4 + kUdp;
  out->dblp_len = static_cast<uint16_t>(ulen - kUdp);
  rte_ether_addr_copy(&eth->src_addr, &out->src.mac);
  out->src.ipv4 = rte_be_to_cpu_32(ip->src_addr);
  out->src.udp_port = rte_be_to_cpu_16(udp->src_port);
  out->dst_port = dst_port;
  return FrameStatus::kOk;
}

}  // namespace dblp
