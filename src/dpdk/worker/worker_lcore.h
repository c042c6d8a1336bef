// dblp-worker's datapath lcores. Every turn reads the clock once and runs,
// in this order: RX (the broadcast's frames into the receive sides),
// control events, the receive sides' steps (STOP, BITMAP answers), TX (the
// push sides' steps); PollUntil (dblp/base/poll_loop.h) runs the turns.
// Rounds themselves live in the sides (lib/dblp/round/send_side.h,
// receive_side.h); worker_engine.cc sets up, joins and reports.
//
// Several lcores (EAL -l/--lcores): a push's chunks are split over the TX
// queues of every link; lcore 0 keeps RX, the broadcast and the control
// events, helper lcores step the other queues' push sides (PushCrew).
#pragma once

#include <rte_common.h>
#include <rte_mbuf.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dblp/base/idle_backoff.h"
#include "dblp/base/round_pacer.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "port/datapath.h"
#include "port/frame_builder.h"
#include "runtime/lcore.h"
#include "worker/shard_link.h"
#include "worker/worker_control.h"

namespace dblp {

// What a worker's iteration measured on its own side.
struct WorkerIterationTimes {
  uint64_t push_begin_ns = 0;
  uint64_t push_done_ns = 0;   // STOP's arrival (or the complete BITMAP)
  uint64_t bcast_done_ns = 0;  // our STOP for the broadcast went out
  double announced_p = 0;      // the push round's p, from ROUND_BEGIN
  bool critical = false;       // ...and the policy's phase
};

// A worker with several lcores (-l): lcore 0 runs RX, the control events,
// the broadcast receivers and the push sides of its own TX queues; helper
// lcore j steps the push sides of the TX queues q with q % lcores == j on
// every link (one lcore per TX queue). Lcore 0 opens every side of a push
// (SendSide::Begin) while the helpers wait, then hands them the push with a
// go generation; a helper steps its sides until they are done (or lcore 0
// aborts the push) and acknowledges. Between a helper's acknowledgement and
// the next go, lcore 0 alone touches the helpers' sides. No locks: atomics
// with release/acquire, the helpers spin/sleep (IdleBackoff) while idle.
class PushCrew {
 public:
  explicit PushCrew(unsigned helpers);
  unsigned helpers() const { return static_cast<unsigned>(helpers_.size()); }

  // Lcore 0. Go: the sides it opened go to the helpers; returns the push's
  // generation. Done: every helper acknowledged `gen`. Abort: ends `gen`
  // early and waits until every helper acknowledged it. End: the helpers
  // return (after the last push).
  uint64_t Go();
  bool Done(uint64_t gen) const;
  void Abort(uint64_t gen);
  void End();
  // The helpers' progress marks summed (RoundPacer's watchdog on lcore 0).
  uint64_t Progress() const;

  // Helper `h` (0-based: lcore h + 1). Wait: the next generation after
  // `seen`, or 0 once End was called. Ended: lcore 0 aborted `gen`.
  uint64_t Wait(uint64_t seen) const;
  bool Aborted(uint64_t gen) const {
    return abort_.load(std::memory_order_acquire) >= gen;
  }
  void Publish(unsigned h, uint64_t progress) {
    helpers_[h]->progress.store(progress, std::memory_order_relaxed);
  }
  void Acknowledge(unsigned h, uint64_t gen) {
    helpers_[h]->done.store(gen, std::memory_order_release);
  }

 private:
  struct alignas(RTE_CACHE_LINE_SIZE) Helper {
    // Writer: helper h (release); reader: lcore 0 (acquire): the last push
    // generation whose sides h finished or gave up.
    std::atomic<uint64_t> done{0};
    // Writer: helper h; reader: lcore 0's watchdog. Its sides' progress.
    std::atomic<uint64_t> progress{0};
  };
  // Writer: lcore 0 (release, after Begin on every side); readers: helpers.
  alignas(RTE_CACHE_LINE_SIZE) std::atomic<uint64_t> go_{0};
  // Writer: lcore 0; readers: helpers. The latest generation cut short.
  std::atomic<uint64_t> abort_{0};
  // Writer: lcore 0 (once, at the end); readers: helpers waiting for go.
  std::atomic<bool> end_{false};
  std::vector<std::unique_ptr<Helper>> helpers_;
};

// A worker's helper lcore (PushCrew): the push sides of its TX queues.
class WorkerPushLcore {
 public:
  // One push side with its own frames (a transmitter on its TX queue that
  // counts into this lcore's LcoreConf, this lcore's template copy) and
  // its link's request ring (multi-producer: WorkerControl).
  struct Queue {
    SendSide* side;
    MbufFrames frames;
    RingOutbox outbox;
  };
  WorkerPushLcore(LcoreConf& conf, PushCrew& crew, unsigned helper,
                  std::vector<Queue> queues, uint32_t idle_spin,
                  uint32_t idle_sleep_us)
      : conf_(conf),
        crew_(crew),
        helper_(helper),
        queues_(std::move(queues)),
        backoff_(idle_spin, idle_sleep_us) {}
  // Pushes until PushCrew::End.
  void Run();
  const LcoreConf& conf() const { return conf_; }
  size_t queues() const { return queues_.size(); }

