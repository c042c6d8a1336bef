#include "port/frame_builder.h"

#include <rte_byteorder.h>

#include <algorithm>
#include <cstring>

#include "dblp/wire/checksum.h"
#include "port/payload_copy.h"

namespace dblp {

namespace {

constexpr uint32_t kEthBytes = sizeof(rte_ether_hdr);
constexpr uint32_t kIpBytes = sizeof(rte_ipv4_hdr);
constexpr uint32_t kUdpBytes = sizeof(rte_udp_hdr);
constexpr uint8_t kIpVersionIhl = 0x45;  // IPv4, 5 words, no options
constexpr uint8_t kTtl = 64;
constexpr uint64_t kTxCksumFlags =
    RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_L4_MASK;

// The frame's headers. Every DPDK header struct is packed (alignment <= 2),
// so these casts are valid at any offset.
rte_ether_hdr* EthAt(uint8_t* p) { return reinterpret_cast<rte_ether_hdr*>(p); }
rte_ipv4_hdr* IpAt(uint8_t* p) {
  return reinterpret_cast<rte_ipv4_hdr*>(p + kEthBytes);
}
rte_udp_hdr* UdpAt(uint8_t* p) {
  return reinterpret_cast<rte_udp_hdr*>(p + kEthBytes + kIpBytes);
}

}  // namespace

bool UdpChecksumOk(const rte_ipv4_hdr* ip, const uint8_t* udp, uint16_t ulen) {
  struct __attribute__((packed)) PseudoHeader {
    uint32_t src, dst;
    uint8_t zero, proto;
    uint16_t len_be;
  } ph;
  ph.src = ip->src_addr;
  ph.dst = ip->dst_addr;
  ph.zero = 0;
  ph.proto = ip->next_proto_id;
  ph.len_be = rte_cpu_to_be_16(ulen);
  // OnesSum16 sums 32-bit words (vectorised); rte_raw_cksum 16-bit ones.
  return AddSum16(OnesSum16(reinterpret_cast<const uint8_t*>(&ph), sizeof(ph)),
                  OnesSum16(udp, ulen)) == 0xFFFFu;
}

FrameTemplate::FrameTemplate(const Endpoint& src, const Endpoint& dst,
                             const PortCaps& caps)
    : src_(src),
      dst_(dst),
      ip_offload_(caps.tx_ipv4_cksum_offload),
      udp_offload_(caps.tx_udp_cksum_offload && !caps.udp_cksum_zero),
      udp_zero_(caps.udp_cksum_zero),
      fused_(caps.fused_checksum) {
  rte_ether_hdr* eth = EthAt(hdr_);
  rte_ether_addr_copy(&dst.mac, &eth->dst_addr);
  rte_ether_addr_copy(&src.mac, &eth->src_addr);
  eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);

  rte_ipv4_hdr* ip = IpAt(hdr_);
  ip->version_ihl = kIpVersionIhl;
  ip->type_of_service = 0;
  ip->total_length = 0;  // per packet
  ip->packet_id = 0;     // per packet
  ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
  ip->time_to_live = kTtl;
  ip->next_proto_id = IPPROTO_UDP;
  ip->hdr_checksum = 0;
  ip->src_addr = rte_cpu_to_be_32(src.ipv4);
  ip->dst_addr = rte_cpu_to_be_32(dst.ipv4);

  rte_udp_hdr* udp = UdpAt(hdr_);
  udp->src_port = rte_cpu_to_be_16(src.udp_port);
  udp->dst_port = rte_cpu_to_be_16(dst.udp_port);
  udp->dgram_len = 0;    // per packet
  udp->dgram_cksum = 0;  // per packet
  // Length, id and checksum are still 0 here.
  ip_template_sum_ =
      OnesSum16(reinterpret_cast<const uint8_t*>(ip), sizeof(rte_ipv4_hdr));
}

