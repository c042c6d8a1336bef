// The kernel-UDP server of a whole job (udp_job.h): per worker a push
// ReceiveSide and a broadcast SendSide over one UDP socket, the mean over
// all of them, the tolerance policy between the two directions.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/base/rng.h"
#include "dblp/control/accepted_mail.h"
#include "dblp/control/admission.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/join.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/job/counters.h"
#include "dblp/job/diagnosis.h"
#include "dblp/job/rows.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/mean_reducer.h"
#include "dblp/policy/tolerance.h"
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

using udp::Backoff;
using udp::EventQueue;
using udp::NowNs;
using udp::Outbox;
using udp::Watchdog;

class JobServer {
 public:
  explicit JobServer(const UdpJobServerOptions& o) : o_(o) {}
  UdpJobServerResult Run();

 private:
  // Why a worker left (an ERROR's text, or the close reason): the sidecar
  // writes both once, before its PeerGoneEvent; the datapath reads them
  // after taking that event.
  struct Departure {
    bool failed = false;
    std::string why;
    bool told = false;  // sidecar only
  };

  UdpJobServerResult Fail(int code, const std::string& msg) {
    return udp::Failed(&res_, code, msg);
  }
  std::string CheckOptions();
  std::string OpenSockets(ControlSidecar& sidecar);

  // Sidecar thread.
  void OnMessage(ConnId c, const ControlMessage& m);
  void Welcome();
  void MakeSides(const ChunkLayout& layout);
  void OnClose(ConnId c, const std::string& reason);
  void OnWakeup();
  void TellGone(uint32_t w, bool failed, const std::string& why);

  // Datapath thread.
  std::string AwaitWorkers();
  std::string SetUpJob();
  std::string ServeRounds(Outbox& out);
  void OpenPush(Outbox& out);
  bool Receive(bool* progress);
  bool StepSides(Outbox& out);
  bool StepBroadcast(Outbox& out, bool* progress);
  bool TakeEvents(std::string* failure);
  std::string FinishedEarly();
  bool AllLiveSaidBye() const {
    for (uint32_t w = 0; w < o_.workers; ++w) {
      if (Alive(w) && !bye_[w]) return false;
    }
    return true;
  }
  bool LoseWorker(uint32_t w, const std::string& how, std::string* failure);
  bool Alive(uint32_t w) const {
    return alive_[w].load(std::memory_order_relaxed);
  }
  uint32_t LiveCount() const {
    uint32_t n = 0;
    for (uint32_t w = 0; w < o_.workers; ++w) n += Alive(w) ? 1 : 0;
    return n;
  }
  bool CloseRoundIfStopped(Outbox& out);
  void StageAccepted(Outbox& out);
  void AddPushRows(double norm, bool resync);
  void BeginBroadcast(Outbox& out, const ReducedPush& r);
  bool CloseBroadcastIfDone();
  std::string NoProgress() const;
  void Finish(Outbox& out, const std::string& failure);
  void FillCounters();

  const UdpJobServerOptions& o_;
  UdpJobServerResult res_;  // datapath only
  // Datapath; the sidecar reads only its bound address, for WELCOME.
  UdpSocketPort port_;
  // Set before the sidecar thread starts, read-only after.
  UdpPortOptions popts_;
  LossSpec loss_spec_;
  uint32_t session_ = 0;
  uint32_t chunk_payload_ = 0;
  AuthBytes job_nonce_{};
  FrameKey frame_key_;
  std::string policy_text_;
  ControlSidecar* sc_ = nullptr;

  // Join state: the sidecar writes it (under join_mu_) until `joined_`;
  // read-only after, by both threads (but for the departure fields). The
  // sides are made with the last JOIN, so the sidecar can hand them PROBE,
  // STOP and BITMAP as soon as `joined_` is set.
  std::mutex join_mu_;
  Admission admission_{
      JoinPolicy{o_.workers, o_.mtu, o_.max_gradient_bytes, true,
                 o_.rank_by_name}, o_.secret,
      "udp-server"};
  JoinDesk& desk_ = admission_.desk();
  std::vector<Departure> gone_;  // by worker rank, sized at the WELCOME
  std::vector<std::unique_ptr<ReceiveSide>> push_;  // by worker rank
  std::vector<std::unique_ptr<SendSide>> bcast_;    // by worker rank
  std::atomic<bool> joined_{false};