 private:
  void Push(uint64_t gen);

  LcoreConf& conf_;
  PushCrew& crew_;
  const unsigned helper_;
  std::vector<Queue> queues_;
  IdleBackoff backoff_;
};

// dblp-worker's lcore: for every link (shard_link.h: one per server
// shard) pushes the link's partition of the gradient (one SendSide per
// lane of that server, each on its TX queue) and receives the mean's
// partition (one ReceiveSide over every RX queue of the link's port). Links
// that share one port are told apart by the broadcast's source IPv4 and UDP
// port.
class WorkerLcore {
 public:
  struct Setup {
    RxLossInjector* loss = nullptr;  // on the broadcast we receive
    RoundPacer* pacer = nullptr;
    // Several lcores: the helpers that step the other TX queues' sides
    // (lcore 0 steps queue q when q % lcores == 0). Null with one lcore.
    PushCrew* crew = nullptr;
    bool prefetch = true;  // the next chunks' places in the mean
  };
  WorkerLcore(LcoreConf& conf, WorkerShardLinks& links, const Setup& setup);

  // Opens iteration `it`'s broadcast receivers and waits for every server
  // shard to open its push round. False (with *failure) on a timeout, a
  // lost server or a quit signal.
  bool AwaitPushRound(uint64_t it, std::string* failure);
  // Pushes each link's `order` until its STOP and receives the mean until
  // our STOP on every link.
  bool Exchange(uint64_t it, std::string* failure);
  const WorkerIterationTimes& times() const { return times_; }

 private:
  // One link as this lcore runs it.
  struct LinkRun {
    ShardLink* link = nullptr;
    std::vector<MbufFrames> frames;  // per TX queue
    ChunkRanges lanes;               // the partition over that server's lcores
    RingOutbox outbox;
    bool have_go = false;
    uint32_t go_round = 0;  // the latest push ROUND_BEGIN
    double go_p = 0;
    bool go_critical = false;
    bool arrivals = false;           // frames polled on its port this turn
    std::vector<uint16_t> queues{};  // the TX queues this lcore steps
  };
  // One RX queue this lcore polls, and the links whose broadcast it brings.
  struct RxQueue {
    uint16_t port = 0;
    uint16_t queue = 0;
    std::vector<LinkRun*> link_runs;
    uint16_t port_lo = 0, port_hi = 0;  // the links' UDP ports
  };

  bool Turn(uint64_t now_ns);
  uint16_t PollBroadcast(uint64_t now_ns, const RxQueue& rxq);
  LinkRun* LinkRunOf(const RxQueue& rxq, const ParsedFrame& pf);
  bool HandleEvents(uint64_t now_ns);
  bool PushDone() const;
  bool PushDone(const LinkRun& lane) const;
  void StopHelpers();
  bool BroadcastOpen() const;
  bool AwaitsBroadcast() const;
  uint64_t Progress() const;
  template <class Done>
  bool RunUntil(Done done, const char* waiting_for, uint64_t it,
                std::string* failure);
  std::string Stalled(const char* waiting_for, uint64_t it) const;

  LcoreConf& conf_;
  WorkerShardLinks& links_;
  Setup setup_;
  std::vector<LinkRun> link_runs_;
  std::vector<RxQueue> rx_;
  std::vector<uint32_t> lane_order_;
  uint64_t drained_gen_ = 0;
  uint64_t announcements_ = 0;  // ROUND_BEGINs taken: they move the job
  uint64_t crew_gen_ = 0;       // the push the helpers have (0: none)
  WorkerIterationTimes times_;
};

}  // namespace dblp
