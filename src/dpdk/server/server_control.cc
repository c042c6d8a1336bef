#include "server/server_control.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <variant>

#include "dblp/base/log.h"
#include "dblp/job/diagnosis.h"
#include "dblp/round/round_control.h"
#include "runtime/eal_app.h"

namespace dblp {

ServerControl::ServerControl(const ServerJoinConfig& join,
                             std::vector<const DatapathCounters*> ctr,
                             double stats_period_s, const ControlLimits& limits)
    : cfg_(join),
      sidecar_(MakeCallbacks(std::move(ctr), stats_period_s), kMaxControlFrame,
               limits),
      admission_(JoinPolicy{join.workers, join.mtu, join.max_gradient_bytes,
                            false, join.rank_by_name,
                            join.sharding && join.sharding->role.index > 0},
                 *join.secret, "dblp-server"),
      errors_(join.workers),
      bye_seen_(join.workers, false),
      alive_(new std::atomic<bool>[join.workers]) {
  for (uint32_t w = 0; w < join.workers; ++w) alive_[w].store(true);
  if (join.sharding && join.sharding->role.sharded()) {
    admission_.set_role(join.sharding->role);
    shards_ = std::make_unique<ShardLinks>(
        *join.sharding, sidecar_,
        [this](const std::string& why) { FailFromSidecar(why); });
  }
}

// Sidecar thread: a shard or the directory is gone; lcore 0 ends the job
// at its next look (HandleEvents), a blocked phase returns on its own.
void ServerControl::FailFromSidecar(const std::string& why) {
  if (failed_.load(std::memory_order_acquire)) return;
  failure_ = why;
  failed_.store(true, std::memory_order_release);
}

ServerControl::~ServerControl() { Stop(); }

ControlSidecar::Callbacks ServerControl::MakeCallbacks(
    std::vector<const DatapathCounters*> ctr, double stats_period_s) {
  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId c, const ControlMessage& m) {
    OnMessage(c, m);
  };
  cb.on_close = [this](ConnId c, const std::string& r) { OnClose(c, r); };
  cb.on_wakeup = [this] { SendRequests(); };
  if (stats_period_s > 0) {
    cb.tick_ms = static_cast<uint32_t>(stats_period_s * 1000);
    cb.on_tick = [this, ctr, stats_period_s, last_rx = uint64_t{0},
                  last_tx = uint64_t{0}]() mutable {
      if (!attached_.load()) return;
      uint64_t rx = 0, tx = 0;
      for (const DatapathCounters* c : ctr) {
        rx += c->rx_frames.load(std::memory_order_relaxed);
        tx += c->tx_frames.load(std::memory_order_relaxed);
      }
      std::printf("[server] iter %llu  rx %.0f pps  tx %.0f pps  p=%.3f%s\n",
                  static_cast<unsigned long long>(iteration_.load()),
                  static_cast<double>(rx - last_rx) / stats_period_s,
                  static_cast<double>(tx - last_tx) / stats_period_s, p_.load(),
                  critical_.load() ? " (critical)" : "");
      std::fflush(stdout);
      last_rx = rx;
      last_tx = tx;
    };
  }
  return cb;
}

// Every worker joined: each gets its rank, the job's layout, the address
// its frames are pinned to and the frame authentication, all under the
// WELCOME's MAC.
void ServerControl::Welcome() {
  JoinDesk& desk = admission_.desk();
  desk.Close();
  const uint32_t payload =
      ChunkPayloadForMtu(cfg_.mtu, FrameTagBytes(cfg_.frame_auth));
  pinned_.resize(cfg_.workers);
  keys_.resize(cfg_.workers);
  const JobWelcome job{.session = cfg_.session,
                       .resync_every = cfg_.resync_every,
                       .push_feedback = cfg_.push_feedback,
                       .consistent_broadcast = cfg_.consistent_broadcast,
                       .lanes = cfg_.lanes,
                       .server_ipv4 = cfg_.local_ip,
                       .server_mac = std::to_array(cfg_.mac.addr_bytes),
                       .udp_base_port = cfg_.udp_port,
                       .policy = cfg_.policy,
                       .frame_auth = cfg_.frame_auth,
                       .job_nonce = cfg_.job_nonce};
  for (uint32_t w = 0; w < cfg_.workers; ++w) {
    const JoinDesk::Member& member = desk.members()[w];
    WelcomeMsg wm = admission_.Welcome(w, payload, job);
    wm.worker_ipv4 =
        member.data_ipv4 != 0 ? member.data_ipv4 : kDefaultWorkerIpv4 + w;
    if (shards_) {
      if (std::string why = shards_->FillWelcome(&wm, cfg_.job_nonce);
          !why.empty()) {
        admit_failure_ = why;
        for (const JoinDesk::Member& m : desk.members()) {
          sidecar_.Send(m.conn, ErrorMsg{2, "the job failed: " + why});
        }
        return;
      }
    }
    admission_.SealWelcome(w, &wm);
    Endpoint& pin = pinned_[w];
    std::memcpy(pin.mac.addr_bytes, member.data_mac.data(), 6);
    pin.ipv4 = wm.worker_ipv4;
    pin.udp_port = static_cast<uint16_t>(cfg_.udp_port + 1 + w);
    keys_[w] = admission_.MemberFrameKey(w, cfg_.job_nonce, cfg_.frame_auth);
    sidecar_.Send(member.conn, wm);
  }
  joined_.store(true, std::memory_order_release);
}

