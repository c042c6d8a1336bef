// The in-memory job's loop. The rounds are driven by the round sides
// (send_side.h, receive_side.h), as in every transport's datapath; this file
// only models what is around them: the network (the loopback fabric, one
// burst per turn on the server's link, the clock) and the control threads
// (the pipes with their codec and delay, round_control.h's glue).
#include "sim/memory_cluster.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/job/counters.h"
#include "dblp/job/worker_model.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/round/round_events.h"
#include "dblp/round/send_side.h"
#include "dblp/transport/loopback_transport.h"
#include "dblp/transport/packet_frames.h"
#include "dblp/wire/wire.h"

namespace dblp {

namespace {

constexpr uint32_t kServerEndpoint = 0;
constexpr uint32_t WorkerEndpoint(uint32_t rank) { return rank + 1; }

// The modelled clock, and the one link every data frame crosses (into the
// server on push, out of it on broadcast), which carries one burst per loop
// turn. Single-threaded: the frames advance `now` per frame sent, the loop's
// waits advance it to the next event; everyone reads it.
struct SimClock {
  double now = 0;
  double ns_per_frame = 0;
  bool link_free = false;  // this turn's burst has not been sent yet
  uint64_t ns() const { return static_cast<uint64_t>(now); }
};

// A control message on its way over the (modelled) TCP connection.
struct Envelope {
  double at_ns;
  std::vector<uint8_t> bytes;
};

// One direction of one TCP connection: in order, constant delay, and read
// by the far side's decoder in two pieces (as a socket read may split it).
struct ControlPipe {
  void Send(const ControlMessage& m, double now_ns) {
    Envelope e{now_ns + one_way_ns, {}};
    EncodeControl(m, e.bytes);
    queue.push_back(std::move(e));
    ++sent;
  }
  double next_at_ns() const {
    return queue.empty() ? std::numeric_limits<double>::infinity()
                         : queue.front().at_ns;
  }

  std::deque<Envelope> queue;
  ControlDecoder decoder;
  double one_way_ns = 0;
  uint64_t sent = 0;
};

// Where an endpoint's sides post their requests for one peer: what the
// control thread would send, encoded into the pipe to that peer.
// `answering` is the endpoint's receive side for the peer, whose mailbox
// holds the BITMAP a BitmapRequest refers to.
struct PipeOutbox {
  void Post(const ControlRequest& r) {
    for (const ControlMessage& m : SideRequestMessages(r, answering)) {
      pipe->Send(m, clock->now);
    }
  }

  ControlPipe* pipe = nullptr;
  ReceiveSide* answering = nullptr;
  const SimClock* clock = nullptr;
};

// A send side's frames: real frames over a loopback port, each charged
// `ns_per_frame` of modelled time. The link takes one burst per turn; a
// sender that finds it taken gets TX backpressure (the side sends those
// chunks next turn), which is how the senders share the server's link.
class SimFrames {
 public:
  SimFrames(LoopbackPort* port, uint32_t dst, const ChunkLayout* layout,
            uint32_t burst, SimClock* clock)
      : frames_(port, dst, nullptr, layout, burst), clock_(clock) {}

  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    if (!clock_->link_free) return 0;
    const uint32_t sent = frames_.Send(proto, seqs, n);
    clock_->link_free = false;
    clock_->now += sent * clock_->ns_per_frame;
    return sent;
  }
  void set_buffer(std::span<const float> v) {
    frames_.set_buffer(reinterpret_cast<const uint8_t*>(v.data()));
  }

 private:
  PacketFrames<LoopbackPort> frames_;
  SimClock* clock_;
};

// A send side with what it sends here: its frames and its first-pass order.
struct SimSender {
  SimSender(const SendSideConfig& c, SendOrder o, SimFrames f)
      : side(c), frames(std::move(f)), order(o) {}

  // The first pass in this sender's order.
  void Begin(uint32_t round, std::span<const float> data, uint32_t num_chunks,
             uint64_t now_ns) {
    order.Fill(round, num_chunks, order_buf);
    Begin(round, data, order_buf, num_chunks, now_ns);
  }
  // ... or in `first_pass` (the server job's broadcast order).
  void Begin(uint32_t round, std::span<const float> data,
             std::span<const uint32_t> first_pass, uint32_t num_chunks,
             uint64_t now_ns) {
    frames.set_buffer(data);
    side.Begin(round, first_pass, now_ns, num_chunks);
  }