  EventQueue<DatapathEvent> events_;     // sidecar -> datapath: BYE, gone
  EventQueue<ControlRequest> requests_;  // datapath -> sidecar
  std::vector<ControlRequest> sending_;  // sidecar only
  // Push feedback: the datapath stages each worker's ACCEPTED before the
  // request that sends it; the sidecar takes it then.
  AcceptedSlots accepted_;
  // The job's failure text: datapath wo before its FinishRequest; the
  // sidecar reads it when handling that request.
  std::string failure_;
  std::atomic<bool> finished_{false};  // sidecar: wo once finish went out

  // Datapath only, from SetUpJob on.
  ChunkLayout layout_;
  // Made by CheckOptions (its description goes into WELCOME), then owned
  // by iteration_ from SetUpJob on.
  std::unique_ptr<TolerancePolicy> policy_;
  // What the server decides between a push and its broadcast (the same
  // object as dblp-server's): mean, policy, broadcast, next push.
  std::unique_ptr<ServerIteration> iteration_;
  RoundTolerance push_tol_;  // the policy's for the next push
  std::vector<Bitmap> arrived_;
  std::unique_ptr<RxLossInjector> loss_;
  std::vector<Packet> pkts_;
  std::vector<uint8_t> arrivals_;  // per worker: frames this turn
  std::vector<uint8_t> bye_;       // per worker: said BYE
  // Per worker: false once lost under --on_worker_loss=continue (its
  // frames are dropped, it gets no more rounds). Datapath: wo; sidecar: ro
  // (no more ROUND_BEGIN to it).
  std::unique_ptr<std::atomic<bool>[]> alive_;
  uint64_t from_lost_ = 0;  // frames of lost workers, dropped
  std::vector<DatapathEvent> taken_;
  std::vector<SendOrder> orders_;  // broadcast, per worker
  std::vector<uint32_t> order_buf_;
  std::vector<std::unique_ptr<PacketFrames<UdpSocketPort>>> frames_;
  uint64_t it_ = 0;            // the open push round's iteration
  RoundTolerance round_tol_;   // the open push round's (reliable: resync)
  bool broadcasting_ = false;  // iteration it_ - 1's mean is going out
  uint64_t unpinned_ = 0;      // frames from an unpinned address
  uint64_t poll_gen_ = 0, drained_gen_ = 0;
  uint64_t round_open_ns_ = 0;
  // The rows, streamed as the iterations end and kept for the summary.
  RowStream row_stream_;
  RunReport report_;
};

