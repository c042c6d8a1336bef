// The in-memory job's loop. The rounds are driven by the round sides
// (send_side.h, receive_side.h), as in every transport's datapath; this file
// only models what is around them: the network (the loopback fabric, one
// burst per turn on the server's link, the clock) and the control threads
// (the pipes with their codec and delay, round_control.h's glue).
#include "sim/memory_cluster.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/job/counters.h"
#include "dblp/job/phase_link.h"
#include "dblp/job/server_driver.h"
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

// Endpoints of the fabric: server shard k is k, worker w is shards + w.

// The modelled clock and what the current turn charged each resource. A
// turn lasts as long as its busiest resource: a node's lcores (CPU per
// frame sent and received, split over its lcores), its NIC out and its NIC
// in (a frame's bits at the node's link rate), and, on a host whose cores
// every process shares, all their CPU work over those cores. Single
// threaded: the frames charge the turn, the loop ends it; everyone reads
// `now`.
class SimClock {
 public:
  SimClock(const SimCosts& c, uint32_t shards, uint32_t workers,
           uint32_t server_lcores, uint32_t worker_lcores)
      : costs_(c),
        shards_(shards),
        cpu_(shards + workers),
        out_(shards + workers),
        in_(shards + workers),
        server_lcores_(server_lcores),
        worker_lcores_(worker_lcores) {}

  uint64_t ns() const { return static_cast<uint64_t>(now); }
  // A data frame of `bytes` (DBLP header and payload) from node src to dst.
  void Charge(uint32_t src, uint32_t dst, uint32_t bytes) {
    const double wire_bits =
        8.0 * (bytes + kEthernetHeaderBytes + kIpv4HeaderBytes +
               kUdpHeaderBytes + kWireOverheadBytes);
    const double rx = costs_.rx_ns + costs_.reduce_ns;
    cpu_[src] += costs_.tx_ns / Lcores(src);
    cpu_[dst] += rx / Lcores(dst);
    host_ += costs_.tx_ns + rx;
    out_[src] += WireNs(wire_bits, src);
    in_[dst] += WireNs(wire_bits, dst);
    ++frames_;
  }
  // Ends the turn: advances `now` by its busiest resource and returns
  // whether any frame was sent in it.
  bool EndTurn() {
    double t = costs_.host_cores ? host_ / costs_.host_cores : 0;
    for (size_t i = 0; i < cpu_.size(); ++i) {
      t = std::max({t, cpu_[i], out_[i], in_[i]});
    }
    now += t;
    std::fill(cpu_.begin(), cpu_.end(), 0.0);
    std::fill(out_.begin(), out_.end(), 0.0);
    std::fill(in_.begin(), in_.end(), 0.0);
    host_ = 0;
    const bool sent = frames_ > 0;
    frames_ = 0;
    return sent;
  }

  double now = 0;

 private:
  double Lcores(uint32_t node) const {
    return node < shards_ ? server_lcores_ : worker_lcores_;
  }
  double WireNs(double bits, uint32_t node) const {
    const double gbps =
        node < shards_ ? costs_.server_gbps : costs_.worker_gbps;
    return gbps > 0 ? bits / gbps : 0;
  }

  const SimCosts costs_;
  const uint32_t shards_;
  std::vector<double> cpu_, out_, in_;
  double host_ = 0;
  uint64_t frames_ = 0;
  const double server_lcores_, worker_lcores_;
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

// A send side's frames: real frames over a loopback port, each charged to
// the turn (SimClock::Charge) from node `src` to node `dst`.
class SimFrames {
 public:
  SimFrames(LoopbackPort* port, uint32_t dst, const ChunkLayout* layout,
            uint32_t burst, SimClock* clock)
      : frames_(port, dst, nullptr, layout, burst),
        layout_(layout),
        clock_(clock),
        src_(port->id()),
        dst_(dst) {}

  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    const uint32_t sent = frames_.Send(proto, seqs, n);
    for (uint32_t i = 0; i < sent; ++i) {
      clock_->Charge(src_, dst_, kDataHeaderBytes + layout_->Length(seqs[i]));
    }
    return sent;
  }
  void set_buffer(std::span<const float> v) {
    frames_.set_buffer(reinterpret_cast<const uint8_t*>(v.data()));
  }
  const ChunkLayout& layout() const { return *layout_; }

 private:
  PacketFrames<LoopbackPort> frames_;
  const ChunkLayout* layout_;
  SimClock* clock_;
  uint32_t src_, dst_;
};

// A send side with what it sends here: its frames and its first-pass order.
struct SimSender {
  SimSender(const SendSideConfig& c, SendOrder o, SimFrames f)
      : side(c), frames(std::move(f)), order(o) {}