  SendSide side;
  SimFrames frames;
  SendOrder order;
  std::vector<uint32_t> order_buf;
};

// No PROBE retry (probe_retry_ns = 0). A retry recovers a BITMAP lost on
// the way; here nothing is lost: the pipes deliver every message, and the
// one-slot mailboxes are emptied at once (the answer by the outbox, the
// sender's at its next Step), so a PROBE always gets its BITMAP. A retry
// could only fire spuriously, with a modelled round trip longer than its
// timeout, and add PROBEs the protocol did not need.
constexpr uint64_t kNoProbeRetry = 0;

// A simulated worker's gradient source: the caller's vector of this
// iteration (RunIteration's grads[rank]), pushed as the gradient or, in a
// resync, as the model; and the worker's copy of the mean, shared with the
// simulator (worker_average). What the worker does around the exchange
// (fill, resync load, the previous mean) is WorkerModel's, as in the apps.
class SimSource : public GradientSource {
 public:
  SimSource(uint64_t floats, std::vector<float>* average)
      : floats_(floats), average_(average) {}
  std::vector<LayerInfo> Layers() const override { return {}; }
  uint64_t floats() const override { return floats_; }
  void Bind(uint32_t, uint32_t) override {}
  void Compute(uint64_t, std::span<float> grad) override { Copy(grad); }
  void ExportModel(std::span<float> out) override { Copy(out); }
  void Apply(uint64_t, std::span<const float>) override {}
  std::string Describe() const override { return "simulated"; }
  std::span<float> SharedMean() override { return *average_; }
  void set_current(const std::vector<float>* g) { current_ = g; }

 private:
  void Copy(std::span<float> out) const {
    std::copy(current_->begin(), current_->end(), out.begin());
  }

  uint64_t floats_;
  std::vector<float>* average_;
  const std::vector<float>* current_ = nullptr;
};

}  // namespace

struct MemoryCluster::Impl {
  struct Worker {
    Worker(const SendSideConfig& sc, SendOrder o, SimFrames f,
           const ReceiveSideConfig& rc)
        : push(sc, o, std::move(f)), bcast(rc) {}
    SimSender push;         // this worker -> server, out of this worker's port
    ReceiveSide bcast;      // server -> this worker
    PipeOutbox out;         // requests of both sides, to the server
    ControlPipe to_worker;  // server -> this worker
    ControlPipe to_server;  // this worker -> server
    std::vector<float> average;  // the model's mean (shared with `source`)
    std::unique_ptr<SimSource> source;    // RunIteration(grads)'s
    GradientSource* gradients = nullptr;  // that, or the caller's source
    std::unique_ptr<WorkerModel> model;  // the apps' worker model
    AcceptedInbox accepted;              // push feedback: the server's ACCEPTED
    std::vector<Packet> replay;  // frames kept to replay as stale later
    Bitmap bcast_arrived;
  };
  struct ServerLink {  // the server's state for one worker
    ServerLink(const ReceiveSideConfig& rc, const SendSideConfig& sc,
               SendOrder o, SimFrames f)
        : push(rc), bcast(sc, o, std::move(f)) {}
    ReceiveSide push;  // the worker -> server
    SimSender bcast;   // server -> the worker, out of the server's port
    PipeOutbox out;    // requests of both sides, to the worker
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
    WelcomeMsg wel;
    wel.consistent_broadcast = c.consistent_broadcast;
    if (std::string e = WorkerModel::CheckBroadcastFill(wel, c.bcast_fill);
        !e.empty()) {
      throw std::invalid_argument("in-memory cluster: " + e);
    }
    if (c.continue_on_worker_loss) {
      throw std::invalid_argument(
          "in-memory cluster: worker loss is not simulated (dblp-server and "
          "dblp-udp-server have --on_worker_loss=continue)");
    }
    return c;
  }

