// Pieces shared by the server's and the worker's datapath lcore: counters,
// the control bridge (rings between the datapath and the control sidecar),
// the clock, and the chunk transmitter.
#pragma once

#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dblp/base/quit_signal.h"  // the apps' InstallQuitHandlers
#include "dblp/base/round_pacer.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/emul/loss_model.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/emul/token_bucket.h"
#include "dblp/obs/run_report.h"  // DumpBinary
#include "dblp/round/round_events.h"
#include "dblp/round/sender_round.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "port/frame_builder.h"
#include "runtime/eal_app.h"

namespace dblp {

// What a long run must give back: mbufs in use in `pool` and the process's
// resident memory. Sampled at iterations 1, 2, 4, 8, ... (cheap: a /proc
// read at a power of two); the report gives the last sample at or before
// half the run (warm: every buffer and pool page touched once) and the end,
// which a soak (tests/soak_test.py) checks are equal. Control path only.
struct ResourceGauge {
  uint64_t mbufs_in_use = 0;
  uint64_t rss_kib = 0;
  static ResourceGauge Read(const rte_mempool* pool);
};

class ResourceTrack {
 public:
  explicit ResourceTrack(const rte_mempool* pool) : pool_(pool) {}
  // At the start of iteration `it` (after it - 1 ended).
  void Sample(uint64_t it) {
    if (it == 0 || (it & (it - 1)) != 0) return;
    samples_.emplace_back(it, ResourceGauge::Read(pool_));
  }
  // <key>: mid_run_iteration, mid_run_mbufs_in_use, mid_run_rss_kib,
  // end_mbufs_in_use, end_rss_kib, for a run of `iterations`.
  void AddTo(uint64_t iterations,
             std::vector<std::pair<std::string, uint64_t>>* counters) const {
    const ResourceGauge end = ResourceGauge::Read(pool_);
    std::pair<uint64_t, ResourceGauge> mid{0, end};
    for (const auto& s : samples_) {
      if (2 * s.first <= iterations) mid = s;
    }
    counters->emplace_back("mid_run_iteration", mid.first);
    counters->emplace_back("mid_run_mbufs_in_use", mid.second.mbufs_in_use);
    counters->emplace_back("mid_run_rss_kib", mid.second.rss_kib);
    counters->emplace_back("end_mbufs_in_use", end.mbufs_in_use);
    counters->emplace_back("end_rss_kib", end.rss_kib);
  }

 private:
  const rte_mempool* pool_;
  std::vector<std::pair<uint64_t, ResourceGauge>> samples_;
};

inline uint64_t NowNs() {
  static const double ns_per_cycle =
      1e9 / static_cast<double>(rte_get_tsc_hz());
  return static_cast<uint64_t>(static_cast<double>(rte_get_tsc_cycles()) *
                               ns_per_cycle);
}

// Per-lcore datapath counters. Writer: the owning datapath lcore (plain
// increments through a relaxed atomic store, no locked instruction).
// Readers: the sidecar's stats line and the final summary (relaxed loads).
struct alignas(RTE_CACHE_LINE_SIZE) DatapathCounters {
  using Counter = std::atomic<uint64_t>;
  Counter rx_frames{0};
  Counter tx_frames{0};
  Counter tx_ring_full{0};    // bursts cut short by a full TX ring
  Counter injected_drops{0};  // the software loss injector
  Counter mbuf_alloc_failures{0};
  Counter from_lost_worker{0};  // server: frames of a worker declared gone
  // Frames from an address other than the one pinned for the sender
  // (server: the worker's JOIN; worker: the server's WELCOME).
  Counter unpinned_source{0};
  // Server: frames of another lcore's chunk range that landed on this
  // lcore's queue (RSS steering) and were handed to their owner, and
  // those dropped because its handoff ring was full (the sender resends).
  Counter misrouted{0};
  Counter handoff_full{0};
  std::array<Counter, kNumFrameStatus> frame_drops{};  // L2-L4 validation