  // The first pass in this sender's order; `rank`: --send_order=magnitude
  // ranks `data`'s chunks, as WorkerJob does for a training push.
  void Begin(uint32_t round, std::span<const float> data, uint32_t num_chunks,
             uint64_t now_ns, bool rank) {
    order.Fill(round, num_chunks, order_buf);
    if (rank && order.kind() == SendOrderKind::kMagnitude) {
      OrderByMagnitude(data, frames.layout(), order_buf, norms);
    }
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
  std::vector<double> norms;  // OrderByMagnitude's scratch
};

// No PROBE retry (probe_retry_ns = 0). A retry recovers a BITMAP lost on
// the way; here nothing is lost: the pipes deliver every message, and the
// one-slot mailboxes are emptied at once (the answer by the outbox, the
// sender's at its next Step), so a PROBE always gets its BITMAP. A retry
// could only fire spuriously, with a modelled round trip longer than its
// timeout, and add PROBEs the protocol did not need.
SendSideConfig WithoutProbeRetry(SendSideConfig c) {
  c.probe_retry_ns = 0;
  return c;
}

// The shards' threads meet in the phase at once (ClosePushes starts them
// together); a wait this long is a bug.
constexpr int64_t kPhaseTimeoutMs = 60000;

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
  // A worker: the whole gradient's model, and per server shard one push
  // side, one broadcast receive side and one control connection.
  struct Worker {
    std::vector<std::unique_ptr<SimSender>> push;     // to shard k
    std::vector<std::unique_ptr<ReceiveSide>> bcast;  // from shard k
    std::deque<PipeOutbox> out;          // requests of both sides, to shard k
    std::deque<ControlPipe> to_worker;   // shard k -> this worker
    std::deque<ControlPipe> to_server;   // this worker -> shard k
    std::deque<AcceptedInbox> accepted;  // push feedback: shard k's ACCEPTED
    std::vector<float> average;  // the model's mean (shared with `source`)
    std::unique_ptr<SimSource> source;    // RunIteration(grads)'s
    GradientSource* gradients = nullptr;  // that, or the caller's source
    std::unique_ptr<WorkerModel> model;   // the apps' worker model
    std::vector<Packet> replay;  // frames kept to replay as stale later
    std::vector<Bitmap> bcast_local;  // per shard, the closed broadcast
    Bitmap bcast_arrived;             // their union, whole gradient
  };
  struct ServerLink {  // a server shard's state for one worker
    ServerLink(const ReceiveSideConfig& rc, const SendSideConfig& sc,
               SendOrder o, SimFrames f)
        : push(rc), bcast(sc, o, std::move(f)) {}
    ReceiveSide push;  // the worker -> server
    SimSender bcast;   // server -> the worker, out of the server's port
    PipeOutbox out;    // requests of both sides, to the worker
  };
  // A server shard: an ordinary job over its partition's local layout,
  // and the transport its coordinator asks (server_driver.h). The
  // simulator calls the coordinator's steps in ServeIterations' order
  // (ClosePush, PlanPush and AnnouncePush of the next push, CloseBroadcast);
  // its sides differ only in that each broadcast side begins before the
  // next push is planned, at the same modelled time.
  struct Shard final : ServerTransport {
    Shard(const ClusterConfig& c, uint32_t k, uint32_t first,
          const ChunkLayout& local)
        : index(k),
          first_chunk(first),
          layout(local),
          job(c, TolerancePolicy::Create(c.policy), layout,
              std::vector<std::string>(c.num_workers, "simulated"),
              c.send_order, c.seed,
              c.server_shards > 1 ? "sim-server" + std::to_string(k)
                                  : "sim-server"),
          coord(job, *this, c.push_only),
          bcast_loss(c.bcast_loss,
                     c.bursts_on_broadcast ? c.bursts : BurstSchedule{},
                     HashMix(c.seed, 0xB0 + k)) {}

    // ServerTransport: the modelled time and burst of the boundary being
    // decided (the simulator sets them first); the requests wait in
    // `posts` until the simulator sends them (Flush).
    uint64_t Now() override { return at_ns; }
    std::span<const ReceiveSide* const> PushLanes(uint32_t w) override {
      return {&push_sides[w], 1};  // one lane per worker here
    }
    std::span<const SendSide* const> BroadcastLanes(uint32_t w) override {
      return {&bcast_sides[w], 1};
    }
    void Post(const ControlRequest& r) override { posts.push_back(r); }
    AcceptedSlots* Accepted() override { return &accepted; }
    bool InBurst(uint64_t /*it*/) override { return burst; }

    uint32_t index;
    uint32_t first_chunk;  // global chunk of local chunk 0
    ChunkLayout layout;
    ServerJob job;
    ServerCoordinator coord;
    LossInjector bcast_loss;
    AcceptedSlots accepted;             // push feedback, staged by the job
    std::vector<ControlRequest> posts;  // what the job decided to send
    uint64_t at_ns = 0;
    bool burst = false;
    std::vector<std::unique_ptr<ServerLink>> links;  // per worker
    std::vector<const ReceiveSide*> push_sides;      // links[w]->push
    std::vector<const SendSide*> bcast_sides;        // links[w]->bcast
    std::vector<uint32_t> order_buf;
    std::vector<bool> rx_from;  // PollServer: frames from each worker
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
    if (c.server_shards == 0 || c.server_lcores == 0 || c.worker_lcores == 0) {
      throw std::invalid_argument(
          "in-memory cluster: server_shards, server_lcores and worker_lcores "
          "must be >= 1");
    }
    WelcomeMsg wel;
    wel.consistent_broadcast = c.consistent_broadcast;
    if (std::string e = WorkerModel::CheckBroadcastFill(wel, c.bcast_fill);
        !e.empty()) {
      throw std::invalid_argument("in-memory cluster: " + e);
    }
    if (c.silent.rank >= static_cast<int64_t>(c.num_workers)) {
      throw std::invalid_argument(
          "in-memory cluster: the silent member " +
          std::to_string(c.silent.rank) + " is not a worker (0.." +
          std::to_string(c.num_workers - 1) + ")");
    }
    return c;
  }