// Inlined into each builder: a call's prologue and epilogue cost as much as
// the work (callgrind: 49 and 42 instructions per frame out of line).
[[gnu::always_inline]] inline uint8_t* FrameTemplate::WriteHeaders(
    rte_mbuf* m, uint32_t udp_payload_len, uint32_t data_len) {
  const uint32_t udp_len = kUdpBytes + udp_payload_len;
  const uint32_t ip_len = kIpBytes + udp_len;
  // The template is written whole (fixed-size stores), so the first
  // segment needs room for it even when the frame is shorter.
  const uint32_t room = static_cast<uint32_t>(m->buf_len - m->data_off);
  if (ip_len > UINT16_MAX || m->pkt_len != 0 || m->data_len != 0 ||
      std::max(data_len, kTemplateBytes) > room) {
    return nullptr;
  }
  uint8_t* p = rte_pktmbuf_mtod(m, uint8_t*);
  std::memcpy(p, hdr_, kTemplateBytes);
  const uint16_t ip_len_be = rte_cpu_to_be_16(static_cast<uint16_t>(ip_len));
  const uint16_t id_be = rte_cpu_to_be_16(ip_id_++);
  const uint16_t udp_len_be = rte_cpu_to_be_16(static_cast<uint16_t>(udp_len));
  std::memcpy(p + kEthBytes + offsetof(rte_ipv4_hdr, total_length), &ip_len_be,
              2);
  std::memcpy(p + kEthBytes + offsetof(rte_ipv4_hdr, packet_id), &id_be, 2);
  std::memcpy(p + kEthBytes + kIpBytes + offsetof(rte_udp_hdr, dgram_len),
              &udp_len_be, 2);
  m->data_len = static_cast<uint16_t>(data_len);
  m->pkt_len = kEthBytes + ip_len;
  return p;
}

uint8_t* FrameTemplate::Begin(rte_mbuf* m, uint32_t udp_payload_len) {
  uint8_t* p = WriteHeaders(m, udp_payload_len, kL2L3L4Bytes + udp_payload_len);
  return p == nullptr ? nullptr : p + kL2L3L4Bytes;
}

[[gnu::always_inline]] inline void FrameTemplate::FinishAt(
    rte_mbuf* m, uint8_t* p, const uint16_t* payload_sum) {
  rte_ipv4_hdr* ip = IpAt(p);
  rte_udp_hdr* udp = UdpAt(p);
  uint64_t flags = 0;
  if (ip_offload_) {
    flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
  } else {
    // The template's sum plus the two fields patched per frame (RFC 1624
    // style): three additions instead of a pass over the header.
    const uint16_t sum =
        AddSum16(AddSum16(ip_template_sum_, ip->total_length), ip->packet_id);
    ip->hdr_checksum = static_cast<uint16_t>(~sum);
  }
  if (udp_zero_) {
    // Already 0 from the template: "no checksum", legal in IPv4.
  } else if (udp_offload_) {
    flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_UDP_CKSUM;
    udp->dgram_cksum = rte_ipv4_phdr_cksum(ip, flags);
  } else if (payload_sum != nullptr) {
    // Pseudo-header + UDP header (checksum field 0) + DBLP header, plus the
    // payload's sum from the copy; the payload starts at an even offset.
    constexpr uint32_t kHeadBytes = kUdpBytes + kDataHeaderBytes;
    static_assert(kHeadBytes % 2 == 0, "payload sum must start word-aligned");
    uint16_t sum =
        AddSum16(static_cast<uint16_t>(rte_ipv4_phdr_cksum(ip, 0)),
                 OnesSum16(reinterpret_cast<uint8_t*>(udp), kHeadBytes));
    sum = static_cast<uint16_t>(~AddSum16(sum, *payload_sum));
    // 0 means "no checksum" in UDP over IPv4; its ones'-complement twin is
    // sent instead (RFC 768).
    udp->dgram_cksum = sum == 0 ? 0xFFFF : sum;
  } else {
    udp->dgram_cksum = rte_ipv4_udptcp_cksum(ip, udp);
  }
  if (flags != 0) {
    m->ol_flags = (m->ol_flags & ~kTxCksumFlags) | flags;
    m->l2_len = kEthBytes;
    m->l3_len = kIpBytes;
  } else if ((m->ol_flags & kTxCksumFlags) != 0) {
    m->ol_flags &= ~kTxCksumFlags;
  }
}

void FrameTemplate::Finish(rte_mbuf* m, const uint16_t* payload_sum) {
  FinishAt(m, rte_pktmbuf_mtod(m, uint8_t*), payload_sum);
}

void FrameTemplate::Prime(const DataHeader& proto) {
  EncodeDataHeader(proto, hdr_ + kL2L3L4Bytes);
}

namespace {
// The two DBLP header fields that differ between the frames of a burst.
inline void PatchDataHeader(uint8_t* dblp, uint32_t seq, uint16_t len) {
  const uint32_t seq_be = rte_cpu_to_be_32(seq);
  const uint16_t len_be = rte_cpu_to_be_16(len);
  std::memcpy(dblp + offsetof(DataHeaderWire, seq_be), &seq_be, 4);
  std::memcpy(dblp + offsetof(DataHeaderWire, payload_len_be), &len_be, 2);
}
}  // namespace