  Impl(const ClusterConfig& c, std::vector<GradientSource*> sources)
      : cfg(Validated(c)),
        external(std::move(sources)),
        layout(ChunkLayout::ForMtu(c.gradient_floats * sizeof(float), c.mtu)),
        fabric(c.num_workers + 1, c.ring_size),
        job(c, TolerancePolicy::Create(c.policy), layout,
            std::vector<std::string>(c.num_workers, "simulated"), c.send_order,
            c.seed, "sim-server"),
        bcast_loss(c.bcast_loss,
                   c.bursts_on_broadcast ? c.bursts : BurstSchedule{},
                   HashMix(c.seed, 0xB0)),
        round(c.first_round) {
    clock.ns_per_frame = c.ns_per_frame;
    fabric.port(kServerEndpoint).set_loss(&bcast_loss);
    // Every frame a worker sends is a push frame: the first stale_replay of
    // a push are kept to replay at the server in the next one.
    fabric.set_tap([this](const Packet& p) { KeepForReplay(p); });
    for (uint32_t w = 0; w < c.num_workers; ++w) {
      push_loss.emplace_back(std::make_unique<LossInjector>(
          c.push_loss, c.bursts, HashMix(c.seed, 0x100 + w)));
      fabric.port(WorkerEndpoint(w)).set_loss(push_loss.back().get());
      AddWorker(w);
    }
    push_arrived.resize(c.num_workers);
    push_stop_ns.resize(c.num_workers);
  }

  void AddWorker(uint32_t w) {
    const auto rank = static_cast<uint16_t>(w);
    workers.emplace_back(std::make_unique<Worker>(
        SendSideConfig{FrameType::kPush, cfg.session, rank, 0, Direction::kPush,
                       cfg.burst, kNoProbeRetry},
        SendOrder(cfg.send_order, w, cfg.num_workers, cfg.seed),
        SimFrames(&fabric.port(WorkerEndpoint(w)), kServerEndpoint, &layout,
                  cfg.burst, &clock),
        ReceiveSideConfig{ReceiverConfig{cfg.session, FrameType::kBroadcast,
                                         kServerRank, layout},
                          Direction::kBroadcast, 0}));
    Worker& wk = *workers.back();
    wk.average.assign(cfg.gradient_floats, 0.0f);
    wk.source = std::make_unique<SimSource>(cfg.gradient_floats, &wk.average);
    wk.gradients = wk.source.get();
    WelcomeMsg wel;  // what a WELCOME tells a worker of the job
    wel.rank = w;
    wel.num_workers = cfg.num_workers;
    wel.resync_every = cfg.resync_every;
    wel.consistent_broadcast = cfg.consistent_broadcast;
    wel.push_feedback = cfg.push_feedback;
    if (!external.empty()) {
      wk.gradients = external.at(w);
      wk.gradients->Bind(w, cfg.num_workers);
      wk.gradients->OnJobStart(cfg.resync_every);
    }
    wk.model = std::make_unique<WorkerModel>(*wk.gradients, wel, layout,
                                             cfg.bcast_fill);
    wk.to_worker.one_way_ns = cfg.control_one_way_ns;
    wk.to_server.one_way_ns = cfg.control_one_way_ns;
    wk.out = PipeOutbox{&wk.to_server, &wk.bcast, &clock};

    // The broadcast order is per worker too, so the workers' losses of
    // the mean fall on different chunks.
    links.emplace_back(std::make_unique<ServerLink>(
        ReceiveSideConfig{ReceiverConfig{cfg.session, FrameType::kPush,
                                         static_cast<int32_t>(w), layout},
                          Direction::kPush, rank},
        SendSideConfig{FrameType::kBroadcast, cfg.session, kServerRank, rank,
                       Direction::kBroadcast, cfg.burst, kNoProbeRetry},
        SendOrder(cfg.send_order, w, cfg.num_workers, HashMix(cfg.seed, 0xBC)),
        SimFrames(&fabric.port(kServerEndpoint), WorkerEndpoint(w), &layout,
                  cfg.burst, &clock)));
    ServerLink& ln = *links.back();
    ln.out = PipeOutbox{&wk.to_worker, &ln.push, &clock};
  }