std::string JobServer::CheckOptions() {
  if (std::string e = udp::CheckCommon(o_.mtu, o_.round_timeout_ms);
      !e.empty()) {
    return e;
  }
  if (o_.workers == 0 || o_.workers >= 0xFFFF) {
    return "workers=" + std::to_string(o_.workers) +
           " is out of range: use 1..65534";
  }
  if (o_.burst == 0 || o_.burst > UdpSocketPort::kMaxBurst) {
    return "burst=" + std::to_string(o_.burst) + " must be in 1.." +
           std::to_string(UdpSocketPort::kMaxBurst);
  }
  std::string err;
  if (!udp::CheckCpu(o_.cpu, &err)) return "server datapath: " + err;
  try {
    loss_spec_ = ParseLossSpec(o_.loss);
  } catch (const std::exception& e) {
    return std::string("loss: ") + e.what();
  }
  try {
    policy_ = TolerancePolicy::Create(o_.policy);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Both sockets, and the job's nonce, session and frame key.
std::string JobServer::OpenSockets(ControlSidecar& sidecar) {
  std::string err;
  popts_.max_datagram = o_.mtu - udp::kIpUdpHeaders;
  if (!port_.Open(o_.data, popts_, &err)) return err;
  job_nonce_ = RandomAuthBytes();
  session_ = DeriveSession(o_.secret, job_nonce_);
  frame_key_ = DeriveFrameKey(o_.secret, job_nonce_, o_.frame_auth);
  chunk_payload_ = ChunkPayloadForMtu(o_.mtu, FrameTagBytes(o_.frame_auth));
  policy_text_ = policy_->Describe();
  if (!sidecar.Listen(o_.control, &err, UdpServerApp())) {
    return "control: " + err;
  }
  if (!o_.quiet) {
    std::printf("udp-server: control %s port %u, data %s, %s\n",
                o_.control.c_str(), sidecar.bound_port(),
                FormatIpv4Endpoint(port_.bound_addr()).c_str(),
                policy_text_.c_str());
    std::fflush(stdout);
  }
  if (o_.on_listening) {
    o_.on_listening(sidecar.bound_port(), port_.bound_port());
  }
  return "";
}

UdpJobServerResult JobServer::Run() {
  if (std::string e = CheckOptions(); !e.empty()) return Fail(2, e);
  std::string err;
  // Before anything else: a directory that cannot take the rows fails the
  // server now, not after the whole job.
  if (!o_.out_dir.empty() && !row_stream_.Open(o_.out_dir, &err)) {
    return Fail(2, err);
  }
  if (o_.secret.insecure() && o_.frame_auth != FrameAuthMode::kNone) {
    return Fail(2, "frame authentication needs a job secret");
  }
  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId c, const ControlMessage& m) {
    OnMessage(c, m);
  };
  cb.on_close = [this](ConnId c, const std::string& r) { OnClose(c, r); };
  cb.on_wakeup = [this] { OnWakeup(); };
  ControlSidecar sidecar(cb, kMaxControlFrame, o_.control_limits);
  sc_ = &sidecar;
  if (std::string e = OpenSockets(sidecar); !e.empty()) return Fail(1, e);
  // The sidecar thread starts before the pinning, so it does not inherit
  // the datapath's CPU.
  SidecarThread sidecar_thread(sidecar);
  if (!udp::PinThisThread(o_.cpu, &err)) return Fail(2, err);
  if (std::string e = AwaitWorkers(); !e.empty()) return Fail(1, e);
  if (std::string e = SetUpJob(); !e.empty()) return Fail(1, e);

  Outbox out(&requests_, &sidecar);
  const std::string failure = ServeRounds(out);
  if (!failure.empty()) {
    res_.exit_code = 1;
    res_.error = failure;
  }
  Finish(out, failure);
  sidecar_thread.Stop();
  FillCounters();
  row_stream_.Sync(report_.rows);  // a broadcast the failure cut short
  report_.role = "server";
  report_.policy = policy_text_;
  report_.burst_iterations = o_.bursts.iterations;
  report_.info = {{"transport", "kernel-udp"},
                  {"loss", o_.loss},
                  {"chunks", std::to_string(layout_.num_chunks())},
                  {"chunk_bytes", std::to_string(layout_.chunk_payload())},
                  {"push_fill", FillModeName(o_.push_fill)},
                  {"resync_every", std::to_string(o_.resync_every)},
                  {"broadcast", o_.push_only ? "none" : "same_p"}};
  udp::FinishReport(row_stream_, std::move(report_), &res_);
  return res_;
}

// ---- sidecar thread -------------------------------------------------------

void JobServer::OnMessage(ConnId c, const ControlMessage& m) {
  Admission::Step step;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    step = admission_.OnMessage(*sc_, c, m);
    if (step == Admission::Step::kAdmitted && desk_.full()) Welcome();
  }
  if (step != Admission::Step::kMember) return;
  if (!joined_.load(std::memory_order_acquire)) return;
  const auto peer = static_cast<uint16_t>(desk_.RankOf(c));
  // A PROBE goes to the worker's push side, which answers it after an RX
  // poll that started later (so the BITMAP counts every frame sent before
  // it); STOP and BITMAP to its broadcast side.
  if (DeliverToSides(m, bcast_[peer].get(), push_[peer].get(), NowNs())) {
    return;
  }
  if (std::holds_alternative<ByeMsg>(m)) {
    events_.Push(PeerByeEvent{peer});
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    TellGone(peer, true, e->text);
  }
}

