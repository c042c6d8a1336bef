// The kernel-UDP worker of a whole job (udp_job.h): a push SendSide and a
// broadcast ReceiveSide over one UDP socket, around a GradientSource.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dblp/base/poll_loop.h"
#include "dblp/base/rng.h"
#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/shard_claim.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/job/counters.h"
#include "dblp/job/diagnosis.h"
#include "dblp/job/rows.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/resync.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/round/send_order.h"
#include "dblp/round/send_side.h"
#include "dblp/transport/packet_frames.h"
#include "dblp/transport/udp_transport.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "udp/udp_common.h"
#include "udp/udp_job.h"

namespace dblp {
namespace {

using udp::EventQueue;
using udp::kServerEndpoint;
using udp::NowNs;
using udp::Outbox;

class JobWorker {
 public:
  JobWorker(const UdpJobWorkerOptions& o, GradientSource& source)
      : o_(o), source_(source) {}
  UdpJobWorkerResult Run();

  // What the model asks of the control plane (AcceptedChannel): push
  // feedback's ACCEPTED, and whether the server is gone. Datapath thread.
  bool TakeAccepted(uint32_t round, Bitmap* out) {
    return accepted_.Take(round, out);
  }
  bool server_gone() const {
    return server_gone_.load(std::memory_order_acquire);
  }
  const std::string& failure() const { return gone_why_; }

 private:
  UdpJobWorkerResult Fail(int code, const std::string& msg) {
    return udp::Failed(&res_, code, msg);
  }
  std::string CheckOptions();
  std::string Join(ControlSidecar& sidecar);

  // Sidecar thread.
  void OnMessage(const ControlMessage& m);
  void OnWakeup();
  void ServerGone(const std::string& why);

  // Datapath thread.
  std::string AwaitWelcome();
  std::string SetUpJob();
  std::string StartSource();
  std::string RunIterations();
  bool TakeEvents();
  // The server's text, and what this worker measured itself (the server
  // cannot see our injector).
  std::string GoneWhy() const {
    return gone_why_ + MeasuredCauses(0, loss_->dropped(), loss_->considered());
  }
  bool Quit() const {
    return o_.quit != nullptr && o_.quit->load(std::memory_order_relaxed);
  }
  uint64_t Progress() const;
  std::string AwaitRoundBegin(uint32_t round);

 public:
  // The WorkerJob's transport (WorkerExchanger).
  std::string Exchange(uint64_t it, std::span<const uint32_t> order);
  WorkerExchange Exchanged(uint64_t it) const;
  const Bitmap& arrived() const { return arrived_; }

 private:
  bool ExchangeDone();
  bool Receive(bool* progress);
  std::string Stalled(uint64_t it) const;
  void Finish(Outbox& out, const std::string& failure);
  void Report();

  const UdpJobWorkerOptions& o_;
  GradientSource& source_;
  UdpJobWorkerResult res_;     // datapath only
  UdpSocketPort port_;         // datapath only
  sockaddr_in server_ctrl_{};  // datapath only
  // Set before the sidecar thread starts, read-only after.
  ControlSidecar* sc_ = nullptr;
  ConnId conn_ = 0;

  // Shared with the sidecar; each field's writer noted. The datapath reads
  // a text only after the flag written after it (acquire).
  WorkerHandshake handshake_{o_.secret};  // sidecar (Run starts it before)
  JoinMsg join_;        // Run: wo before the sidecar thread; sidecar: ro
  WelcomeMsg welcome_;  // sidecar: wo before `welcomed_`
  std::atomic<bool> welcomed_{false};
  std::string gone_why_;  // sidecar: wo (once) before `server_gone_`
  std::atomic<bool> server_gone_{false};
  std::atomic<bool> closed_{false};  // sidecar: wo
  AcceptedInbox accepted_;  // sidecar: puts; datapath (the model): takes
  // The two directions: made by the datapath once WELCOME named the
  // session and rank, then published (release) for the sidecar, which
  // hands the push side STOP and BITMAP, the broadcast side PROBE; null
  // before.
  std::unique_ptr<SendSide> push_;
  std::unique_ptr<ReceiveSide> bcast_;
  std::atomic<bool> sides_live_{false};
  EventQueue<DatapathEvent> events_;     // sidecar -> datapath: ROUND_BEGIN
  EventQueue<ControlRequest> requests_;  // datapath -> sidecar
  std::vector<ControlRequest> sending_;  // sidecar only
  // The job's failure text: datapath wo before its FinishRequest; the
  // sidecar reads it when handling that request.
  std::string failure_;