  // ---- control plane -------------------------------------------------------
  // Feeds every message due by now into its decoder and returns the decoded
  // messages through `handle`.
  template <class Handler>
  void Deliver(ControlPipe& pipe, Handler&& handle) {
    while (!pipe.queue.empty() && pipe.queue.front().at_ns <= clock.now) {
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

  // What the control threads do with a message: PROBE, BITMAP and STOP go
  // to the side they are for; a broadcast's ROUND_BEGIN to the worker's
  // broadcast receiver (the push's p is the server's business alone).
  void DeliverAll() {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      Worker& wk = *workers[w];
      ServerLink& ln = *links[w];
      Deliver(wk.to_worker, [&](const ControlMessage& m) {
        const auto* rb = std::get_if<RoundBeginMsg>(&m);
        if (const auto* a = std::get_if<AcceptedMsg>(&m)) {
          wk.accepted.Put(*a);
        } else if (rb == nullptr) {
          DeliverToSides(m, &wk.push.side, &wk.bcast, clock.ns());
        } else if (rb->direction == Direction::kBroadcast) {
          wk.bcast.Announce(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                            rb->deadline_ns, rb->min_fraction},
                            clock.ns());
        }
      });
      Deliver(wk.to_server, [&](const ControlMessage& m) {
        DeliverToSides(m, &ln.bcast.side, &ln.push, clock.ns());
      });
    }
  }

  double NextControlTime() const {
    double t = std::numeric_limits<double>::infinity();
    for (const auto& wk : workers) {
      t = std::min({t, wk->to_worker.next_at_ns(), wk->to_server.next_at_ns()});
    }
    return t;
  }

  // ---- data plane ----------------------------------------------------------
  // What a receive side's Step is told after a poll. The fabric delivers
  // synchronously and every poll empties the ring, so every poll drains. A
  // PROBE that DeliverAll handed over was seen before this poll's RX began,
  // so every frame its sender sent before it is counted by now: the Step may
  // answer it at once (drained_gen > poll_gen).
  RxProgress Drained(bool arrivals) {
    ++poll_gen;
    return RxProgress{arrivals, poll_gen, poll_gen + 1};
  }

  // Hands every frame in `port`'s ring to `take`; returns whether any came.
  template <class Take>
  bool DrainRing(LoopbackPort& port, Take&& take) {
    rx_buf.resize(cfg.burst);
    bool any = false;
    uint16_t k;
    while ((k = port.RxBurst(rx_buf.data(),
                             static_cast<uint16_t>(rx_buf.size()))) > 0) {
      any = true;
      for (uint16_t i = 0; i < k; ++i) take(rx_buf[i]);
    }
    return any;
  }

  // The server's RX step: every frame to the push receive side of the worker
  // that sent it, into the mean; then each side's Step (STOP, BITMAP).
  void PollServer() {
    rx_from.assign(links.size(), false);
    DrainRing(fabric.port(kServerEndpoint), [&](const Packet& p) {
      // The source endpoint plays the role of the UDP source port.
      if (p.src == kServerEndpoint || p.src > links.size()) {
        ++unknown_source;
        return;
      }
      const uint32_t w = p.src - 1;
      rx_from[w] = true;
      links[w]->push.OnFrame(p.bytes.data(), p.bytes.size(),
                             [&](const DataHeader& h, const uint8_t* payload) {
                               job.iteration().reducer().Accumulate(w, h.seq,
                                                                    payload);
                             });
    });
    for (uint32_t w = 0; w < links.size(); ++w) {
      ServerLink& ln = *links[w];
      ln.push.Step(clock.ns(), Drained(rx_from[w]), ln.out);
    }
  }

  // Worker `w`'s RX step: frames into its copy of the mean, then its
  // broadcast side's Step (STOP, BITMAP).
  void PollWorker(uint32_t w) {
    Worker& wk = *workers[w];
    auto* avg = reinterpret_cast<uint8_t*>(wk.model->avg().data());
    const bool any =
        DrainRing(fabric.port(WorkerEndpoint(w)), [&](const Packet& p) {
          wk.bcast.OnFrame(p.bytes.data(), p.bytes.size(),
                           [&](const DataHeader& h, const uint8_t* payload) {
                             std::memcpy(avg + layout.Offset(h.seq), payload,
                                         h.payload_len);
                           });
        });
    wk.bcast.Step(clock.ns(), Drained(any), wk.out);
  }