// One push receiver and one broadcast sender per worker.
void JobServer::MakeSides(const ChunkLayout& layout) {
  for (uint32_t w = 0; w < o_.workers; ++w) {
    ReceiveSideConfig rc;
    rc.receiver = ReceiverConfig{
        session_,   FrameType::kPush, static_cast<int32_t>(w), layout, 0,
        UINT32_MAX, frame_key_};
    rc.direction = Direction::kPush;
    rc.peer = static_cast<uint16_t>(w);
    push_.push_back(std::make_unique<ReceiveSide>(rc));
    SendSideConfig sc;
    sc.type = FrameType::kBroadcast;
    sc.session = session_;
    sc.sender_rank = kServerRank;
    sc.peer = static_cast<uint16_t>(w);
    sc.direction = Direction::kBroadcast;
    sc.burst = o_.burst;
    bcast_.push_back(std::make_unique<SendSide>(sc));
  }
}

// The last JOIN: the sides, then WELCOME to every worker, then `joined_`.
void JobServer::Welcome() {
  desk_.Close();
  gone_.resize(o_.workers);
  MakeSides(ChunkLayout(desk_.first().total_bytes, chunk_payload_));
  for (uint32_t w = 0; w < o_.workers; ++w) {
    WelcomeMsg wm = desk_.Welcome(w, chunk_payload_);
    wm.session = session_;
    wm.resync_every = o_.resync_every;
    wm.consistent_broadcast = o_.consistent_broadcast;
    wm.push_feedback = o_.push_feedback;
    wm.udp_base_port = port_.bound_port();
    wm.server_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr);
    wm.policy = policy_text_;
    wm.frame_auth = static_cast<uint8_t>(o_.frame_auth);
    wm.job_nonce = job_nonce_;
    // Frames of worker w count only from the address it named at JOIN
    // (its control connection's IPv4 if it named none); the broadcast
    // goes there.
    const JoinDesk::Member& m = desk_.members()[w];
    sockaddr_in pin{};
    std::string err;
    ParseIpv4Endpoint(sc_->PeerAddress(m.conn), false, false, "", &pin, &err);
    if (m.data_ipv4 != 0) pin.sin_addr.s_addr = htonl(m.data_ipv4);
    pin.sin_port = htons(m.data_udp_port);
    wm.worker_ipv4 = ntohl(pin.sin_addr.s_addr);
    // The datapath reads the peer table only after joined_ (below).
    port_.AddPeer(w, pin);
    admission_.SealWelcome(w, &wm);
    sc_->Send(m.conn, wm);
  }
  joined_.store(true, std::memory_order_release);
}

void JobServer::OnClose(ConnId c, const std::string& reason) {
  std::lock_guard<std::mutex> lock(join_mu_);
  const int w = admission_.OnClose(c);  // frees a slot during the join
  if (w < 0 || !joined_.load()) return;
  TellGone(static_cast<uint32_t>(w), false, reason);
}

// Only the first of a worker's ERROR and close is told: the datapath may be
// reading the text of the first while a second would write it.
void JobServer::TellGone(uint32_t w, bool failed, const std::string& why) {
  Departure& d = gone_[w];
  if (d.told) return;
  d.told = true;
  d.failed = failed;
  d.why = why;
  events_.Push(PeerGoneEvent{static_cast<uint16_t>(w)});
}

void JobServer::OnWakeup() {
  if (!requests_.Drain(&sending_)) return;
  for (const ControlRequest& r : sending_) {
    std::visit(
        Overloaded{
            [&](const RoundBeginRequest& rb) {
              const RoundBeginMsg m{rb.round,   rb.round / 2,   rb.direction,
                                    rb.p,       rb.deadline_ns, rb.min_fraction,
                                    rb.critical};
              const auto& members = desk_.members();
              for (uint32_t w = 0; w < members.size(); ++w) {
                if (!alive_ || alive_[w].load()) sc_->Send(members[w].conn, m);
              }
            },
            [&](const AcceptedRequest& a) {
              AcceptedMsg m;
              if (accepted_.Take(a.peer, a.round, &m)) {
                sc_->Send(desk_.members()[a.peer].conn, m);
              }
            },
            [&](const FinishRequest& f) {
              // ERROR (with the cause) or a plain close to every worker.
              for (const auto& w : desk_.members()) {
                if (!f.ok) sc_->Send(w.conn, ErrorMsg{2, failure_});
                sc_->Close(w.conn, f.ok ? "job finished" : failure_);
              }
              finished_.store(true, std::memory_order_release);
            },
            [&](const auto& side) {  // a side's request for worker side.peer
              if (size_t{side.peer} >= push_.size()) return;
              for (const ControlMessage& m :
                   SideRequestMessages(r, push_[side.peer].get())) {
                sc_->Send(desk_.members()[side.peer].conn, m);
              }
            }},
        r);
  }
}

