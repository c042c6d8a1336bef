#include "dblp/memory_cluster.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

#include "dblp/clr_detector.h"
#include "dblp/control.h"
#include "dblp/loopback_transport.h"
#include "dblp/receiver_round.h"
#include "dblp/sender_round.h"
#include "dblp/wire.h"

namespace dblp {

namespace {

constexpr uint32_t kServerEndpoint = 0;
constexpr uint32_t WorkerEndpoint(uint32_t rank) { return rank + 1; }

// A control message on its way over the (modelled) TCP connection.
struct Envelope {
  double at_ns;
  std::vector<uint8_t> bytes;
};

// One direction of one TCP connection: in order, constant delay, and read
// by the far side's decoder in two pieces (as a socket read may split it).
struct ControlPipe {
  std::deque<Envelope> queue;
  ControlDecoder decoder;
};

StopReason ToWire(StopTrigger t) {
  return t == StopTrigger::kDeadline ? StopReason::kDeadline
                                     : StopReason::kThreshold;
}

}  // namespace

struct MemoryCluster::Impl {
  struct Worker {
    explicit Worker(const ReceiverConfig& rc, SendOrder o)
        : bcast_rx(rc), order(o) {}
    SenderRound push_tx;
    ReceiverRound bcast_rx;
    SendOrder order;
    std::vector<uint32_t> order_buf;
    ControlPipe to_worker;  // server -> this worker
    ControlPipe to_server;  // this worker -> server
    bool probe_outstanding = false;
    bool push_done = false;
    double push_done_ns = 0;
    bool bcast_done = false;
    double bcast_done_ns = 0;
    std::vector<float> average, previous_average;
    std::vector<Packet> replay;  // frames kept to replay as stale later
    Bitmap bcast_arrived;
  };
  struct ServerLink {  // the server's state for one worker
    explicit ServerLink(const ReceiverConfig& rc, SendOrder o)
        : push_rx(rc), order(o) {}
    ReceiverRound push_rx;
    SenderRound bcast_tx;
    SendOrder order;
    std::vector<uint32_t> order_buf;
    bool probe_outstanding = false;
    Bitmap push_arrived;
  };

  // Runs before any member is built, so a bad config gets this message
  // rather than one from deep inside a member's constructor.
  static const ClusterConfig& Validated(const ClusterConfig& c) {
    if (c.num_workers == 0 || c.num_workers >= kServerRank) {
      throw std::invalid_argument("in-memory cluster: need 1.." +
                                  std::to_string(kServerRank - 1) + " workers");
    }
    if (c.burst == 0) {
      throw std::invalid_argument("in-memory cluster: burst must be >= 1");
    }
    return c;
  }

  explicit Impl(const ClusterConfig& c)
      : cfg(Validated(c)),
        layout(ChunkLayout::ForMtu(c.gradient_floats * sizeof(float), c.mtu)),
        fabric(c.num_workers + 1, c.ring_size),
        policy(TolerancePolicy::Create(c.policy)),
        reducer(layout, c.num_workers),
        bcast_loss(c.bcast_loss,
                   c.bursts_on_broadcast ? c.bursts : BurstSchedule{},
                   HashMix(c.seed, 0xB0)),
        round(c.first_round) {
    mean.assign(c.gradient_floats, 0.0f);
    fabric.port(kServerEndpoint).set_loss(&bcast_loss);
    for (uint32_t w = 0; w < c.num_workers; ++w) {
      push_loss.emplace_back(std::make_unique<LossInjector>(
          c.push_loss, c.bursts, HashMix(c.seed, 0x100 + w)));
      fabric.port(WorkerEndpoint(w)).set_loss(push_loss.back().get());

      ReceiverConfig bcast_rc{c.session, FrameType::kBroadcast, kServerRank,
                              layout};
      workers.emplace_back(std::make_unique<Worker>(
          bcast_rc, SendOrder(c.send_order, w, c.num_workers, c.seed)));
      Worker& wk = *workers.back();
      wk.average.assign(c.gradient_floats, 0.0f);
      wk.previous_average.assign(c.gradient_floats, 0.0f);

      ReceiverConfig push_rc{c.session, FrameType::kPush,
                             static_cast<int32_t>(w), layout};
      // The broadcast order is per worker too, so the workers' losses of
      // the mean fall on different chunks.
      links.emplace_back(std::make_unique<ServerLink>(
          push_rc, SendOrder(c.send_order, w, c.num_workers,
                             HashMix(c.seed, 0xBC))));
    }
  }

