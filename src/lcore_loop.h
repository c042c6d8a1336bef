// The datapath lcore loops of both apps. Every turn reads the clock once and
// runs, in this order: RX (frames into the receive sides), control events,
// the receive sides' steps (STOP, BITMAP answers), TX (the send sides'
// steps), then the idle back-off. Rounds themselves live in the sides
// (lib/dblp/send_side.h, receive_side.h); the engines (worker_engine.cc,
// server_engine.cc) only set up, join, run iterations and report.
#pragma once

#include <rte_common.h>
#include <rte_mbuf.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "datapath.h"
#include "dblp/chunking.h"
#include "dblp/loss_fill.h"
#include "dblp/receive_side.h"
#include "dblp/send_order.h"
#include "dblp/send_side.h"
#include "dblp/token_bucket.h"
#include "frame_builder.h"
#include "port.h"
#include "server_control.h"
#include "worker_control.h"

namespace dblp {

inline constexpr uint16_t kRxBurst = 64;

// One datapath lcore's own state (l3fwd's lcore_conf). Writer: that lcore;
// readers: the sidecar's stats line and the summary read `counters` only.
struct alignas(RTE_CACHE_LINE_SIZE) LcoreConf {
  unsigned lcore_id = 0;
  uint16_t rx_queue = 0;
  uint16_t tx_queue = 0;
  // RX polls so far, and the latest one that came back short on every port
  // this lcore polls: a PROBE seen at poll g is answered once drained > g.
  uint64_t poll_gen = 0;
  DatapathCounters counters;
  rte_mbuf* rx_pkts[kRxBurst];
};

// What a worker's iteration measured on its own side.
struct WorkerIterationTimes {
  uint64_t push_begin_ns = 0;
  uint64_t push_done_ns = 0;   // STOP's arrival (or the complete BITMAP)
  uint64_t bcast_done_ns = 0;  // our STOP for the broadcast went out
  double announced_p = 0;      // the push round's p, from ROUND_BEGIN
};

// dblp-worker's lcore: pushes its gradient (the push SendSide) and receives
// the mean (the broadcast ReceiveSide) on one port.
class WorkerLcore {
 public:
  struct Setup {
    uint16_t port = 0;
    uint16_t udp_port = 0;      // ours: the broadcast arrives here
    const ChunkLayout* layout = nullptr;
    RxLossInjector* loss = nullptr;   // on the broadcast we receive
    ChunkTransmitter* tx = nullptr;
    FrameTemplate* to_server = nullptr;
    const uint8_t* gradient = nullptr;  // what the push sends
    uint8_t* mean = nullptr;            // where the broadcast lands
    RoundPacer* pacer = nullptr;
  };
  WorkerLcore(LcoreConf& conf, WorkerControl& control, SendSide& push,
              ReceiveSide& bcast, const Setup& setup);

  // Opens iteration `it`'s broadcast receiver and waits for the server to
  // open its push round. False (with *failure) on a timeout, a lost server
  // or a quit signal.
  bool AwaitPushRound(uint64_t it, std::string* failure);
  // Pushes in `order` until STOP and receives the mean until our STOP.
  bool Exchange(uint64_t it, std::span<const uint32_t> order,
                std::string* failure);
  const WorkerIterationTimes& times() const { return times_; }

 private:
  bool Turn(uint64_t now_ns);
  uint16_t PollBroadcast(uint64_t now_ns);
  bool HandleEvents(uint64_t now_ns);
  // Runs turns until `done()`; false with *failure if the loop must end.
  template <class Done>
  bool RunUntil(Done done, const char* waiting_for, uint64_t it,
                std::string* failure);

  LcoreConf& conf_;
  WorkerControl& control_;
  SendSide& push_;
  ReceiveSide& bcast_;
  Setup setup_;
  MbufFrames frames_;
  RingOutbox outbox_;
  uint64_t drained_gen_ = 0;
  bool have_go_ = false;
  uint32_t go_round_ = 0;   // the latest push ROUND_BEGIN
  double go_p_ = 0;
  WorkerIterationTimes times_;
};


// The server's state for one worker. Datapath lcore only, except the
// sides' own control-thread entry points (send_side.h, receive_side.h).
struct ServerLink {
  ServerLink(const ReceiveSideConfig& rc, const SendSideConfig& sc,
             const SendOrder& o)
      : push(rc), bcast(sc), order(o) {}
  ReceiveSide push;
  SendSide bcast;
  SendOrder order;
  std::vector<uint32_t> order_buf;
  // The worker's return path, learned from its first accepted frame.
  bool learned = false;
  uint16_t port = 0;
  FrameTemplate tmpl;
  bool alive = true;      // false: lost, its frames are dropped
  bool said_bye = false;  // finished its iterations
  bool arrivals = false;  // frames accepted this turn
};

// dblp-server's lcore: receives every worker's push (a ReceiveSide per
// worker, summed into the MeanReducer) and broadcasts the mean (a SendSide
// per worker), on one port per worker.
class ServerLcore {
 public:
  struct Setup {
    uint16_t nb_ports = 1;
    uint16_t udp_port = 0;  // pushes arrive here; worker r gets +1+r
    uint32_t local_ip = 0;
    const std::vector<PortCaps>* caps = nullptr;
    const ChunkLayout* layout = nullptr;
    RxLossInjector* loss = nullptr;  // on the pushes we receive
    MeanReducer* reducer = nullptr;
    const uint8_t* mean = nullptr;   // what the broadcast sends
    rte_mempool* pool = nullptr;
    std::vector<TokenBucket>* link_rate = nullptr;  // per port
    bool prefetch = true;
    RoundPacer* pacer = nullptr;
    bool continue_on_worker_loss = false;
  };
  enum class PushEnd : uint8_t { kStopped, kAllBye, kFailed };

  ServerLcore(LcoreConf& conf, ServerControl& control,
              std::vector<std::unique_ptr<ServerLink>>& links,
              const Setup& setup);

  // Turns until every live worker's push round reached STOP (or every
  // worker said BYE, or the job must end: *failure says why).
  PushEnd RunPush(uint64_t it, std::string* failure);
  // Broadcasts the mean to every live worker until each one's STOP.
  bool RunBroadcast(uint64_t it, std::string* failure);
  uint32_t live_count() const;
  RingOutbox& outbox() { return outbox_; }

  // Out of line and named so that profiles (tools/dblp-bench --callgrind)
  // attribute the RX path's instructions to it.
  [[gnu::noinline]] void ReceiveBurst(uint16_t port, rte_mbuf** pkts,
                                      uint16_t n, uint64_t now_ns);

 private:
  bool Turn(uint64_t now_ns, bool broadcasting);
  uint32_t PollPushes(uint64_t now_ns);
  void Learn(ServerLink& l, uint16_t port, uint16_t rank,
             const ParsedFrame& pf);
  bool HandleEvents(std::string* failure);
  bool LoseWorker(uint32_t w, const std::string& how, std::string* failure);
  uint64_t DrainedFor(const ServerLink& l) const;
  bool FinishedEarly(uint64_t it, std::string* failure);
  template <class Done>
  bool RunUntil(Done done, bool broadcasting, const std::string& what,
                std::string* failure);

  LcoreConf& conf_;
  ServerControl& control_;
  std::vector<std::unique_ptr<ServerLink>>& links_;
  Setup setup_;
  RingOutbox outbox_;
  ChunkTransmitter tx_;
  std::vector<uint64_t> drained_gen_;  // per port: last short poll
  uint32_t rr_ = 0;                    // broadcast round robin
  uint64_t iteration_ = 0;
};

}  // namespace dblp
