// Pieces shared by the server's and the worker's datapath lcore: counters,
// the control bridge (rings between the datapath and the control sidecar),
// the clock, and the chunk transmitter.
#pragma once

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <array>
#include <cstring>
#include <atomic>
#include <cstdint>
#include <string>

#include "dblp/bitmap.h"
#include "dblp/chunking.h"
#include "dblp/control.h"
#include "dblp/loss_model.h"
#include "dblp/sender_round.h"
#include "dblp/wire.h"
#include "eal_app.h"
#include "frame_builder.h"

namespace dblp {

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
    kPeerGone,        // the control connection of `peer` closed
    kFatal,           // the control plane failed; stop
    // datapath -> sidecar
    kSendProbe,       // PROBE for `round` of `peer`, value = pass
    kSendStop,        // STOP for `round` of `peer`, value = received
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
  bool Push(CtlEvent e) {  // by value: the ring API takes a non-const ptr
    return rte_ring_enqueue_elem(ring_, &e, sizeof(CtlEvent)) == 0;
  }
  bool Pop(CtlEvent* e) {
    return rte_ring_dequeue_elem(ring_, e, sizeof(CtlEvent)) == 0;
  }

 private:
  rte_ring* ring_ = nullptr;
};

// A BITMAP handed from the sidecar to the datapath. One per sender: a
// sender has at most one PROBE outstanding, so at most one BITMAP is in
// flight; a second one while the first is unread is counted and dropped.
class BitmapMailbox {
 public:
  // Sidecar. Returns false (counted) if the slot is busy or the words do
  // not fit `num_bits`.
  bool Post(const BitmapMsg& m) {
    if (busy_.load(std::memory_order_acquire)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    slot_.Resize(m.num_bits);
    if (!slot_.AssignWords(m.words)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    busy_.store(true, std::memory_order_release);
    return true;
  }
  // Datapath, after the event announcing the post: read, then Release.
  const Bitmap& slot() const { return slot_; }
  void Release() { busy_.store(false, std::memory_order_release); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  Bitmap slot_;                          // sidecar: wo while !busy; dp: ro
  std::atomic<bool> busy_{false};        // sidecar: sets; datapath: clears
  std::atomic<uint64_t> dropped_{0};     // sidecar: wo
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

// Sends the chunks a SenderRound hands out, built straight into mbufs.
struct ChunkTransmitter {
  uint16_t port = 0;
  uint16_t queue = 0;
  rte_mempool* pool = nullptr;
  LossInjector* loss = nullptr;  // may be null
  DatapathCounters* counters = nullptr;
  uint32_t tx_retries = 8;      // bounded retry when the TX ring is full

  // Builds and transmits `n` chunks `seqs` of `buffer` as frames of `proto`
  // (type, session, rank, round; seq and length are filled per chunk).
  // Frames the loss injector drops are never built (they count as sent, as
  // if lost on the wire). Returns how many of `seqs` were consumed: fewer
  // than `n` when the TX ring stayed full, and the caller hands the rest
  // back (SenderRound::Unsend) to send later.
  uint32_t Send(FrameTemplate& tmpl, DataHeader proto, const uint32_t* seqs,
                uint32_t n, const uint8_t* buffer, const ChunkLayout& layout);
};

}  // namespace dblp