  // Every endpoint's RX step, whichever direction is running: a side keeps
  // answering while its round is over (a PROBE still in flight gets the
  // BITMAP of the closed round, as a real loop that steps every side does).
  void PollAll() {
    PollServer();
    for (uint32_t w = 0; w < workers.size(); ++w) PollWorker(w);
  }

  // The tap's job: copies of the first stale_replay frames of a push.
  void KeepForReplay(const Packet& p) {
    if (p.src == kServerEndpoint || p.src > workers.size()) return;
    std::vector<Packet>& keep = workers[p.src - 1]->replay;
    if (keep.size() < cfg.stale_replay) keep.push_back(p);
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

  // ---- one round -----------------------------------------------------------
  // One loop turn of the round in direction `d`: the control messages due
  // land; the receivers poll (answering a PROBE that just landed); every
  // sender of `d` steps in round-robin order, the first with frames taking
  // the link for one burst; the receivers poll again (that burst, STOP).
  // Returns whether a burst was sent.
  bool Turn(Direction d) {
    DeliverAll();
    PollAll();
    clock.link_free = true;
    const uint32_t first = rr;
    const auto n = static_cast<uint32_t>(workers.size());
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t w = (first + i) % n;
      const bool free = clock.link_free;
      SimSender& tx =
          d == Direction::kPush ? workers[w]->push : links[w]->bcast;
      PipeOutbox& out = d == Direction::kPush ? workers[w]->out : links[w]->out;
      tx.side.Step(clock.ns(), tx.frames, out);
      if (free && !clock.link_free) rr = w + 1;  // the next turn starts after
    }
    const bool sent = !clock.link_free;
    clock.link_free = false;
    PollAll();
    return sent;
  }

