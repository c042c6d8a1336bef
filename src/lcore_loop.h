// The datapath lcore loops of both apps. Every turn reads the clock once and
// runs, in this order: RX (frames into the receive sides), control events,
// the receive sides' steps (STOP, BITMAP answers), TX (the send sides'
// steps), then the idle back-off. Rounds themselves live in the sides
// (lib/dblp/round/send_side.h, receive_side.h); the engines (worker_engine.cc,
// server_engine.cc) set up, join, and report.
//
// Several lcores (EAL -l/--lcores): a round's chunks are sharded over them
// (lib/dblp/round/shards.h). Lcore k owns shard k: RX and TX queue k of every
// port, and shard k's side of every round, so each bitmap word and each sum
// slice has one writer. A sender puts chunk `seq` on TX queue ShardOf(seq),
// to UDP port base + ShardOf(seq): memif maps a client's TX queue k to the
// server's RX queue k, a NIC steers the port to it (steering.h), and a
// frame that still lands on another lcore's queue is handed to its owner.
#pragma once

#include <rte_common.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "bcast_frames.h"
#include "datapath.h"
#include "dblp/base/idle_backoff.h"
#include "dblp/emul/token_bucket.h"
#include "dblp/job/server_job.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_order.h"
#include "dblp/round/send_side.h"
#include "dblp/round/shards.h"
#include "dblp/wire/chunking.h"
#include "frame_builder.h"
#include "port.h"
#include "push_rx.h"
#include "server_control.h"
#include "shard_link.h"
#include "worker_control.h"

namespace dblp {

inline constexpr uint16_t kRxBurst = 64;

// One datapath lcore's own state (l3fwd's lcore_conf). Writer: that lcore;
// readers: the sidecar's stats line and the summary read `counters` only.
struct alignas(RTE_CACHE_LINE_SIZE) LcoreConf {
  unsigned lcore_id = 0;
  uint16_t shard = 0;     // = its RX and TX queue on every port
  uint64_t poll_gen = 0;  // RX polls so far
  DatapathCounters counters;
  rte_mbuf* rx_pkts[kRxBurst];
};

// What a job's datapath lcores share: a barrier between the phases of an
// iteration, the first failure (which ends every lcore's loop) and the
// latest progress any lcore made (RoundPacer's shared watchdog).
class JobSync {
 public:
  JobSync(unsigned lcores, const std::atomic<bool>* quit)
      : lcores_(lcores), quit_(quit) {}
  // Every lcore calls it between two phases; returns false (without
  // waiting for the others) once the job failed or was interrupted.
  bool Barrier();
  void Fail(const std::string& why);  // the first failure is kept
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure();
  std::atomic<uint64_t>* progress() { return &progress_ns_; }

 private:
  const unsigned lcores_;
  const std::atomic<bool>* quit_;
  alignas(RTE_CACHE_LINE_SIZE) std::atomic<unsigned> arrived_{0};  // all: RMW
  std::atomic<uint64_t> generation_{0};  // last lcore to arrive: wo; all: ro
  std::atomic<bool> failed_{false};      // any lcore: wo; all: ro
  std::mutex failure_mu_;  // Fail / failure only, never per packet
  std::string failure_;
  alignas(RTE_CACHE_LINE_SIZE) std::atomic<uint64_t> progress_ns_{0};
};

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
// lcore shard of that server, each on its TX queue) and receives the mean's
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
  struct Lane {
    ShardLink* link = nullptr;
    std::vector<MbufFrames> frames;  // per TX queue
    ShardMap shards;                 // the partition over that server's lcores
    RingOutbox outbox;
    bool have_go = false;
    uint32_t go_round = 0;  // the latest push ROUND_BEGIN
    double go_p = 0;
    bool go_critical = false;
    bool arrivals = false;  // frames polled on its port this turn
    std::vector<uint16_t> queues{};  // the TX queues this lcore steps
  };
  // One RX queue this lcore polls, and the lanes whose broadcast it brings.
  struct RxQueue {
    uint16_t port = 0;
    uint16_t queue = 0;
    std::vector<Lane*> lanes;
    uint16_t port_lo = 0, port_hi = 0;  // the lanes' UDP ports
  };

  bool Turn(uint64_t now_ns);
  uint16_t PollBroadcast(uint64_t now_ns, const RxQueue& rxq);
  Lane* LaneOf(const RxQueue& rxq, const ParsedFrame& pf);
  bool HandleEvents(uint64_t now_ns);
  bool PushDone() const;
  bool PushDone(const Lane& lane) const;
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
  std::vector<Lane> lanes_;
  std::vector<RxQueue> rx_;
  std::vector<uint32_t> shard_order_;
  uint64_t drained_gen_ = 0;
  uint64_t announcements_ = 0;  // ROUND_BEGINs taken: they move the job
  uint64_t crew_gen_ = 0;       // the push the helpers have (0: none)
  WorkerIterationTimes times_;
};