  static void Add(Counter& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// One ring of typed messages between the control sidecar and a
// datapath lcore (round_events.h: ControlRequest one way, DatapathEvent the
// other), passed by value. Created at setup.
template <class T>
class TypedRing {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % 4 == 0,
                "rte_ring elements are copied as 4-byte words");

 public:
  // `multi_producer`: several lcores push (the server's requests, a
  // worker's requests with helper lcores).
  TypedRing(const std::string& name, unsigned size, bool multi_producer = false)
      : name_(name) {
    ring_ = rte_ring_create_elem(
        name.c_str(), sizeof(T), size, static_cast<int>(rte_socket_id()),
        multi_producer ? RING_F_SC_DEQ : RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (ring_ == nullptr) {
      Die("cannot create control ring " + name + ": " + rte_strerror(rte_errno),
          "give the EAL more memory (-m) or check --file-prefix clashes");
    }
  }
  ~TypedRing() { rte_ring_free(ring_); }
  TypedRing(const TypedRing&) = delete;
  TypedRing& operator=(const TypedRing&) = delete;
  // A full ring means the other side stopped consuming for thousands of
  // messages: the job cannot go on correctly. The message is not queued;
  // the ring remembers (Overflow) and the loops end the job through their
  // failure path, never a process exit from a datapath or sidecar thread.
  bool Push(const T& e) {
    if (rte_ring_enqueue_elem(ring_, const_cast<T*>(&e), sizeof(T)) == 0) {
      return true;
    }
    full_.store(true, std::memory_order_relaxed);
    return false;
  }
  // Why the job must end ("" while no message was refused).
  std::string Overflow() const {
    if (!full_.load(std::memory_order_relaxed)) return "";
    return "control ring " + name_ +
           " was full: the thread that drains it stopped consuming and a "
           "message was refused (report this with the command line; a "
           "larger --round_timeout_ms will not help)";
  }
  bool Pop(T* e) { return rte_ring_dequeue_elem(ring_, e, sizeof(T)) == 0; }

 private:
  rte_ring* ring_ = nullptr;
  std::string name_;
  std::atomic<bool> full_{false};
};

// Where a datapath lcore's round sides post their control requests: the
// ring to the sidecar, then a wakeup (one eventfd write; per pass or round,
// never per packet).
struct RingOutbox {
  TypedRing<ControlRequest>* ring;
  ControlSidecar* sidecar;
  void Post(const ControlRequest& r) {
    ring->Push(r);
    sidecar->Wakeup();
  }
};

// The RX step both apps share: validates a received frame's L2-L4 headers
// for the UDP port `udp_port` and applies the loss injector. Returns true if
// the frame goes on to the protocol (`*pf` then locates its DBLP bytes);
// every frame turned away is counted by reason in `ctr`.
// Always inlined: it runs once per received frame.
// `port_lo..port_hi`: the UDP destination ports we own (a server with S
// lcores: its base port + 0..S-1; a worker: its server shards sharing a
// port).
[[gnu::always_inline]] inline bool AdmitFrameIn(
    const rte_mbuf* m, uint16_t port_lo, uint16_t port_hi, RxLossInjector& loss,
    uint64_t now_ns, DatapathCounters& ctr, ParsedFrame* pf) {
  const FrameStatus fs = ParseFrame(m, port_lo, port_hi, pf);
  if (fs != FrameStatus::kOk) {
    DatapathCounters::Add(ctr.frame_drops[static_cast<int>(fs)]);
    return false;
  }
  if (loss.ShouldDrop(pf->dblp, pf->dblp_len, now_ns)) {
    DatapathCounters::Add(ctr.injected_drops);
    return false;
  }
  return true;
}
[[gnu::always_inline]] inline bool AdmitFrame(
    const rte_mbuf* m, uint16_t udp_port, RxLossInjector& loss, uint64_t now_ns,
    DatapathCounters& ctr, ParsedFrame* pf) {
  return AdmitFrameIn(m, udp_port, udp_port, loss, now_ns, ctr, pf);
}

// Asks for `n` bytes at `p` to be brought into the caches, a line at a
// time (the chunk a later frame will read, while this one is processed).
inline void PrefetchBytes(const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  for (size_t off = 0; off < n; off += RTE_CACHE_LINE_SIZE) {
    rte_prefetch0(c + off);
  }
}

// The chunk number of a received DBLP frame with plain Ethernet/IPv4/UDP
// headers, read without validation to prefetch its sum slice early; any
// value may come back for other frames (callers range-check it).
inline uint32_t PeekSeq(const rte_mbuf* m) {
  constexpr uint32_t kAt = kL2L3L4Bytes + offsetof(DataHeaderWire, seq_be);
  if (rte_pktmbuf_data_len(m) < kAt + 4) return UINT32_MAX;
  uint32_t be;
  std::memcpy(&be, rte_pktmbuf_mtod_offset(m, const uint8_t*, kAt), 4);
  return rte_be_to_cpu_32(be);
}

// The chunk number of a received push: plain Ethernet / IPv4 (no options)
// / UDP to a destination port in `port_lo..port_hi`, long enough for a
// DBLP header; UINT32_MAX for any other frame. Reads the first 64 bytes
// only (already prefetched), to find the lcore that owns it before the
// frame is validated (ServerLcore::HandOver).
inline uint32_t PeekPushSeq(const rte_mbuf* m, uint16_t port_lo,
                            uint16_t port_hi) {
  constexpr uint32_t kAt = kL2L3L4Bytes + offsetof(DataHeaderWire, seq_be);
  if (rte_pktmbuf_data_len(m) < kAt + 4) return UINT32_MAX;
  const auto* p = rte_pktmbuf_mtod(m, const uint8_t*);
  const auto* eth = reinterpret_cast<const rte_ether_hdr*>(p);
  const auto* ip =
      reinterpret_cast<const rte_ipv4_hdr*>(p + sizeof(rte_ether_hdr));
  if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) ||
      ip->version_ihl != 0x45 || ip->next_proto_id != IPPROTO_UDP) {
    return UINT32_MAX;
  }
  uint16_t dst_be;
  std::memcpy(&dst_be, p + kL2L3L4Bytes - sizeof(rte_udp_hdr) + 2, 2);
  const uint16_t dst = rte_be_to_cpu_16(dst_be);
  if (dst < port_lo || dst > port_hi) return UINT32_MAX;
  return PeekSeq(m);
}

// rte_eth_rx_burst, out of line so that profiles attribute the PMD's RX
// work (for memif, the copy out of the shared ring) to one named caller.
uint16_t PollRx(uint16_t port, uint16_t queue, rte_mbuf** pkts, uint16_t max);

// Wire bytes of a full data frame at IP MTU `mtu`, for pacing: Ethernet
// header + IP packet + preamble, FCS and inter-frame gap.
constexpr uint32_t WireBytesPerFrame(uint32_t mtu) {
  return kEthernetHeaderBytes + mtu + kEthernetWireOverhead;
}

// Priorities for the control sidecar's thread (started once setup is
// done): when allowed it runs under SCHED_FIFO one level above the
// datapath, so that a PROBE or STOP is handled at once even on a shared
// core. With `realtime_datapath` the calling (datapath) thread gets
// SCHED_FIFO too. Missing privileges are reported once, naming the effect.
void SetControlPriorities(SidecarThread& sidecar, const char* app,
                          bool realtime_datapath);

// The memory that external-buffer frames (--tx_payload=extbuf) point
// into: a worker's gradient, registered once for the port's DMA where the
// port needs it (not on net_memif, which copies by virtual address), with
// one rte_mbuf_ext_shared_info per chunk. A chunk's refcnt is 1 while one
// frame carries it (set and cleared without atomics; a resend while the
// last frame is still on the ring takes DPDK's atomic update), and its free
// callback counts the frame done (ChunkTransmitter::DrainExtbuf).
class ExtbufRegion {
 public:
  ExtbufRegion() = default;
  ~ExtbufRegion();
  ExtbufRegion(const ExtbufRegion&) = delete;
  ExtbufRegion& operator=(const ExtbufRegion&) = delete;
  // `len` bytes at `base` cut into `chunks` chunks, sent on `port` (driver
  // `driver`). Returns "" or why the port cannot DMA from it.
  std::string Init(const uint8_t* base, size_t len, uint32_t chunks,
                   uint16_t port, const std::string& driver);
  const uint8_t* base() const { return base_; }
  rte_mbuf_ext_shared_info* shinfo(uint32_t seq) { return &shinfo_[seq]; }
  rte_iova_t IovaOf(const uint8_t* p) const {
    return iova_base_ + static_cast<rte_iova_t>(p - base_);
  }