  // Push: every worker's send side is done (STOP, or nothing missing).
  // Broadcast: also every worker's receive side sent its STOP, the time the
  // round is measured by.
  bool RoundOver(Direction d) const {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (d == Direction::kPush) {
        if (!workers[w]->push.side.done()) return false;
      } else if (!workers[w]->bcast.stopped() || !links[w]->bcast.side.done()) {
        return false;
      }
    }
    return true;
  }

  // The earliest deadline of a receive side still open in direction `d`.
  double NextDeadline(Direction d) const {
    double t = std::numeric_limits<double>::infinity();
    for (uint32_t w = 0; w < workers.size(); ++w) {
      const ReceiveSide& rx =
          d == Direction::kPush ? links[w]->push : workers[w]->bcast;
      const uint64_t deadline = rx.receiver().deadline_ns();
      if (!rx.stopped() && deadline != 0) {
        t = std::min(t, static_cast<double>(deadline));
      }
    }
    return t;
  }

  // Advances the clock to the next event when nobody could send: a control
  // message landing or a deadline that has not passed yet.
  void WaitForEvent(double deadline_event) {
    double t = NextControlTime();
    if (deadline_event > clock.now) t = std::min(t, deadline_event);
    if (!std::isfinite(t)) {
      throw std::logic_error(
          "in-memory cluster stalled: no frame to send and no message in "
          "flight (a protocol bug)");
    }
    clock.now = std::max(clock.now, t);
  }

  void RunRound(Direction d) {
    rr = 0;
    uint64_t mark = Progress(d);
    double last_progress = clock.now;
    const double timeout_ns = 1e6 * cfg.round_timeout_ms;
    while (!RoundOver(d)) {
      if (!Turn(d) && !RoundOver(d)) WaitForEvent(NextDeadline(d));
      const uint64_t next = Progress(d);
      if (next != mark) {
        mark = next;
        last_progress = clock.now;
      } else if (clock.now - last_progress > timeout_ns) {
        throw std::runtime_error(Stalled(d));
      }
    }
  }

  // What moves a round in direction `d`, as the apps' loops count it.
  uint64_t Progress(Direction d) const {
    uint64_t mark = 0;
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (d == Direction::kPush) {
        mark += workers[w]->push.side.progress() + links[w]->push.progress();
      } else {
        mark += links[w]->bcast.side.progress() + workers[w]->bcast.progress();
      }
    }
    return mark;
  }

  std::string Stalled(Direction d) const {
    const std::string why =
        d == Direction::kPush
            ? job.PushStalled(iteration, cfg.round_timeout_ms,
                              [&](uint32_t w) {
                                return links[w]->push.receiver().received();
                              })
            : job.BroadcastStalled(iteration, cfg.round_timeout_ms,
                                   [&](uint32_t w) {
                                     return links[w]->bcast.side.done() &&
                                            workers[w]->bcast.stopped();
                                   });
    return why + " (modelled time; --loss, --round_timeout_ms)";
  }

  // ---- one iteration -------------------------------------------------------
  // What WorkerModel reports as a failure is a bug of the simulation.
  static void Check(const std::string& why) {
    if (!why.empty()) throw std::logic_error("in-memory worker: " + why);
  }
  // A worker's ACCEPTED, delivered by its control pipe (push feedback).
  struct SimFeedback {
    AcceptedInbox* inbox;
    bool TakeAccepted(uint32_t round, Bitmap* out) {
      return inbox->Take(round, out);
    }
    bool server_gone() const { return false; }
    std::string failure() const { return ""; }
  };

  void CheckGrads(std::span<const std::vector<float>> grads) const {
    if (!external.empty()) {
      if (!grads.empty()) {
        throw std::invalid_argument(
            "RunIteration: the workers have sources; pass no gradients");
      }
      return;
    }
    if (grads.size() != workers.size()) {
      throw std::invalid_argument("RunIteration: need one gradient per worker");
    }
    for (const auto& g : grads) {
      if (g.size() != cfg.gradient_floats) {
        throw std::invalid_argument(
            "RunIteration: gradient size differs from gradient_floats");
      }
    }
  }

  // The server job's ROUND_BEGIN to every worker, in the simulator's round
  // numbering (it may start anywhere: first_round tests the wrap-around).
  void Announce(RoundBeginRequest rb, uint32_t sim_round) {
    rb.round = sim_round;
    RoundBeginMsg m = RoundBeginMessage(rb);
    m.iteration = static_cast<uint32_t>(iteration);
    for (auto& wk : workers) wk->to_worker.Send(m, clock.now);
  }

  // Push: every worker -> server; the server decides STOP with its p.
  void BeginPush(const IterationOutcome& out,
                 std::span<const std::vector<float>> grads) {
    push_start_ns = clock.now;
    const PushOpening open = job.OpenPush(iteration, clock.ns());
    const RoundBeginRequest& rb = open.announce;
    Announce(rb, out.push_round);
    for (uint32_t w = 0; w < workers.size(); ++w) {
      Worker& wk = *workers[w];
      links[w]->push.Begin(out.push_round, rb.p, open.deadline_ns,
                           rb.min_fraction, clock.ns());
      if (!grads.empty()) wk.source->set_current(&grads[w]);
      bool more = true;
      // In one process the server cannot go away while a worker waits.
      Check(wk.model->Prepare(iteration, &more, {}));
      wk.push.Begin(out.push_round, wk.model->grad(), layout.num_chunks(),
                    clock.ns());
      // Open the broadcast receiver now, so no early broadcast frame is lost.
      // Its p is unknown until the broadcast's ROUND_BEGIN lands (the policy
      // may switch after this push), so until then it may only STOP on a
      // complete buffer (p = 0), which satisfies any p. Opening it with the
      // previous round's p let a worker STOP by a stale, higher p.
      wk.bcast.Begin(out.bcast_round, 0.0, 0, 0, clock.ns());
    }
    InjectStale();
  }

  void EndPush(IterationOutcome& out) {
    double push_end = push_start_ns;
    for (auto& wk : workers) {
      push_end =
          std::max(push_end, static_cast<double>(wk->push.side.done_ns()));
    }
    out.push_round_ns = push_end - push_start_ns;
    for (uint32_t w = 0; w < links.size(); ++w) {
      ServerLink& ln = *links[w];
      ln.push.Close();
      ln.push.receiver().SnapshotBitmap(push_arrived[w]);
      push_stop_ns[w] = ln.push.stop_ns();
    }
    // What the servers decide (ServerJob): mean, policy, rows, broadcast.
    posts.clear();
    reduced = job.ClosePush(iteration,
                            ClosedPush{static_cast<uint64_t>(push_end),
                                       push_arrived, push_stop_ns, out.burst},
                            &accepted, &posts);
    out.grad_norm = reduced.norm;
    out.failure = reduced.failure;
  }

  // Broadcast: server -> every worker; each worker decides STOP with the p
  // its ROUND_BEGIN announces.
  void BeginBroadcast(IterationOutcome& out) {
    out.bcast_tolerance = reduced.broadcast;
    bcast_start_ns = clock.now;
    for (const ControlRequest& r : posts) {  // ACCEPTED, then ROUND_BEGIN
      AcceptedMsg m;
      if (const auto* rb = std::get_if<RoundBeginRequest>(&r)) {
        Announce(*rb, out.bcast_round);
      } else if (const auto* a = std::get_if<AcceptedRequest>(&r);
                 a != nullptr && accepted.Take(a->peer, a->round, &m)) {
        workers[a->peer]->to_worker.Send(m, clock.now);
      }
    }
    for (uint32_t w = 0; w < workers.size(); ++w) {
      job.BroadcastOrder(w, iteration, layout.num_chunks(), &order_buf);
      links[w]->bcast.Begin(out.bcast_round, job.iteration().mean(), order_buf,
                            layout.num_chunks(), clock.ns());
    }
  }

  void EndBroadcast(IterationOutcome& out) {
    double bcast_end = bcast_start_ns;
    for (auto& wk : workers) {
      bcast_end = std::max(bcast_end, static_cast<double>(wk->bcast.stop_ns()));
      wk->bcast.Close();
      wk->bcast.receiver().SnapshotBitmap(wk->bcast_arrived);
    }
    out.bcast_round_ns = bcast_end - bcast_start_ns;
    // A broadcast shorter than a control message's flight: the ACCEPTED
    // of push feedback is still on its way. Its landing time, then.
    while (cfg.push_feedback && std::isfinite(NextControlTime())) {
      clock.now = std::max(clock.now, NextControlTime());
      DeliverAll();
    }
    for (uint32_t w = 0; w < workers.size(); ++w) Absorb(w);
  }

  void Absorb(uint32_t w) {
    Worker& wk = *workers[w];
    SimFeedback feedback{&wk.accepted};
    Check(wk.model->Absorb(iteration, feedback, wk.bcast_arrived, 0));
    if (!external.empty()) {
      const std::span<const float> avg = wk.model->avg();
      wk.average.assign(avg.begin(), avg.end());
    }
    if (cfg.on_absorbed) {
      cfg.on_absorbed(AbsorbedView{iteration, w, wk.model->IsResync(iteration),
                                   wk.model->grad(), wk.model->avg(),
                                   &wk.bcast_arrived, wk.gradients});
    }
  }

  void AddRecords(IterationOutcome& out) const {
    const double n = layout.num_chunks();
    for (uint32_t w = 0; w < workers.size(); ++w) {
      const Worker& wk = *workers[w];
      const ServerLink& ln = *links[w];
      IterationRecord r;
      r.iteration = iteration;
      r.rank = w;
      r.send_latency_us =
          (static_cast<double>(wk.push.side.done_ns()) - push_start_ns) / 1e3;
      r.bcast_latency_us =
          (static_cast<double>(wk.bcast.stop_ns()) - bcast_start_ns) / 1e3;
      const SenderRound& push = wk.push.side.sender();
      r.passes = push.passes();
      r.bcast_passes = ln.bcast.side.sender().passes();
      r.packets_sent = push.packets_sent();
      r.packets_resent = push.packets_resent();
      r.delivered_fraction = push_arrived[w].Count() / n;
      r.p = out.push_tolerance.p;
      r.critical = out.push_tolerance.critical;
      r.grad_norm = out.grad_norm;
      r.burst = out.burst;
      out.workers.push_back(r);
      out.bcast_delivered.push_back(wk.bcast_arrived.Count() / n);
    }
  }

  IterationOutcome Run(std::span<const std::vector<float>> grads) {
    CheckGrads(grads);
    IterationOutcome out;
    out.iteration = iteration;
    out.push_round = round;
    out.bcast_round = round + 1;
    for (auto& l : push_loss) l->SetIteration(iteration);
    bcast_loss.SetIteration(iteration);
    out.burst = push_loss[0]->InBurst();
    out.push_tolerance = job.PushTolerance(iteration);

    BeginPush(out, grads);
    RunRound(Direction::kPush);
    EndPush(out);
    if (!out.failure.empty()) return out;  // no mean goes out
    BeginBroadcast(out);
    RunRound(Direction::kBroadcast);
    EndBroadcast(out);
    AddRecords(out);
    ++iteration;
    round += 2;
    return out;
  }

  ClusterConfig cfg;
  std::vector<GradientSource*> external;  // the caller's, one per worker
  ChunkLayout layout;
  LoopbackFabric fabric;
  ServerJob job;        // the server's job, as dblp-server's
  AcceptedSlots accepted;  // push feedback, staged by the job
  ReducedPush reduced;  // this iteration's
  std::vector<ControlRequest> posts;  // what the job announced
  std::vector<Bitmap> push_arrived;   // per worker, the closed push
  std::vector<uint64_t> push_stop_ns;
  std::vector<uint32_t> order_buf;
  LossInjector bcast_loss;
  std::vector<std::unique_ptr<LossInjector>> push_loss;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::unique_ptr<ServerLink>> links;
  uint32_t round;
  uint64_t iteration = 0;
  SimClock clock;
  double push_start_ns = 0;
  double bcast_start_ns = 0;
  uint32_t rr = 0;        // the sender the next turn tries first
  uint64_t poll_gen = 0;  // RX polls so far, all endpoints
  uint64_t unknown_source = 0;
  std::vector<bool> rx_from;  // PollServer: frames from each worker this poll
  std::vector<Packet> rx_buf;
};

