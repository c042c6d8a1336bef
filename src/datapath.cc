#include "datapath.h"

#include <rte_errno.h>
#include <rte_ethdev.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "dblp/base/log.h"
#include "eal_app.h"

namespace dblp {

namespace {
std::atomic<bool> g_quit{false};
void OnQuitSignal(int) { g_quit.store(true); }
}  // namespace

const std::atomic<bool>& InstallQuitHandlers() {
  std::signal(SIGINT, OnQuitSignal);
  std::signal(SIGTERM, OnQuitSignal);
  std::signal(SIGHUP, OnQuitSignal);  // a closed terminal: exit cleanly too
  // A peer that died must give EPIPE, never kill us before the summary:
  // our sockets send with MSG_NOSIGNAL, but net_memif's control channel
  // sendmsg()s with no flags when it tells a vanished peer it disconnects.
  std::signal(SIGPIPE, SIG_IGN);
  return g_quit;
}

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

uint32_t ChunkTransmitter::Send(FrameTemplate& tmpl, DataHeader proto,
                                const uint32_t* seqs, uint32_t n,
                                const uint8_t* buffer,
                                const ChunkLayout& layout) {
  constexpr uint32_t kMaxBurst = 64;
  rte_mbuf* mbufs[kMaxBurst];
  uint32_t consumed = 0;
  if (udp_dst_port != 0) tmpl.set_dst_port(udp_dst_port);
  while (consumed < n) {
    uint32_t k = std::min(n - consumed, kMaxBurst);
    if (pacer != nullptr) {
      k = pacer->Admit(NowNs(), wire_frame_bytes, k);
      if (k == 0) return consumed;  // the emulated link is busy
    }
    if (rte_pktmbuf_alloc_bulk(pool, mbufs, k) != 0) {
      DatapathCounters::Add(counters->mbuf_alloc_failures);
      if (pacer != nullptr) pacer->Refund(k, wire_frame_bytes);
      return consumed;  // no mbufs now: hand this burst back
    }
    if (prefetch) {
      const uint32_t first = seqs[consumed];
      PrefetchBytes(buffer + layout.Offset(first), layout.Length(first));
    }
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t seq = seqs[consumed + i];
      if (prefetch && consumed + i + 1 < n) {
        // In the permuted send order the next chunk is anywhere in the
        // gradient, too far for the hardware prefetcher to guess.
        const uint32_t next = seqs[consumed + i + 1];
        PrefetchBytes(buffer + layout.Offset(next), layout.Length(next));
      }
      proto.seq = seq;
      proto.payload_len = static_cast<uint16_t>(layout.Length(seq));
      tmpl.Build(mbufs[i], proto, buffer + layout.Offset(seq));
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
