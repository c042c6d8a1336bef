// The server's per-frame push RX decision (ServerLcore::ReceiveBurst): L2-L4,
// loss, sender, pin, then the worker's receiver (round, range, tag, bitmap).
//
// Two paths that decide alike. The full one parses every field
// (ParseFrame, DecodeDataHeader) and counts every drop by its reason. The
// expected-frame path compares a frame's first 64 bytes with the last frame
// of the same worker the full path accepted on this lcore (RxExpect), less
// the bytes that change from frame to frame (IPv4 id and checksum, DBLP
// seq): a few 16-byte compares instead of a field-by-field parse. A round's
// frames but its last have one length, so the lengths are compared too
// (the short last chunk takes the full path). What it cannot vouch for from
// that match alone (the IPv4 checksum, the offload flags, the frame's
// length against the IPv4 length) it checks; on any mismatch
// the frame takes the full path, so a frame is dropped, and counted, only by
// the full path or by the checks both share (loss, liveness, the receiver's
// round, range, tag and bitmap: ReceiverRound::OnDecoded).
#pragma once

#include <rte_mbuf.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dblp/emul/rx_loss.h"
#include "dblp/round/receiver_round.h"
#include "dblp/wire/wire.h"
#include "port/datapath.h"
#include "port/frame_builder.h"

namespace dblp {

// How much of a frame the expected-frame path compares: L2-L4 (42 bytes,
// an option-less IPv4 header), the DBLP header (20) and two bytes past it.
inline constexpr uint32_t kExpectBytes = 64;
static_assert(kL2L3L4Bytes + kDataHeaderBytes + 2 == kExpectBytes);

// Offsets in the frame (Ethernet at 0, IPv4 at 14, UDP at 34, DBLP at 42).
namespace expect_at {
inline constexpr uint32_t kIpVersionIhl = 14;
inline constexpr uint32_t kIpLength = 16;
inline constexpr uint32_t kIpId = 18;
inline constexpr uint32_t kIpChecksum = 24;
inline constexpr uint32_t kUdpLength = 38;
inline constexpr uint32_t kUdpChecksum = 40;
inline constexpr uint32_t kDblp = kL2L3L4Bytes;
inline constexpr uint32_t kRank =
    kDblp + offsetof(DataHeaderWire, sender_rank_be);
inline constexpr uint32_t kPayloadLength =
    kDblp + offsetof(DataHeaderWire, payload_len_be);
inline constexpr uint32_t kRound = kDblp + offsetof(DataHeaderWire, round_be);
inline constexpr uint32_t kSeq = kDblp + offsetof(DataHeaderWire, seq_be);
}  // namespace expect_at

// 0xFF where every frame of a worker's round carries the same byte.
alignas(64) inline constexpr uint8_t kExpectMask[kExpectBytes] = {
    // Ethernet: destination, source, ethertype.
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
    0xFF, 0xFF,
    // IPv4: version/IHL, TOS, length, [id], flags/fragment, TTL, protocol,
    // [checksum], source, destination.
    0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF,
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
    // UDP: source port, destination port, length, checksum (0: none).
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
    // DBLP: magic, version, type, session, rank, payload length, round,
    // [seq]; then two bytes past the header.
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
    0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0};

// A worker's expected frame on one server lcore. Matches no frame until
// Learn: frame_len starts past any mbuf (the zero bytes alone would match
// a crafted all-zero frame).
struct alignas(64) RxExpect {
  uint8_t bytes[kExpectBytes] = {};  // the frame's bytes under kExpectMask
  // The ones' complement sum (32-bit, unfolded) of the IPv4 header's 16-bit
  // words under the mask (8 of 10), host-order loads.
  uint32_t ip_sum = 0;
  // Of the learned frame, host order: where its IPv4 datagram ends (a
  // frame must hold that many bytes), its DBLP bytes (ParseFrame's
  // dblp_len), payload length and round.
  uint32_t frame_len = UINT32_MAX;
  uint16_t dblp_len = 0;
  uint16_t payload_len = 0;
  uint32_t round = 0;