  // ---- control plane -------------------------------------------------------
  void Send(ControlPipe& pipe, const ControlMessage& m) {
    Envelope e{now + cfg.control_one_way_ns, {}};
    EncodeControl(m, e.bytes);
    pipe.queue.push_back(std::move(e));
    ++control_messages;
  }

  // Feeds every message due by now into its decoder and returns the decoded
  // messages through `handle`.
  template <class Handler>
  void Deliver(ControlPipe& pipe, Handler&& handle) {
    while (!pipe.queue.empty() && pipe.queue.front().at_ns <= now) {
      const std::vector<uint8_t>& b = pipe.queue.front().bytes;
      const size_t half = b.size() / 2;
      pipe.decoder.Feed(b.data(), half);
      pipe.decoder.Feed(b.data() + half, b.size() - half);
      pipe.queue.pop_front();
      ControlMessage m;
      ControlDecoder::Status s;
      while ((s = pipe.decoder.Next(m)) == ControlDecoder::Status::kMessage) {
        handle(m);
      }
      if (s == ControlDecoder::Status::kError) {
        throw std::logic_error("in-memory control stream corrupt: " +
                               pipe.decoder.error_text());
      }
    }
  }

  static Bitmap ToBitmap(const BitmapMsg& b) {
    Bitmap out(b.num_bits);
    if (!out.AssignWords(b.words)) {
      throw std::logic_error("in-memory cluster: BITMAP of the wrong size");
    }
    return out;
  }