  // Datapath only, from SetUpJob on.
  ChunkLayout layout_;
  // The job (the same as dblp-worker's): the model (the gradient the push
  // sends, the mean the broadcast fills), the push order, the rows.
  std::optional<WorkerJob> job_;
  Outbox* out_ = nullptr;  // the datapath's, for the sides' requests
  const SendSide* push_sides_[1] = {};
  std::unique_ptr<PacketFrames<UdpSocketPort>> frames_;
  std::unique_ptr<RxLossInjector> loss_;
  std::vector<Packet> pkts_;
  std::optional<RoundPacer> pacer_;
  std::vector<DatapathEvent> taken_;
  bool have_go_ = false;  // a push ROUND_BEGIN came; go_round_ is its round
  uint32_t go_round_ = 0;
  uint64_t announcements_ = 0;  // ROUND_BEGINs taken: they move the job
  double go_p_ = 0;
  bool go_critical_ = false;
  // What the server announced for this iteration's push.
  double push_p_ = 0;
  bool push_critical_ = false;
  Bitmap arrived_;  // this iteration's broadcast chunks
  uint64_t poll_gen_ = 0, drained_gen_ = 0;
  uint64_t bcast_done_ns_ = 0;
  uint64_t bitmaps_ = 0;  // BITMAPs that started a pass or ended a round
  uint64_t unpinned_ = 0;
  // The rows, streamed as the iterations end and kept for the summary.
  RowStream row_stream_;
  RunReport report_;
};

std::string JobWorker::CheckOptions() {
  if (std::string e = udp::CheckCommon(o_.mtu, o_.round_timeout_ms);
      !e.empty()) {
    return e;
  }
  if (source_.floats() == 0) return "the gradient source has no floats";
  if (o_.burst == 0 || o_.burst > UdpSocketPort::kMaxBurst) {
    return "burst=" + std::to_string(o_.burst) + " must be in 1.." +
           std::to_string(UdpSocketPort::kMaxBurst);
  }
  std::string err;
  if (!udp::CheckCpu(o_.cpu, &err)) return "worker datapath: " + err;
  if (!ParseIpv4Endpoint(o_.server, false, false, "127.0.0.1:9100",
                         &server_ctrl_, &err)) {
    return "--server: " + err;
  }
  try {
    ParseLossSpec(o_.loss);
  } catch (const std::exception& e) {
    return std::string("loss: ") + e.what();
  }
  return "";
}

// Connects to the server and sends the JOIN (the sidecar answers the rest
// of the handshake).
std::string JobWorker::Join(ControlSidecar& sidecar) {
  std::string err;
  if (!sidecar.Connect(o_.server, o_.join_timeout_ms, &conn_, &err,
                       UdpServerApp())) {
    return "cannot reach the server at " + o_.server + ": " + err;
  }
  JoinMsg join;
  join.worker_name = o_.name;
  join.total_bytes = source_.floats() * sizeof(float);
  join.mtu = o_.mtu;
  try {
    join.layers = source_.Layers();
  } catch (const std::exception& e) {
    return std::string("the gradient source's layers: ") + e.what();
  }
  // Our data socket, which the server pins (0.0.0.0: the address it sees
  // our control connection come from).
  join.data_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr);
  join.data_udp_port = port_.bound_port();
  handshake_.Start(&join);
  join_ = join;
  // A JOIN the codec refuses is said now, not at the join deadline.
  if (!sidecar.Send(conn_, join, &err)) {
    return "cannot send JOIN to the server at " + o_.server + ": " + err;
  }
  return "";
}

UdpJobWorkerResult JobWorker::Run() {
  if (std::string e = CheckOptions(); !e.empty()) return Fail(2, e);
  std::string err;
  // Before the JOIN: a directory that cannot take the rows fails the
  // worker now, not after the whole job.
  row_stream_.set_on_error(o_.rows_on_error);
  if (!o_.out_dir.empty() && !row_stream_.Open(o_.out_dir, &err)) {
    return Fail(2, err);
  }
  UdpPortOptions popts;
  popts.max_datagram = o_.mtu - udp::kIpUdpHeaders;
  if (!port_.Open(o_.data, popts, &err)) return Fail(1, "--data: " + err);

  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId, const ControlMessage& m) { OnMessage(m); };
  cb.on_close = [this](ConnId, const std::string& reason) {
    ServerGone("control connection to the server at " + o_.server +
               " closed: " + reason);
    closed_.store(true, std::memory_order_release);
  };
  cb.on_wakeup = [this] { OnWakeup(); };
  ControlSidecar sidecar(cb);
  sc_ = &sidecar;
  if (std::string e = Join(sidecar); !e.empty()) return Fail(1, e);
  SidecarThread sidecar_thread(sidecar);
  if (!udp::PinThisThread(o_.cpu, &err)) return Fail(2, err);
  if (std::string e = AwaitWelcome(); !e.empty()) return Fail(1, e);

