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
#include "dblp/base/poll_loop.h"
#include "dblp/base/rng.h"
#include "dblp/control/accepted_mail.h"
#include "dblp/control/admission.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/join.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/job/counters.h"
#include "dblp/job/diagnosis.h"
#include "dblp/job/server_driver.h"
#include "dblp/job/server_job.h"
#include "dblp/job/shard_links.h"
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

using udp::EventQueue;
using udp::NowNs;
using udp::Outbox;

// The UDP server's one datapath thread is the job's one lane and its
// coordinator (server_driver.h): it polls and steps; ServeIterations
// decides.
class JobServer final : public ServerTransport {
 public:
  explicit JobServer(const UdpJobServerOptions& o) : o_(o) {}
  UdpJobServerResult Run();

  // ---- the lane (ServeIterations) ----
  template <class Done>
  bool RunRound(uint64_t it, bool broadcasting, Done done);
  bool PushStopped(uint32_t w, uint64_t /*it*/) const {
    return push_[w]->stopped();
  }
  bool BroadcastDone(uint32_t w) const { return bcast_[w]->done(); }
  void ClosePushSides();
  void OpenPushSides(uint64_t it, const PushOpening& open);
  bool BeginBroadcastSides(uint64_t it);

  // ---- the transport (ServerCoordinator) ----
  uint64_t Now() override { return NowNs(); }
  std::span<const ReceiveSide* const> PushLanes(uint32_t w) override {
    return {&push_ptrs_[w], 1};  // one lane per worker here
  }
  std::span<const SendSide* const> BroadcastLanes(uint32_t w) override {
    return {&bcast_ptrs_[w], 1};
  }
  void Post(const ControlRequest& r) override { out_->Post(r); }
  AcceptedSlots* Accepted() override { return &accepted_; }
  bool InBurst(uint64_t it) override { return loss_->InBurst(it); }
  void PushClosed(uint64_t it, const ReducedPush& /*r*/) override {
    res_.iterations = it + 1;
  }

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
  std::string LinkShards(ControlSidecar& sidecar);
  // A sharded job's failure from the sidecar (a shard gone, the phase):
  // "" if none.
  std::string ShardFailure() const {
    return shard_failed_.load(std::memory_order_acquire) ? shard_failure_ : "";
  }

  // Sidecar thread.
  void OnMessage(ConnId c, const ControlMessage& m);
  void OnShardMessage(ConnId c, const ControlMessage& m);
  void MaybeWelcome();
  void Welcome();
  void MakeSides(const ChunkLayout& layout);
  void OnClose(ConnId c, const std::string& reason);
  void OnWakeup();
  void TellGone(uint32_t w, bool failed, const std::string& why);

  // Datapath thread.
  std::string AwaitWorkers();
  std::string SetUpJob();
  std::string ServeRounds(Outbox& out);
  bool Receive();
  uint64_t Progress() const;
  bool StepSides(Outbox& out);
  bool StepBroadcast(Outbox& out);
  bool TakeEvents(std::string* failure);
  std::string FinishedEarly();
  bool Alive(uint32_t w) const { return job_->alive(w); }
  bool Quit() const {
    return o_.quit != nullptr && o_.quit->load(std::memory_order_relaxed);
  }
  std::string NoProgress() const;
  std::string LoseSilent();
  uint64_t injected_at_open_ = 0;  // the injector's drops at the push's open
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
  std::vector<FrameKey> keys_;  // [w] (job_auth.h), set at Welcome
  std::string policy_text_;
  ControlSidecar* sc_ = nullptr;