  void WorkerHandles(uint32_t w, const ControlMessage& m) {
    Worker& wk = *workers[w];
    if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
      if (rb->direction == Direction::kBroadcast &&
          rb->round == wk.bcast_rx.round()) {
        // The p that counts is the one announced now, not the one the
        // receiver was opened with.
        wk.bcast_rx.SetTolerance(rb->p);
        wk.bcast_rx.SetDeadline(
            rb->deadline_ns ? bcast_start_ns + rb->deadline_ns : 0,
            rb->min_fraction);
      }
    } else if (const auto* st = std::get_if<StopMsg>(&m)) {
      if (st->direction == Direction::kPush &&
          st->round == wk.push_tx.round() && !wk.push_done) {
        wk.push_tx.RequestStop(st->round);
        wk.push_done = true;
        wk.push_done_ns = now;
      }
    } else if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
      if (bm->direction == Direction::kPush &&
          bm->round == wk.push_tx.round()) {
        wk.probe_outstanding = false;
        wk.push_tx.OnBitmap(ToBitmap(*bm));
      }
    } else if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
      if (pr->direction == Direction::kBroadcast &&
          pr->round == wk.bcast_rx.round()) {
        Bitmap snap;
        wk.bcast_rx.SnapshotBitmap(snap);
        Send(wk.to_server, BitmapMsg{pr->round, Direction::kBroadcast,
                                     snap.size(),
                                     {snap.words().begin(), snap.words().end()}});
      }
    }
  }

  void ServerHandles(uint32_t w, const ControlMessage& m) {
    ServerLink& ln = *links[w];
    if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
      if (pr->direction == Direction::kPush &&
          pr->round == ln.push_rx.round()) {
        Bitmap snap;
        ln.push_rx.SnapshotBitmap(snap);
        Send(workers[w]->to_worker,
             BitmapMsg{pr->round, Direction::kPush, snap.size(),
                       {snap.words().begin(), snap.words().end()}});
      }
    } else if (const auto* st = std::get_if<StopMsg>(&m)) {
      if (st->direction == Direction::kBroadcast &&
          st->round == ln.bcast_tx.round()) {
        ln.bcast_tx.RequestStop(st->round);
      }
    } else if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
      if (bm->direction == Direction::kBroadcast &&
          bm->round == ln.bcast_tx.round()) {
        ln.probe_outstanding = false;
        ln.bcast_tx.OnBitmap(ToBitmap(*bm));
      }
    }
  }

  void DeliverAll() {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      Deliver(workers[w]->to_worker,
              [&](const ControlMessage& m) { WorkerHandles(w, m); });
      Deliver(workers[w]->to_server,
              [&](const ControlMessage& m) { ServerHandles(w, m); });
    }
  }

  double NextControlTime() const {
    double t = std::numeric_limits<double>::infinity();
    for (const auto& wk : workers) {
      if (!wk->to_worker.queue.empty()) {
        t = std::min(t, wk->to_worker.queue.front().at_ns);
      }
      if (!wk->to_server.queue.empty()) {
        t = std::min(t, wk->to_server.queue.front().at_ns);
      }
    }
    return t;
  }

  // ---- data plane ----------------------------------------------------------
  // Sends one burst of `tx` from `port` to `dst`, payload from `buf`.
  // Returns the frames sent; `keep` (optional) receives copies for replay.
  uint32_t SendBurst(SenderRound& tx, LoopbackPort& port, uint32_t dst,
                     FrameType type, uint16_t rank, const float* buf,
                     std::vector<Packet>* keep) {
    seq_buf.resize(cfg.burst);
    const uint32_t k = tx.NextBurst(seq_buf.data(), cfg.burst);
    if (k == 0) return 0;
    pkt_buf.resize(k);
    const auto* bytes = reinterpret_cast<const uint8_t*>(buf);
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t seq = seq_buf[i];
      DataHeader h{type, cfg.session, rank,
                   static_cast<uint16_t>(layout.Length(seq)), tx.round(), seq};
      Packet& p = pkt_buf[i];
      p.dst = dst;
      p.bytes.resize(kDataHeaderBytes + h.payload_len);
      BuildDataFrame(h, bytes + layout.Offset(seq), p.bytes.data());
      if (keep != nullptr && keep->size() < cfg.stale_replay) {
        keep->push_back(p);
      }
    }
    port.TxBurst(pkt_buf.data(), static_cast<uint16_t>(k));
    now += k * cfg.ns_per_frame;
    return k;
  }

  // Server RX: every pending frame to the owning worker's push receiver.
  void ServerReceive() {
    LoopbackPort& port = fabric.port(kServerEndpoint);
    rx_buf.resize(cfg.burst);
    uint16_t k;
    while ((k = port.RxBurst(rx_buf.data(),
                             static_cast<uint16_t>(rx_buf.size()))) > 0) {
      for (uint16_t i = 0; i < k; ++i) {
        const Packet& p = rx_buf[i];
        // The source endpoint plays the role of the UDP source port.
        if (p.src == kServerEndpoint || p.src > workers.size()) {
          ++unknown_source;
          continue;
        }
        ServerLink& ln = *links[p.src - 1];
        DataHeader h;
        const uint8_t* payload = nullptr;
        if (ln.push_rx.OnFrame(p.bytes.data(), p.bytes.size(), &h, &payload) ==
            Verdict::kAccepted) {
          reducer.Accumulate(h.seq, payload);
        }
      }
    }
    for (uint32_t w = 0; w < links.size(); ++w) {
      ReceiverRound& rx = links[w]->push_rx;
      const StopTrigger t = rx.PollStop(static_cast<uint64_t>(now));
      if (t != StopTrigger::kNone) {
        ++stops_sent;
        Send(workers[w]->to_worker, StopMsg{rx.round(), Direction::kPush,
                                            rx.received(), ToWire(t)});
      }
    }
  }

  void WorkerReceive(uint32_t w) {
    Worker& wk = *workers[w];
    LoopbackPort& port = fabric.port(WorkerEndpoint(w));
    rx_buf.resize(cfg.burst);
    uint16_t k;
    auto* avg = reinterpret_cast<uint8_t*>(wk.average.data());
    while ((k = port.RxBurst(rx_buf.data(),
                             static_cast<uint16_t>(rx_buf.size()))) > 0) {
      for (uint16_t i = 0; i < k; ++i) {
        const Packet& p = rx_buf[i];
        DataHeader h;
        const uint8_t* payload = nullptr;
        if (wk.bcast_rx.OnFrame(p.bytes.data(), p.bytes.size(), &h,
                                &payload) == Verdict::kAccepted) {
          std::memcpy(avg + layout.Offset(h.seq), payload, h.payload_len);
        }
      }
    }
    const StopTrigger t = wk.bcast_rx.PollStop(static_cast<uint64_t>(now));
    if (t != StopTrigger::kNone) {
      ++stops_sent;
      wk.bcast_done = true;
      wk.bcast_done_ns = now;
      Send(wk.to_server, StopMsg{wk.bcast_rx.round(), Direction::kBroadcast,
                                 wk.bcast_rx.received(), ToWire(t)});
    }
  }

  // Replays frames of an earlier round and hostile input at the server.
  void InjectStale() {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (Packet& p : workers[w]->replay) {
        p.src = WorkerEndpoint(w);
        fabric.Inject(kServerEndpoint, std::move(p));
      }
      workers[w]->replay.clear();
    }
  }

  // Advances the clock to the next event when nobody could send: a control
  // message landing or a deadline that has not passed yet.
  void WaitForEvent(double deadline_event) {
    double t = NextControlTime();
    if (deadline_event > now) t = std::min(t, deadline_event);
    if (!std::isfinite(t)) {
      throw std::logic_error(
          "in-memory cluster stalled: no frame to send and no message in "
          "flight (a protocol bug)");
    }
    now = std::max(now, t);
  }

  IterationOutcome Run(std::span<const std::vector<float>> grads) {
    const uint32_t W = static_cast<uint32_t>(workers.size());
    if (grads.size() != W) {
      throw std::invalid_argument("RunIteration: need one gradient per worker");
    }
    for (const auto& g : grads) {
      if (g.size() != cfg.gradient_floats) {
        throw std::invalid_argument(
            "RunIteration: gradient size differs from gradient_floats");
      }
    }
    IterationOutcome out;
    out.iteration = iteration;
    out.push_round = round;
    out.bcast_round = round + 1;
    for (auto& l : push_loss) l->SetIteration(iteration);
    bcast_loss.SetIteration(iteration);
    out.burst = push_loss[0]->InBurst();

    // ---- push: every worker -> server, server decides STOP with its p ----
    const RoundTolerance push_tol = policy->Current();
    out.push_tolerance = push_tol;
    const double t0 = now;
    push_deadline_abs = push_tol.deadline_ns
                            ? t0 + static_cast<double>(push_tol.deadline_ns)
                            : std::numeric_limits<double>::infinity();
    reducer.BeginRound();
    for (uint32_t w = 0; w < W; ++w) {
      ServerLink& ln = *links[w];
      ln.push_rx.Begin(
          out.push_round, push_tol.p,
          push_tol.deadline_ns ? static_cast<uint64_t>(push_deadline_abs) : 0,
          push_tol.min_fraction);
      ln.probe_outstanding = false;
      Send(workers[w]->to_worker,
           RoundBeginMsg{out.push_round, static_cast<uint32_t>(iteration),
                         Direction::kPush, push_tol.p, push_tol.deadline_ns,
                         push_tol.deadline_ns ? push_tol.min_fraction : 0});
      Worker& wk = *workers[w];
      wk.order.Fill(out.push_round, layout.num_chunks(), wk.order_buf);
      wk.push_tx.Begin(out.push_round, wk.order_buf);
      wk.probe_outstanding = false;
      wk.push_done = false;
      wk.bcast_done = false;
      // Open the broadcast receiver now, so no early broadcast frame is lost.
      // Its p is unknown until the broadcast's ROUND_BEGIN lands (the policy
      // may switch after this push), so until then it may only STOP on a
      // complete buffer (p = 0), which satisfies any p. Opening it with the
      // previous round's p let a worker STOP by a stale, higher p.
      wk.bcast_rx.Begin(out.bcast_round, 0.0);
    }
    InjectStale();

    uint32_t rr = 0;
    auto all_pushed = [&] {
      return std::all_of(workers.begin(), workers.end(),
                         [](const auto& wk) { return wk->push_done; });
    };
    while (!all_pushed()) {
      DeliverAll();
      bool sent = false;
      for (uint32_t i = 0; i < W; ++i) {
        const uint32_t w = (rr + i) % W;
        Worker& wk = *workers[w];
        if (wk.push_done) continue;
        if (SendBurst(wk.push_tx, fabric.port(WorkerEndpoint(w)),
                      kServerEndpoint, FrameType::kPush,
                      static_cast<uint16_t>(w), grads[w].data(),
                      &wk.replay) > 0) {
          sent = true;
          rr = w + 1;
          ServerReceive();
          break;
        }
      }
      for (uint32_t w = 0; w < W; ++w) {
        Worker& wk = *workers[w];
        if (wk.push_done) continue;
        if (wk.push_tx.state() == SenderRound::State::kAwaitingBitmap &&
            !wk.probe_outstanding) {
          wk.probe_outstanding = true;
          Send(wk.to_server, ProbeMsg{out.push_round, Direction::kPush,
                                      wk.push_tx.passes()});
        } else if (wk.push_tx.state() == SenderRound::State::kStopped &&
                   !wk.push_tx.stop_requested()) {
          // The bitmap showed nothing missing: the round is complete.
          wk.push_done = true;
          wk.push_done_ns = now;
        }
      }
      ServerReceive();
      if (!sent && !all_pushed()) WaitForEvent(push_deadline_abs);
    }
    double push_end = t0;
    for (auto& wk : workers) push_end = std::max(push_end, wk->push_done_ns);
    out.push_round_ns = push_end - t0;
    for (auto& ln : links) {
      ln->push_rx.Close();
      ln->push_rx.SnapshotBitmap(ln->push_arrived);
    }
    reducer.Finalize(cfg.push_fill, mean);
    out.grad_norm = L2Norm(mean);
    policy->OnIterationEnd(iteration, out.grad_norm,
                           static_cast<uint64_t>(out.push_round_ns));

    // ---- broadcast: server -> every worker, each worker decides STOP ----
    RoundTolerance bcast_tol = policy->Current();
    if (cfg.reliable_broadcast) bcast_tol = RoundTolerance{};
    out.bcast_tolerance = bcast_tol;
    bcast_start_ns = now;
    bcast_deadline_abs = std::numeric_limits<double>::infinity();
    for (uint32_t w = 0; w < W; ++w) {
      ServerLink& ln = *links[w];
      Send(workers[w]->to_worker,
           RoundBeginMsg{out.bcast_round, static_cast<uint32_t>(iteration),
                         Direction::kBroadcast, bcast_tol.p,
                         bcast_tol.deadline_ns,
                         bcast_tol.deadline_ns ? bcast_tol.min_fraction : 0});
      ln.order.Fill(out.bcast_round, layout.num_chunks(), ln.order_buf);
      ln.bcast_tx.Begin(out.bcast_round, ln.order_buf);
      ln.probe_outstanding = false;
    }
    auto all_received = [&] {
      for (uint32_t w = 0; w < W; ++w) {
        if (!workers[w]->bcast_done || !links[w]->bcast_tx.finished()) {
          return false;
        }
      }
      return true;
    };
    rr = 0;
    while (!all_received()) {
      DeliverAll();
      bool sent = false;
      for (uint32_t i = 0; i < W; ++i) {
        const uint32_t w = (rr + i) % W;
        if (SendBurst(links[w]->bcast_tx, fabric.port(kServerEndpoint),
                      WorkerEndpoint(w), FrameType::kBroadcast, kServerRank,
                      mean.data(), nullptr) > 0) {
          sent = true;
          rr = w + 1;
          WorkerReceive(w);
          break;
        }
      }
      for (uint32_t w = 0; w < W; ++w) {
        ServerLink& ln = *links[w];
        if (ln.bcast_tx.state() == SenderRound::State::kAwaitingBitmap &&
            !ln.probe_outstanding) {
          ln.probe_outstanding = true;
          Send(workers[w]->to_worker, ProbeMsg{out.bcast_round,
                                               Direction::kBroadcast,
                                               ln.bcast_tx.passes()});
        }
        WorkerReceive(w);  // also polls a deadline-only STOP
      }
      if (!sent && !all_received()) {
        double next_deadline = std::numeric_limits<double>::infinity();
        for (auto& wk : workers) {
          if (!wk->bcast_done && bcast_tol.deadline_ns) {
            next_deadline =
                std::min(next_deadline,
                         bcast_start_ns + static_cast<double>(bcast_tol.deadline_ns));
          }
        }
        WaitForEvent(next_deadline);
      }
    }
    double bcast_end = bcast_start_ns;
    for (uint32_t w = 0; w < W; ++w) {
      Worker& wk = *workers[w];
      bcast_end = std::max(bcast_end, wk.bcast_done_ns);
      wk.bcast_rx.Close();
      wk.bcast_rx.SnapshotBitmap(wk.bcast_arrived);
      FillMissing(wk.average, wk.bcast_arrived, layout, cfg.bcast_fill,
                  wk.previous_average);
      wk.previous_average = wk.average;
    }
    out.bcast_round_ns = bcast_end - bcast_start_ns;

    for (uint32_t w = 0; w < W; ++w) {
      const Worker& wk = *workers[w];
      const ServerLink& ln = *links[w];
      IterationRecord r;
      r.iteration = iteration;
      r.rank = w;
      r.send_latency_us = (wk.push_done_ns - t0) / 1e3;
      r.bcast_latency_us = (wk.bcast_done_ns - bcast_start_ns) / 1e3;
      r.passes = wk.push_tx.passes();
      r.bcast_passes = ln.bcast_tx.passes();
      r.packets_sent = wk.push_tx.packets_sent();
      r.packets_resent = wk.push_tx.packets_resent();
      r.delivered_fraction =
          static_cast<double>(ln.push_arrived.Count()) / layout.num_chunks();
      r.p = push_tol.p;
      r.critical = push_tol.critical;
      r.grad_norm = out.grad_norm;
      r.burst = out.burst;
      out.workers.push_back(r);
      out.bcast_delivered.push_back(
          static_cast<double>(wk.bcast_arrived.Count()) / layout.num_chunks());
    }
    ++iteration;
    round += 2;
    return out;
  }

  ClusterConfig cfg;
  ChunkLayout layout;
  LoopbackFabric fabric;
  std::unique_ptr<TolerancePolicy> policy;
  MeanReducer reducer;
  LossInjector bcast_loss;
  std::vector<std::unique_ptr<LossInjector>> push_loss;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::unique_ptr<ServerLink>> links;
  std::vector<float> mean;
  uint32_t round;
  uint64_t iteration = 0;
  double now = 0;
  double bcast_start_ns = 0;
  double push_deadline_abs = 0;
  double bcast_deadline_abs = 0;
  uint64_t control_messages = 0;
  uint64_t stops_sent = 0;
  uint64_t unknown_source = 0;
  std::vector<uint32_t> seq_buf;
  std::vector<Packet> pkt_buf;
  std::vector<Packet> rx_buf;
};