  // `p`: a frame the full path accepted (`len` bytes). Learns it if the
  // expected-frame path can take its likes: 64 bytes or more, an IPv4
  // header without options and no UDP checksum (0). Otherwise keeps the
  // one it had.
  void Learn(const uint8_t* p, uint32_t len);
};

namespace push_rx_detail {

inline uint16_t Be16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return FromBe16(v);
}
inline uint32_t Be32At(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return FromBe32(v);
}
inline uint32_t Word16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace push_rx_detail

inline void RxExpect::Learn(const uint8_t* p, uint32_t len) {
  if (len < kExpectBytes || p[expect_at::kIpVersionIhl] != 0x45 ||
      p[expect_at::kUdpChecksum] != 0 || p[expect_at::kUdpChecksum + 1] != 0) {
    return;
  }
  for (uint32_t k = 0; k < kExpectBytes; ++k) bytes[k] = p[k] & kExpectMask[k];
  uint32_t sum = 0;
  for (uint32_t k = expect_at::kIpVersionIhl; k < kL2L3L4Bytes - 8; k += 2) {
    if (kExpectMask[k] != 0) sum += push_rx_detail::Word16At(p + k);
  }
  ip_sum = sum;
  using push_rx_detail::Be16At;
  frame_len = sizeof(rte_ether_hdr) + Be16At(p + expect_at::kIpLength);
  dblp_len = static_cast<uint16_t>(Be16At(p + expect_at::kUdpLength) -
                                   sizeof(rte_udp_hdr));
  payload_len = Be16At(p + expect_at::kPayloadLength);
  round = push_rx_detail::Be32At(p + expect_at::kRound);
}

namespace push_rx_detail {

// (frame ^ expected) & mask == 0 over 64 bytes, 16 at a time (SSE2 and up;
// GCC lowers the vector type to scalar words elsewhere). The last block
// is bytes 42-57 (the mask's last six bytes are zero), whose mask is all
// ones like the first and third blocks': only the second needs an AND.
// Written out: GCC kept the four blocks as a loop.
[[gnu::always_inline]] inline bool SameMasked(const uint8_t* p,
                                              const uint8_t* expected) {
  using V = uint64_t __attribute__((vector_size(16)));
  static_assert(kExpectMask[42] == 0xFF && kExpectMask[57] == 0xFF &&
                kExpectMask[58] == 0 && kExpectMask[63] == 0);
  const auto block = [&](uint32_t at) {
    V f, e, m;
    std::memcpy(&f, p + at, sizeof(f));
    std::memcpy(&e, expected + at, sizeof(e));
    std::memcpy(&m, kExpectMask + at, sizeof(m));
    return (f ^ e) & m;
  };
  const V diff = (block(0) | block(16)) | (block(32) | block(42));
  return (diff[0] | diff[1]) == 0;
}

}  // namespace push_rx_detail

// The expected-frame path's test: true if `m` (its bytes at `p`, 64 or
// more) matches `e` and so would pass ParseFrame (kOk, the source `e` was
// learned from, whose pin held) and DecodeDataHeader (kOk, `e`'s session,
// type and rank); then `*h` holds its round, seq and payload length, and
// `*dblp_len` ParseFrame's. False says nothing: the full path decides.
[[gnu::always_inline]] inline bool MatchExpected(const rte_mbuf* m,
                                                 const uint8_t* p,
                                                 const RxExpect& e,
                                                 DataHeader* h,
                                                 uint16_t* dblp_len) {
  // The lengths are the learned frame's, which passed ParseFrame and the
  // decode; this frame must hold the datagram they describe.
  if (!push_rx_detail::SameMasked(p, e.bytes) ||
      rte_pktmbuf_data_len(m) < e.frame_len) {
    return false;
  }
  // Checksums as ParseFrame takes them: a flag the device set, else the
  // IPv4 header sum (the learned words' sum plus the two that vary); the
  // UDP checksum is 0 (the mask), which needs no sum.
  constexpr uint64_t kFlags =
      RTE_MBUF_F_RX_IP_CKSUM_MASK | RTE_MBUF_F_RX_L4_CKSUM_MASK;
  const uint64_t flags = m->ol_flags & kFlags;
  bool sum_ip = true;
  if (flags != 0) [[unlikely]] {  // not both unknown
    const uint64_t ip_flag = flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
    if (ip_flag == RTE_MBUF_F_RX_IP_CKSUM_BAD ||
        (flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) == RTE_MBUF_F_RX_L4_CKSUM_BAD) {
      return false;
    }
    sum_ip = ip_flag == RTE_MBUF_F_RX_IP_CKSUM_UNKNOWN;
  }
  if (sum_ip) {
    uint32_t sum = e.ip_sum + push_rx_detail::Word16At(p + expect_at::kIpId) +
                   push_rx_detail::Word16At(p + expect_at::kIpChecksum);
    sum = (sum & 0xFFFFu) + (sum >> 16);  // < 2^20 before
    sum = (sum & 0xFFFFu) + (sum >> 16);
    if (sum != 0xFFFFu) return false;
  }
  h->payload_len = e.payload_len;
  h->round = e.round;
  h->seq = push_rx_detail::Be32At(p + expect_at::kSeq);
  *dblp_len = e.dblp_len;
  return true;
}

// What a server lcore holds for worker w's pushes.
struct PushRxWorker {
  ReceiverRound* rx = nullptr;
  const Endpoint* pin = nullptr;  // read-only while lcores run
  RxExpect* expect = nullptr;
};

// A chunk accepted from a frame: its payload, seq, worker and length
// (MeanReducer::AccumulateBurst's Chunk).
struct PushRxChunk {
  const uint8_t* payload;
  uint32_t seq;
  uint16_t w;
  uint16_t bytes;
};

// One burst's state. Drops of a lost worker and unpinned ones are summed
// here, added to `ctr` by Flush.
struct PushRxBurst {
  const PushRxWorker* workers = nullptr;
  uint32_t num_workers = 0;
  const std::atomic<bool>* alive = nullptr;  // per worker
  uint16_t port_lo = 0, port_hi = 0;
  RxLossInjector* loss = nullptr;
  uint64_t now_ns = 0;
  DatapathCounters* ctr = nullptr;
  uint32_t lost = 0, unpinned = 0;