  // Join state: the sidecar writes it (under join_mu_) until `joined_`;
  // read-only after, by both threads (but for the departure fields). The
  // sides are made with the last JOIN, so the sidecar can hand them PROBE,
  // STOP and BITMAP as soon as `joined_` is set.
  std::mutex join_mu_;
  Admission admission_{JoinPolicy{.workers = o_.workers,
                                  .mtu = o_.mtu,
                                  .max_gradient_bytes = o_.max_gradient_bytes,
                                  .require_data_port = true,
                                  .rank_by_name = o_.rank_by_name,
                                  .rank_by_claim = o_.shard_role.index > 0},
                       o_.secret, "udp-server"};
  JoinDesk& desk_ = admission_.desk();
  std::vector<Departure> gone_;  // by worker rank, sized at the WELCOME
  std::vector<std::unique_ptr<ReceiveSide>> push_;  // by worker rank
  std::vector<const ReceiveSide*> push_ptrs_;       // the same, for Gather
  std::vector<std::unique_ptr<SendSide>> bcast_;    // by worker rank
  std::vector<const SendSide*> bcast_ptrs_;         // the same, for the rows
  std::atomic<bool> joined_{false};
  // The bytes this server reduces: the gradient's, or its partition's in a
  // sharded job. Sidecar: wo before `joined_`.
  uint64_t job_bytes_ = 0;
  // Why the job cannot start (a sharded WELCOME refused): sidecar wo under
  // join_mu_; the datapath reads it under join_mu_.
  std::string admit_failure_;
  // A sharded job's links to the other server shards (null unsharded):
  // made before the sidecar thread; the phase's Decide runs on the
  // datapath, the rest on the sidecar.
  std::unique_ptr<ShardLinks> shards_;
  std::string shard_failure_;  // sidecar: wo (once) before `shard_failed_`
  std::atomic<bool> shard_failed_{false};

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
  // by job_ from SetUpJob on.
  std::unique_ptr<TolerancePolicy> policy_;
  // The job (the same object as dblp-server's): each iteration's
  // decisions, the rows and the workers' lifecycle. Its alive(w) is read
  // by the sidecar too (no ROUND_BEGIN to a lost worker).
  std::unique_ptr<ServerJob> job_;
  std::unique_ptr<RxLossInjector> loss_;
  std::vector<Packet> pkts_;
  std::vector<uint8_t> arrivals_;  // per worker: frames this turn
  uint64_t from_lost_ = 0;  // frames of lost workers, dropped
  std::vector<DatapathEvent> taken_;
  std::vector<uint32_t> order_buf_;
  std::vector<std::unique_ptr<PacketFrames<UdpSocketPort>>> frames_;
  uint64_t departures_ = 0;    // BYEs and lost connections taken
  Outbox* out_ = nullptr;      // ServeRounds'
  std::unique_ptr<RoundPacer> pacer_;
  SoloSync sync_;
  uint64_t it_ = 0;            // the running round's iteration
  bool broadcasting_ = false;  // the running round is it_'s broadcast
  uint64_t unpinned_ = 0;      // frames from an unpinned address
  uint64_t poll_gen_ = 0, drained_gen_ = 0;
  // The job's rows, streamed as the iterations end.
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

// Both sockets, and the job's nonce and session.
std::string JobServer::OpenSockets(ControlSidecar& sidecar) {
  std::string err;
  popts_.max_datagram = o_.mtu - udp::kIpUdpHeaders;
  if (!port_.Open(o_.data, popts_, &err)) return "--data: " + err;
  job_nonce_ = RandomAuthBytes();
  session_ = DeriveSession(o_.secret, job_nonce_);
  chunk_payload_ = ChunkPayloadForMtu(o_.mtu, FrameTagBytes(o_.frame_auth));
  policy_text_ = policy_->Describe();
  if (!sidecar.Listen(o_.control, &err, UdpServerApp())) {
    return "--control: " + err;
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
  row_stream_.set_on_error(o_.rows_on_error);
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
  if (std::string e = LinkShards(sidecar); !e.empty()) return Fail(1, e);
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
  if (job_) {
    row_stream_.Sync(job_->rows());  // a broadcast the failure cut short
    report_.rows = std::move(job_->rows());
  }
  report_.role = "server";
  report_.policy = policy_text_;
  report_.burst_iterations = o_.bursts.iterations;
  if (job_) report_.info = job_->Info();
  report_.info.emplace_back("transport", "kernel-udp");
  report_.info.emplace_back("loss", o_.loss);
  udp::FinishReport(row_stream_, std::move(report_), &res_);
  return res_;
}

// A server shard of a sharded job: its links to the others, over the
// sidecar; shard k > 0 registers with the directory before the sidecar
// thread runs (its JOIN goes out first).
std::string JobServer::LinkShards(ControlSidecar& sidecar) {
  if (!o_.shard_role.sharded()) return "";
  admission_.set_role(o_.shard_role);
  // The address the directory lists: the bound control port, so an
  // ephemeral --control works too.
  sockaddr_in ctrl{};
  std::string err;
  ParseIpv4Endpoint(o_.control, true, true, "127.0.0.1:9100", &ctrl, &err);
  ctrl.sin_port = htons(sidecar.bound_port());
  ShardRole role = o_.shard_role;
  if (role.index == 0) role.directory = FormatIpv4Endpoint(ctrl);
  shards_ = std::make_unique<ShardLinks>(
      ShardLinksConfig{.app = "dblp-udp-server",
                       .role = role,
                       .listen = FormatIpv4Endpoint(ctrl),
                       .job_flags = o_.shard_job_flags,
                       .local_ip = ntohl(port_.bound_addr().sin_addr.s_addr),
                       .mac = {},
                       .udp_port = port_.bound_port(),
                       .queues = 1,
                       .mtu = o_.mtu,
                       .secret = &o_.secret,
                       .policy = o_.policy,
                       .resync_every = o_.resync_every,
                       .round_timeout_ms = o_.round_timeout_ms},
      sidecar, [this](const std::string& why) {
        if (shard_failed_.load(std::memory_order_acquire)) return;
        shard_failure_ = why;
        shard_failed_.store(true, std::memory_order_release);
      });
  if (role.index > 0) return shards_->ConnectDirectory(o_.join_timeout_ms);
  return "";
}

// ---- sidecar thread -------------------------------------------------------

void JobServer::OnMessage(ConnId c, const ControlMessage& m) {
  if (shards_ && shards_->Owns(c)) return OnShardMessage(c, m);
  Admission::Step step;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    step = admission_.OnMessage(*sc_, c, m);
    if (step == Admission::Step::kShard) {
      shards_->OnRegistration(c, admission_.registration());
    }
    if (step == Admission::Step::kAdmitted) MaybeWelcome();
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

// A message on the directory's or a server shard's connection.
void JobServer::OnShardMessage(ConnId c, const ControlMessage& m) {
  std::lock_guard<std::mutex> lock(join_mu_);
  const ShardLinks::Event e = shards_->OnMessage(c, m);
  if (e == ShardLinks::Event::kAssigned) {
    admission_.Assign(*sc_, shards_->partition());
  }
  if (e != ShardLinks::Event::kNone) MaybeWelcome();
}

// Under join_mu_: WELCOME everyone once every worker (and, in a sharded
// job, every shard or the partition) is in.
void JobServer::MaybeWelcome() {
  if (joined_.load() || !admit_failure_.empty() || !desk_.full()) return;
  if (shards_ && !shards_->ready()) return;
  Welcome();
}

// One push receiver and one broadcast sender per worker.
void JobServer::MakeSides(const ChunkLayout& layout) {
  for (uint32_t w = 0; w < o_.workers; ++w) {
    const auto peer = static_cast<uint16_t>(w);
    push_.push_back(std::make_unique<ReceiveSide>(
        PushReceiveConfig(session_, peer, layout, keys_[w])));
    push_ptrs_.push_back(push_.back().get());
    bcast_.push_back(std::make_unique<SendSide>(
        BroadcastSendConfig(session_, peer, o_.burst)));
    bcast_ptrs_.push_back(bcast_.back().get());
  }
}

// The last JOIN: the sides, then WELCOME to every worker, then `joined_`.
// A server shard's WELCOMEs describe its partition (ShardLinks), and the
// sides run over it.
void JobServer::Welcome() {
  desk_.Close();
  gone_.resize(o_.workers);
  const JobWelcome job{.session = session_,
                       .resync_every = o_.resync_every,
                       .push_feedback = o_.push_feedback,
                       .consistent_broadcast = o_.consistent_broadcast,
                       .lanes = 1,
                       .server_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr),
                       .server_mac = {},
                       .udp_base_port = port_.bound_port(),
                       .policy = policy_text_,
                       .frame_auth = o_.frame_auth,
                       .job_nonce = job_nonce_};
  std::vector<WelcomeMsg> welcomes;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    keys_.push_back(admission_.MemberFrameKey(w, job_nonce_, o_.frame_auth));
    welcomes.push_back(admission_.Welcome(w, chunk_payload_, job));
    if (!shards_) continue;
    if (std::string why = shards_->FillWelcome(&welcomes.back(), job_nonce_);
        !why.empty()) {
      admit_failure_ = why;
      for (const JoinDesk::Member& m : desk_.members()) {
        sc_->Send(m.conn, ErrorMsg{2, "the job failed: " + why});
      }
      return;
    }
  }
  job_bytes_ = welcomes[0].total_bytes;
  MakeSides(ChunkLayout(job_bytes_, chunk_payload_));
  for (uint32_t w = 0; w < o_.workers; ++w) {
    WelcomeMsg& wm = welcomes[w];
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
  if (shards_ && shards_->Owns(c)) {
    shards_->OnClose(c, reason);
    return;
  }
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
  if (shards_) shards_->Flush();  // the phase's partial or decision
  if (!requests_.Drain(&sending_)) return;
  for (const ControlRequest& r : sending_) {
    std::visit(
        Overloaded{
            [&](const RoundBeginRequest& rb) {
              const RoundBeginMsg m = RoundBeginMessage(rb);
              const auto& members = desk_.members();
              for (uint32_t w = 0; w < members.size(); ++w) {
                if (job_->alive(w)) sc_->Send(members[w].conn, m);
              }
            },
            [&](const AcceptedRequest& a) {
              AcceptedMsg m;
              if (accepted_.Take(a.peer, a.round, &m)) {
                sc_->Send(desk_.members()[a.peer].conn, m);
              }
            },
            [&](const DropRequest& d) {
              if (size_t{d.peer} >= desk_.members().size()) return;
              const auto conn = desk_.members()[d.peer].conn;
              sc_->Send(conn, ErrorMsg{2, DroppedText()});
              sc_->Close(conn, "went on without it");
            },
            [&](const FinishRequest& f) {
              // ERROR (with the cause) or a plain close to every worker.
              for (const auto& w : desk_.members()) {
                if (!f.ok) sc_->Send(w.conn, ErrorMsg{2, failure_});
                sc_->Close(w.conn, f.ok ? "job finished" : failure_);
              }
              // BYE or the ERROR to the other server shards.
              if (shards_) shards_->Finish(f.ok ? "" : failure_);
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
  std::string failure;
  auto failed = [&] {
    std::lock_guard<std::mutex> lock(join_mu_);
    failure = admit_failure_.empty() ? ShardFailure() : admit_failure_;
    return !failure.empty();
  };
  if (udp::WaitFor(
          [&] {
            return joined_.load(std::memory_order_acquire) || Quit() ||
                   failed();
          },
          o_.join_timeout_ms)) {
    if (!failure.empty()) return failure;
    return Quit() ? "interrupted" : "";
  }
  std::string shortfall;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    shortfall = desk_.Shortfall();
    if (shards_ && !shards_->Shortfall().empty()) {
      shortfall += "; " + shards_->Shortfall();
    }
  }
  const std::string fix =
      shards_ ? "start the workers with --server=" + o_.shard_role.directory +
                    " and every server shard with --directory=" +
                    o_.shard_role.directory
              : "start the workers with the server's control address";
  return shortfall + " within " + std::to_string(o_.join_timeout_ms) +
         " ms: " + fix;
}

std::string JobServer::SetUpJob() {
  const uint32_t W = o_.workers;
  layout_ = ChunkLayout(job_bytes_, chunk_payload_);
  res_.chunks = layout_.num_chunks();
  std::vector<std::string> names;
  for (const JoinDesk::Member& m : desk_.members()) names.push_back(m.name);
  // A server shard: the job's phase decides the norm and p; the clip share
  // counts the whole gradient.
  ServerJobSettings settings = o_;
  if (shards_) {
    settings.phase = shards_.get();
    settings.model_floats = shards_->partition().model_bytes / sizeof(float);
  }
  try {
    job_ = std::make_unique<ServerJob>(settings, std::move(policy_), layout_,
                                       std::move(names), o_.send_order, o_.seed,
                                       "dblp-udp-server");
  } catch (const std::bad_alloc&) {
    return "cannot allocate the sums of a " +
           std::to_string(layout_.total_bytes()) +
           "-byte gradient: lower the workers' size or give the server more "
           "memory";
  }
  job_->set_row_stream(&row_stream_);
  loss_ = std::make_unique<RxLossInjector>(loss_spec_, o_.bursts,
                                           HashMix(o_.seed, 0xB0));
  loss_->StartClock(NowNs());
  pkts_.resize(udp::kRxBurst);
  for (Packet& p : pkts_) p.bytes.reserve(popts_.max_datagram);
  arrivals_.assign(W, 0);
  const auto* mean =
      reinterpret_cast<const uint8_t*>(job_->iteration().mean().data());
  for (uint32_t w = 0; w < W; ++w) {
    frames_.push_back(std::make_unique<PacketFrames<UdpSocketPort>>(
        &port_, w, mean, &layout_, o_.burst));
    frames_.back()->set_auth(keys_[w]);
  }
  return "";
}

std::string JobServer::ServeRounds(Outbox& out) {
  out_ = &out;
  // Yields, not pauses, while spinning: the sidecar thread may share the
  // core.
  pacer_ = std::make_unique<RoundPacer>(
      512, o_.idle_sleep_us, o_.round_timeout_ms, o_.quit, nullptr,
      o_.deep_idle, IdleBackoff::Spin::kYield);
  ServerCoordinator coord(*job_, *this, o_.push_only);
  ServeIterations(*this, sync_, coord, true);
  return sync_.failure();  // "": every live worker said BYE
}

// Turns until done(). `work` ends the idle back-off; only progress
// (Progress: a new chunk, a first-pass frame, a BITMAP showing more, a
// STOP, a departure) feeds the watchdog, so a round whose every frame is
// lost, or whose peer stopped, still times out.
template <class Done>
bool JobServer::RunRound(uint64_t it, bool broadcasting, Done done) {
  it_ = it;
  broadcasting_ = broadcasting;
  std::string failure;
  const PollEnd end = PollUntil(
      *pacer_, NowNs,
      [&](uint64_t) {
        PollTurn t{Receive()};
        t.work = TakeEvents(&failure) || t.work;
        if (failure.empty() && !broadcasting) failure = FinishedEarly();
        if (failure.empty()) {
          t.work = StepSides(*out_) || t.work;
          if (broadcasting) t.work = StepBroadcast(*out_) || t.work;
          if (done()) t.then = PollTurn::Then::kDone;
        }
        if (!failure.empty()) t.then = PollTurn::Then::kFailed;
        return t;
      },
      [&] { return Progress(); }, OneTimeout,
      [&](uint64_t) {
        // --on_worker_loss=continue: the workers the round still waits for
        // while the others are done are lost, and it goes on.
        failure = LoseSilent();
        ++departures_;
        return failure.empty();
      });
  switch (end) {
    case PollEnd::kDone:
      return true;
    case PollEnd::kQuit:
      sync_.Fail("interrupted");
      return false;
    case PollEnd::kFailed:
    case PollEnd::kTimedOut:
      sync_.Fail(failure);
      return false;
  }
  return false;
}

std::string JobServer::LoseSilent() {
  std::vector<uint32_t> dropped;
  std::string failure = job_->LoseSilent(
      it_, broadcasting_, o_.round_timeout_ms,
      [&](uint32_t w) {
        return broadcasting_ ? !bcast_[w]->done() : !push_[w]->stopped();
      },
      NoProgress(), &dropped);
  for (const uint32_t w : dropped) {
    out_->Post(DropRequest{static_cast<uint16_t>(w)});
  }
  return failure;
}

void JobServer::OpenPushSides(uint64_t /*it*/, const PushOpening& open) {
  const uint64_t now = NowNs();
  injected_at_open_ = loss_->dropped();
  const RoundBeginRequest& rb = open.announce;
  for (auto& side : push_) {
    side->Begin(rb.round, rb.p, 0, 0, now);
    side->DeadlineAfterFirstChunk(open.deadline_after_first_ns,
                                  rb.min_fraction);
  }
}

// One RX poll: each frame to its worker's side, accepted chunks summed.
bool JobServer::Receive() {
  const uint32_t W = o_.workers;
  ++poll_gen_;
  const uint16_t n = port_.RxBurst(pkts_.data(), udp::kRxBurst);
  if (n < udp::kRxBurst) drained_gen_ = poll_gen_;
  std::fill(arrivals_.begin(), arrivals_.end(), 0);
  MeanReducer& reducer = job_->iteration().reducer();
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
    // Summed, or refused by the reducer's check (counted in w's tally).
    auto accumulate = [&](const DataHeader& h, const uint8_t* payload) {
      reducer.Accumulate(w, h.seq, payload);
    };
    push_[w]->OnFrame(buf, len, accumulate);
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

// One burst to each worker whose broadcast is not done.
bool JobServer::StepBroadcast(Outbox& out) {
  const uint64_t now = NowNs();
  bool work = false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (!Alive(w)) continue;
    work = bcast_[w]->Step(now, *frames_[w], out) || work;
  }
  return work;
}

// What moves the job (send_side.h, receive_side.h): never a duplicate, a
// stranger's frame, a resent pass or a PROBE retry.
uint64_t JobServer::Progress() const {
  uint64_t mark = departures_;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    mark += push_[w]->progress() + bcast_[w]->progress();
  }
  return mark;
}

bool JobServer::TakeEvents(std::string* failure) {
  if (failure->empty()) *failure = ShardFailure();
  if (!events_.Drain(&taken_)) return false;
  for (const DatapathEvent& e : taken_) {
    ++departures_;  // only BYE and lost connections come here
    std::string f = job_->OnEvent(e, it_, [&](uint32_t w) {
      return ServerJob::GoneReason{gone_[w].failed, gone_[w].why};
    });
    if (failure->empty()) *failure = std::move(f);
  }
  return true;
}

std::string JobServer::FinishedEarly() {
  return job_->FinishedEarly(
      it_, [&](uint32_t w) { return push_[w]->receiver().received(); },
      [&](uint32_t w) { return push_[w]->stopped(); });
}

void JobServer::ClosePushSides() {
  for (uint32_t w = 0; w < o_.workers; ++w) {
    push_[w]->Close();
    res_.rounds.push_back(
        UdpServerRound{it_, w, push_[w]->receiver().delivered_fraction()});
  }
}

// Iteration it's mean to every live worker, in the job's order.
bool JobServer::BeginBroadcastSides(uint64_t it) {
  const uint32_t round = BroadcastRound(it);
  const uint64_t now = NowNs();
  for (uint32_t w = 0; w < o_.workers; ++w) {
    if (!Alive(w)) continue;
    job_->BroadcastOrder(w, it, layout_.num_chunks(), &order_buf_);
    bcast_[w]->Begin(round, order_buf_, now, layout_.num_chunks());
  }
  return true;
}

std::string JobServer::NoProgress() const {
  if (broadcasting_) {
    return job_->BroadcastStalled(it_, o_.round_timeout_ms, [&](uint32_t w) {
      return bcast_[w]->done();
    });
  }
  return job_->PushStalled(
      it_, o_.round_timeout_ms,
      [&](uint32_t w) { return push_[w]->receiver().received(); },
      loss_->dropped() - injected_at_open_);
}

// ERROR (with the cause) or a plain close to every worker, flushed before
// the sidecar stops.
void JobServer::Finish(Outbox& out, const std::string& failure) {
  failure_ = failure;  // before the request: the sidecar reads it then
  out.Post(FinishRequest{failure.empty()});
  udp::WaitFor([&] { return finished_.load(std::memory_order_acquire); }, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// The DPDK server's names (src/dpdk/server/server_report.cc) for what both
// count, so tools and tests read one set.
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
      {"control_connections_refused", sc_->connections_refused()},
      {"control_connections_evicted", sc_->connections_evicted()},
      {"control_join_timeouts", sc_->join_timeouts()},
  };
  std::vector<const ReceiverRound*> receivers;
  for (const auto& side : push_) receivers.push_back(&side->receiver());
  AddReceiverCounters("push_", receivers, true, &c);
  if (job_) job_->AddCounters(&c);
  res_.counters.insert(c.begin(), c.end());
}

}  // namespace

UdpJobServerResult RunUdpJobServer(const UdpJobServerOptions& o) {
  return JobServer(o).Run();
}

}  // namespace dblp