void ServerControl::MaybeWelcome() {
  if (joined_.load() || !admit_failure_.empty()) return;
  if (!admission_.desk().full()) return;
  if (shards_ && !shards_->ready()) return;
  Welcome();
}

// Sidecar: a message on the directory's or a shard's connection.
void ServerControl::OnShardMessage(ConnId c, const ControlMessage& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shards_->OnMessage(c, m) == ShardLinks::Event::kAssigned) {
    admission_.Assign(sidecar_, shards_->partition());
  }
  MaybeWelcome();
}

void ServerControl::OnMessage(ConnId c, const ControlMessage& m) {
  if (shards_ && shards_->Owns(c)) return OnShardMessage(c, m);
  Admission::Step step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = admission_.OnMessage(sidecar_, c, m);
    if (step == Admission::Step::kShard) {
      shards_->OnRegistration(c, admission_.registration());
    }
    if (step == Admission::Step::kAdmitted) MaybeWelcome();
  }
  if (step != Admission::Step::kMember) return;
  const int w = admission_.desk().RankOf(c);
  if (!attached_.load(std::memory_order_acquire)) return;
  // A PROBE or BITMAP goes to the side of the shard it names, STOP to every
  // shard's broadcast side.
  if (DeliverToSides(m, bcast_[w], push_[w], NowNs())) return;
  if (const auto* err = std::get_if<ErrorMsg>(&m)) {
    // The worker failed; its connection closes next (PeerGoneEvent).
    std::lock_guard<std::mutex> lock(mu_);
    errors_[w] = err->text;
  } else if (std::holds_alternative<ByeMsg>(m) && !bye_seen_[w]) {
    // One BYE per worker: a peer repeating it must not fill the ring.
    bye_seen_[w] = true;
    events_.Push(PeerByeEvent{static_cast<uint16_t>(w)});
  }
}

void ServerControl::OnClose(ConnId c, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shards_ && shards_->Owns(c)) {
    admission_.OnClose(c);
    shards_->OnClose(c, reason);
    return;
  }
  const int w = admission_.OnClose(c);  // frees a slot during the join
  if (w < 0) return;
  if (!joined_.load()) {
    DBLP_LOG(Warning,
             "dblp-server: a worker left before the job "
             "started (%s)",
             reason.c_str());
    return;
  }
  events_.Push(PeerGoneEvent{static_cast<uint16_t>(w)});
  DBLP_LOG(Info,
           "dblp-server: control connection of worker %d "
           "closed: %s",
           w, reason.c_str());
}

std::string ServerControl::worker_error(uint32_t w) {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_[w];
}

void ServerControl::Announce(const RoundBeginRequest& r) {
  const RoundBeginMsg rb = RoundBeginMessage(r);
  std::string why;
  if (ValidateControl(rb, &why) != ControlError::kNone) {
    // A policy value the wire cannot carry: a bug, not a hang.
    FailFromSidecar("cannot announce round " + std::to_string(r.round) + ": " +
                    why);
    return;
  }
  for (uint32_t w = 0; w < admission_.desk().members().size(); ++w) {
    if (alive_[w].load())
      sidecar_.Send(admission_.desk().members()[w].conn, rb);
  }
}