// The server's state for one worker, shared by its lcores (whether it is
// alive and said BYE is the job's: ServerJob). push_stop: every lcore (its
// own CAS protocol, shards.h).
// return_port/return_mac: writer the lcore that wins return_claimed (the
// first to accept a frame from the worker), readers every lcore after
// return_ready (release/acquire) — an lcore whose shard got none of the
// worker's frames still knows which port to broadcast on. The address is
// the pinned source, never what a frame claims.
struct WorkerState {
  // Where its frames must come from, pinned at JOIN (ServerControl::
  // pinned_source); written before the lcores start, read-only after.
  Endpoint source;
  FrameKey frame_key;  // its own (ServerControl::member_frame_key), likewise
  StopGroup push_stop;                // the push STOP across shards
  std::atomic<bool> return_claimed{false};
  std::atomic<bool> return_ready{false};
  uint16_t return_port = 0;  // the port its frames arrive on
  // Their source MAC: the next hop back when the worker pinned none (it
  // sits behind a router, --eth_peer).
  rte_ether_addr return_mac{};
};

// One server lcore's sides for one worker (its shard of that worker's
// rounds). Writer: that lcore; the control thread uses the sides' own
// entry points; lcore 0 reads the stats of every lcore's links only while
// the others wait at a JobSync barrier (the rows of an iteration).
struct ServerLink {
  ServerLink(const ReceiveSideConfig& rc, const SendSideConfig& sc,
             const WorkerState& w)
      : push(rc), bcast(sc), worker(w) {}
  ReceiveSide push;
  SendSide bcast;
  const WorkerState& worker;  // its pinned source, read per frame
  std::vector<uint32_t> order_buf;
  // The worker's return path: from this lcore's first accepted frame of
  // the worker, else from WorkerState at the broadcast.
  bool learned = false;
  uint16_t port = 0;
  FrameTemplate tmpl;
  // The push receiver's accepted count at the last turn (its arrivals).
  uint64_t accepted_seen = 0;
  RxExpect expect;  // the last push frame accepted (push_rx.h)
};

// links[k][w]: lcore k's link to worker w.
using LinkGrid = std::vector<std::vector<std::unique_ptr<ServerLink>>>;

// Lcore k's link to worker w: shard k of w's pushes and broadcasts, each
// push side registered with the worker's StopGroup; w's pushes must carry
// tags under w's key, and w's broadcast is sealed with it.
LinkGrid BuildLinkGrid(uint32_t session, const ChunkLayout& layout,
                       const ShardMap& shards, uint32_t burst,
                       std::vector<std::unique_ptr<WorkerState>>& workers);

// What lcore 0 decides for every server lcore. Writer: lcore 0, before a
// JobSync barrier; readers: every lcore, after it.
struct ServerDecisions {
  RoundTolerance next_push;  // the tolerance of the push being opened
  bool all_bye = false;      // every live worker finished: the job ends
};

// The iteration steps only lcore 0 takes, between the lcores' phases (the
// engine's calls into the ServerJob).
struct ServerCoordinator {
  // Every lcore's push sides are closed: reduce, run the policy, announce
  // the broadcast. Returns the next push's tolerance.
  std::function<RoundTolerance(uint64_t it)> reduce;
  // Every lcore opened the next push: announce it.
  std::function<void(uint64_t next_it)> announce_push;
  // Every lcore's broadcast is done.
  std::function<void(uint64_t it)> broadcast_done;
};

// dblp-server's lcore k: shard k of every worker's push (its ReceiveSides,
// summed into the MeanReducer's slices of the shard) and of every broadcast
// (its SendSides).
class ServerLcore {
 public:
  struct Setup {
    uint16_t nb_ports = 1;
    uint16_t udp_port = 0;  // pushes arrive here; worker r gets +1+r
    uint32_t local_ip = 0;
    const std::vector<PortCaps>* caps = nullptr;
    const ChunkLayout* layout = nullptr;
    const ShardMap* shards = nullptr;
    RxLossInjector* loss = nullptr;  // on the pushes we receive
    // The job: its reducer sums this lcore's chunk range; its alive(w) is
    // read per frame; lcore 0 alone calls its coordinator entry points.
    ServerJob* job = nullptr;
    const uint8_t* mean = nullptr;  // what the broadcast sends
    rte_mempool* pool = nullptr;
    std::vector<TokenBucket>* link_rate = nullptr;  // this lcore's, per port
    bool prefetch = true;
    bool push_only = false;
    ServerDecisions* decisions = nullptr;
    // Several lcores: lcore j's handoff ring, which takes the frames of
    // j's chunk range that landed on another lcore's queue (RSS steering,
    // steering.h). Empty with one lcore.
    std::vector<rte_ring*> handoff;
    // How the broadcast's frames carry the mean (bcast_frames.h).
    BcastFrameMode bcast_frames = BcastFrameMode::kCopy;
    rte_iova_t mean_iova = RTE_BAD_IOVA;
  };