// ---- datapath thread ------------------------------------------------------

std::string JobServer::AwaitWorkers() {
  if (udp::WaitFor([&] { return joined_.load(std::memory_order_acquire); },
                   o_.join_timeout_ms)) {
    return "";
  }
  std::string shortfall;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    shortfall = desk_.Shortfall();
  }
  return shortfall + " within " + std::to_string(o_.join_timeout_ms) +
         " ms: start the workers with the server's control address";
}

std::string JobServer::SetUpJob() {
  const uint32_t W = o_.workers;
  layout_ = ChunkLayout(desk_.first().total_bytes, chunk_payload_);
  res_.chunks = layout_.num_chunks();
  push_tol_ = policy_->Current();
  try {
    iteration_ = std::make_unique<ServerIteration>(
        o_, std::move(policy_), layout_, W, o_.seed, "dblp-udp-server");
  } catch (const std::bad_alloc&) {
    return "cannot allocate the sums of a " +
           std::to_string(layout_.total_bytes()) +
           "-byte gradient: lower the workers' size or give the server more "
           "memory";
  }
  arrived_.resize(W);
  loss_ = std::make_unique<RxLossInjector>(loss_spec_, o_.bursts,
                                           HashMix(o_.seed, 0xB0));
  loss_->StartClock(NowNs());
  pkts_.resize(udp::kRxBurst);
  for (Packet& p : pkts_) p.bytes.reserve(popts_.max_datagram);
  arrivals_.assign(W, 0);
  bye_.assign(W, 0);
  alive_ = std::make_unique<std::atomic<bool>[]>(W);
  for (uint32_t w = 0; w < W; ++w) alive_[w].store(true);
  const auto* mean =
      reinterpret_cast<const uint8_t*>(iteration_->mean().data());
  for (uint32_t w = 0; w < W; ++w) {
    orders_.emplace_back(o_.send_order, w, W, HashMix(o_.seed, 0xBC));
    frames_.push_back(std::make_unique<PacketFrames<UdpSocketPort>>(
        &port_, w, mean, &layout_, o_.burst));
    frames_.back()->set_auth(frame_key_);
  }
  return "";
}

std::string JobServer::ServeRounds(Outbox& out) {
  Backoff backoff(o_.idle_sleep_us, o_.deep_idle);
  Watchdog watchdog(o_.round_timeout_ms);
  std::string failure;
  OpenPush(out);
  for (;;) {
    // `work` ends the idle back-off; only `progress` (a new chunk, a new
    // pass of the broadcast, a new round) feeds the watchdog, so a round
    // whose every frame is lost still times out.
    bool progress = false;
    bool work = Receive(&progress);
    work = TakeEvents(&failure) || work;
    if (failure.empty()) failure = FinishedEarly();
    if (!failure.empty()) return failure;
    work = StepSides(out) || work;
    if (broadcasting_) work = StepBroadcast(out, &progress) || work;
    if (CloseBroadcastIfDone()) work = progress = true;
    if (!broadcasting_ && AllLiveSaidBye()) return "";
    if (!broadcasting_ && CloseRoundIfStopped(out)) work = progress = true;
    if (progress) watchdog.Progress();
    if (work) {
      backoff.Work();
    } else {
      backoff.Idle();
    }
    if (!progress && watchdog.Expired()) return NoProgress();
  }
}