  Outbox out(&requests_, &sidecar);
  std::string failure = SetUpJob();
  out_ = &out;
  if (failure.empty()) failure = RunIterations();
  if (!failure.empty()) {
    res_.exit_code = 1;
    res_.error = failure;
    try {
      source_.Fail(failure);
    } catch (const std::exception&) {
      // Telling the trainer is best effort: the job failed either way.
    }
  }
  Finish(out, failure);
  sidecar_thread.Stop();
  Report();
  return res_;
}

// ---- sidecar thread -------------------------------------------------------

void JobWorker::OnMessage(const ControlMessage& m) {
  if (const auto* c = std::get_if<ChallengeMsg>(&m)) {
    ProofMsg proof;
    if (std::string why = handshake_.OnChallenge(*c, &proof); !why.empty()) {
      sc_->Close(conn_, why);
      return ServerGone(why);
    }
    sc_->Send(conn_, proof);
    sc_->Authenticate(conn_, handshake_.Keys());
  } else if (const auto* w = std::get_if<WelcomeMsg>(&m)) {
    // Authenticated, then checked against what we can hold.
    std::string why = handshake_.CheckWelcome(*w);
    if (why.empty()) why = ValidateWelcome(*w, join_);
    if (why.empty() && IsShardedWelcome(*w)) {
      why = "the job has " + std::to_string(w->shard_count) +
            " server shards, which only dblp-worker (DPDK) joins; run "
            "dblp-worker, or one dblp-server without --shards";
    }
    if (!why.empty() || welcomed_.load()) {
      if (why.empty()) why = "the server sent WELCOME twice";
      why = "the server's WELCOME is refused: " + why;
      sc_->Send(conn_, ErrorMsg{3, why});
      sc_->Close(conn_, why);
      return ServerGone(why);
    }
    welcome_ = *w;
    welcomed_.store(true, std::memory_order_release);
  } else if (!welcomed_.load() && !std::holds_alternative<ErrorMsg>(m)) {
    const std::string why =
        std::string("the server sent ") + ControlTypeName(m) + " out of order";
    sc_->Close(conn_, why);
    ServerGone(why);
  } else if (const auto* a = std::get_if<AcceptedMsg>(&m)) {
    accepted_.Put(*a);  // push feedback: what the server summed
  } else if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
    events_.Push(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                 rb->deadline_ns, rb->min_fraction,
                                 rb->critical});
  } else if (sides_live_.load(std::memory_order_acquire) &&
             DeliverToSides(m, push_.get(), bcast_.get(), NowNs())) {
    // STOP or BITMAP for the push, PROBE for the broadcast.
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    ServerGone("the server at " + o_.server + ": " + e->text);
  } else if (std::holds_alternative<ByeMsg>(m)) {
    ServerGone("server said BYE");
  }
}

