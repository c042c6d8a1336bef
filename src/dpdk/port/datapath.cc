#include "port/datapath.h"

#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_memory.h>
#include <rte_pause.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "dblp/base/log.h"
#include "runtime/eal_app.h"

namespace dblp {

void SetControlPriorities(SidecarThread& sidecar, const char* app,
                          bool realtime_datapath) {
  if (realtime_datapath && !SetRealtime(pthread_self(), kDatapathRtPriority)) {
    DBLP_LOG(Warning,
             "%s: --realtime needs CAP_SYS_NICE (root); the "
             "datapath runs at normal priority",
             app);
  }
  if (!SetRealtime(sidecar.native_handle(), kSidecarRtPriority)) {
    DBLP_LOG(Warning,
             "%s: control thread runs at normal priority (no "
             "CAP_SYS_NICE): control latency may grow when cores are "
             "shared",
             app);
  }
}

uint16_t PollRx(uint16_t port, uint16_t queue, rte_mbuf** pkts, uint16_t max) {
  return rte_eth_rx_burst(port, queue, pkts, max);
}

namespace {
// A chunk (about 1.4 KB at MTU 1500), one prefetch per 128 bytes: the L2's
// adjacent-line prefetcher completes each 128-byte pair, so every other
// line is asked for (12 instructions a chunk instead of 23), and its first
// and last lines always are.
inline void PrefetchChunk(const uint8_t* p, uint32_t n) {
  if (n == 0) return;
  const uint8_t* last = p + n - 1;
  for (; p < last; p += 2 * RTE_CACHE_LINE_SIZE) rte_prefetch0(p);
  rte_prefetch0(last);
}

// A burst's k frames into `mbufs`, the payload copied; 0 if the pool ran
// dry (nothing allocated then).
uint32_t BuildCopies(ChunkTransmitter& tx, FrameTemplate& tmpl,
                     const uint32_t* seqs, uint32_t k, const uint8_t* buffer,
                     const ChunkLayout& layout, rte_mbuf** mbufs) {
  if (rte_pktmbuf_alloc_bulk(tx.pool, mbufs, k) != 0) return 0;
  if (tx.prefetch) {
    // The whole burst's chunks at once, before the first is read: in the
    // permuted send order they are anywhere in the gradient, too far apart
    // for the hardware prefetcher, and their misses overlap this way.
    for (uint32_t i = 0; i < k; ++i) {
      PrefetchChunk(buffer + layout.Offset(seqs[i]), layout.Length(seqs[i]));
    }
  }
  if (!tmpl.BuildBurst(mbufs, seqs, k, buffer, layout)) {
    // A chunk longer than the pool's mbufs: CreatePoolOrDie sizes them
    // for the MTU, so only a misconfigured test gets here.
    rte_pktmbuf_free_bulk(mbufs, k);
    return 0;
  }
  return k;
}

// The shared info's free callback: one extbuf frame fewer in flight.
void OnExtbufFree(void* /*addr*/, void* opaque) {
  auto* freed = static_cast<uint64_t*>(opaque);
  __atomic_store_n(freed, *freed + 1, __ATOMIC_RELAXED);
}

// A burst's k frames as header mbufs in `mbufs`, each chained to a segment
// attached to its chunk in place (and a tag segment when tagged); 0 if the
// pool ran dry or a frame could not be built (nothing sent, every mbuf and
// reference given back).
uint32_t BuildExtbuf(ChunkTransmitter& tx, FrameTemplate& tmpl,
                     const uint32_t* seqs, uint32_t k, const uint8_t* buffer,
                     const ChunkLayout& layout, rte_mbuf** mbufs) {
  constexpr uint32_t kMaxBurst = 64;
  const uint32_t extra = tmpl.tag_bytes() != 0 ? 2 * k : k;
  rte_mbuf* segs[2 * kMaxBurst];
  if (rte_pktmbuf_alloc_bulk(tx.pool, mbufs, k) != 0) return 0;
  if (rte_pktmbuf_alloc_bulk(tx.pool, segs, extra) != 0) {
    rte_pktmbuf_free_bulk(mbufs, k);
    return 0;
  }
  ExtbufRegion& r = *tx.extbuf;
  // Chunks that go from no frame in flight to one: the free callback runs
  // once per such chunk, when its refcnt is back at 0.
  uint32_t fresh = 0;
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t seq = seqs[i];
    rte_mbuf_ext_shared_info* sh = r.shinfo(seq);
    // Not in flight (the usual case): 0 -> 1 without a locked instruction.
    if (rte_mbuf_ext_refcnt_read(sh) == 0) {
      rte_mbuf_ext_refcnt_set(sh, 1);
      ++fresh;
    } else {
      rte_mbuf_ext_refcnt_update(sh, 1);
    }
    sh->fcb_opaque = &tx.extbuf_freed;
    const uint8_t* payload = buffer + layout.Offset(seq);
    if (!tmpl.BuildChunkExtbuf(mbufs[i], segs[i],
                               extra > k ? segs[k + i] : nullptr, seq,
                               static_cast<uint16_t>(layout.Length(seq)),
                               payload, r.IovaOf(payload), sh)) {
      // Only a misconfigured pool gets here (nothing was chained): give
      // chunk i its reference back, and every mbuf of the burst to the
      // pool. The frames built before it free through their callbacks,
      // which the `fresh` ones count.
      if (rte_mbuf_ext_refcnt_read(sh) == 1) {
        rte_mbuf_ext_refcnt_set(sh, 0);
        --fresh;
      } else {
        rte_mbuf_ext_refcnt_update(sh, -1);
      }
      __atomic_store_n(&tx.extbuf_attached, tx.extbuf_attached + fresh,
                       __ATOMIC_RELAXED);
      for (uint32_t j = 0; j < i; ++j) rte_pktmbuf_free(mbufs[j]);
      rte_pktmbuf_free_bulk(mbufs + i, k - i);
      rte_pktmbuf_free_bulk(segs + i, k - i);
      if (extra > k) rte_pktmbuf_free_bulk(segs + k + i, k - i);
      return 0;
    }
  }
  __atomic_store_n(&tx.extbuf_attached, tx.extbuf_attached + fresh,
                   __ATOMIC_RELAXED);
  return k;
}
}  // namespace