void JobServer::OpenPush(Outbox& out) {
  const uint32_t round = PushRound(it_);
  const uint64_t now = NowNs();
  // A resync's push is reliable, whatever the policy says.
  round_tol_ = iteration_->PushTolerance(it_, push_tol_);
  const RoundTolerance& t = round_tol_;
  const uint64_t deadline = t.deadline_ns ? now + t.deadline_ns : 0;
  const double floor = t.deadline_ns ? t.min_fraction : 0;
  for (auto& side : push_) side->Begin(round, t.p, deadline, floor, now);
  round_open_ns_ = now;
  out.Post(RoundBeginRequest{Direction::kPush, round, t.p, t.deadline_ns, floor,
                             t.critical});
}

// One RX poll: each frame to its worker's side, accepted chunks summed.
bool JobServer::Receive(bool* progress) {
  const uint32_t W = o_.workers;
  ++poll_gen_;
  const uint16_t n = port_.RxBurst(pkts_.data(), udp::kRxBurst);
  if (n < udp::kRxBurst) drained_gen_ = poll_gen_;
  std::fill(arrivals_.begin(), arrivals_.end(), 0);
  MeanReducer& reducer = iteration_->reducer();
  auto accumulate = [&](const DataHeader& h, const uint8_t* payload) {
    reducer.Accumulate(h.seq, payload);
  };
  const uint64_t now = n > 0 ? NowNs() : 0;
  for (uint16_t i = 0; i < n; ++i) {
    const uint8_t* buf = pkts_[i].bytes.data();
    const size_t len = pkts_[i].bytes.size();
    if (loss_->ShouldDrop(buf, len, now)) continue;
    // Unknown ranks go to worker 0's side, which counts them as
    // wrong-sender (or malformed) without accepting anything.
    const uint32_t rank = PeekSenderRank(buf, len);
    const uint32_t w = rank < W ? rank : 0;
    if (pkts_[i].src != w) {  // not from where worker w was pinned
      ++unpinned_;
      continue;
    }
    if (!Alive(w)) {
      ++from_lost_;
      continue;
    }
    arrivals_[w] = 1;
    if (push_[w]->OnFrame(buf, len, accumulate) == Verdict::kAccepted) {
      *progress = true;
    }
  }
  return n > 0;
}

bool JobServer::StepSides(Outbox& out) {
  const uint64_t now = NowNs();
  bool asked = false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    const RxProgress rx{arrivals_[w] != 0, poll_gen_, drained_gen_};
    asked = push_[w]->Step(now, rx, out) || asked;
  }
  return asked;
}

// One burst to each worker whose broadcast is not done. A new frame sent
// is progress (a pass); a PROBE retry is not.
bool JobServer::StepBroadcast(Outbox& out, bool* progress) {
  const uint64_t now = NowNs();
  bool work = false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (!Alive(w)) continue;
    SendSide& side = *bcast_[w];
    const uint64_t sent = side.sender().packets_sent();
    work = side.Step(now, *frames_[w], out) || work;
    if (side.sender().packets_sent() != sent || side.done()) *progress = true;
  }
  return work;
}

bool JobServer::TakeEvents(std::string* failure) {
  if (!events_.Drain(&taken_)) return false;
  for (const DatapathEvent& e : taken_) {
    if (const auto* bye = std::get_if<PeerByeEvent>(&e)) {
      bye_[bye->peer] = 1;
      continue;
    }
    const auto* gone = std::get_if<PeerGoneEvent>(&e);
    if (gone == nullptr || !failure->empty()) continue;
    const uint32_t w = gone->peer;
    const Departure& d = gone_[w];
    if (!Alive(w) || (!d.failed && bye_[w])) continue;
    LoseWorker(w,
               d.failed ? "failed (" + d.why + ")"
                        : "disconnected without BYE (" + d.why + ")",
               failure);
  }
  return true;
}

// A worker lost: the job fails naming it (--on_worker_loss=abort), or goes
// on without it: its frames are dropped, it gets no more rounds, and the
// mean divides by the live workers from the next round on (this one may
// already hold its chunks). False (with *failure) if the job ends.
bool JobServer::LoseWorker(uint32_t w, const std::string& how,
                           std::string* failure) {
  if (!o_.continue_on_worker_loss) {
    *failure = WorkerLostText(w, desk_.members()[w].name, how, it_);
    return false;
  }
  DBLP_LOG(Warning, "dblp-udp-server: continuing without worker %u (%s)", w,
           how.c_str());
  alive_[w].store(false);
  if (LiveCount() == 0) {
    *failure = "every worker is gone";
    return false;
  }
  return true;
}