 private:
  const uint8_t* base_ = nullptr;
  rte_iova_t iova_base_ = 0;
  std::vector<rte_mbuf_ext_shared_info> shinfo_;
  void* registered_ = nullptr;  // page-aligned range given to the EAL
  size_t registered_len_ = 0;
  rte_device* dma_dev_ = nullptr;  // mapped for this device's DMA
};

// Sends the chunks a SenderRound hands out, built straight into mbufs.
struct ChunkTransmitter {
  uint16_t port = 0;
  uint16_t queue = 0;
  rte_mempool* pool = nullptr;
  DatapathCounters* counters = nullptr;
  TokenBucket* pacer = nullptr;  // emulated link rate; null = line rate
  uint32_t tx_retries = 8;       // bounded retry when the TX ring is full
  uint32_t wire_frame_bytes = WireBytesPerFrame(1500);  // for the pacer
  bool prefetch = true;  // the next chunk's payload while building this one
  // Non-zero: every frame goes to this UDP destination port (a worker's
  // queue k: the server's base port + k, steering.h), set on the template
  // once per Send.
  uint16_t udp_dst_port = 0;

  // Builds and transmits `n` chunks `seqs` of `buffer` as frames of `proto`
  // (type, session, rank, round; seq and length are filled per chunk).
  // With a pacer, only the frames its tokens admit now leave.
  // Returns how many of `seqs` were consumed: fewer
  // than `n` when the TX ring stayed full, and the caller hands the rest
  // back (SenderRound::Unsend) to send later.
  uint32_t Send(FrameTemplate& tmpl, DataHeader proto, const uint32_t* seqs,
                uint32_t n, const uint8_t* buffer, const ChunkLayout& layout);