bool FrameTemplate::BuildChunk(rte_mbuf* m, uint32_t seq, uint16_t payload_len,
                               const uint8_t* payload) {
  const uint32_t tag_bytes = auth_.tag_bytes();
  const uint32_t body = kDataHeaderBytes + payload_len;
  const uint32_t udp_payload = body + tag_bytes;
  uint8_t* p = WriteHeaders(m, udp_payload, kL2L3L4Bytes + udp_payload);
  if (p == nullptr) return false;
  uint8_t* dblp = p + kL2L3L4Bytes;
  PatchDataHeader(dblp, seq, payload_len);
  // A tag after an odd payload would start mid-word: sum it all instead
  // (payloads are whole floats, so only hand-made frames get there).
  if (fused_ && !udp_zero_ && !udp_offload_ &&
      (tag_bytes == 0 || payload_len % 2 == 0)) {
    uint16_t sum = CopyAndSum16(dblp + kDataHeaderBytes, payload, payload_len);
    if (tag_bytes != 0) {
      auth_.Seal(dblp, body, dblp + body);
      sum = AddSum16(sum, OnesSum16(dblp + body, tag_bytes));
    }
    FinishAt(m, p, &sum);
    return true;
  }
  CopyPayload(dblp + kDataHeaderBytes, payload, payload_len);
  if (tag_bytes != 0) auth_.Seal(dblp, body, dblp + body);
  FinishAt(m, p, nullptr);
  return true;
}

bool FrameTemplate::BuildBurst(rte_mbuf* const* mbufs, const uint32_t* seqs,
                               uint32_t k, const uint8_t* buffer,
                               const ChunkLayout& layout) {
  if (k == 0) return true;
  const uint32_t tag_bytes = auth_.tag_bytes();
  // Software UDP checksums, tags and offload flags: the general path.
  if (tag_bytes != 0 || !udp_zero_ || ip_offload_) {
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t seq = seqs[i];
      if (!BuildChunk(mbufs[i], seq, static_cast<uint16_t>(layout.Length(seq)),
                      buffer + layout.Offset(seq))) {
        return false;  // only a chunk longer than the mbuf gets here
      }
    }
    return true;
  }
  // Untagged, UDP checksum 0, IPv4 checksum in software (memif's auto):
  // the room check once for the burst's mbufs (one pool, so one data
  // room), then per frame the template, five patched fields and the copy.
  const uint32_t max_ip =
      kIpBytes + kUdpBytes + kDataHeaderBytes + layout.chunk_payload();
  if (max_ip > UINT16_MAX ||
      std::max(kEthBytes + max_ip, kTemplateBytes) >
          static_cast<uint32_t>(mbufs[0]->buf_len - mbufs[0]->data_off)) {
    return false;
  }
  const PayloadCopyFn copy = BestPayloadCopyFn();
  for (uint32_t i = 0; i < k; ++i) {
    rte_mbuf* m = mbufs[i];
    const uint32_t seq = seqs[i];
    const uint32_t len = layout.Length(seq);
    const uint32_t udp_len = kUdpBytes + kDataHeaderBytes + len;
    const uint32_t ip_len = kIpBytes + udp_len;
    uint8_t* p = rte_pktmbuf_mtod(m, uint8_t*);
    std::memcpy(p, hdr_, kTemplateBytes);
    const uint16_t ip_len_be = rte_cpu_to_be_16(static_cast<uint16_t>(ip_len));
    const uint16_t id_be = rte_cpu_to_be_16(ip_id_++);
    const uint16_t udp_len_be =
        rte_cpu_to_be_16(static_cast<uint16_t>(udp_len));
    rte_ipv4_hdr* ip = IpAt(p);
    std::memcpy(&ip->total_length, &ip_len_be, 2);
    std::memcpy(&ip->packet_id, &id_be, 2);
    const uint16_t sum = AddSum16(AddSum16(ip_template_sum_, ip_len_be), id_be);
    ip->hdr_checksum = static_cast<uint16_t>(~sum);
    std::memcpy(&UdpAt(p)->dgram_len, &udp_len_be, 2);
    PatchDataHeader(p + kL2L3L4Bytes, seq, static_cast<uint16_t>(len));
    copy(p + kL2L3L4Bytes + kDataHeaderBytes, buffer + layout.Offset(seq), len);
    m->data_len = static_cast<uint16_t>(kEthBytes + ip_len);
    m->pkt_len = kEthBytes + ip_len;
  }
  return true;
}