// A worker that said BYE while another already pushes the open round ran
// fewer iterations: the round could never close with it.
std::string JobServer::FinishedEarly() {
  bool others_push = false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (Alive(w) && !bye_[w] && push_[w]->receiver().received() > 0) {
      others_push = true;
    }
  }
  if (!others_push) return "";
  std::string failure;
  for (uint32_t w = 0; w < o_.workers && failure.empty(); ++w) {
    if (Alive(w) && bye_[w] && !push_[w]->stopped()) {
      LoseWorker(w, FinishedEarlyHow(it_), &failure);
    }
  }
  return failure;
}

// Every push side sent its STOP: the mean, the policy's next p, then the
// next push opens and (in a job) the mean's broadcast begins.
bool JobServer::CloseRoundIfStopped(Outbox& out) {
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (Alive(w) && !push_[w]->stopped()) return false;
  }
  const uint64_t push_ns = NowNs() - round_open_ns_;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    push_[w]->Close();
    push_[w]->receiver().SnapshotBitmap(arrived_[w]);
    res_.rounds.push_back(
        UdpServerRound{it_, w, push_[w]->receiver().delivered_fraction()});
  }
  const ReducedPush r = iteration_->Reduce(it_, push_ns);
  iteration_->set_live_workers(LiveCount());  // the next round's divisor
  AddPushRows(r.norm, r.resync);
  // Without a broadcast the rows are complete: on disk before on_round.
  if (o_.push_only) row_stream_.Sync(report_.rows);
  if (o_.on_round) {
    o_.on_round(UdpServerRoundView{it_, iteration_->mean(), arrived_});
  }
  // Each worker's ACCEPTED before the broadcast's ROUND_BEGIN, so it holds
  // it when the broadcast begins.
  if (o_.push_feedback && !r.resync) StageAccepted(out);
  res_.iterations = ++it_;
  push_tol_ = r.next;
  // The broadcast before the push: its ROUND_BEGIN goes out first.
  if (!o_.push_only) BeginBroadcast(out, r);
  OpenPush(out);
  return true;
}

// Push feedback: tell each worker the chunks of its push the mean summed.
void JobServer::StageAccepted(Outbox& out) {
  const uint32_t round = PushRound(it_);
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (!Alive(w)) continue;
    const std::span<const uint64_t> words = arrived_[w].words();
    accepted_.Stage(
        w,
        AcceptedMsg{round, arrived_[w].size(), {words.begin(), words.end()}});
    out.Post(AcceptedRequest{static_cast<uint16_t>(w), round});
  }
}

// The push half of the iteration's rows (the DPDK server's columns), and
// the dumps of the test hook.
void JobServer::AddPushRows(double norm, bool resync) {
  const bool dump = !o_.dump_dir.empty() && it_ < o_.dump_iterations;
  const std::string base = o_.dump_dir + "/";
  for (uint32_t w = 0; w < o_.workers; ++w) {
    const ReceiveSide& side = *push_[w];
    report_.rows.push_back(ServerPushRow(
        ServerPush{it_, w, round_open_ns_, side.stop_ns(),
                   side.receiver().delivered_fraction(), round_tol_, norm,
                   loss_->InBurst(it_), resync}));
    if (dump) {
      const std::span<const uint64_t> words = arrived_[w].words();
      DumpBinary(base + "w" + std::to_string(w) + "_it" + std::to_string(it_) +
                     "_push.bits",
                 words.data(), words.size() * sizeof(uint64_t));
    }
  }
  if (dump) {
    const std::span<const float> mean = iteration_->mean();
    DumpBinary(base + "mean_it" + std::to_string(it_) + ".f32", mean.data(),
               mean.size() * sizeof(float));
  }
}