void JobWorker::ServerGone(const std::string& why) {
  if (server_gone_.load()) return;  // the first cause is the one told
  gone_why_ = why;
  server_gone_.store(true, std::memory_order_release);
}

void JobWorker::OnWakeup() {
  if (!requests_.Drain(&sending_)) return;
  for (const ControlRequest& r : sending_) {
    if (const auto* f = std::get_if<FinishRequest>(&r)) {
      if (f->ok) {
        // The server closes once every worker said BYE. Closing first
        // would race the server's next ROUND_BEGIN: its write could fail
        // on our closed socket before it read this BYE, and a finished
        // worker would look lost. Finish waits (bounded) for that close.
        sc_->Send(conn_, ByeMsg{"done"});
      } else {
        sc_->Send(conn_, ErrorMsg{2, failure_});
        sc_->Close(conn_, "job failed");
      }
    } else {
      // The push side's PROBE; the broadcast side's STOP and BITMAP.
      for (const ControlMessage& m : SideRequestMessages(r, bcast_.get())) {
        sc_->Send(conn_, m);
      }
    }
  }
}

// ---- datapath thread ------------------------------------------------------

std::string JobWorker::AwaitWelcome() {
  if (!udp::WaitFor(
          [&] { return welcomed_.load() || server_gone_.load() || Quit(); },
          o_.join_timeout_ms) ||
      !welcomed_.load()) {
    if (Quit()) return "interrupted";
    return "no WELCOME from the server at " + o_.server +
           (server_gone_.load()
                ? " (" + gone_why_ + ")"
                : " within " + std::to_string(o_.join_timeout_ms) + " ms");
  }
  // OnMessage authenticated and validated it (ValidateWelcome).
  layout_ = ChunkLayout(welcome_.total_bytes, welcome_.chunk_payload);
  return "";
}

// The server's data address, the source, the send order and the sides.
std::string JobWorker::SetUpJob() {
  const WelcomeMsg& w = welcome_;
  res_.rank = w.rank;
  res_.chunks = layout_.num_chunks();
  sockaddr_in server_data = server_ctrl_;
  if (w.server_ipv4 != 0) server_data.sin_addr.s_addr = htonl(w.server_ipv4);
  server_data.sin_port = htons(w.udp_base_port);
  port_.AddPeer(kServerEndpoint, server_data);
  if (std::string e = StartSource(); !e.empty()) return e;

  const FrameKey key =
      handshake_.MemberFrameKey(w.job_nonce, static_cast<uint16_t>(w.rank),
                                static_cast<FrameAuthMode>(w.frame_auth));
  frames_ = std::make_unique<PacketFrames<UdpSocketPort>>(
      &port_, kServerEndpoint,
      reinterpret_cast<const uint8_t*>(job_->model().grad().data()), &layout_,
      o_.burst);
  frames_->set_auth(key);
  SendSideConfig sc;
  sc.type = FrameType::kPush;
  sc.session = w.session;
  sc.sender_rank = w.rank;
  sc.peer = 0;  // the server
  sc.direction = Direction::kPush;
  sc.burst = o_.burst;
  push_ = std::make_unique<SendSide>(sc);
  push_sides_[0] = push_.get();
  bcast_ = std::make_unique<ReceiveSide>(ReceiveSideConfig{
      ReceiverConfig{w.session, FrameType::kBroadcast, kServerRank, layout_, 0,
                     UINT32_MAX, key},
      Direction::kBroadcast, 0});
  sides_live_.store(true, std::memory_order_release);
  loss_ = std::make_unique<RxLossInjector>(ParseLossSpec(o_.loss), o_.bursts,
                                           HashMix(o_.seed, w.rank + 1));
  loss_->StartClock(NowNs());
  pkts_.resize(udp::kRxBurst);
  for (Packet& p : pkts_) p.bytes.reserve(o_.mtu - udp::kIpUdpHeaders);
  // Yields, not pauses, while spinning: the sidecar thread may share the
  // core.
  pacer_.emplace(512, o_.idle_sleep_us, o_.round_timeout_ms, o_.quit, nullptr,
                 o_.deep_idle, IdleBackoff::Spin::kYield);
  return "";
}