bool FrameTemplate::BuildChunkExtbuf(rte_mbuf* m, rte_mbuf* seg,
                                     rte_mbuf* tag_seg, uint32_t seq,
                                     uint16_t payload_len,
                                     const uint8_t* payload,
                                     rte_iova_t payload_iova,
                                     rte_mbuf_ext_shared_info* shinfo) {
  const uint32_t tag_bytes = auth_.tag_bytes();
  if (seg->pkt_len != 0 || seg->data_len != 0) return false;
  if (tag_bytes != 0 &&
      (tag_seg == nullptr || tag_seg->pkt_len != 0 ||
       tag_bytes >
           static_cast<uint32_t>(tag_seg->buf_len - tag_seg->data_off))) {
    return false;
  }
  uint8_t* p = WriteHeaders(m, kDataHeaderBytes + payload_len + tag_bytes,
                            kL2L3L4Bytes + kDataHeaderBytes);
  if (p == nullptr) return false;
  uint8_t* dblp = p + kL2L3L4Bytes;
  PatchDataHeader(dblp, seq, payload_len);
  rte_pktmbuf_attach_extbuf(seg, const_cast<uint8_t*>(payload), payload_iova,
                            payload_len, shinfo);
  seg->data_len = payload_len;
  seg->pkt_len = payload_len;
  m->next = seg;
  m->nb_segs = 2;
  uint8_t* tag = nullptr;
  if (tag_bytes != 0) {
    tag = rte_pktmbuf_mtod(tag_seg, uint8_t*);
    auth_.SealParts(dblp, kDataHeaderBytes, payload, payload_len, tag);
    tag_seg->data_len = static_cast<uint16_t>(tag_bytes);
    tag_seg->pkt_len = tag_bytes;
    seg->next = tag_seg;
    m->nb_segs = 3;
  }
  if (udp_zero_ || udp_offload_) {
    FinishAt(m, p, nullptr);
    return true;
  }
  // Software UDP checksum over the pieces: the payload summed in place, a
  // tag after an odd payload starts mid-word, which swaps its sum's bytes.
  uint16_t sum = OnesSum16(payload, payload_len);
  if (tag != nullptr) {
    uint16_t ts = OnesSum16(tag, tag_bytes);
    if (payload_len % 2 != 0) ts = static_cast<uint16_t>((ts << 8) | (ts >> 8));
    sum = AddSum16(sum, ts);
  }
  FinishAt(m, p, &sum);
  return true;
}

bool FrameTemplate::BuildHead(rte_mbuf* m, const DataHeader& h,
                              const uint8_t* payload, uint8_t* tag) {
  const uint32_t trailing = h.payload_len + auth_.tag_bytes();
  const bool sw_sum = !udp_zero_ && !udp_offload_;
  // Summed in 16-bit words: the tag must start on one.
  if (sw_sum && h.payload_len % 2 != 0) return false;
  uint8_t* dblp = Begin(m, kDataHeaderBytes + trailing);
  if (dblp == nullptr) return false;
  // Begin sized the IP and UDP lengths for the whole frame; only the
  // headers stay in this segment.
  rte_pktmbuf_trim(m, static_cast<uint16_t>(trailing));
  EncodeDataHeader(h, dblp);
  if (auth_.enabled())
    auth_.SealParts(dblp, kDataHeaderBytes, payload, h.payload_len, tag);
  if (!sw_sum) {
    Finish(m);
    return true;
  }
  uint16_t sum = OnesSum16(payload, h.payload_len);
  if (auth_.enabled()) sum = AddSum16(sum, OnesSum16(tag, auth_.tag_bytes()));
  Finish(m, &sum);
  return true;
}

bool FrameTemplate::BuildRaw(rte_mbuf* m, const uint8_t* udp_payload,
                             uint16_t len) {
  uint8_t* dst = Begin(m, len);
  if (dst == nullptr) return false;
  if (len != 0) std::memcpy(dst, udp_payload, len);
  Finish(m);
  return true;
}

const char* FrameStatusName(FrameStatus s) {
  switch (s) {
    case FrameStatus::kOk:
      return "ok";
    case FrameStatus::kTooShort:
      return "too_short";
    case FrameStatus::kNotIpv4:
      return "not_ipv4";
    case FrameStatus::kBadIpHeader:
      return "bad_ip_header";
    case FrameStatus::kFragment:
      return "fragment";
    case FrameStatus::kNotUdp:
      return "not_udp";
    case FrameStatus::kBadUdpLength:
      return "bad_udp_length";
    case FrameStatus::kBadIpChecksum:
      return "bad_ip_checksum";
    case FrameStatus::kBadUdpChecksum:
      return "bad_udp_checksum";
    case FrameStatus::kWrongPort:
      return "wrong_port";
  }
  return "unknown";
}

}  // namespace dblp