// Iteration it_ - 1's mean to every worker under the broadcast's
// tolerance: each worker's receiver STOPs at its own 1-p of it, or, for a
// consistent broadcast, every worker gets the one subset, reliably.
void JobServer::BeginBroadcast(Outbox& out, const ReducedPush& r) {
  const uint32_t round = BroadcastRound(it_ - 1);
  const RoundTolerance& t = r.broadcast;
  out.Post(RoundBeginRequest{Direction::kBroadcast, round, t.p, t.deadline_ns,
                             t.deadline_ns ? t.min_fraction : 0, t.critical});
  const uint64_t now = NowNs();
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (!Alive(w)) continue;
    if (r.subset.empty()) {
      orders_[w].Fill(round, layout_.num_chunks(), order_buf_);
      bcast_[w]->Begin(round, order_buf_, now);
    } else {
      bcast_[w]->Begin(round, r.subset, now, layout_.num_chunks());
    }
  }
  broadcasting_ = true;
}

// Every worker holds its share of the mean: the rows are complete.
bool JobServer::CloseBroadcastIfDone() {
  if (!broadcasting_) return false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (Alive(w) && !bcast_[w]->done()) return false;
  }
  broadcasting_ = false;
  const size_t first = report_.rows.size() - o_.workers;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    const SendSide* sides[] = {bcast_[w].get()};
    AddBroadcastToRow(sides, &report_.rows[first + w]);
  }
  row_stream_.Sync(report_.rows);  // on disk before the next iteration
  return true;
}

std::string JobServer::NoProgress() const {
  if (broadcasting_) {
    std::string s = NoProgressText("broadcast round " +
                                       std::to_string(BroadcastRound(it_ - 1)),
                                   o_.round_timeout_ms) +
                    "; pending:";
    for (uint32_t w = 0; w < o_.workers; ++w) {
      if (Alive(w) && !bcast_[w]->done()) s += " w" + std::to_string(w);
    }
    return s;
  }
  std::string s = NoProgressText("push round " + std::to_string(PushRound(it_)),
                                 o_.round_timeout_ms) +
                  "; chunks received:";
  for (uint32_t w = 0; w < o_.workers; ++w) {
    s += " w" + std::to_string(w) + "=" +
         std::to_string(push_[w]->receiver().received()) + "/" +
         std::to_string(layout_.num_chunks());
  }
  return s + PushStalledHint();
}

// ERROR (with the cause) or a plain close to every worker, flushed before
// the sidecar stops.
void JobServer::Finish(Outbox& out, const std::string& failure) {
  failure_ = failure;  // before the request: the sidecar reads it then
  out.Post(FinishRequest{failure.empty()});
  udp::WaitFor([&] { return finished_.load(std::memory_order_acquire); }, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// The DPDK server's names (src/server_report.cc) for what both count, so
// tools and tests read one set.
void JobServer::FillCounters() {
  uint64_t probes = 0;
  for (const auto& side : bcast_) probes += side->probes_sent();
  NamedCounters c = {
      {"rx_frames", port_.rx_frames()},
      {"tx_frames", port_.tx_frames()},
      {"tx_eagain", port_.tx_eagain()},
      {"tx_errors", port_.tx_errors()},
      {"bcast_probes", probes},
      {"injected_drops", loss_ ? loss_->dropped() : 0},
      {"socket_drops", port_.socket_drops()},
      {"rx_truncated", port_.rx_truncated()},
      {"rcvbuf_bytes", static_cast<uint64_t>(port_.rcvbuf_bytes())},
      {"frames_unpinned_source", unpinned_},
      {"frames_from_lost_workers", from_lost_},
      {"control_auth_failures", admission_.auth_failures()},
      {"control_refused_joins", admission_.refused_joins()},
      {"control_out_of_state", admission_.out_of_state()},
  };
  std::vector<const ReceiverRound*> receivers;
  for (const auto& side : push_) receivers.push_back(&side->receiver());
  AddReceiverCounters("push_", receivers, true, &c);
  res_.counters.insert(c.begin(), c.end());
}

}  // namespace

UdpJobServerResult RunUdpJobServer(const UdpJobServerOptions& o) {
  return JobServer(o).Run();
}

}  // namespace dblp