MemoryCluster::MemoryCluster(const ClusterConfig& config,
                             std::vector<GradientSource*> sources)
    : impl_(std::make_unique<Impl>(config, std::move(sources))) {}
MemoryCluster::~MemoryCluster() = default;

IterationOutcome MemoryCluster::RunIteration(
    std::span<const std::vector<float>> grads) {
  return impl_->Run(grads);
}

const ClusterConfig& MemoryCluster::config() const { return impl_->cfg; }
const ChunkLayout& MemoryCluster::layout() const { return impl_->layout; }
const std::vector<float>& MemoryCluster::server_mean() const {
  const ServerIteration& it = impl_->job.iteration();
  return it.mean();
}
const std::vector<float>& MemoryCluster::worker_average(uint32_t rank) const {
  return impl_->workers.at(rank)->average;
}
const Bitmap& MemoryCluster::push_arrived(uint32_t rank) const {
  return impl_->push_arrived.at(rank);
}
const Bitmap& MemoryCluster::bcast_arrived(uint32_t rank) const {
  return impl_->workers.at(rank)->bcast_arrived;
}

NamedCounters MemoryCluster::server_counters() const {
  NamedCounters c;
  std::vector<const ReceiverRound*> receivers;
  for (const auto& ln : impl_->links) receivers.push_back(&ln->push.receiver());
  AddReceiverCounters("push_", receivers, true, &c);
  uint64_t injected = 0;
  for (const auto& l : impl_->push_loss) injected += l->dropped();
  c.emplace_back("injected_drops", injected);
  c.emplace_back("frames_unpinned_source", impl_->unknown_source);
  impl_->job.AddCounters(&c);
  return c;
}

std::vector<std::pair<std::string, std::string>> MemoryCluster::server_info()
    const {
  return impl_->job.Info();
}

std::vector<IterationRecord>& MemoryCluster::server_rows() {
  return impl_->job.rows();
}

ClusterCounters MemoryCluster::counters() const {
  ClusterCounters c;
  auto add = [&c](const ReceiveSide& side) {
    const ReceiverRound& rx = side.receiver();
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
    c.stops_sent += side.stops_sent();
  };
  for (const auto& ln : impl_->links) add(ln->push);
  for (const auto& wk : impl_->workers) {
    add(wk->bcast);
    c.control_messages += wk->to_worker.sent + wk->to_server.sent;
  }
  c.malformed += impl_->unknown_source;
  for (uint32_t i = 0; i < impl_->fabric.size(); ++i) {
    c.injected_drops += impl_->fabric.port(i).injected_drops();
    c.ring_drops += impl_->fabric.port(i).ring_drops();
  }
  return c;
}

}  // namespace dblp