  ServerLcore(LcoreConf& conf, ServerControl& control, JobSync& sync,
              std::vector<std::unique_ptr<WorkerState>>& workers,
              std::vector<ServerLink*> links, RoundPacer& pacer,
              const Setup& setup);

  // The whole job on this lcore: iterations until every worker said BYE
  // or the job fails (JobSync holds why). `coord` on lcore 0 only.
  void Run(ServerCoordinator* coord);
  // Lcore 0, before Run: opens iteration 0's push.
  void OpenPush(uint64_t it, const RoundTolerance& tol);
  RingOutbox& outbox() { return outbox_; }

  // Out of line and named so that profiles (tools/dblp-bench --callgrind)
  // attribute the RX path's instructions to it.
  [[gnu::noinline]] void ReceiveBurst(uint16_t port, rte_mbuf** pkts,
                                      uint16_t n, uint64_t now_ns);

 private:
  enum class PushEnd : uint8_t { kStopped, kAllBye, kFailed };
  void LearnFrom(uint16_t port, const rte_mbuf* m, uint16_t w);
  bool Turn(uint64_t now_ns, bool broadcasting);
  uint32_t PollPushes(uint64_t now_ns);
  uint16_t HandOver(uint16_t port, rte_mbuf** pkts, uint16_t n);
  bool TakeHandedOver(uint64_t now_ns, uint32_t* total);
  void Learn(ServerLink& l, uint16_t port, uint16_t rank,
             const rte_ether_addr& next_hop);
  bool AdoptReturnPaths();
  bool HandleEvents();
  bool LoseWorker(uint32_t w, const std::string& failure);
  std::string Stalled(bool broadcasting) const;
  std::string LoseSilent(bool broadcasting);
  uint64_t Progress() const;
  uint64_t DrainedFor(const ServerLink& l) const;
  bool FinishedEarly(uint64_t it);
  PushEnd RunPush(uint64_t it);
  bool RunBroadcast(uint64_t it);
  template <class Done>
  bool RunUntil(Done done, bool broadcasting);

  LcoreConf& conf_;
  ServerControl& control_;
  JobSync& sync_;
  ServerJob& job_;
  std::vector<std::unique_ptr<WorkerState>>& workers_;
  std::vector<ServerLink*> links_;  // this lcore's shard of each worker
  std::vector<PushRxWorker> rx_workers_;  // links_' receivers, pins, expects
  RoundPacer& pacer_;
  Setup setup_;
  RingOutbox outbox_;
  ChunkTransmitter tx_;
  std::vector<uint64_t> drained_gen_;  // per port: last short poll
  uint32_t rr_ = 0;                    // broadcast round robin
  uint64_t iteration_ = 0;
  uint64_t departures_ = 0;  // BYEs and lost workers: they move the job
  uint64_t injected_at_start_ = 0;  // the injector's drops as a wait began
  // HandOver's frames for each other lcore, within one burst.
  std::vector<std::array<rte_mbuf*, kRxBurst>> staged_;
  std::vector<uint16_t> staged_n_;
  rte_mbuf* handed_[kRxBurst];  // taken from our own handoff ring
};

// The handoff rings of a server's lcores (ServerLcore::Setup::handoff):
// multi-producer, single-consumer. Setup only; what is left in them at the
// end goes back to the pool.
class HandoffRings {
 public:
  HandoffRings() = default;
  HandoffRings(uint16_t lcores, int socket);
  ~HandoffRings();
  HandoffRings(const HandoffRings&) = delete;
  HandoffRings& operator=(const HandoffRings&) = delete;
  const std::vector<rte_ring*>& rings() const { return rings_; }

 private:
  std::vector<rte_ring*> rings_;
};
// Frames a handoff ring holds (the pool needs that many more mbufs).
inline constexpr uint32_t kHandoffRingSize = 1024;

}  // namespace dblp