  void Flush() {
    if (lost != 0) DatapathCounters::Add(ctr->from_lost_worker, lost);
    if (unpinned != 0) DatapathCounters::Add(ctr->unpinned_source, unpinned);
    lost = unpinned = 0;
  }
};

// What became of a frame: refused, or accepted on the expected-frame path
// or the full one. A worker's first accepted frame on an lcore is always
// the full path's (its RxExpect matches nothing until then), so a caller
// that learns something from a worker's first frame looks only at kFull.
enum PushRxTaken : uint8_t { kRxRefused = 0, kRxExpected, kRxFull };

// The full path: every check, every drop counted by reason; a frame it
// accepts becomes its worker's expected frame. Out of line: a worker's
// first frame on an lcore and each round's first take it, then frames
// that do not match.
[[gnu::noinline]] inline PushRxTaken PushRxFull(rte_mbuf* m, PushRxBurst& b,
                                                PushRxChunk* out) {
  ParsedFrame pf;
  if (!AdmitFrameIn(m, b.port_lo, b.port_hi, *b.loss, b.now_ns, *b.ctr, &pf)) {
    return kRxRefused;
  }
  // Unknown ranks go to worker 0's receiver, which counts them as
  // wrong-sender (or malformed) without accepting anything.
  const uint16_t rank = PeekSenderRank(pf.dblp, pf.dblp_len);
  const uint16_t w = rank < b.num_workers ? rank : 0;
  if (!b.alive[w].load(std::memory_order_relaxed)) {
    ++b.lost;
    return kRxRefused;
  }
  const PushRxWorker& wk = b.workers[w];
  if (!SameSource(pf.src, *wk.pin)) {
    ++b.unpinned;
    return kRxRefused;
  }
  DataHeader h;
  const uint8_t* payload = nullptr;
  if (wk.rx->OnFrame(pf.dblp, pf.dblp_len, &h, &payload) !=
      Verdict::kAccepted) {
    return kRxRefused;
  }
  wk.expect->Learn(rte_pktmbuf_mtod(m, const uint8_t*),
                   rte_pktmbuf_data_len(m));
  *out = PushRxChunk{payload, h.seq, w, h.payload_len};
  return kRxFull;
}

// One frame: `*out` is the chunk to sum if it is accepted.
[[gnu::always_inline]] inline PushRxTaken PushRxFrame(rte_mbuf* m,
                                                      PushRxBurst& b,
                                                      PushRxChunk* out) {
  const uint8_t* p = rte_pktmbuf_mtod(m, const uint8_t*);
  if (rte_pktmbuf_data_len(m) < kExpectBytes) {
    return PushRxFull(m, b, out);
  }
  const uint16_t w = push_rx_detail::Be16At(p + expect_at::kRank);
  DataHeader h;
  uint16_t dblp_len;
  if (w >= b.num_workers ||
      !MatchExpected(m, p, *b.workers[w].expect, &h, &dblp_len)) {
    return PushRxFull(m, b, out);
  }
  // From here on as the full path after its parse.
  if (b.loss->ShouldDropRound(h.round, b.now_ns)) {
    DatapathCounters::Add(b.ctr->injected_drops);
    return kRxRefused;
  }
  if (!b.alive[w].load(std::memory_order_relaxed)) {
    ++b.lost;
    return kRxRefused;
  }
  const uint8_t* payload = nullptr;
  if (b.workers[w].rx->OnDecoded(h, p + kL2L3L4Bytes, dblp_len, &payload) !=
      Verdict::kAccepted) {
    return kRxRefused;
  }
  *out = PushRxChunk{payload, h.seq, w, h.payload_len};
  return kRxExpected;
}

}  // namespace dblp