  Impl(const ClusterConfig& c, std::vector<GradientSource*> sources)
      : cfg(Validated(c)),
        external(std::move(sources)),
        layout(ChunkLayout::ForMtu(c.gradient_floats * sizeof(float), c.mtu)),
        shard_map(layout.num_chunks(), c.server_shards),
        fabric(c.server_shards + c.num_workers, c.ring_size),
        clock(c.costs, c.server_shards, c.num_workers, c.server_lcores,
              c.worker_lcores),
        round(c.first_round) {
    AddShards();
    // Every frame a worker sends is a push frame: the first stale_replay of
    // a push are kept to replay at its shard in the next one.
    fabric.set_tap([this](const Packet& p) { KeepForReplay(p); });
    for (uint32_t w = 0; w < c.num_workers; ++w) {
      push_loss.emplace_back(std::make_unique<LossInjector>(
          c.push_loss, c.bursts, HashMix(c.seed, 0x100 + w)));
      fabric.port(Node(w)).set_loss(push_loss.back().get());
      AddWorker(w);
    }
    push_arrived.resize(c.num_workers);
    asleep.assign(c.num_workers, false);
    mean.assign(c.gradient_floats, 0.0f);
  }

  uint32_t Node(uint32_t rank) const { return cfg.server_shards + rank; }

  // Partitions: ChunkRanges's contiguous ranges, multiples of 64 chunks, so
  // each partition's bitmap is a word-aligned slice of the whole one. With
  // several shards, one phase: each shard's Reduce hands its block squares
  // to shard 0's leader (in process) and runs under its decision.
  void AddShards() {
    std::vector<ChunkLayout> local;
    std::vector<uint32_t> blocks;
    for (uint32_t k = 0; k < cfg.server_shards; ++k) {
      const uint32_t b = shard_map.begin(k), e = shard_map.end(k);
      if (b == e) {
        throw std::invalid_argument(
            "in-memory cluster: " + std::to_string(layout.num_chunks()) +
            " chunks leave server shard " + std::to_string(k) +
            " empty (partitions are multiples of 64 chunks): use fewer "
            "server_shards or a larger gradient");
      }
      const uint64_t bytes =
          layout.Offset(e - 1) + layout.Length(e - 1) - layout.Offset(b);
      local.emplace_back(bytes, layout.chunk_payload());
      blocks.push_back(PartitionNormBlocks(e - b));
    }
    if (cfg.server_shards > 1) {
      phase = std::make_unique<InProcessPhase>(
          TolerancePolicy::Create(cfg.policy), cfg.resync_every, blocks,
          std::chrono::milliseconds(kPhaseTimeoutMs));
    }
    for (uint32_t k = 0; k < cfg.server_shards; ++k) {
      ClusterConfig c = cfg;
      if (phase) {
        c.phase = &phase->link(k);
        c.model_floats = cfg.gradient_floats;
      }
      shards.push_back(
          std::make_unique<Shard>(c, k, shard_map.begin(k), local[k]));
      fabric.port(k).set_loss(&shards.back()->bcast_loss);
    }
  }

  // Shard k's slice of a whole-gradient buffer.
  template <class T>
  std::span<T> Slice(std::span<T> whole, uint32_t k) const {
    const Shard& sh = *shards[k];
    return whole.subspan(layout.Offset(sh.first_chunk) / sizeof(float),
                         sh.layout.total_bytes() / sizeof(float));
  }

  void AddWorker(uint32_t w) {
    workers.emplace_back(std::make_unique<Worker>());
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
    wk.bcast_local.resize(shards.size());
    for (auto& sh : shards) AddLink(w, *sh);
  }

