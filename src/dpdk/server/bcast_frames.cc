// rte_dev_dma_map is still experimental in DPDK 22.11 (MapMeanForDma).
#define ALLOW_EXPERIMENTAL_API 1
#include "server/bcast_frames.h"

#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_memory.h>
#include <unistd.h>

#include <algorithm>

namespace dblp {

namespace {

// The mean outlives every frame that points into it: nothing to free.
void KeepMean(void*, void*) {}

// Segments per frame: header, payload, and the tag when there is one.
uint32_t SegsPerFrame(const FrameTemplate& tmpl) {
  return tmpl.tag_bytes() != 0 ? 3 : 2;
}

}  // namespace

const char* BcastFrameModeName(BcastFrameMode m) {
  return m == BcastFrameMode::kShared ? "shared" : "copy";
}

bool ParseBcastFrameMode(const std::string& s, bool* is_auto,
                         BcastFrameMode* out) {
  *is_auto = s == "auto";
  if (*is_auto || s == "copy") {
    *out = BcastFrameMode::kCopy;
    return true;
  }
  if (s == "shared") {
    *out = BcastFrameMode::kShared;
    return true;
  }
  return false;
}

BcastFrameMode AutoBcastFrameMode(const std::string& driver,
                                  bool mean_dma_mapped) {
  const bool copies = driver == "net_memif" || driver == "net_ring" ||
                      driver == "net_af_packet" || driver == "net_pcap" ||
                      driver == "net_tap" || driver == "net_null";
  return copies || !mean_dma_mapped ? BcastFrameMode::kCopy
                                    : BcastFrameMode::kShared;
}

bool MapMeanForDma(const void* p, size_t len, const uint16_t* ports,
                   uint16_t nb_ports) {
  if (rte_eal_iova_mode() != RTE_IOVA_VA || len == 0) return false;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi =
      (reinterpret_cast<uintptr_t>(p) + len + page - 1) & ~(page - 1);
  void* addr = reinterpret_cast<void*>(lo);
  if (rte_extmem_register(addr, hi - lo, nullptr, 0, page) != 0 &&
      rte_errno != EEXIST) {
    return false;
  }
  for (uint16_t k = 0; k < nb_ports; ++k) {
    rte_eth_dev_info info;
    if (rte_eth_dev_info_get(ports[k], &info) != 0 || info.device == nullptr ||
        rte_dev_dma_map(info.device, addr, lo, hi - lo) != 0) {
      return false;
    }
  }
  return true;
}

rte_iova_t MeanIova(const void* p) {
  return rte_eal_iova_mode() == RTE_IOVA_VA
             ? static_cast<rte_iova_t>(reinterpret_cast<uintptr_t>(p))
             : RTE_BAD_IOVA;
}

bool BuildSharedFrame(FrameTemplate& tmpl, const DataHeader& h,
                      const uint8_t* payload, rte_iova_t payload_iova,
                      rte_mbuf** segs) {
  rte_mbuf* head = segs[0];
  rte_mbuf* body = segs[1];
  uint8_t* tag = nullptr;
  if (tmpl.tag_bytes() != 0) {
    tag = reinterpret_cast<uint8_t*>(
        rte_pktmbuf_append(segs[2], static_cast<uint16_t>(tmpl.tag_bytes())));
    if (tag == nullptr) return false;
  }
  if (!tmpl.BuildHead(head, h, payload, tag)) return false;
  // The payload mbuf's own data room is unused while attached: its end
  // holds the shared info (refcnt 1, a no-op free), so the free that
  // detaches it touches no line another frame uses, and no atomic.
  uint16_t room = body->buf_len;
  rte_mbuf_ext_shared_info* shinfo = rte_pktmbuf_ext_shinfo_init_helper(
      body->buf_addr, &room, KeepMean, nullptr);
  if (shinfo == nullptr) return false;  // a pool without data room
  rte_pktmbuf_attach_extbuf(body, const_cast<uint8_t*>(payload), payload_iova,
                            h.payload_len, shinfo);
  body->data_len = h.payload_len;
  body->pkt_len = h.payload_len;
  head->next = body;
  uint32_t segs_n = 2;
  if (tag != nullptr) {
    body->next = segs[2];
    segs_n = 3;
  }
  head->nb_segs = static_cast<uint16_t>(segs_n);
  head->pkt_len = head->data_len + h.payload_len + tmpl.tag_bytes();
  return true;
}

uint32_t SendSharedChunks(ChunkTransmitter& tx, FrameTemplate& tmpl,
                          DataHeader proto, const uint32_t* seqs, uint32_t n,
                          const uint8_t* buffer, rte_iova_t buffer_iova,
                          const ChunkLayout& layout) {
  constexpr uint32_t kMaxBurst = 64;
  const uint32_t per = SegsPerFrame(tmpl);
  rte_mbuf* segs[kMaxBurst * 3];
  rte_mbuf* frames[kMaxBurst];
  uint32_t consumed = 0;
  if (tx.udp_dst_port != 0) tmpl.set_dst_port(tx.udp_dst_port);
  while (consumed < n) {
    uint32_t k = std::min(n - consumed, kMaxBurst);
    if (tx.pacer != nullptr) {
      k = tx.pacer->Admit(NowNs(), tx.wire_frame_bytes, k);
      if (k == 0) return consumed;  // the emulated link is busy
    }
    if (rte_pktmbuf_alloc_bulk(tx.pool, segs, k * per) != 0) {
      DatapathCounters::Add(tx.counters->mbuf_alloc_failures);
      if (tx.pacer != nullptr) tx.pacer->Refund(k, tx.wire_frame_bytes);
      return consumed;  // no mbufs now: hand this burst back
    }
    // No payload prefetch: the CPU reads only the header and, when tagged,
    // the payload for the tag (sequentially, which the hardware prefetcher
    // follows); the PMD or the NIC reads the rest.
    uint32_t built = 0;
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t seq = seqs[consumed + i];
      const uint64_t off = layout.Offset(seq);
      proto.seq = seq;
      proto.payload_len = static_cast<uint16_t>(layout.Length(seq));
      if (!BuildSharedFrame(
              tmpl, proto, buffer + off,
              buffer_iova == RTE_BAD_IOVA ? RTE_BAD_IOVA : buffer_iova + off,
              segs + i * per)) {
        break;  // cannot happen with the pool's mbufs and whole floats
      }
      frames[i] = segs[i * per];
      ++built;
    }
    uint32_t done = 0;
    for (uint32_t tries = 0; done < built && tries <= tx.tx_retries; ++tries) {
      done += rte_eth_tx_burst(tx.port, tx.queue, frames + done,
                               static_cast<uint16_t>(built - done));
    }
    DatapathCounters::Add(tx.counters->tx_frames, done);
    if (done < k) {
      // The ring stayed full (or a frame was refused): free what did not
      // leave, chains whole, and report it as not consumed.
      if (done < built) DatapathCounters::Add(tx.counters->tx_ring_full);
      for (uint32_t i = done; i < built; ++i) rte_pktmbuf_free(frames[i]);
      rte_pktmbuf_free_bulk(segs + built * per, (k - built) * per);
      if (tx.pacer != nullptr) tx.pacer->Refund(k - done, tx.wire_frame_bytes);
      return consumed + done;
    }
    consumed += k;
    if (tx.pacer != nullptr && !tx.pacer->unlimited()) return consumed;
  }
  return consumed;
}

}  // namespace dblp