MemoryCluster::MemoryCluster(const ClusterConfig& config)
    : impl_(std::make_unique<Impl>(config)) {}
MemoryCluster::~MemoryCluster() = default;

IterationOutcome MemoryCluster::RunIteration(
    std::span<const std::vector<float>> grads) {
  return impl_->Run(grads);
}

const ClusterConfig& MemoryCluster::config() const { return impl_->cfg; }
const ChunkLayout& MemoryCluster::layout() const { return impl_->layout; }
const std::vector<float>& MemoryCluster::server_mean() const {
  return impl_->mean;
}
const std::vector<float>& MemoryCluster::worker_average(uint32_t rank) const {
  return impl_->workers.at(rank)->average;
}
const Bitmap& MemoryCluster::push_arrived(uint32_t rank) const {
  return impl_->links.at(rank)->push_arrived;
}
const Bitmap& MemoryCluster::bcast_arrived(uint32_t rank) const {
  return impl_->workers.at(rank)->bcast_arrived;
}

ClusterCounters MemoryCluster::counters() const {
  ClusterCounters c;
  auto add = [&c](const ReceiverRound& rx) {
    c.accepted += rx.verdict_count(Verdict::kAccepted);
    c.duplicate += rx.verdict_count(Verdict::kDuplicate);
    c.stale += rx.verdict_count(Verdict::kStaleRound);
    c.future += rx.verdict_count(Verdict::kFutureRound);
    c.late += rx.verdict_count(Verdict::kLate);
    c.malformed += rx.verdict_count(Verdict::kMalformed);
    c.rejected_other += rx.verdict_count(Verdict::kWrongSession) +
                        rx.verdict_count(Verdict::kWrongSender) +
                        rx.verdict_count(Verdict::kWrongType) +
                        rx.verdict_count(Verdict::kOutOfRange) +
                        rx.verdict_count(Verdict::kIdle);
  };
  for (const auto& ln : impl_->links) add(ln->push_rx);
  for (const auto& wk : impl_->workers) add(wk->bcast_rx);
  c.malformed += impl_->unknown_source;
  for (uint32_t i = 0; i < impl_->fabric.size(); ++i) {
    c.injected_drops += impl_->fabric.port(i).injected_drops();
    c.ring_drops += impl_->fabric.port(i).ring_drops();
  }
  c.control_messages = impl_->control_messages;
  c.stops_sent = impl_->stops_sent;
  return c;
}

}  // namespace dblp