  // Worker w's sides for shard `sh` and the shard's for the worker, over
  // the partition's local layout (frames carry local seqs).
  void AddLink(uint32_t w, Shard& sh) {
    Worker& wk = *workers[w];
    const auto rank = static_cast<uint16_t>(w);
    const uint32_t k = sh.index;
    wk.push.push_back(std::make_unique<SimSender>(
        WithoutProbeRetry(PushSendConfig(cfg.session, rank, cfg.burst)),
        SendOrder(cfg.send_order, w, cfg.num_workers, cfg.seed),
        SimFrames(&fabric.port(Node(w)), k, &sh.layout, cfg.burst, &clock)));
    wk.bcast.push_back(std::make_unique<ReceiveSide>(
        BroadcastReceiveConfig(cfg.session, sh.layout)));
    ControlPipe& to_worker = wk.to_worker.emplace_back();
    ControlPipe& to_server = wk.to_server.emplace_back();
    to_worker.one_way_ns = cfg.costs.control_one_way_ns;
    to_server.one_way_ns = cfg.costs.control_one_way_ns;
    wk.out.push_back(PipeOutbox{&to_server, wk.bcast.back().get(), &clock});
    wk.accepted.emplace_back();

    // The broadcast order is per worker too, so the workers' losses of
    // the mean fall on different chunks.
    sh.links.emplace_back(std::make_unique<ServerLink>(
        PushReceiveConfig(cfg.session, rank, sh.layout),
        WithoutProbeRetry(BroadcastSendConfig(cfg.session, rank, cfg.burst)),
        SendOrder(cfg.send_order, w, cfg.num_workers, HashMix(cfg.seed, 0xBC)),
        SimFrames(&fabric.port(k), Node(w), &sh.layout, cfg.burst, &clock)));
    ServerLink& ln = *sh.links.back();
    ln.out = PipeOutbox{&to_worker, &ln.push, &clock};
    sh.push_sides.push_back(&ln.push);
    sh.bcast_sides.push_back(&ln.bcast.side);
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
      for (uint32_t k = 0; k < shards.size(); ++k) {
        ServerLink& ln = *shards[k]->links[w];
        ReceiveSide& bcast = *wk.bcast[k];
        // A silent member reads nothing: what is sent to it waits.
        auto to_worker = [&](const ControlMessage& m) {
          const auto* rb = std::get_if<RoundBeginMsg>(&m);
          if (const auto* a = std::get_if<AcceptedMsg>(&m)) {
            wk.accepted[k].Put(*a);
          } else if (rb == nullptr) {
            DeliverToSides(m, &wk.push[k]->side, &bcast, clock.ns());
          } else if (rb->direction == Direction::kBroadcast) {
            bcast.Announce(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                           rb->deadline_ns, rb->min_fraction},
                           clock.ns());
          }
        };
        if (!asleep[w]) Deliver(wk.to_worker[k], to_worker);
        if (!shards[k]->job.alive(w)) {  // the server closed its connection
          wk.to_server[k].queue.clear();
          continue;
        }
        Deliver(wk.to_server[k], [&](const ControlMessage& m) {
          DeliverToSides(m, &ln.bcast.side, &ln.push, clock.ns());
        });
      }
    }
  }

  double NextControlTime() const {
    double t = std::numeric_limits<double>::infinity();
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (uint32_t k = 0; k < shards.size(); ++k) {
        t = std::min(t, workers[w]->to_server[k].next_at_ns());
        if (!asleep[w]) t = std::min(t, workers[w]->to_worker[k].next_at_ns());
      }
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

  // Hands every frame in `port`'s ring to `take`.
  template <class Take>
  void DrainRing(LoopbackPort& port, Take&& take) {
    rx_buf.resize(cfg.burst);
    uint16_t k;
    while ((k = port.RxBurst(rx_buf.data(),
                             static_cast<uint16_t>(rx_buf.size()))) > 0) {
      for (uint16_t i = 0; i < k; ++i) take(rx_buf[i]);
    }
  }

  // Shard k's RX step: every frame to the push receive side of the worker
  // that sent it, into the shard's sum; then each side's Step (STOP,
  // BITMAP).
  void PollServer(Shard& sh) {
    sh.rx_from.assign(workers.size(), false);
    MeanReducer& reducer = sh.job.iteration().reducer();
    DrainRing(fabric.port(sh.index), [&](const Packet& p) {
      // The source endpoint plays the role of the UDP source port.
      if (p.src < cfg.server_shards || p.src >= fabric.size()) {
        ++unknown_source;
        return;
      }
      const uint32_t w = p.src - cfg.server_shards;
      if (!sh.job.alive(w)) {  // as the apps: dropped and counted
        ++from_lost;
        return;
      }
      sh.rx_from[w] = true;
      sh.links[w]->push.OnFrame(
          p.bytes.data(), p.bytes.size(),
          [&](const DataHeader& h, const uint8_t* payload) {
            reducer.Accumulate(w, h.seq, payload);
          });
    });
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (!sh.job.alive(w)) continue;
      ServerLink& ln = *sh.links[w];
      ln.push.Step(clock.ns(), Drained(sh.rx_from[w]), ln.out);
    }
  }

  // Worker `w`'s RX step: each shard's frames into its slice of the
  // worker's copy of the mean, then each broadcast side's Step.
  void PollWorker(uint32_t w) {
    Worker& wk = *workers[w];
    auto* avg = reinterpret_cast<uint8_t*>(wk.model->avg().data());
    rx_from_shard.assign(shards.size(), false);
    DrainRing(fabric.port(Node(w)), [&](const Packet& p) {
      if (p.src >= cfg.server_shards) {
        ++unknown_source;
        return;
      }
      const Shard& sh = *shards[p.src];
      rx_from_shard[p.src] = true;
      uint8_t* base = avg + layout.Offset(sh.first_chunk);
      wk.bcast[p.src]->OnFrame(
          p.bytes.data(), p.bytes.size(),
          [&](const DataHeader& h, const uint8_t* payload) {
            std::memcpy(base + sh.layout.Offset(h.seq), payload, h.payload_len);
          });
    });
    for (uint32_t k = 0; k < shards.size(); ++k) {
      wk.bcast[k]->Step(clock.ns(), Drained(rx_from_shard[k]), wk.out[k]);
    }
  }

  // Every endpoint's RX step, whichever direction is running: a side keeps
  // answering while its round is over (a PROBE still in flight gets the
  // BITMAP of the closed round, as a real loop that steps every side does).
  void PollAll() {
    for (auto& sh : shards) PollServer(*sh);
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (!asleep[w]) PollWorker(w);
    }
  }

  // The tap's job: copies of the first stale_replay frames of a push.
  void KeepForReplay(const Packet& p) {
    if (p.src < cfg.server_shards || p.src >= fabric.size()) return;
    std::vector<Packet>& keep = workers[p.src - cfg.server_shards]->replay;
    if (keep.size() < cfg.stale_replay) keep.push_back(p);
  }

  // Replays frames of an earlier round and hostile input at the shards.
  void InjectStale() {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (Packet& p : workers[w]->replay) {
        p.src = Node(w);
        const uint32_t dst = p.dst;
        fabric.Inject(dst, std::move(p));
      }
      workers[w]->replay.clear();
    }
  }

  // ---- one round -----------------------------------------------------------
  // One loop turn of the round in direction `d`: the control messages due
  // land; the receivers poll (answering a PROBE that just landed); every
  // sender of `d` steps once per link, sending at most one burst; the turn
  // lasts as long as its busiest resource (SimClock); the receivers poll
  // again (that burst, STOP). Returns whether a burst was sent.
  bool Turn(Direction d) {
    DeliverAll();
    PollAll();
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (uint32_t k = 0; k < shards.size(); ++k) {
        if (d == Direction::kPush) {
          if (asleep[w]) continue;
          SimSender& tx = *workers[w]->push[k];
          tx.side.Step(clock.ns(), tx.frames, workers[w]->out[k]);
        } else if (shards[k]->job.alive(w)) {
          ServerLink& ln = *shards[k]->links[w];
          ln.bcast.side.Step(clock.ns(), ln.bcast.frames, ln.out);
        }
      }
    }
    const bool sent = clock.EndTurn();
    PollAll();
    return sent;
  }

  // Calls f(worker, shard) for every pair.
  template <class F>
  bool AllPairs(F&& f) const {
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (uint32_t k = 0; k < shards.size(); ++k) {
        if (!f(w, k)) return false;
      }
    }
    return true;
  }

  // First every shard's own rule, the apps' (ServerJob::PushOver,
  // BroadcastOver); then, as the simulator runs the workers too, their
  // sides. Push: every worker's send sides are done (STOP, or nothing
  // missing). Broadcast: also every worker's receive sides sent their
  // STOP, the time the round is measured by.
  // A silent member's pair is over when the server's side is (it never
  // sees its own), and a lost one's at once.
  bool RoundOver(Direction d) const {
    for (const auto& sh : shards) {
      const auto& links = sh->links;
      const bool over = d == Direction::kPush
                            ? sh->job.PushOver([&](uint32_t w) {
                                return links[w]->push.stopped();
                              }) != ServerJob::PushState::kOpen
                            : sh->job.BroadcastOver([&](uint32_t w) {
                                return links[w]->bcast.side.done();
                              });
      if (!over) return false;
    }
    return AllPairs([&](uint32_t w, uint32_t k) {
      const ServerLink& ln = *shards[k]->links[w];
      if (!shards[k]->job.alive(w)) return true;  // the job went on without
      if (d == Direction::kPush) {
        return asleep[w] ? ln.push.stopped() : workers[w]->push[k]->side.done();
      }
      return (asleep[w] || workers[w]->bcast[k]->stopped()) &&
             ln.bcast.side.done();
    });
  }

  const ReceiveSide& Receiver(Direction d, uint32_t w, uint32_t k) const {
    return d == Direction::kPush ? shards[k]->links[w]->push
                                 : *workers[w]->bcast[k];
  }

  // The earliest deadline of a receive side still open in direction `d`.
  double NextDeadline(Direction d) const {
    double t = std::numeric_limits<double>::infinity();
    AllPairs([&](uint32_t w, uint32_t k) {
      const ReceiveSide& rx = Receiver(d, w, k);
      const uint64_t deadline = rx.receiver().deadline_ns();
      if (!rx.stopped() && deadline != 0) {
        t = std::min(t, static_cast<double>(deadline));
      }
      return true;
    });
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

  // Returns when the servers last lost a silent member in it (0: never):
  // the round lasted at least that long, whatever the live ones saw.
  double RunRound(Direction d, IterationOutcome& out) {
    double lost_at = 0;
    uint64_t mark = Progress(d);
    double last_progress = clock.now;
    const double timeout_ns = 1e6 * cfg.round_timeout_ms;
    const bool someone_asleep =
        std::find(asleep.begin(), asleep.end(), true) != asleep.end();
    while (!RoundOver(d)) {
      const bool sent = Turn(d);
      // Progress is made in turns, at the turn's time (not after a wait).
      const uint64_t next = Progress(d);
      if (next != mark) {
        mark = next;
        last_progress = clock.now;
      } else if (clock.now - last_progress > timeout_ns) {
        LoseSilent(d, &out.lost);  // throws when the job ends
        last_progress = lost_at = clock.now;
        continue;
      }
      if (!sent && !RoundOver(d)) {
        // A silent member's round has nothing else to wait for than the
        // servers' timeout. Without one, no event is a protocol bug.
        WaitForEvent(someone_asleep ? std::min(NextDeadline(d),
                                               last_progress + timeout_ns + 1)
                                    : NextDeadline(d));
      }
    }
    return lost_at;
  }

  // ---- a silent member -----------------------------------------------------
  // The configured member stops as direction `d` of this iteration begins,
  // and stays stopped.
  void MaybeSleep(Direction d) {
    const ClusterConfig::SilentMember& s = cfg.silent;
    if (s.rank >= 0 && s.iteration == iteration && s.from == d) {
      asleep[static_cast<size_t>(s.rank)] = true;
    }
  }

  // A round without progress for the timeout. Under continue each shard
  // loses the live workers its own round still waits for, as each
  // server process does (ServerJob::LoseSilent), and the round goes on;
  // else, or when a shard waits for every live worker, the job ends with
  // the shard's text. `lost`: the workers taken out, once each.
  void LoseSilent(Direction d, std::vector<uint32_t>* lost) {
    if (!cfg.continue_on_worker_loss) throw std::runtime_error(Stalled(d));
    const bool bcast = d == Direction::kBroadcast;
    for (auto& sh : shards) {
      auto waiting = [&](uint32_t w) {
        const ServerLink& ln = *sh->links[w];
        return bcast ? !ln.bcast.side.done() : !ln.push.stopped();
      };
      std::vector<uint32_t> dropped;
      const std::string failure =
          sh->job.LoseSilent(iteration, bcast, cfg.round_timeout_ms, waiting,
                             Stalled(d, *sh), &dropped);
      if (!failure.empty()) throw std::runtime_error(failure);
      for (const uint32_t w : dropped) {
        if (std::find(lost->begin(), lost->end(), w) == lost->end()) {
          lost->push_back(w);
        }
      }
    }
  }

  // What moves a round in direction `d`, as the apps' loops count it.
  uint64_t Progress(Direction d) const {
    uint64_t mark = 0;
    AllPairs([&](uint32_t w, uint32_t k) {
      const ServerLink& ln = *shards[k]->links[w];
      if (d == Direction::kPush) {
        mark += workers[w]->push[k]->side.progress() + ln.push.progress();
      } else {
        mark += ln.bcast.side.progress() + workers[w]->bcast[k]->progress();
      }
      return true;
    });
    return mark;
  }

  // The first shard with a round still open names the workers it waits for.
  std::string Stalled(Direction d) const {
    uint32_t k = 0;
    while (k + 1 < shards.size() && AllPairs([&](uint32_t w, uint32_t j) {
             return j != k || !shards[j]->job.alive(w) ||
                    Receiver(d, w, j).stopped();
           })) {
      ++k;
    }
    return Stalled(d, *shards[k]);
  }
  std::string Stalled(Direction d, const Shard& sh) const {
    const uint32_t k = sh.index;
    const std::string why =
        d == Direction::kPush
            ? sh.job.PushStalled(
                  iteration, cfg.round_timeout_ms,
                  [&](uint32_t w) {
                    return sh.links[w]->push.receiver().received();
                  })
            : sh.job.BroadcastStalled(iteration, cfg.round_timeout_ms,
                                      [&](uint32_t w) {
                                        return sh.links[w]->bcast.side.done() &&
                                               workers[w]->bcast[k]->stopped();
                                      });
    const std::string who =
        shards.size() > 1 ? "server shard " + std::to_string(k) + ": " : "";
    return who + why + " (modelled time; --loss, --round_timeout_ms)";
  }

  // ---- one iteration -------------------------------------------------------
  // What WorkerModel reports as a failure is a bug of the simulation.
  static void Check(const std::string& why) {
    if (!why.empty()) throw std::logic_error("in-memory worker: " + why);
  }

  // Partitions' bitmaps (local, per shard) into the whole gradient's:
  // partitions start on word boundaries.
  void Union(std::span<const Bitmap> local, Bitmap* whole) const {
    if (local.size() == 1) {
      *whole = local[0];
      return;
    }
    whole_words.assign(BitmapWords(layout.num_chunks()), 0);
    for (uint32_t k = 0; k < shards.size(); ++k) {
      const auto words = local[k].words();
      std::copy(words.begin(), words.end(),
                whole_words.begin() + shards[k]->first_chunk / 64);
    }
    whole->Resize(layout.num_chunks());
    whole->AssignWords(whole_words);
  }

  // A worker's ACCEPTED, one per shard (each delivered by its control
  // pipe), as the whole gradient's set (push feedback).
  struct SimFeedback {
    const Impl* cluster;
    Worker* worker;
    bool TakeAccepted(uint32_t round, Bitmap* out) {
      std::vector<Bitmap> local(cluster->shards.size());
      for (uint32_t k = 0; k < local.size(); ++k) {
        if (!worker->accepted[k].Take(round, &local[k])) return false;
      }
      cluster->Union(local, out);
      return true;
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

  // What shard `sh`'s job posted, sent now: each ACCEPTED, and each
  // ROUND_BEGIN (of iteration `it`) to every worker in the simulator's
  // round numbering (it may start anywhere: first_round tests the
  // wrap-around).
  void Flush(Shard& sh, uint64_t it) {
    for (const ControlRequest& r : sh.posts) {
      AcceptedMsg m;
      if (const auto* rb = std::get_if<RoundBeginRequest>(&r)) {
        RoundBeginMsg begin = RoundBeginMessage(*rb);
        begin.round = cfg.first_round + rb->round;
        begin.iteration = static_cast<uint32_t>(it);
        for (uint32_t w = 0; w < workers.size(); ++w) {
          // None to a worker the job went on without (its connection
          // closed).
          if (sh.job.alive(w)) {
            workers[w]->to_worker[sh.index].Send(begin, clock.now);
          }
        }
      } else if (const auto* a = std::get_if<AcceptedRequest>(&r);
                 a != nullptr && sh.accepted.Take(a->peer, a->round, &m)) {
        workers[a->peer]->to_worker[sh.index].Send(m, clock.now);
      }
    }
    sh.posts.clear();
  }

  // Each shard opens iteration `it`'s push (its coordinator's PlanPush,
  // the sides, AnnouncePush). As the apps' servers do: the first at the
  // job's start, every later one as the push before it closes, beside
  // that push's broadcast (its deadline runs from then).
  void OpenPush(uint64_t it, uint32_t push_round) {
    for (auto& sh : shards) {
      sh->at_ns = clock.ns();
      sh->coord.PlanPush(it);
      const PushOpening& open = sh->coord.opening();
      for (auto& ln : sh->links) {
        ln->push.Begin(push_round, open.announce.p, 0, 0, clock.ns());
        ln->push.DeadlineAfterFirstChunk(open.deadline_after_first_ns,
                                         open.announce.min_fraction);
      }
      sh->coord.AnnouncePush();
      Flush(*sh, it);
    }
    push_opened = it + 1;
  }

  // Push: every worker -> each shard; each shard decides STOP with its p.
  void BeginPush(const IterationOutcome& out,
                 std::span<const std::vector<float>> grads) {
    push_start_ns = clock.now;
    MaybeSleep(Direction::kPush);
    if (push_opened != iteration + 1) OpenPush(iteration, out.push_round);
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (asleep[w]) continue;
      Worker& wk = *workers[w];
      if (!grads.empty()) wk.source->set_current(&grads[w]);
      bool more = true;
      // In one process the server cannot go away while a worker waits.
      Check(wk.model->Prepare(iteration, &more, {}));
      for (uint32_t k = 0; k < shards.size(); ++k) {
        wk.push[k]->Begin(out.push_round,
                          Slice(std::span<const float>(wk.model->grad()), k),
                          shards[k]->layout.num_chunks(), clock.ns(),
                          !wk.model->IsResync(iteration));
        // Open the broadcast receiver now, so no early broadcast frame is
        // lost. Its p is unknown until the broadcast's ROUND_BEGIN lands
        // (the policy may switch after this push), so until then it may
        // only STOP on a complete buffer (p = 0), which satisfies any p.
        // Opening it with the previous round's p let a worker STOP by a
        // stale, higher p.
        wk.bcast[k]->Begin(out.bcast_round, 0.0, 0, 0, clock.ns());
      }
    }
    InjectStale();
  }

  // Every shard's ClosePush (its coordinator's). With several shards each
  // one's Reduce asks the phase (phase_link.h) and blocks until all have
  // asked, as shards in their own processes do: one thread each, joined
  // here. The first shard's failure, or "".
  std::string ClosePushes(uint64_t push_end, bool burst) {
    std::vector<std::string> failures(shards.size());
    auto close = [&](Shard& sh) {
      sh.at_ns = push_end;
      sh.burst = burst;
      failures[sh.index] = sh.coord.ClosePush(iteration);
    };
    if (shards.size() == 1) {
      close(*shards[0]);
    } else {
      std::vector<std::thread> threads;
      for (auto& sh : shards) threads.emplace_back(close, std::ref(*sh));
      for (auto& t : threads) t.join();
    }
    for (std::string& f : failures) {
      if (!f.empty()) return std::move(f);
    }
    return "";
  }

  void EndPush(IterationOutcome& out, double lost_at) {
    double push_end = std::max(push_start_ns, lost_at);
    AllPairs([&](uint32_t w, uint32_t k) {
      if (asleep[w]) return true;
      push_end = std::max(
          push_end, static_cast<double>(workers[w]->push[k]->side.done_ns()));
      return true;
    });
    out.push_round_ns = push_end - push_start_ns;
    double first = push_end;
    AllPairs([&](uint32_t w, uint32_t k) {
      const uint64_t f = shards[k]->links[w]->push.first_ns();
      if (f != 0) first = std::min(first, static_cast<double>(f));
      return true;
    });
    out.push_first_chunk_ns = first - push_start_ns;
    // What the servers decide (their coordinators, as every server's):
    // each gathers its closed push (one lane per worker here); mean,
    // policy, rows, broadcast.
    for (auto& sh : shards) {
      for (auto& ln : sh->links) ln->push.Close();
    }
    out.failure = ClosePushes(static_cast<uint64_t>(push_end), out.burst);
    // The whole gradient's view is the union of the shards'.
    std::vector<Bitmap> local(shards.size());
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (auto& sh : shards) {
        local[sh->index] = sh->coord.closed_push().arrived()[w];
      }
      Union(local, &push_arrived[w]);
    }
    out.grad_norm = shards[0]->coord.reduced().norm;
    for (auto& sh : shards) {
      const std::span<const float> part = sh->job.iteration().mean();
      std::copy(part.begin(), part.end(),
                Slice(std::span<float>(mean), sh->index).begin());
    }
  }

  // Broadcast: each shard -> every worker; each worker decides STOP with
  // the p its ROUND_BEGIN announces.
  void BeginBroadcast(IterationOutcome& out) {
    out.bcast_tolerance = shards[0]->coord.reduced().broadcast;
    bcast_start_ns = clock.now;
    MaybeSleep(Direction::kBroadcast);
    for (auto& sh : shards) {
      Flush(*sh, iteration);  // ACCEPTED, then ROUND_BEGIN
      for (uint32_t w = 0; w < workers.size(); ++w) {
        sh->job.BroadcastOrder(w, iteration, sh->layout.num_chunks(),
                               &sh->order_buf);
        sh->links[w]->bcast.Begin(out.bcast_round, sh->job.iteration().mean(),
                                  sh->order_buf, sh->layout.num_chunks(),
                                  clock.ns());
      }
    }
  }

  void EndBroadcast(IterationOutcome& out, double lost_at) {
    double bcast_end = std::max(bcast_start_ns, lost_at);
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (asleep[w]) continue;
      Worker* wk = workers[w].get();
      for (uint32_t k = 0; k < shards.size(); ++k) {
        ReceiveSide& rx = *wk->bcast[k];
        bcast_end = std::max(bcast_end, static_cast<double>(rx.stop_ns()));
        rx.Close();
        rx.receiver().SnapshotBitmap(wk->bcast_local[k]);
      }
      Union(wk->bcast_local, &wk->bcast_arrived);
    }
    out.bcast_round_ns = bcast_end - bcast_start_ns;
    // A broadcast shorter than a control message's flight: the ACCEPTED
    // of push feedback is still on its way. Its landing time, then.
    while (cfg.push_feedback && std::isfinite(NextControlTime())) {
      clock.now = std::max(clock.now, NextControlTime());
      DeliverAll();
    }
    for (uint32_t w = 0; w < workers.size(); ++w) {
      if (!asleep[w]) Absorb(w);
    }
    // Every shard's rows get their broadcast half (its coordinator).
    for (auto& sh : shards) {
      sh->at_ns = clock.ns();
      if (std::string e = sh->coord.CloseBroadcast(iteration); !e.empty()) {
        throw std::runtime_error(e);
      }
    }
  }

  // Every worker that is neither lost nor silent says BYE to every shard
  // after its last iteration, as the apps' workers do.
  void Finish() {
    for (auto& sh : shards) {
      for (uint32_t w = 0; w < workers.size(); ++w) {
        if (sh->job.alive(w) && !asleep[w]) sh->job.OnBye(w);
      }
    }
  }

  void Absorb(uint32_t w) {
    Worker& wk = *workers[w];
    SimFeedback feedback{this, &wk};
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
      if (asleep[w]) continue;  // a stopped process writes no row
      const Worker& wk = *workers[w];
      IterationRecord r;
      r.iteration = iteration;
      r.rank = w;
      double push_done = push_start_ns, bcast_done = bcast_start_ns;
      for (uint32_t k = 0; k < shards.size(); ++k) {
        const SendSide& side = wk.push[k]->side;
        push_done = std::max(push_done, static_cast<double>(side.done_ns()));
        bcast_done =
            std::max(bcast_done, static_cast<double>(wk.bcast[k]->stop_ns()));
        const SenderRound& push = side.sender();
        r.passes = std::max(r.passes, push.passes());
        r.bcast_passes = std::max(
            r.bcast_passes, shards[k]->links[w]->bcast.side.sender().passes());
        r.packets_sent += push.packets_sent();
        r.packets_resent += push.packets_resent();
      }
      r.send_latency_us = (push_done - push_start_ns) / 1e3;
      r.bcast_latency_us = (bcast_done - bcast_start_ns) / 1e3;
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
    for (auto& sh : shards) sh->bcast_loss.SetIteration(iteration);
    out.burst = push_loss[0]->InBurst();
    out.push_tolerance = shards[0]->job.PushTolerance(iteration);

    BeginPush(out, grads);
    EndPush(out, RunRound(Direction::kPush, out));
    if (!out.failure.empty()) return out;  // no mean goes out
    BeginBroadcast(out);
    // The next push opens beside this broadcast (ServerJob's order).
    OpenPush(iteration + 1, round + 2);
    EndBroadcast(out, RunRound(Direction::kBroadcast, out));
    AddRecords(out);
    ++iteration;
    round += 2;
    return out;
  }

  ClusterConfig cfg;
  std::vector<GradientSource*> external;  // the caller's, one per worker
  ChunkLayout layout;                     // the whole gradient's
  ChunkRanges shard_map;                  // its partitions
  LoopbackFabric fabric;
  SimClock clock;
  // A sharded job's phase (phase_link.h); null with one shard.
  std::unique_ptr<InProcessPhase> phase;
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<Bitmap> push_arrived;  // per worker, the closed push (whole)
  std::vector<float> mean;           // the shards' means, whole
  std::vector<std::unique_ptr<LossInjector>> push_loss;
  std::vector<std::unique_ptr<Worker>> workers;
  uint32_t round;
  uint64_t iteration = 0;
  uint64_t push_opened = 0;   // the last push opened + 1 (0: none yet)
  double push_start_ns = 0;
  double bcast_start_ns = 0;
  uint64_t poll_gen = 0;  // RX polls so far, all endpoints
  uint64_t unknown_source = 0;
  uint64_t from_lost = 0;     // frames of workers the job went on without
  std::vector<bool> asleep;   // per worker: the silent member, once stopped
  std::vector<bool> rx_from_shard;  // PollWorker: frames from each shard
  std::vector<Packet> rx_buf;
  mutable std::vector<uint64_t> whole_words;  // Union's
};