void ServerControl::Finish() {
  if (thread_ == nullptr || shards_ == nullptr) return;
  outbox().Post(FinishRequest{true});
  for (int i = 0; i < 200 && !job_error_sent_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ServerControl::Fail(const std::string& why) {
  if (thread_ == nullptr) return;
  job_error_ = why;
  outbox().Post(FinishRequest{false});
  for (int i = 0; i < 200 && !job_error_sent_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Stop();
}

// Sidecar thread.
void ServerControl::SendJobError() {
  const ErrorMsg m{2, "the job failed: " + job_error_.substr(0, 900)};
  for (uint32_t w = 0; w < admission_.desk().members().size(); ++w) {
    if (!alive_[w].load()) continue;
    sidecar_.Send(admission_.desk().members()[w].conn, m);
    sidecar_.Close(admission_.desk().members()[w].conn, "job failed");
  }
  if (shards_) shards_->Finish(job_error_);
  job_error_sent_.store(true);
}

void ServerControl::SendRequests() {
  if (shards_) shards_->Flush();  // the phase's partial or decision
  ControlRequest r;
  while (requests_.Pop(&r)) {
    if (const auto* f = std::get_if<FinishRequest>(&r)) {
      if (!f->ok) {
        SendJobError();
      } else {
        shards_->Finish("");
        job_error_sent_.store(true);
      }
      continue;
    }
    if (const auto* rb = std::get_if<RoundBeginRequest>(&r)) {
      Announce(*rb);
      continue;
    }
    if (const auto* d = std::get_if<DropRequest>(&r)) {
      if (d->peer < admission_.desk().members().size()) {
        const auto conn = admission_.desk().members()[d->peer].conn;
        sidecar_.Send(conn, ErrorMsg{2, DroppedText()});
        sidecar_.Close(conn, "went on without it");
      }
      continue;
    }
    if (const auto* a = std::get_if<AcceptedRequest>(&r)) {
      AcceptedMsg m;
      if (accepted_.Take(a->peer, a->round, &m) && alive_[a->peer].load()) {
        sidecar_.Send(admission_.desk().members()[a->peer].conn, m);
      }
      continue;
    }
    const uint16_t peer = std::visit(
        Overloaded{[](const RoundBeginRequest&) -> uint16_t { return 0; },
                   [](const FinishRequest&) -> uint16_t { return 0; },
                   [](const auto& q) -> uint16_t { return q.peer; }},
        r);
    if (peer >= admission_.desk().members().size()) continue;
    ReceiveSide* answering = nullptr;
    if (const auto* b = std::get_if<BitmapRequest>(&r)) {
      if (b->side >= push_[peer].size()) continue;
      answering = push_[peer][b->side];
    }
    for (const ControlMessage& m : SideRequestMessages(r, answering)) {
      sidecar_.Send(admission_.desk().members()[peer].conn, m);
    }
  }
}

AppFailure ServerControl::AdmitWorkers(const std::string& listen,
                                       uint32_t timeout_ms,
                                       const std::atomic<bool>& quit,
                                       bool realtime) {
  std::string err;
  if (!sidecar_.Listen(listen, &err)) {
    return {"cannot listen on " + listen + ": " + err,
            "pick a free --listen=IP:PORT"};
  }
  std::printf(
      "dblp-server: %u port(s), waiting for %u workers on %s "
      "(session %08x, policy %s)\n",
      cfg_.ports, cfg_.workers, listen.c_str(), cfg_.session,
      cfg_.policy.c_str());
  std::fflush(stdout);
  if (shards_ && cfg_.sharding->role.index > 0) {
    // Registered before the thread runs: the JOIN goes out first.
    if (std::string why = shards_->ConnectDirectory(timeout_ms); !why.empty()) {
      return {why, "see above"};
    }
  }
  thread_ = std::make_unique<SidecarThread>(sidecar_);
  SetControlPriorities(*thread_, "dblp-server", realtime);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string directory =
      shards_ ? cfg_.sharding->role.directory : listen;
  while (!joined_.load(std::memory_order_acquire)) {
    std::string admit_failure;
    {
      std::lock_guard<std::mutex> lock(mu_);
      admit_failure = admit_failure_;
    }
    if (!admit_failure.empty() || failed()) {
      Stop();
      return {admit_failure.empty() ? failure_ : admit_failure,
              "see above; every server shard's log says what it refused"};
    }
    if (quit.load() || std::chrono::steady_clock::now() > deadline) {
      std::string shortfall;
      {
        std::lock_guard<std::mutex> lock(mu_);
        shortfall = admission_.desk().Shortfall();
        if (shards_ && !shards_->Shortfall().empty()) {
          shortfall += "; " + shards_->Shortfall();
        }
      }
      Stop();
      return {
          shortfall,
          "start all workers with --server=" + directory +
              (shards_ ? " and every server shard with --directory=" + directory
                       : std::string(" or lower --workers"))};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {};
}

void ServerControl::Attach(std::vector<std::vector<ReceiveSide*>> push,
                           std::vector<std::vector<SendSide*>> bcast) {
  push_ = std::move(push);
  bcast_ = std::move(bcast);
  attached_.store(true, std::memory_order_release);
}

}  // namespace dblp
