#include "worker/worker_lcore.h"

#include <rte_pause.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <variant>

#include "dblp/base/log.h"
#include "dblp/base/poll_loop.h"
#include "dblp/job/diagnosis.h"

namespace dblp {

// ---- dblp-worker's helper lcores --------------------------------------------

PushCrew::PushCrew(unsigned helpers) {
  for (unsigned h = 0; h < helpers; ++h) {
    helpers_.push_back(std::make_unique<Helper>());
  }
}

uint64_t PushCrew::Go() {
  const uint64_t gen = go_.load(std::memory_order_relaxed) + 1;
  go_.store(gen, std::memory_order_release);
  return gen;
}

bool PushCrew::Done(uint64_t gen) const {
  for (const auto& h : helpers_) {
    if (h->done.load(std::memory_order_acquire) < gen) return false;
  }
  return true;
}

void PushCrew::Abort(uint64_t gen) {
  abort_.store(gen, std::memory_order_release);
  IdleBackoff backoff(256, 50);
  while (!Done(gen)) backoff.Idle();
}

void PushCrew::End() { end_.store(true, std::memory_order_release); }

uint64_t PushCrew::Progress() const {
  uint64_t mark = 0;
  for (const auto& h : helpers_) {
    mark += h->progress.load(std::memory_order_relaxed);
  }
  return mark;
}

uint64_t PushCrew::Wait(uint64_t seen) const {
  IdleBackoff backoff(256, 50);
  for (;;) {
    const uint64_t gen = go_.load(std::memory_order_acquire);
    if (gen > seen) return gen;
    if (end_.load(std::memory_order_acquire)) return 0;
    backoff.Idle();
  }
}

void WorkerPushLcore::Run() {
  uint64_t gen = 0;
  while ((gen = crew_.Wait(gen)) != 0) Push(gen);
}

// Push `gen` on this lcore's sides (lcore 0 opened them) until every one
// is done or lcore 0 gave the push up; then they are lcore 0's to read.
void WorkerPushLcore::Push(uint64_t gen) {
  backoff_.Work();
  for (;;) {
    const uint64_t now = NowNs();
    bool work = false, done = true;
    uint64_t progress = 0;
    for (Queue& q : queues_) {
      work |= q.side->Step(now, q.frames, q.outbox);
      done = done && q.side->done();
      progress += q.side->progress();
    }
    crew_.Publish(helper_, progress);
    if (done || crew_.Aborted(gen)) break;
    if (work) {
      backoff_.Work();
    } else {
      backoff_.Idle();
    }
  }
  crew_.Acknowledge(helper_, gen);
}

// ---- dblp-worker ------------------------------------------------------------

WorkerLcore::WorkerLcore(LcoreConf& conf, WorkerShardLinks& links,
                         const Setup& setup)
    : conf_(conf), links_(links), setup_(setup) {
  link_runs_.reserve(links.size());  // rx_ points into it
  for (const auto& link : links) {
    ShardLink& l = *link;
    LinkRun lr{&l,
               {},
               ChunkRanges(l.layout.num_chunks(),
                           static_cast<uint32_t>(l.push.size())),
               l.control.outbox()};
    const unsigned lcores = setup.crew ? setup.crew->helpers() + 1 : 1;
    for (ChunkTransmitter& tx : l.tx) {
      lr.frames.push_back(MbufFrames{&tx, &l.to_server, l.gradient, &l.layout});
      if (tx.queue % lcores == 0) lr.queues.push_back(tx.queue);
    }
    link_runs_.push_back(std::move(lr));
  }
  // Every RX queue of every port a link uses, with the links it brings.
  // A port that several links share has as many queues as the link with
  // the most, and the NIC's hash may put any link's broadcast on any of
  // them: each of its queues must know every link on the port.
  std::vector<uint16_t> port_queues;
  for (const LinkRun& lr : link_runs_) {
    const ShardLink& l = *lr.link;
    if (port_queues.size() <= l.port) port_queues.resize(l.port + 1, 0);
    port_queues[l.port] = std::max<uint16_t>(
        port_queues[l.port], static_cast<uint16_t>(l.tx.size()));
  }
  for (LinkRun& lr : link_runs_) {
    const ShardLink& l = *lr.link;
    for (uint16_t q = 0; q < port_queues[l.port]; ++q) {
      auto it = std::find_if(rx_.begin(), rx_.end(), [&](const RxQueue& r) {
        return r.port == l.port && r.queue == q;
      });
      if (it == rx_.end()) {
        rx_.push_back(
            RxQueue{l.port, q, {}, l.local.udp_port, l.local.udp_port});
        it = rx_.end() - 1;
      }
      it->link_runs.push_back(&lr);
      it->port_lo = std::min(it->port_lo, l.local.udp_port);
      it->port_hi = std::max(it->port_hi, l.local.udp_port);
    }
  }
}

// The link a broadcast frame belongs to: its server's IPv4 from the
// WELCOME and our UDP port toward it (the server's MAC is the port's it
// sends on, which the WELCOME cannot name when the server has several).
WorkerLcore::LinkRun* WorkerLcore::LinkRunOf(const RxQueue& rxq,
                                             const ParsedFrame& pf) {
  for (LinkRun* lr : rxq.link_runs) {
    const ShardLink& l = *lr->link;
    if (pf.src.ipv4 == l.wel.server_ipv4 &&
        pf.src.udp_port == l.local.udp_port &&
        pf.dst_port == l.local.udp_port) {
      return lr;
    }
  }
  return nullptr;
}

// A burst in stages: L2-L4, loss and link; then each link's receiver (header,
// round, range, tag, bitmap); then the copies into the mean, the destination of
// the chunks two ahead prefetched while one is copied. Drops are counted per
// burst.
uint16_t WorkerLcore::PollBroadcast(uint64_t now_ns, const RxQueue& rxq) {
  const uint16_t n = PollRx(rxq.port, rxq.queue, conf_.rx_pkts, kRxBurst);
  if (n == 0) return 0;
  DatapathCounters::Add(conf_.counters.rx_frames, n);
  for (LinkRun* lr : rxq.link_runs) lr->arrivals = true;
  struct Admitted {
    const uint8_t* dblp;
    uint16_t len;
    ShardLink* link;
  };
  Admitted admitted[kRxBurst];
  uint16_t m = 0;
  uint32_t unpinned = 0;
  for (uint16_t i = 0; i < n; ++i) {
    ParsedFrame pf;
    if (!AdmitFrameIn(conf_.rx_pkts[i], rxq.port_lo, rxq.port_hi, *setup_.loss,
                      now_ns, conf_.counters, &pf)) {
      continue;
    }
    LinkRun* lr = LinkRunOf(rxq, pf);
    if (lr == nullptr) {
      ++unpinned;
      continue;
    }
    admitted[m++] = Admitted{pf.dblp, pf.dblp_len, lr->link};
  }
  if (unpinned != 0) {
    DatapathCounters::Add(conf_.counters.unpinned_source, unpinned);
  }
  struct Copy {
    uint8_t* dst;
    const uint8_t* payload;
    uint16_t len;
  };
  Copy copies[kRxBurst];
  uint16_t a = 0;
  for (uint16_t j = 0; j < m; ++j) {
    ShardLink& l = *admitted[j].link;
    DataHeader h;
    const uint8_t* payload = nullptr;
    if (l.bcast->receiver().OnFrame(admitted[j].dblp, admitted[j].len, &h,
                                    &payload) == Verdict::kAccepted) {
      copies[a++] =
          Copy{l.mean + l.layout.Offset(h.seq), payload, h.payload_len};
    }
  }
  constexpr uint16_t kAhead = 2;
  const bool prefetch = setup_.prefetch;
  for (uint16_t k = 0; k < a; ++k) {
    if (prefetch && k + kAhead < a) {
      PrefetchBytes(copies[k + kAhead].dst, copies[k + kAhead].len);
    }
    std::memcpy(copies[k].dst, copies[k].payload, copies[k].len);
  }
  rte_pktmbuf_free_bulk(conf_.rx_pkts, n);
  return n;
}

bool WorkerLcore::HandleEvents(uint64_t now_ns) {
  bool any = false;
  for (LinkRun& lr : link_runs_) {
    DatapathEvent e;
    while (lr.link->control.events().Pop(&e)) {
      any = true;
      if (const auto* rb = std::get_if<RoundBeginEvent>(&e)) {
        ++announcements_;
        if (rb->direction == Direction::kPush) {
          lr.have_go = true;
          lr.go_round = rb->round;
          lr.go_p = rb->p;
          lr.go_critical = rb->critical;
        } else {
          lr.link->bcast->Announce(*rb, now_ns);
        }
      }
    }
  }
  return any;
}

bool WorkerLcore::PushDone(const LinkRun& lr) const {
  for (const auto& s : lr.link->push) {
    if (!s->done()) return false;
  }
  return true;
}

// This lcore's sides, then the helpers' (PushCrew).
bool WorkerLcore::PushDone() const {
  for (const LinkRun& lr : link_runs_) {
    for (const uint16_t q : lr.queues) {
      if (!lr.link->push[q]->done()) return false;
    }
  }
  return crew_gen_ == 0 || setup_.crew->Done(crew_gen_);
}

// A push given up (a failure): the helpers stop stepping their sides, which
// are then this lcore's to read.
void WorkerLcore::StopHelpers() {
  if (crew_gen_ != 0) setup_.crew->Abort(crew_gen_);
}

// Our push is done and no frame of the broadcast came: the server is
// still in the push, perhaps waiting for another worker (RoundPacer's
// patience).
bool WorkerLcore::AwaitsBroadcast() const {
  if (!PushDone()) return false;
  for (const LinkRun& lr : link_runs_) {
    if (lr.link->bcast->receiver().received() != 0) return false;
  }
  return true;
}

bool WorkerLcore::BroadcastOpen() const {
  for (const LinkRun& lr : link_runs_) {
    if (lr.link->bcast->receiver().open()) return true;
  }
  return false;
}

bool WorkerLcore::Turn(uint64_t now_ns) {
  ++conf_.poll_gen;
  for (LinkRun& lr : link_runs_) lr.arrivals = false;
  uint32_t n = 0;
  bool drained = true;
  for (const RxQueue& rxq : rx_) {
    const uint16_t k = PollBroadcast(now_ns, rxq);
    n += k;
    drained = drained && k < kRxBurst;
  }
  if (drained) drained_gen_ = conf_.poll_gen;
  bool work = n > 0;
  work |= HandleEvents(now_ns);
  for (LinkRun& lr : link_runs_) {
    const RxProgress rx{lr.arrivals, conf_.poll_gen, drained_gen_};
    work |= lr.link->bcast->Step(now_ns, rx, lr.outbox);
  }
  for (LinkRun& lr : link_runs_) {
    std::vector<std::unique_ptr<SendSide>>& push = lr.link->push;
    for (const uint16_t q : lr.queues) {
      work |= push[q]->Step(now_ns, lr.frames[q], lr.outbox);
    }
  }
  return work;
}

// Only what moves the job counts for the watchdog: chunks that set a new
// bit, first-pass frames, a BITMAP showing more delivered, STOP, a
// ROUND_BEGIN. Retransmissions into a dead link, PROBE retries and
// frames that are not the server's (a shared L2 port's ARP, TCP ACKs,
// strangers) do not, so 100% loss or a stopped server times out.
uint64_t WorkerLcore::Progress() const {
  uint64_t mark = announcements_;
  for (const LinkRun& lr : link_runs_) {
    mark += lr.link->bcast->progress();
    for (const uint16_t q : lr.queues) {
      mark += lr.link->push[q]->progress();
    }
  }
  return setup_.crew ? mark + setup_.crew->Progress() : mark;
}

template <class Done>
bool WorkerLcore::RunUntil(Done done, const char* waiting_for, uint64_t it,
                           std::string* failure) {
  const PollEnd end = PollUntil(
      *setup_.pacer, NowNs,
      [&](uint64_t now) {
        PollTurn t{Turn(now)};
        for (LinkRun& lr : link_runs_) {
          ReceiveSide& bcast = *lr.link->bcast;
          if (bcast.stopped() && bcast.receiver().open()) {
            times_.bcast_done_ns =
                std::max(times_.bcast_done_ns, bcast.stop_ns());
            bcast.Close();
          }
        }
        if (done()) {
          t.then = PollTurn::Then::kDone;
          return t;
        }
        for (const LinkRun& lr : link_runs_) {
          if (std::string e = lr.link->control.RingFailure(); !e.empty()) {
            *failure = e;
            t.then = PollTurn::Then::kFailed;
            return t;
          }
        }
        if (links_.server_gone()) {
          // The server's text, and what this worker measured itself (the
          // server cannot see our mbuf pool or our injector).
          *failure =
              links_.failure() + MeasuredHint(conf_.counters, setup_.loss);
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      [&] { return Progress(); },
      // Only a turn without progress can time out: only then is the kind
      // of wait looked at.
      [&](bool moved) -> uint32_t {
        return !moved && (waiting_for != nullptr || AwaitsBroadcast()) ? 2 : 1;
      },
      NeverResume);
  if (end == PollEnd::kDone) return true;
  StopHelpers();
  if (end == PollEnd::kQuit) *failure = "interrupted";
  if (end == PollEnd::kTimedOut) {
    *failure =
        Stalled(waiting_for, it) + MeasuredHint(conf_.counters, setup_.loss);
  }
  return false;
}

// Names the server shard and the phase that stalled (`waiting_for`: the
// push round's opening; else the push until it is done, then the
// broadcast), with what each direction delivered on that link.
std::string WorkerLcore::Stalled(const char* waiting_for, uint64_t it) const {
  const uint32_t round = PushRound(it);
  const LinkRun* stuck = &link_runs_[0];
  for (const LinkRun& lr : link_runs_) {
    const bool waiting =
        waiting_for != nullptr
            ? !(lr.have_go && lr.go_round == round)
            : !PushDone(lr) || lr.link->bcast->receiver().open();
    if (waiting) {
      stuck = &lr;
      break;
    }
  }
  const ShardLink& l = *stuck->link;
  const bool push_done = PushDone(*stuck);
  if (waiting_for == nullptr) {
    waiting_for = push_done ? "the broadcast stalled" : "the push stalled";
  }
  std::string s = "iteration " + std::to_string(it) + ": " + waiting_for +
                  ": no progress from " + l.Label() + " for " +
                  std::to_string(setup_.pacer->limit_ms()) + " ms (push ";
  if (push_done) {
    s += "done";
  } else {
    uint32_t passes = 0;
    for (const auto& side : l.push) {
      passes = std::max(passes, side->sender().passes());
    }
    s += "pending after " + std::to_string(passes) + " passes";
  }
  s += ", broadcast " + std::to_string(l.bcast->receiver().received()) + "/" +
       std::to_string(l.layout.num_chunks()) +
       " chunks); check that the server runs and that frames pass both "
       "ways (--loss, the link), or raise --round_timeout_ms";
  return s;
}

bool WorkerLcore::AwaitPushRound(uint64_t it, std::string* failure) {
  // Until its ROUND_BEGIN announces the broadcast's p, the receiver may
  // only STOP on a complete buffer (p = 0), which satisfies any p.
  const uint64_t now = NowNs();
  for (LinkRun& lr : link_runs_) {
    lr.link->bcast->Begin(BroadcastRound(it), 0.0, 0, 0, now);
  }
  times_ = WorkerIterationTimes{};
  const uint32_t round = PushRound(it);
  return RunUntil(
      [&] {
        for (const LinkRun& lr : link_runs_) {
          if (!lr.have_go || lr.go_round != round) return false;
        }
        return true;
      },
      "the server never opened the push round", it, failure);
}

bool WorkerLcore::Exchange(uint64_t it, std::string* failure) {
  // One phase for the whole job: every server shard announces the same p.
  // Shards that disagree (a shard run with other job flags) are named
  // rather than pushed to under two policies.
  times_.announced_p = link_runs_[0].go_p;
  times_.critical = link_runs_[0].go_critical;
  for (size_t k = 1; k < link_runs_.size(); ++k) {
    if (link_runs_[k].go_p != link_runs_[0].go_p ||
        link_runs_[k].go_critical != link_runs_[0].go_critical) {
      *failure =
          "iteration " + std::to_string(it) + ": server shard " +
          std::to_string(k) +
          " opened the push under p=" + std::to_string(link_runs_[k].go_p) +
          ", server shard 0 under p=" + std::to_string(link_runs_[0].go_p) +
          ": the shards' phase is not one (restart the job with the "
          "same job flags on every shard)";
      return false;
    }
  }
  times_.push_begin_ns = NowNs();
  for (LinkRun& lr : link_runs_) {
    ShardLink& l = *lr.link;
    for (uint16_t q = 0; q < l.push.size(); ++q) {
      lr.lanes.Filter(l.order, q, lane_order_);
      l.push[q]->Begin(PushRound(it), lane_order_, times_.push_begin_ns,
                       l.layout.num_chunks());
    }
  }
  // Every side is open: the helpers step theirs from here on.
  crew_gen_ = setup_.crew ? setup_.crew->Go() : 0;
  bool ok = RunUntil([&] { return PushDone() && !BroadcastOpen(); }, nullptr,
                     it, failure);
  // --tx_payload=extbuf: no frame may still point into the gradient when
  // the trainer gets it back (the helpers are done sending by now).
  for (LinkRun& lr : link_runs_) {
    for (ChunkTransmitter& tx : lr.link->tx) {
      if (ok && !tx.DrainExtbuf()) {
        *failure = "iteration " + std::to_string(it) + ": " +
                   std::to_string(tx.extbuf_in_flight()) +
                   " push frames of TX queue " + std::to_string(tx.queue) +
                   " still not freed by the port 100 ms after the round "
                   "(--tx_payload=extbuf); use --tx_payload=copy";
        ok = false;
      }
    }
  }
  times_.push_done_ns = 0;
  for (const LinkRun& lr : link_runs_) {
    for (const auto& s : lr.link->push) {
      times_.push_done_ns = std::max(times_.push_done_ns, s->done_ns());
    }
  }
  return ok;
}

}  // namespace dblp