uint32_t ChunkTransmitter::Send(FrameTemplate& tmpl, DataHeader proto,
                                const uint32_t* seqs, uint32_t n,
                                const uint8_t* buffer,
                                const ChunkLayout& layout) {
  constexpr uint32_t kMaxBurst = 64;
  rte_mbuf* mbufs[kMaxBurst];
  uint32_t consumed = 0;
  if (udp_dst_port != 0) tmpl.set_dst_port(udp_dst_port);
  // Type, session, rank and round: the same for every frame of the call.
  tmpl.Prime(proto);
  while (consumed < n) {
    uint32_t k = std::min(n - consumed, kMaxBurst);
    if (pacer != nullptr) {
      k = pacer->Admit(NowNs(), wire_frame_bytes, k);
      if (k == 0) return consumed;  // the emulated link is busy
    }
    const uint32_t* s = seqs + consumed;
    const uint32_t built =
        extbuf != nullptr
            ? BuildExtbuf(*this, tmpl, s, k, buffer, layout, mbufs)
            : BuildCopies(*this, tmpl, s, k, buffer, layout, mbufs);
    if (built == 0) {
      DatapathCounters::Add(counters->mbuf_alloc_failures);
      if (pacer != nullptr) pacer->Refund(k, wire_frame_bytes);
      return consumed;  // no mbufs now: hand this burst back
    }
    uint32_t done = 0;
    for (uint32_t tries = 0; done < k && tries <= tx_retries; ++tries) {
      done += rte_eth_tx_burst(port, queue, mbufs + done,
                               static_cast<uint16_t>(k - done));
    }
    DatapathCounters::Add(counters->tx_frames, done);
    if (done < k) {
      // The ring stayed full: free the unsent frames and report them as
      // not consumed.
      DatapathCounters::Add(counters->tx_ring_full);
      rte_pktmbuf_free_bulk(mbufs + done, k - done);
      if (pacer != nullptr) pacer->Refund(k - done, wire_frame_bytes);
      return consumed + done;
    }
    consumed += k;
    if (pacer != nullptr && !pacer->unlimited()) return consumed;  // one
    // admission per call: the loop polls RX before asking again
  }
  return consumed;
}