// Bind, OnJobStart, then the model around the source's buffers (its own
// when it shares them with a trainer in another process, else ours).
std::string JobWorker::StartSource() {
  const WelcomeMsg& w = welcome_;
  try {
    source_.Bind(w.rank, w.num_workers);
    source_.OnJobStart(w.resync_every);
  } catch (const std::exception& e) {
    return "the gradient source cannot start as rank " +
           std::to_string(w.rank) + " of " + std::to_string(w.num_workers) +
           ": " + e.what();
  }
  const WorkerJobSettings js{
      o_.bcast_fill, o_.send_order,       o_.seed,
      o_.push_only,  o_.round_timeout_ms, o_.on_absorbed};
  if (std::string e = WorkerJob::Check(source_, w, js); !e.empty()) return e;
  job_.emplace(source_, w, layout_, js);
  job_->set_row_stream(&row_stream_);
  return "";
}

// Compute, exchange, absorb, until the iterations or the trainer end.
std::string JobWorker::RunIterations() {
  const uint64_t iterations = job_->iterations(o_.iterations);
  bool more = true;
  for (uint64_t it = 0; it < iterations; ++it) {
    if (std::string e = job_->Iterate(it, *this, *this, &more); !e.empty()) {
      return e;
    }
    if (!more) break;
    res_.rows.push_back(job_->last_row());
    if (o_.on_iteration) o_.on_iteration(job_->last_row());
  }
  return "";
}

bool JobWorker::TakeEvents() {
  if (!events_.Drain(&taken_)) return false;
  const uint64_t now = NowNs();
  for (const DatapathEvent& e : taken_) {
    const auto* rb = std::get_if<RoundBeginEvent>(&e);
    if (rb == nullptr) continue;
    ++announcements_;
    if (rb->direction == Direction::kPush) {
      have_go_ = true;
      go_round_ = rb->round;
      go_p_ = rb->p;
      go_critical_ = rb->critical;
      res_.p = rb->p;
    } else if (bcast_) {
      bcast_->Announce(*rb, now);  // the broadcast's p, now or at its Begin
    }
  }
  return true;
}

