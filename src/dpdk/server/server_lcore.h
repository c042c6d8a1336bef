// dblp-server's datapath lcores. Every turn reads the clock once and runs,
// in this order: RX (frames into the receive sides), control events, the
// receive sides' steps (STOP, BITMAP answers), TX (the broadcast's send
// sides); PollUntil (dblp/base/poll_loop.h) runs the turns and the job
// (ServerJob) decides at the boundaries. server_engine.cc sets up, joins
// and reports.
//
// Several lcores (EAL -l/--lcores): a round's chunks are divided over them
// (lib/dblp/round/chunk_ranges.h). Lcore k owns lane k: RX and TX queue k of
// every port, and slice k's side of every round, so each bitmap word and
// each sum slice has one writer. A sender puts chunk `seq` on TX queue
// RangeOf(seq), to UDP port base + RangeOf(seq): memif maps a client's TX
// queue k to the server's RX queue k, a NIC steers the port to it
// (steering.h), and a frame that still lands on another lcore's queue is
// handed to its owner.
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

#include "dblp/base/round_pacer.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/emul/token_bucket.h"
#include "dblp/job/server_driver.h"
#include "dblp/job/server_job.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "dblp/wire/chunking.h"
#include "port/datapath.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "runtime/lcore.h"
#include "server/bcast_frames.h"
#include "server/push_rx.h"
#include "server/server_control.h"

namespace dblp {

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

// The server's state for one worker, shared by its lcores (whether it is
// alive and said BYE is the job's: ServerJob). push_stop: every lcore (its
// own CAS protocol, chunk_ranges.h).
// return_port/return_mac: writer the lcore that wins return_claimed (the
// first to accept a frame from the worker), readers every lcore after
// return_ready (release/acquire) — an lcore whose lane got none of the
// worker's frames still knows which port to broadcast on. The address is
// the pinned source, never what a frame claims.
struct WorkerState {
  // Where its frames must come from, pinned at JOIN (ServerControl::
  // pinned_source); written before the lcores start, read-only after.
  Endpoint source;
  FrameKey frame_key;   // its own (ServerControl::member_frame_key), likewise
  StopGroup push_stop;  // the push STOP across lanes
  std::atomic<bool> return_claimed{false};
  std::atomic<bool> return_ready{false};
  uint16_t return_port = 0;  // the port its frames arrive on
  // Their source MAC: the next hop back when the worker pinned none (it
  // sits behind a router, --eth_peer).
  rte_ether_addr return_mac{};
};

// One server lcore's sides for one worker (its lane of that worker's
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

// Lcore k's link to worker w: lane k of w's pushes and broadcasts, each
// push side registered with the worker's StopGroup; w's pushes must carry
// tags under w's key, and w's broadcast is sealed with it.
LinkGrid BuildLinkGrid(uint32_t session, const ChunkLayout& layout,
                       const ChunkRanges& lanes, uint32_t burst,
                       std::vector<std::unique_ptr<WorkerState>>& workers);

// dblp-server's lcore k: lane k of every worker's push (its ReceiveSides,
// summed into the MeanReducer's slices of the lane) and of every broadcast
// (its SendSides).
class ServerLcore {
 public:
  struct Setup {
    uint16_t nb_ports = 1;
    uint16_t udp_port = 0;  // pushes arrive here; worker r gets +1+r
    uint32_t local_ip = 0;
    const std::vector<PortCaps>* caps = nullptr;
    const ChunkLayout* layout = nullptr;
    const ChunkRanges* lanes = nullptr;
    RxLossInjector* loss = nullptr;  // on the pushes we receive
    // The job: its reducer sums this lcore's chunk range; its alive(w) is
    // read per frame; lcore 0 alone calls its coordinator entry points.
    ServerJob* job = nullptr;
    const uint8_t* mean = nullptr;  // what the broadcast sends
    rte_mempool* pool = nullptr;
    std::vector<TokenBucket>* link_rate = nullptr;  // this lcore's, per port
    bool prefetch = true;
    // The job's iteration (server_driver.h); lcore 0 coordinates.
    ServerCoordinator* coordinator = nullptr;
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

  // The whole job on this lcore (ServeIterations): iterations until every
  // worker said BYE or the job fails (JobSync holds why). Lcore 0 also
  // takes the job's decisions.
  void Run();
  RingOutbox& outbox() { return outbox_; }

  // ---- what ServeIterations asks of a lane (server_driver.h) ----
  // Turns until done(), or false once the job failed (JobSync holds why).
  template <class Done>
  bool RunRound(uint64_t it, bool broadcasting, Done done);
  bool PushStopped(uint32_t w, uint64_t it) const {
    return workers_[w]->push_stop.taken(PushRound(it));
  }
  bool BroadcastDone(uint32_t w) const { return links_[w]->bcast.done(); }
  void ClosePushSides() {
    for (ServerLink* l : links_) l->push.Close();
  }
  void OpenPushSides(uint64_t it, const PushOpening& open);
  bool BeginBroadcastSides(uint64_t it);

  // Out of line and named so that profiles (tools/dblp-bench --callgrind)
  // attribute the RX path's instructions to it.
  [[gnu::noinline]] void ReceiveBurst(uint16_t port, rte_mbuf** pkts,
                                      uint16_t n, uint64_t now_ns);

 private:
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

  LcoreConf& conf_;
  ServerControl& control_;
  JobSync& sync_;
  ServerJob& job_;
  std::vector<std::unique_ptr<WorkerState>>& workers_;
  std::vector<ServerLink*> links_;        // this lcore's lane of each worker
  std::vector<PushRxWorker> rx_workers_;  // links_' receivers, pins, expects
  RoundPacer& pacer_;
  Setup setup_;
  RingOutbox outbox_;
  ChunkTransmitter tx_;
  std::vector<uint64_t> drained_gen_;  // per port: last short poll
  uint32_t rr_ = 0;                    // broadcast round robin
  uint64_t iteration_ = 0;
  uint64_t departures_ = 0;         // BYEs and lost workers: they move the job
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