bool ChunkTransmitter::DrainExtbuf(uint32_t wait_us) {
  if (extbuf == nullptr) return true;
  const uint64_t deadline = NowNs() + uint64_t{wait_us} * 1000;
  while (extbuf_in_flight() != 0) {
    if (NowNs() > deadline) return false;
    // Drivers without it (-ENOTSUP) free on their next burst instead.
    rte_eth_tx_done_cleanup(port, queue, 0);
    rte_pause();
  }
  return true;
}

std::string ExtbufRegion::Init(const uint8_t* base, size_t len, uint32_t chunks,
                               uint16_t port, const std::string& driver) {
  base_ = base;
  iova_base_ = static_cast<rte_iova_t>(reinterpret_cast<uintptr_t>(base));
  shinfo_.assign(chunks, rte_mbuf_ext_shared_info{});
  for (rte_mbuf_ext_shared_info& sh : shinfo_) {
    sh.free_cb = OnExtbufFree;
    sh.fcb_opaque = nullptr;
    rte_mbuf_ext_refcnt_set(&sh, 0);
  }
  // A memif client in zero-copy mode hands the server offsets into this
  // process's DPDK memory; the gradient is not in it, and the server reads
  // wherever the offset lands (a server crashed on it in a test run).
  rte_eth_dev_info info{};
  if (driver == "net_memif" && rte_eth_dev_info_get(port, &info) == 0 &&
      info.device != nullptr) {
    const rte_devargs* da = rte_dev_devargs(info.device);
    if (da != nullptr && da->args != nullptr &&
        std::strstr(da->args, "zero-copy=yes") != nullptr) {
      return "--tx_payload=extbuf cannot run over a net_memif client with "
             "zero-copy=yes: zero-copy gives the server offsets into this "
             "process's DPDK memory, and the gradient is not in it";
    }
  }
  // net_memif (copy mode) copies the frame into its shared ring through
  // the virtual address: nothing to register. A NIC DMAs from it: the pages go
  // to the EAL as external memory and are mapped for the device, IOVA = VA.
  if (driver == "net_memif" || len == 0) return "";
  if (rte_eal_iova_mode() != RTE_IOVA_VA) {
    return "--tx_payload=extbuf on " + driver +
           " needs IOVA-as-VA (EAL --iova-mode=va): the gradient is ordinary "
           "process memory";
  }
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
  const uintptr_t hi =
      (reinterpret_cast<uintptr_t>(base) + len + page - 1) & ~(page - 1);
  void* addr = reinterpret_cast<void*>(lo);
  if (rte_extmem_register(addr, hi - lo, nullptr, 0, page) == 0) {
    registered_ = addr;  // ours to unregister
    registered_len_ = hi - lo;
  } else if (rte_errno != EEXIST) {
    return std::string("rte_extmem_register of the gradient failed: ") +
           rte_strerror(rte_errno);
  }
  // rte_dev_dma_map is still experimental in DPDK 22.11.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (rte_eth_dev_info_get(port, &info) == 0 && info.device != nullptr) {
    if (rte_dev_dma_map(info.device, addr, lo, hi - lo) == 0) {
      dma_dev_ = info.device;
    } else if (rte_errno != ENOTSUP) {
      return std::string("rte_dev_dma_map of the gradient for ") + driver +
             " failed: " + rte_strerror(rte_errno);
    }
  }
#pragma GCC diagnostic pop
  return "";
}

ExtbufRegion::~ExtbufRegion() {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (dma_dev_ != nullptr) {
    rte_dev_dma_unmap(dma_dev_, registered_,
                      reinterpret_cast<uintptr_t>(registered_),
                      registered_len_);
  }
#pragma GCC diagnostic pop
  if (registered_ != nullptr)
    rte_extmem_unregister(registered_, registered_len_);
}

ResourceGauge ResourceGauge::Read(const rte_mempool* pool) {
  ResourceGauge g;
  g.mbufs_in_use = rte_mempool_in_use_count(pool);
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long long kib = 0;
      if (std::sscanf(line, "VmRSS: %llu kB", &kib) == 1) {
        g.rss_kib = kib;
        break;
      }
    }
    std::fclose(f);
  }
  return g;
}

}  // namespace dblp