// Waits for the server to open `round` (its ROUND_BEGIN).
std::string JobWorker::AwaitRoundBegin(uint32_t round) {
  const PollEnd end = PollUntil(
      *pacer_, NowNs,
      [&](uint64_t) {
        PollTurn t{TakeEvents()};
        if (have_go_ && go_round_ == round) {
          t.then = PollTurn::Then::kDone;
        } else if (server_gone_.load(std::memory_order_acquire)) {
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      // Only the awaited ROUND_BEGIN (which ends the wait) moves it.
      [] { return uint64_t{0}; },
      // Patience 2: the server may be waiting for another worker.
      [](bool) { return 2u; }, NeverResume);
  switch (end) {
    case PollEnd::kDone:
      push_p_ = go_p_;
      push_critical_ = go_critical_;
      return "";
    case PollEnd::kFailed:
      return GoneWhy();
    case PollEnd::kQuit:
      return "interrupted";
    case PollEnd::kTimedOut:
      break;
  }
  return "the server never opened push round " + std::to_string(round) +
         " (waited " + std::to_string(pacer_->limit_ms()) + " ms)";
}

// The push of iteration `it` in `order` until STOP, and (in a job) its
// broadcast until our receiver STOPped at the broadcast's p.
std::string JobWorker::Exchange(uint64_t it, std::span<const uint32_t> order) {
  Outbox& out = *out_;
  if (!o_.push_only) {
    // Until its ROUND_BEGIN announces the broadcast's p, the receiver may
    // only STOP on a complete buffer (p = 0), which satisfies any p.
    bcast_->Begin(BroadcastRound(it), 0.0, 0, 0, NowNs());
  }
  const uint32_t round = PushRound(it);
  if (std::string e = AwaitRoundBegin(round); !e.empty()) return e;
  push_->Begin(round, order, NowNs());
  std::string failure;
  const PollEnd end = PollUntil(
      *pacer_, NowNs,
      [&](uint64_t now) {
        PollTurn t{TakeEvents()};
        if (!o_.push_only) {
          bool accepted = false;
          t.work = Receive(&accepted) || t.work;
          const RxProgress rx{accepted, poll_gen_, drained_gen_};
          t.work = bcast_->Step(now, rx, out) || t.work;
        }
        t.work = push_->Step(now, *frames_, out) || t.work;
        if (ExchangeDone()) {
          t.then = PollTurn::Then::kDone;
        } else if (server_gone_.load(std::memory_order_acquire)) {
          failure = GoneWhy();
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      // A PROBE retry, a resent pass or a duplicate is work but no
      // progress, so a silent server or a dead link still times the
      // round out.
      [&] { return Progress(); },
      // Our push done and nothing of the broadcast yet: the server may be
      // waiting for another worker (RoundPacer's patience).
      [&](bool moved) -> uint32_t {
        return !moved && push_->done() && !o_.push_only &&
                       bcast_->receiver().received() == 0
                   ? 2
                   : 1;
      },
      NeverResume);
  switch (end) {
    case PollEnd::kDone: {
      // Each BITMAP the round used started a pass after the first, or
      // showed nothing missing (ended the round without STOP).
      const SenderRound& s = push_->sender();
      bitmaps_ += s.passes() - 1 + (s.stop_requested() ? 0 : 1);
      return "";
    }
    case PollEnd::kQuit:
      return "interrupted";
    case PollEnd::kTimedOut:
      return Stalled(it);
    case PollEnd::kFailed:
      break;
  }
  return failure;
}

// Chunks that set a new bit, first-pass frames, BITMAPs showing more
// delivered, STOPs, ROUND_BEGINs (send_side.h, receive_side.h).
uint64_t JobWorker::Progress() const {
  return push_->progress() + (bcast_ ? bcast_->progress() : 0) + announcements_;
}

// The push is done and the broadcast receiver STOPped (closed here, its
// chunks snapshot: later frames count as late and are not copied).
bool JobWorker::ExchangeDone() {
  if (!o_.push_only && bcast_->stopped() && bcast_->receiver().open()) {
    bcast_done_ns_ = bcast_->stop_ns();
    bcast_->Close();
    bcast_->receiver().SnapshotBitmap(arrived_);
  }
  return push_->done() && (o_.push_only || !bcast_->receiver().open());
}

// One RX poll: the server's broadcast frames, copied into the mean.
bool JobWorker::Receive(bool* progress) {
  ++poll_gen_;
  const uint16_t n = port_.RxBurst(pkts_.data(), udp::kRxBurst);
  if (n < udp::kRxBurst) drained_gen_ = poll_gen_;
  auto copy = [&](const DataHeader& h, const uint8_t* payload) {
    std::memcpy(reinterpret_cast<uint8_t*>(job_->model().avg().data()) +
                    layout_.Offset(h.seq),
                payload, h.payload_len);
  };
  const uint64_t now = n > 0 ? NowNs() : 0;
  for (uint16_t i = 0; i < n; ++i) {
    const uint8_t* buf = pkts_[i].bytes.data();
    const size_t len = pkts_[i].bytes.size();
    if (pkts_[i].src != kServerEndpoint) {  // only the server broadcasts
      ++unpinned_;
      continue;
    }
    if (loss_->ShouldDrop(buf, len, now)) continue;
    if (bcast_->OnFrame(buf, len, copy) == Verdict::kAccepted) {
      *progress = true;
    }
  }
  return n > 0;
}

std::string JobWorker::Stalled(uint64_t it) const {
  const SenderRound& s = push_->sender();
  std::string why = "iteration " + std::to_string(it) + ": the " +
                    (push_->done() ? "broadcast" : "push") +
                    " stalled: no progress from server " + o_.server + " for " +
                    std::to_string(pacer_->limit_ms()) + " ms (push ";
  if (push_->done()) {
    why += "done";
  } else {
    why +=
        std::to_string(s.passes()) + " passes, " +
        std::to_string(s.packets_sent()) + " packets sent, " +
        (s.state() == SenderRound::State::kAwaitingBitmap ? "BITMAP never came"
                                                          : "no STOP");
  }
  if (!o_.push_only) {
    why += "; broadcast " + std::to_string(bcast_->receiver().received()) +
           "/" + std::to_string(layout_.num_chunks()) + " chunks";
  }
  return why +
         "); check that the server runs and that frames pass both ways "
         "(--loss, the link), or raise --round_timeout_ms" +
         MeasuredCauses(0, loss_->dropped(), loss_->considered());
}

// The row's inputs (the push bench's delivered fraction is its push's).
WorkerExchange JobWorker::Exchanged(uint64_t it) const {
  const double n = layout_.num_chunks();
  return WorkerExchange{
      it,
      res_.rank,
      push_sides_,
      o_.push_only ? 0 : bcast_done_ns_,
      o_.push_only ? push_->stop_received() / n : arrived_.Count() / n,
      push_p_,
      push_critical_,
      loss_->InBurst(it),
      false};
}

// BYE when done, ERROR with the reason otherwise: the server must not
// mistake a finished worker for a lost one. After a BYE the server closes
// the connection; the sidecar stops after at most a second either way.
void JobWorker::Finish(Outbox& out, const std::string& failure) {
  failure_ = failure;  // before the request: the sidecar reads it then
  out.Post(FinishRequest{failure.empty()});
  udp::WaitFor([&] { return closed_.load(std::memory_order_acquire); }, 1000);
}


void JobWorker::Report() {
  res_.counters = {
      {"tx_frames", port_.tx_frames()},
      {"tx_eagain", port_.tx_eagain()},
      {"tx_errors", port_.tx_errors()},
      {"probes", push_ ? push_->probes_sent() : 0},
      {"bitmaps", bitmaps_},
  };
  if (!o_.push_only) {
    // Prefixed: the push bench merges these with the server's counters.
    res_.counters["bcast_rx_frames"] = port_.rx_frames();
    res_.counters["bcast_injected_drops"] = loss_ ? loss_->dropped() : 0;
    res_.counters["bcast_unpinned_source"] = unpinned_;
    res_.counters["bcast_socket_drops"] = port_.socket_drops();
    if (bcast_) {
      NamedCounters c;
      const ReceiverRound* receivers[] = {&bcast_->receiver()};
      AddReceiverCounters("bcast_", receivers, false, &c);
      res_.counters.insert(c.begin(), c.end());
    }
  }
  if (job_) report_.rows = std::move(job_->rows());
  report_.role = "worker";
  report_.rank = static_cast<int32_t>(res_.rank);
  report_.policy = welcome_.policy;
  report_.burst_iterations = o_.bursts.iterations;
  report_.info = {{"transport", "kernel-udp"},
                  {"source", source_.Describe()},
                  {"loss", o_.loss},
                  {"chunks", std::to_string(layout_.num_chunks())},
                  {"chunk_bytes", std::to_string(layout_.chunk_payload())}};
  udp::FinishReport(row_stream_, std::move(report_), &res_);
}

}  // namespace

UdpJobWorkerResult RunUdpJobWorker(const UdpJobWorkerOptions& o,
                                   GradientSource& source) {
  return JobWorker(o, source).Run();
}

}  // namespace dblp
