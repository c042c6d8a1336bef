// Pieces shared by the server's and the worker's datapath lcore: counters,
// the control bridge (rings between the datapath and the control sidecar),
// the clock, and the chunk transmitter.
#pragma once

#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <thread>

#include "dblp/bitmap.h"
#include "dblp/chunking.h"
#include "dblp/control.h"
#include "dblp/control_sidecar.h"
#include "dblp/loss_model.h"
#include "dblp/sender_round.h"
#include "dblp/token_bucket.h"
#include "dblp/wire.h"
#include "eal_app.h"
#include "frame_builder.h"

namespace dblp {

// SIGINT/SIGTERM set this flag; the poll loops end at their next idle
// moment and the apps still write their reports.
const std::atomic<bool>& InstallQuitHandlers();

// Test hook: writes `n` bytes to `path` (dumps of means and bitmaps).
void DumpBinary(const std::string& path, const void* data, size_t n);

inline uint64_t NowNs() {
  static const double ns_per_cycle = 1e9 / static_cast<double>(rte_get_tsc_hz());
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
  Counter tx_ring_full{0};     // bursts cut short by a full TX ring
  Counter injected_drops{0};   // the software loss injector
  Counter mbuf_alloc_failures{0};
  Counter from_lost_worker{0};  // server: frames of a worker declared gone
  std::array<Counter, kNumFrameStatus> frame_drops{};  // L2-L4 validation

  static void Add(Counter& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// A message between the sidecar and the datapath, passed by value through
// an SPSC rte_ring (one ring per direction).
struct CtlEvent {
  enum Kind : uint8_t {
    // sidecar -> datapath
    kRoundBegin = 1,  // round, direction, value = p as double bits
    kBitmap,          // a BITMAP for sender `peer` is in its slot
    kStopSeen,        // STOP arrived for sender `peer` at value = ns
    kProbe,           // a PROBE for `round` of our receiver of `peer`
    kPeerGone,        // the control connection of `peer` closed
    kFatal,           // the control plane failed; stop
    // datapath -> sidecar
    kSendProbe,       // PROBE for `round` of `peer`, value = pass
    kSendStop,        // STOP for `round` of `peer`, value = received
    kSendBitmap,      // the BITMAP for `round` of `peer` is in its mailbox
    kSendRoundBegin,  // ROUND_BEGIN to every peer (server)
    kIterationDone,   // a worker finished its last iteration: send BYE
  };
  uint8_t kind = 0;
  uint8_t direction = 0;  // Direction
  uint16_t peer = 0;
  uint32_t round = 0;
  uint64_t value = 0;
  uint64_t value2 = 0;
  uint64_t value3 = 0;
};
static_assert(sizeof(CtlEvent) == 32, "CtlEvent is passed by value in rings");

inline uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}
inline double BitsDouble(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
}

// One SPSC ring of CtlEvents, created at setup.
class EventRing {
 public:
  EventRing(const std::string& name, unsigned size);
  ~EventRing();
  EventRing(const EventRing&) = delete;
  EventRing& operator=(const EventRing&) = delete;
  // By value: the ring API takes a non-const pointer. A full ring means the
  // other side stopped consuming for thousands of messages: the job cannot
  // go on correctly, so it ends with a message instead of losing one.
  void Push(CtlEvent e) {
    if (rte_ring_enqueue_elem(ring_, &e, sizeof(CtlEvent)) != 0) {
      Die("control ring " + name_ +
              " is full: the thread that drains it stopped consuming",
          "report this with the command line; a larger --round_timeout_ms "
          "will not help");
    }
  }
  bool Pop(CtlEvent* e) {
    return rte_ring_dequeue_elem(ring_, e, sizeof(CtlEvent)) == 0;
  }

 private:
  rte_ring* ring_ = nullptr;
  std::string name_;
};

// A bitmap handed between the sidecar and the datapath, either way: the
// sidecar posts a BITMAP it received for a sender, the datapath posts the
// snapshot it answers a PROBE with. One per peer and direction suffices: a
// sender has at most one PROBE outstanding. A post while the previous one
// is unread is counted and dropped.
class BitmapMailbox {
 public:
  // Producer. Returns false (counted) if the slot is busy or the words do
  // not fit `num_bits`.
  bool Post(uint32_t num_bits, std::span<const uint64_t> words) {
    if (busy_.load(std::memory_order_acquire)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (slot_.size() != num_bits) slot_.Resize(num_bits);
    if (!slot_.AssignWords(words)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    busy_.store(true, std::memory_order_release);
    return true;
  }
  // Consumer, after the event announcing the post: read, then Release.
  const Bitmap& slot() const { return slot_; }
  void Release() { busy_.store(false, std::memory_order_release); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  Bitmap slot_;                          // producer: wo while !busy
  std::atomic<bool> busy_{false};        // producer: sets; consumer: clears
  std::atomic<uint64_t> dropped_{0};     // producer: wo
};

// The idle back-off and no-progress watchdog of a round's poll loop.
class RoundPacer {
 public:
  enum class Step : uint8_t { kContinue, kTimedOut, kQuit };
  RoundPacer(uint32_t idle_spin, uint32_t idle_sleep_us, uint32_t timeout_ms,
             const std::atomic<bool>* quit)
      : backoff_(idle_spin, idle_sleep_us),
        timeout_ns_(uint64_t{timeout_ms} * 1000000),
        timeout_ms_(timeout_ms),
        quit_(quit) {}
  void Start() { last_progress_ = NowNs(); }
  // After one loop iteration; `work` = anything was received, sent or
  // handled. Sleeps when idle (sharing few cores with other processes).
  Step After(bool work) {
    if (work) {
      backoff_.Work();
      last_progress_ = NowNs();
      return Step::kContinue;
    }
    if (quit_->load(std::memory_order_relaxed)) return Step::kQuit;
    if (NowNs() - last_progress_ > timeout_ns_) return Step::kTimedOut;
    backoff_.Idle();
    return Step::kContinue;
  }
  uint32_t timeout_ms() const { return timeout_ms_; }
  uint64_t sleeps() const { return backoff_.sleeps(); }

 private:
  IdleBackoff backoff_;
  uint64_t timeout_ns_;
  uint32_t timeout_ms_;
  const std::atomic<bool>* quit_;
  uint64_t last_progress_ = 0;
};

// The software loss injector, on the receiving side of a direction: a frame
// it drops has crossed the link, so the sender paid for it as on a lossy
// wire, and it is discarded before the protocol sees it. A burst follows the
// frame's own iteration (round / 2), so a frame of the next iteration that
// arrives early is judged by that iteration's schedule.
class RxLossInjector {
 public:
  RxLossInjector(const LossSpec& base, const BurstSchedule& bursts,
                 uint64_t seed)
      : injector_(base, bursts, seed), has_window_(bursts.HasWindow()) {}

  // `dblp` is the UDP payload of a validated frame. A frame too short to
  // carry a round is never dropped here: the protocol counts it malformed.
  bool ShouldDrop(const uint8_t* dblp, uint16_t len, uint64_t now_ns) {
    if (len < kDataHeaderBytes) return false;
    uint32_t round_be;
    std::memcpy(&round_be, dblp + offsetof(DataHeaderWire, round_be), 4);
    const uint64_t it = rte_be_to_cpu_32(round_be) / 2;
    if (it != iteration_) {
      iteration_ = it;
      injector_.SetIteration(it);
    }
    if (has_window_) injector_.SetTimeNs(now_ns - start_ns_);
    return injector_.ShouldDrop();
  }
  void StartClock(uint64_t now_ns) { start_ns_ = now_ns; }
  bool InBurst(uint64_t iteration) const {
    return injector_.bursts().Contains(iteration);
  }

 private:
  LossInjector injector_;
  bool has_window_;
  uint64_t iteration_ = 0;
  uint64_t start_ns_ = 0;
};

// The RX step both apps share: validates a received frame's L2-L4 headers
// for the UDP port `udp_port` and applies the loss injector. Returns true if
// the frame goes on to the protocol (`*pf` then locates its DBLP bytes);
// every frame turned away is counted by reason in `ctr`.
inline bool AdmitFrame(const rte_mbuf* m, uint16_t udp_port,
                       RxLossInjector& loss, uint64_t now_ns,
                       DatapathCounters& ctr, ParsedFrame* pf) {
  const FrameStatus fs = ParseFrame(m, udp_port, udp_port, pf);
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

// rte_eth_rx_burst, out of line so that profiles attribute the PMD's RX
// work (for memif, the copy out of the shared ring) to one named caller.
uint16_t PollRx(uint16_t port, uint16_t queue, rte_mbuf** pkts,
                uint16_t max);

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

// Sends the chunks a SenderRound hands out, built straight into mbufs.
struct ChunkTransmitter {
  uint16_t port = 0;
  uint16_t queue = 0;
  rte_mempool* pool = nullptr;
  DatapathCounters* counters = nullptr;
  TokenBucket* pacer = nullptr;  // emulated link rate; null = line rate
  uint32_t tx_retries = 8;      // bounded retry when the TX ring is full
  uint32_t wire_frame_bytes = WireBytesPerFrame(1500);  // for the pacer
  bool prefetch = true;  // the next chunk's payload while building this one

  // Builds and transmits `n` chunks `seqs` of `buffer` as frames of `proto`
  // (type, session, rank, round; seq and length are filled per chunk).
  // With a pacer, only the frames its tokens admit now leave.
  // Returns how many of `seqs` were consumed: fewer
  // than `n` when the TX ring stayed full, and the caller hands the rest
  // back (SenderRound::Unsend) to send later.
  uint32_t Send(FrameTemplate& tmpl, DataHeader proto, const uint32_t* seqs,
                uint32_t n, const uint8_t* buffer, const ChunkLayout& layout);
};

}  // namespace dblp