  // External-buffer TX: non-null, every frame is a header mbuf chained to
  // a segment attached to the chunk in `buffer`, which must be
  // extbuf->base() (the port was set up with multi-segment TX). The buffer
  // must not change until DrainExtbuf() returned true.
  ExtbufRegion* extbuf = nullptr;
  // True once every extbuf frame sent so far was freed by the PMD (at
  // once on net_memif, which copies in rte_eth_tx_burst; a NIC frees them
  // on later bursts or rte_eth_tx_done_cleanup, which this asks for, for
  // at most `wait_us`). Call it from the lcore that owns the queue, or
  // once that lcore stopped sending.
  bool DrainExtbuf(uint32_t wait_us = 100000);
  // Chunks with an extbuf frame still held by the PMD (attached counts a
  // chunk's refcnt going 0 -> 1, freed its callback when back at 0).
  uint64_t extbuf_in_flight() const {
    return __atomic_load_n(&extbuf_attached, __ATOMIC_RELAXED) -
           __atomic_load_n(&extbuf_freed, __ATOMIC_RELAXED);
  }
  // Writers: the queue's lcore (Send) and the PMD's free on that lcore
  // (relaxed atomic stores: no locked instruction); plain members so that
  // the transmitter stays an aggregate.
  uint64_t extbuf_attached = 0;
  uint64_t extbuf_freed = 0;
};

// The send side's frames over a DPDK TX queue (send_side.h's ChunkFrames):
// chunks of `buffer` built straight into mbufs from the peer's template.
struct MbufFrames {
  ChunkTransmitter* tx;
  FrameTemplate* tmpl;
  const uint8_t* buffer;
  const ChunkLayout* layout;
  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    return tx->Send(*tmpl, proto, seqs, n, buffer, *layout);
  }
};

}  // namespace dblp
