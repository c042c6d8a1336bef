#include "server/server_lcore.h"

#include <rte_pause.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <variant>

#include "dblp/base/log.h"
#include "dblp/base/poll_loop.h"
#include "dblp/job/diagnosis.h"
#include "runtime/eal_app.h"

namespace dblp {

// ---- JobSync ----------------------------------------------------------------

bool JobSync::Barrier() {
  if (lcores_ == 1) return !failed();
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == lcores_) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.store(gen + 1, std::memory_order_release);
    return !failed();
  }
  IdleBackoff backoff(256, 50);
  while (generation_.load(std::memory_order_acquire) == gen) {
    if (failed()) return false;
    if (quit_->load(std::memory_order_relaxed)) {
      Fail("interrupted");
      return false;
    }
    backoff.Idle();
  }
  return !failed();
}

void JobSync::Fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (failed_.load()) return;
  failure_ = why;
  failed_.store(true, std::memory_order_release);
}

std::string JobSync::failure() {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

// ---- dblp-server ------------------------------------------------------------

namespace {
// Frames ahead of the one being processed whose headers are prefetched.
constexpr uint16_t kRxPrefetchAhead = 4;
// Accepted chunks ahead of the one being summed whose sum slices are
// prefetched (a slice is 23 lines at MTU 1500: more would overrun the
// line fill buffers).
constexpr uint16_t kSumPrefetchAhead = 2;
}  // namespace

ServerLcore::ServerLcore(LcoreConf& conf, ServerControl& control, JobSync& sync,
                         std::vector<std::unique_ptr<WorkerState>>& workers,
                         std::vector<ServerLink*> links, RoundPacer& pacer,
                         const Setup& setup)
    : conf_(conf),
      control_(control),
      sync_(sync),
      job_(*setup.job),
      workers_(workers),
      links_(std::move(links)),
      pacer_(pacer),
      setup_(setup),
      outbox_(control.outbox()),
      drained_gen_(setup.nb_ports, 0) {
  tx_.queue = conf.lane;
  tx_.pool = setup.pool;
  tx_.counters = &conf.counters;
  tx_.prefetch = setup.prefetch;
  for (ServerLink* l : links_) {
    rx_workers_.push_back(
        PushRxWorker{&l->push.receiver(), &l->worker.source, &l->expect});
  }
  staged_.resize(setup.handoff.size());
  staged_n_.assign(setup.handoff.size(), 0);
  // The return path from the JOIN when it says all of it (one port, the
  // worker's MAC), never from a frame. With several ports, or a worker
  // behind a router, the port and next hop come from the first frame that
  // passed the worker's own tag and pin (docs/SECURITY.md).
  if (setup.nb_ports != 1) return;
  for (uint32_t w = 0; w < links_.size(); ++w) {
    ServerLink& l = *links_[w];
    if (!rte_is_zero_ether_addr(&l.worker.source.mac)) {
      Learn(l, 0, static_cast<uint16_t>(w), l.worker.source.mac);
    }
  }
}

// A burst in two stages, in arrival order: each frame's L2-L4, loss,
// sender, pin and the worker's receiver (round, range, tag, bitmap), on
// the expected-frame path where the frame matches its worker's last one
// (push_rx.h); then the sums, with the sum slices of the next chunks
// prefetched while one is added. A chunk's copies are summed in the order
// its workers' frames arrived, as one frame at a time did.
void ServerLcore::ReceiveBurst(uint16_t port, rte_mbuf** pkts, uint16_t n,
                               uint64_t now_ns) {
  const bool prefetch = setup_.prefetch;
  if (prefetch) {
    for (uint16_t j = 0; j < std::min<uint16_t>(n, kRxPrefetchAhead); ++j) {
      rte_prefetch0(rte_pktmbuf_mtod(pkts[j], const void*));
    }
  }
  PushRxBurst b;
  b.workers = rx_workers_.data();
  b.num_workers = static_cast<uint32_t>(rx_workers_.size());
  b.alive = job_.alive_flags();
  // Lcore k's range arrives on udp_port + k (steering.h).
  b.port_lo = setup_.udp_port;
  b.port_hi =
      static_cast<uint16_t>(setup_.udp_port + setup_.lanes->count() - 1);
  b.loss = setup_.loss;
  b.now_ns = now_ns;
  b.ctr = &conf_.counters;
  PushRxChunk accepted[kRxBurst];
  PushRxChunk* out = accepted;
  // Frames below this one prefetch the header kRxPrefetchAhead ahead.
  const size_t ahead_end =
      prefetch && n > kRxPrefetchAhead ? n - kRxPrefetchAhead : 0;
  for (size_t i = 0; i < n; ++i) {
    if (i < ahead_end) {
      rte_prefetch0(rte_pktmbuf_mtod(pkts[i + kRxPrefetchAhead], const void*));
    }
    const PushRxTaken taken = PushRxFrame(pkts[i], b, out);
    // A worker's first accepted frame here is a full-path one.
    if (taken == kRxFull) [[unlikely]]
      LearnFrom(port, pkts[i], out->w);
    out += taken != kRxRefused;
  }
  b.Flush();
  // Summed into the mean, or refused (counted in the worker's tally) by
  // the reducer's check: the frame is accepted either way, so a lying
  // worker's chunk is not asked for again.
  job_.iteration().reducer().AccumulateBurst(
      accepted, static_cast<uint32_t>(out - accepted), conf_.lane,
      prefetch ? kSumPrefetchAhead : 0);
}

// Worker w's frame `m` was accepted on `port` by the full path: if it is
// the worker's first here, it gives the lcore (and the job, if no lcore
// did yet) the worker's return path.
void ServerLcore::LearnFrom(uint16_t port, const rte_mbuf* m, uint16_t w) {
  ServerLink& l = *links_[w];
  if (l.learned) return;
  const auto* eth = rte_pktmbuf_mtod(m, const rte_ether_hdr*);
  Learn(l, port, w, eth->src_addr);
  WorkerState& ws = *workers_[w];
  if (!ws.return_claimed.exchange(true, std::memory_order_relaxed)) {
    ws.return_port = port;
    ws.return_mac = eth->src_addr;
    ws.return_ready.store(true, std::memory_order_release);
  }
}

// The broadcast goes back to the worker's pinned address, on the port its
// authenticated frames arrive on; to the MAC they came from if the worker
// pinned none (a router between us).
void ServerLcore::Learn(ServerLink& l, uint16_t port, uint16_t rank,
                        const rte_ether_addr& next_hop) {
  l.learned = true;
  l.port = port;
  const auto worker_port = static_cast<uint16_t>(setup_.udp_port + 1 + rank);
  const PortCaps& caps = (*setup_.caps)[port];
  const Endpoint local{caps.mac, setup_.local_ip, worker_port};
  Endpoint peer = l.worker.source;
  if (rte_is_zero_ether_addr(&peer.mac)) peer.mac = next_hop;
  l.tmpl.Retarget(local, peer, caps);  // keeps the authenticator
}

// Before a broadcast: a link whose lane saw none of its worker's frames
// takes the return path another lcore learned. False (the job fails) if
// no lcore ever accepted a frame from a live worker.
bool ServerLcore::AdoptReturnPaths() {
  for (uint32_t w = 0; w < links_.size(); ++w) {
    ServerLink& l = *links_[w];
    const WorkerState& ws = *workers_[w];
    if (l.learned || !job_.alive(w)) continue;
    if (!ws.return_ready.load(std::memory_order_acquire)) {
      sync_.Fail(WorkerLabel(w, control_.worker_name(w)) +
                 " sent no frame the server accepted, so its return "
                 "address is unknown; check that its frames reach the "
                 "server's port (--p below 1)");
      return false;
    }
    Learn(l, ws.return_port, static_cast<uint16_t>(w), ws.return_mac);
  }
  return true;
}

// Under RSS steering a queue also gets frames of other lcores' ranges.
// Each goes to its owner through the owner's handoff ring rather than
// being dropped: RSS hashes a flow (a worker's address and the lcore's
// port) to one queue, so a dropped frame's resend would land on the same
// wrong queue and the round would never complete. Only the owner may set
// its bitmap words and add into its sum slice. Returns how many of `pkts`
// stay here (compacted in place); the rest are handed over or, when the
// owner's ring is full, dropped (the sender resends, counted).
uint16_t ServerLcore::HandOver(uint16_t port, rte_mbuf** pkts, uint16_t n) {
  const ChunkRanges& lanes = *setup_.lanes;
  const auto port_hi =
      static_cast<uint16_t>(setup_.udp_port + lanes.count() - 1);
  uint16_t keep = 0;
  bool any = false;
  for (uint16_t i = 0; i < n; ++i) {
    const uint32_t seq = PeekPushSeq(pkts[i], setup_.udp_port, port_hi);
    const uint32_t owner =
        seq < lanes.num_chunks() ? lanes.RangeOf(seq) : conf_.lane;
    if (owner == conf_.lane) {
      pkts[keep++] = pkts[i];
      continue;
    }
    pkts[i]->port = port;  // the owner learns return paths from it
    staged_[owner][staged_n_[owner]++] = pkts[i];
    any = true;
  }
  if (!any) return keep;
  for (uint32_t j = 0; j < staged_.size(); ++j) {
    const uint16_t m = staged_n_[j];
    if (m == 0) continue;
    staged_n_[j] = 0;
    const unsigned in = rte_ring_enqueue_burst(
        setup_.handoff[j], reinterpret_cast<void**>(staged_[j].data()), m,
        nullptr);
    DatapathCounters::Add(conf_.counters.misrouted, m);
    if (in < m) {
      DatapathCounters::Add(conf_.counters.handoff_full, m - in);
      rte_pktmbuf_free_bulk(staged_[j].data() + in, m - in);
    }
  }
  return keep;
}

// The frames other lcores handed to us, in runs of one port. True when
// the ring came back short (nothing more was waiting).
bool ServerLcore::TakeHandedOver(uint64_t now_ns, uint32_t* total) {
  const unsigned n = rte_ring_dequeue_burst(setup_.handoff[conf_.lane],
                                            reinterpret_cast<void**>(handed_),
                                            kRxBurst, nullptr);
  for (unsigned i = 0; i < n;) {
    unsigned j = i + 1;
    while (j < n && handed_[j]->port == handed_[i]->port) ++j;
    ReceiveBurst(handed_[i]->port, handed_ + i, static_cast<uint16_t>(j - i),
                 now_ns);
    i = j;
  }
  if (n != 0) rte_pktmbuf_free_bulk(handed_, n);
  *total += n;
  return n < kRxBurst;
}

uint32_t ServerLcore::PollPushes(uint64_t now_ns) {
  uint32_t total = 0;
  ++conf_.poll_gen;
  const bool handoff = !setup_.handoff.empty();
  // A PROBE is answered after a poll that found both our queue and our
  // handoff ring short (frames still on another lcore's queue may be
  // reported missing and resent: duplicates, never a loss).
  const bool ring_drained = !handoff || TakeHandedOver(now_ns, &total);
  for (uint16_t p = 0; p < setup_.nb_ports; ++p) {
    const uint16_t n = PollRx(p, conf_.lane, conf_.rx_pkts, kRxBurst);
    if (n < kRxBurst && ring_drained) drained_gen_[p] = conf_.poll_gen;
    if (n == 0) continue;
    total += n;
    DatapathCounters::Add(conf_.counters.rx_frames, n);
    const uint16_t mine = handoff ? HandOver(p, conf_.rx_pkts, n) : n;
    ReceiveBurst(p, conf_.rx_pkts, mine, now_ns);
    rte_pktmbuf_free_bulk(conf_.rx_pkts, mine);
  }
  return total;
}

// Until a worker's port is known, any port may hold its frames.
uint64_t ServerLcore::DrainedFor(const ServerLink& l) const {
  if (l.learned) return drained_gen_[l.port];
  return *std::min_element(drained_gen_.begin(), drained_gen_.end());
}

// Worker w is gone: the job fails, or goes on without it (the job's
// decision, --on_worker_loss).
bool ServerLcore::LoseWorker(uint32_t w, const std::string& failure) {
  if (!job_.alive(w)) control_.MarkLost(w);  // no more ROUND_BEGIN to it
  if (failure.empty()) return true;
  sync_.Fail(failure);
  return false;
}

// Lcore 0 only: BYE and lost connections.
bool ServerLcore::HandleEvents() {
  if (control_.failed()) {
    sync_.Fail(control_.failure());
    return false;
  }
  if (std::string e = control_.RingFailure(); !e.empty()) {
    sync_.Fail(e);
    return false;
  }
  DatapathEvent e;
  while (control_.events().Pop(&e)) {
    ++departures_;  // only BYE and lost connections come here
    const std::string failure = job_.OnEvent(e, iteration_, [&](uint32_t w) {
      std::string why = control_.worker_error(w);
      return ServerJob::GoneReason{!why.empty(), std::move(why)};
    });
    if (const auto* gone = std::get_if<PeerGoneEvent>(&e);
        gone != nullptr && gone->peer < workers_.size() &&
        !LoseWorker(gone->peer, failure)) {
      return false;
    }
  }
  return true;
}

bool ServerLcore::Turn(uint64_t now_ns, bool broadcasting) {
  bool work = PollPushes(now_ns) > 0;
  for (ServerLink* l : links_) {
    // Frames accepted since the last turn: the receiver's own count.
    const uint64_t accepted =
        l->push.receiver().verdict_count(Verdict::kAccepted);
    const RxProgress rx{accepted != l->accepted_seen, conf_.poll_gen,
                        DrainedFor(*l)};
    l->accepted_seen = accepted;
    work |= l->push.Step(now_ns, rx, outbox_);
  }
  if (!broadcasting) return work;
  const uint32_t W = static_cast<uint32_t>(links_.size());
  for (uint32_t i = 0; i < W; ++i) {
    const uint32_t w = (rr_ + i) % W;
    ServerLink& l = *links_[w];
    if (!job_.alive(w)) continue;
    tx_.port = l.port;
    tx_.pacer = &(*setup_.link_rate)[l.port];
    tx_.wire_frame_bytes = WireBytesPerFrame((*setup_.caps)[l.port].mtu);
    BcastFrames frames{&tx_,
                       &l.tmpl,
                       setup_.mean,
                       setup_.layout,
                       setup_.bcast_frames,
                       setup_.mean_iova};
    work |= l.bcast.Step(now_ns, frames, outbox_);
  }
  rr_ = (rr_ + 1) % W;
  return work;
}

// Why the round stalled: what each worker delivered of the push, or which
// broadcasts of this lcore's lane are not done.
std::string ServerLcore::Stalled(bool broadcasting) const {
  const uint32_t timeout = pacer_.timeout_ms();
  if (broadcasting) {
    return job_.BroadcastStalled(iteration_, timeout, [&](uint32_t w) {
      return links_[w]->bcast.done();
    }) + MeasuredHint(conf_.counters, nullptr);
  }
  const uint32_t round = PushRound(iteration_);
  const uint64_t injected =
      setup_.loss ? setup_.loss->dropped() - injected_at_start_ : 0;
  return job_.PushStalled(
             iteration_, timeout,
             [&](uint32_t w) { return workers_[w]->push_stop.Received(round); },
             injected) +
         MeasuredHint(conf_.counters, nullptr);
}

// What moves the job on this lcore (WorkerLcore::Progress): new chunks of
// a push, first-pass broadcast frames, BITMAPs showing more delivered,
// STOPs, BYEs and lost workers; never a frame that sets no new bit.
uint64_t ServerLcore::Progress() const {
  uint64_t mark = departures_;
  for (const ServerLink* l : links_) {
    mark += l->push.progress() + l->bcast.progress();
  }
  return mark;
}

template <class Done>
bool ServerLcore::RunRound(uint64_t it, bool broadcasting, Done done) {
  iteration_ = it;
  injected_at_start_ = setup_.loss ? setup_.loss->dropped() : 0;
  std::string failure;
  const PollEnd end = PollUntil(
      pacer_, NowNs,
      [&](uint64_t now) {
        PollTurn t{Turn(now, broadcasting)};
        if ((conf_.lane == 0 && !HandleEvents()) || sync_.failed()) {
          t.then = PollTurn::Then::kFailed;
        } else if (done()) {
          t.then = PollTurn::Then::kDone;
        } else if (conf_.lane == 0 && !broadcasting &&
                   FinishedEarly(iteration_)) {
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      [&] { return Progress(); }, OneTimeout,
      [&](uint64_t) {
        // --on_worker_loss=continue: the workers this round still waits
        // for while the others are done are lost, and it goes on.
        failure = LoseSilent(broadcasting);
        injected_at_start_ = setup_.loss ? setup_.loss->dropped() : 0;
        return failure.empty();
      });
  switch (end) {
    case PollEnd::kDone:
      return true;
    case PollEnd::kFailed:  // the turn's failure is in sync_ already
      return false;
    case PollEnd::kQuit:
      sync_.Fail("interrupted");
      return false;
    case PollEnd::kTimedOut:
      sync_.Fail(failure);
      return false;
  }
  return false;
}

std::string ServerLcore::LoseSilent(bool broadcasting) {
  const uint32_t round = PushRound(iteration_);
  std::vector<uint32_t> dropped;
  const std::string failure = job_.LoseSilent(
      iteration_, broadcasting, pacer_.timeout_ms(),
      [&](uint32_t w) {
        return broadcasting ? !links_[w]->bcast.done()
                            : !workers_[w]->push_stop.taken(round);
      },
      Stalled(broadcasting), &dropped);
  for (const uint32_t w : dropped) {
    LoseWorker(w, "");  // no more ROUND_BEGIN to it
    outbox_.Post(DropRequest{static_cast<uint16_t>(w)});
    ++departures_;
  }
  return failure;
}

// A worker that finished while another already pushes this round ran
// fewer --iterations. True if the job ends.
bool ServerLcore::FinishedEarly(uint64_t it) {
  const uint32_t round = PushRound(it);
  const uint32_t live = job_.live_count();
  const std::string failure = job_.FinishedEarly(
      it, [&](uint32_t w) { return workers_[w]->push_stop.Received(round); },
      [&](uint32_t w) { return workers_[w]->push_stop.taken(round); });
  if (job_.live_count() != live) {  // the job went on without someone
    for (uint32_t w = 0; w < workers_.size(); ++w) LoseWorker(w, "");
  }
  if (failure.empty()) return false;
  sync_.Fail(failure);
  return true;
}

void ServerLcore::OpenPushSides(uint64_t /*it*/, const PushOpening& open) {
  const uint64_t now = NowNs();
  for (ServerLink* l : links_) {
    l->push.Begin(open.announce.round, open.announce.p, 0, 0, now);
    // Counted from the push's first chunk (ServerJob's PushOpening).
    l->push.DeadlineAfterFirstChunk(open.deadline_after_first_ns,
                                    open.announce.min_fraction);
  }
}

// This lane's slice of each worker's first pass, in the job's order.
bool ServerLcore::BeginBroadcastSides(uint64_t it) {
  if (!AdoptReturnPaths()) return false;
  const uint32_t round = BroadcastRound(it);
  const uint32_t n = setup_.layout->num_chunks();
  const uint64_t now = NowNs();
  std::vector<uint32_t> full;
  for (uint32_t w = 0; w < links_.size(); ++w) {
    ServerLink& l = *links_[w];
    job_.BroadcastOrder(w, it, n, &full);
    setup_.lanes->Filter(full, conf_.lane, l.order_buf);
    l.bcast.Begin(round, l.order_buf, now, n);
  }
  return true;
}

void ServerLcore::Run() {
  ServeIterations(*this, sync_, *setup_.coordinator, conf_.lane == 0);
}

// Lcore k's link to worker w: lane k of w's pushes and broadcasts.
LinkGrid BuildLinkGrid(uint32_t session, const ChunkLayout& layout,
                       const ChunkRanges& lanes, uint32_t burst,
                       std::vector<std::unique_ptr<WorkerState>>& workers) {
  LinkGrid links(lanes.count());
  for (uint16_t k = 0; k < lanes.count(); ++k) {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      const FrameKey& key = workers[w]->frame_key;
      const ReceiverConfig rc{.session = session,
                              .expected_type = FrameType::kPush,
                              .expected_sender = static_cast<int32_t>(w),
                              .layout = layout,
                              .seq_begin = lanes.begin(k),
                              .seq_end = lanes.end(k),
                              .frame_key = key};
      const SendSideConfig sc{.type = FrameType::kBroadcast,
                              .session = session,
                              .sender_rank = kServerRank,
                              .peer = static_cast<uint16_t>(w),
                              .direction = Direction::kBroadcast,
                              .burst = burst,
                              .lane = k};
      links[k].push_back(std::make_unique<ServerLink>(
          ReceiveSideConfig{.receiver = rc,
                            .direction = Direction::kPush,
                            .peer = static_cast<uint16_t>(w),
                            .group = &workers[w]->push_stop,
                            .lane = k},
          sc, *workers[w]));
      // Its libcrypto context now, not on the lcore at the first frame.
      links[k][w]->tmpl.set_auth(key);
      workers[w]->push_stop.Add(&links[k][w]->push.receiver());
    }
  }
  return links;
}

HandoffRings::HandoffRings(uint16_t lcores, int socket) {
  for (uint16_t k = 0; k < lcores; ++k) {
    const std::string name = "dblp_handoff_" + std::to_string(k);
    rte_ring* r =
        rte_ring_create(name.c_str(), kHandoffRingSize, socket, RING_F_SC_DEQ);
    if (r == nullptr) {
      Die("cannot create ring " + name + ": " + rte_strerror(rte_errno),
          "give the EAL more memory (-m) or check --file-prefix clashes");
    }
    rings_.push_back(r);
  }
}

HandoffRings::~HandoffRings() {
  for (rte_ring* r : rings_) {
    void* m = nullptr;
    while (rte_ring_dequeue(r, &m) == 0) {
      rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    }
    rte_ring_free(r);
  }
}

}  // namespace dblp