MemoryCluster::MemoryCluster(const ClusterConfig& config,
                             std::vector<GradientSource*> sources)
    : impl_(std::make_unique<Impl>(config, std::move(sources))) {}
MemoryCluster::~MemoryCluster() = default;

IterationOutcome MemoryCluster::RunIteration(
    std::span<const std::vector<float>> grads) {
  return impl_->Run(grads);
}

void MemoryCluster::Finish() { impl_->Finish(); }
const ClusterConfig& MemoryCluster::config() const { return impl_->cfg; }
const ChunkLayout& MemoryCluster::layout() const { return impl_->layout; }
uint32_t MemoryCluster::shard_first_chunk(uint32_t k) const {
  return impl_->shards.at(k)->first_chunk;
}
const ChunkLayout& MemoryCluster::shard_layout(uint32_t k) const {
  return impl_->shards.at(k)->layout;
}
const std::vector<float>& MemoryCluster::server_mean() const {
  return impl_->mean;
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
  for (const auto& sh : impl_->shards) {
    for (const auto& ln : sh->links) receivers.push_back(&ln->push.receiver());
  }
  AddReceiverCounters("push_", receivers, true, &c);
  uint64_t injected = 0;
  for (const auto& l : impl_->push_loss) injected += l->dropped();
  c.emplace_back("injected_drops", injected);
  c.emplace_back("frames_unpinned_source", impl_->unknown_source);
  c.emplace_back("frames_from_lost_workers", impl_->from_lost);
  impl_->shards[0]->job.AddCounters(&c);
  return c;
}

std::vector<std::pair<std::string, std::string>> MemoryCluster::server_info()
    const {
  auto info = impl_->shards[0]->job.Info();
  if (impl_->shards.size() > 1) {
    info.emplace_back("server_shards", std::to_string(impl_->shards.size()));
  }
  return info;
}

std::vector<IterationRecord>& MemoryCluster::server_rows(uint32_t k) {
  return impl_->shards.at(k)->job.rows();
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
  for (const auto& sh : impl_->shards) {
    for (const auto& ln : sh->links) add(ln->push);
  }
  for (const auto& wk : impl_->workers) {
    for (uint32_t k = 0; k < wk->bcast.size(); ++k) {
      add(*wk->bcast[k]);
      c.control_messages += wk->to_worker[k].sent + wk->to_server[k].sent;
    }
  }
  c.malformed += impl_->unknown_source;
  for (uint32_t i = 0; i < impl_->fabric.size(); ++i) {
    c.injected_drops += impl_->fabric.port(i).injected_drops();
    c.ring_drops += impl_->fabric.port(i).ring_drops();
  }
  return c;
}

}  // namespace dblp
