#include "udp/udp_push.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <variant>

#include "dblp/admission.h"
#include "dblp/chunking.h"
#include "dblp/control.h"
#include "dblp/control_sidecar.h"
#include "dblp/join.h"
#include "dblp/loss_fill.h"
#include "dblp/loss_model.h"
#include "dblp/packet_frames.h"
#include "dblp/receive_side.h"
#include "dblp/receiver_round.h"
#include "dblp/rng.h"
#include "dblp/round_control.h"
#include "dblp/round_events.h"
#include "dblp/send_order.h"
#include "dblp/send_side.h"
#include "dblp/sender_round.h"
#include "dblp/udp_transport.h"
#include "dblp/wire.h"
#include "run_report.h"

namespace dblp {
namespace {

constexpr uint32_t kServerEndpoint = 0;
constexpr uint16_t kRxBurst = 64;
// UDP payload of an MTU-sized IPv4 datagram: the largest frame we expect.
constexpr uint32_t kIpUdpHeaders = kIpv4HeaderBytes + kUdpHeaderBytes;

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Multi-producer, single-consumer queue of typed messages (ControlRequest
// or DatapathEvent, by value) between the sidecar and the datapath. The
// consumer polls it every loop turn, so Drain first checks an atomic flag
// and locks only when something was pushed: an idle check is one load.
template <class T>
class EventQueue {
 public:
  void Push(const T& e) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(e);
    pending_.store(true, std::memory_order_release);
  }
  // Moves everything queued into *out (cleared first); false if empty.
  bool Drain(std::vector<T>* out) {
    out->clear();
    if (!pending_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(items_, *out);
    pending_.store(false, std::memory_order_relaxed);
    return !out->empty();
  }

 private:
  std::mutex mu_;
  std::vector<T> items_;
  std::atomic<bool> pending_{false};
};

// The datapath's outbox (the sides' ControlOutbox): queues a request and
// wakes the sidecar, which sends it.
class Outbox {
 public:
  Outbox(EventQueue<ControlRequest>* queue, ControlSidecar* sidecar)
      : queue_(queue), sidecar_(sidecar) {}
  void Post(const ControlRequest& r) {
    queue_->Push(r);
    sidecar_->Wakeup();
  }

 private:
  EventQueue<ControlRequest>* queue_;
  ControlSidecar* sidecar_;
};

// Busy polling while there is work; when idle, yield first (the sidecar
// threads may share our core), then sleep briefly so an idle round does
// not burn a core for nothing.
class Backoff {
 public:
  explicit Backoff(uint32_t sleep_us) : sleep_us_(sleep_us) {}
  void Work() { empty_ = 0; }
  void Idle() {
    if (++empty_ < 512 || sleep_us_ == 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    }
  }

 private:
  uint32_t sleep_us_;
  uint32_t empty_ = 0;
};

// Watchdog of a poll loop: fails a round that makes no progress.
class Watchdog {
 public:
  explicit Watchdog(uint32_t timeout_ms)
      : timeout_ns_(uint64_t{timeout_ms} * 1000000) {}
  void Progress() { last_ = NowNs(); }
  bool Expired() const { return NowNs() - last_ > timeout_ns_; }

 private:
  uint64_t timeout_ns_;
  uint64_t last_ = NowNs();
};

// Checked before any socket opens, so a bad CPU fails fast on both sides.
bool CheckCpu(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
      (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))) {
    *error = "CPU " + std::to_string(cpu) +
             " is not available to this "
             "process (" +
             std::to_string(CPU_COUNT(&allowed)) +
             " allowed): pick another CPU, or -1 for no pinning";
    return false;
  }
  return true;
}

bool PinThisThread(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) {
    *error = "cannot pin the datapath thread to CPU " + std::to_string(cpu) +
             ": " + std::strerror(rc);
    return false;
  }
  return true;
}

std::string CheckCommon(uint32_t mtu, uint32_t round_timeout_ms) {
  try {
    ChunkPayloadForMtu(mtu);
  } catch (const std::exception& e) {
    return std::string("mtu: ") + e.what() + " (use 576..9216, e.g. 1500)";
  }
  if (round_timeout_ms == 0) return "round timeout must be > 0 ms";
  return "";
}

// A result with exit code `code` and the error `msg`.
template <class Result>
Result Failed(Result* res, int code, const std::string& msg) {
  res->exit_code = code;
  res->error = msg;
  return *res;
}

// Waits (polling) for `done` or the timeout; true if done.
template <class F>
bool WaitFor(F done, uint32_t timeout_ms) {
  const uint64_t end = NowNs() + uint64_t{timeout_ms} * 1000000;
  while (!done()) {
    if (NowNs() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Ends a run's report: summary.json next to the streamed rows, with every
// counter. A row or a summary that could not be written fails a run that
// had not failed already (its results are incomplete).
template <class Result>
void FinishReport(RowStream& stream, RunReport report, Result* res) {
  if (!stream.is_open()) return;
  std::string err = stream.error();
  stream.Close();
  report.counters.assign(res->counters.begin(), res->counters.end());
  if (err.empty()) WriteRunSummary(stream.dir(), report, &err);
  if (!err.empty() && res->exit_code == 0) {
    res->exit_code = 1;
    res->error = err;
  }
}

// ---------------------------------------------------------------------------
// Server: one ReceiveSide per worker, the mean over all of them.
// ---------------------------------------------------------------------------

class PushServer {
 public:
  explicit PushServer(const UdpPushServerOptions& o) : o_(o) {}
  UdpPushServerResult Run();

 private:
  // Why a worker left (an ERROR's text, or the close reason): the sidecar
  // writes both once, before its PeerGoneEvent; the datapath reads them
  // after taking that event.
  struct Departure {
    bool failed = false;
    std::string why;
    bool told = false;  // sidecar only
  };

  UdpPushServerResult Fail(int code, const std::string& msg) {
    return Failed(&res_, code, msg);
  }
  std::string CheckOptions();

  // Sidecar thread.
  void OnMessage(ConnId c, const ControlMessage& m);
  void Welcome();
  void OnClose(ConnId c, const std::string& reason);
  void OnWakeup();
  void TellGone(uint32_t w, bool failed, const std::string& why);

  // Datapath thread.
  std::string AwaitWorkers();
  std::string SetUpJob();
  std::string ServeRounds(Outbox& out);
  void OpenRound(Outbox& out);
  bool Receive(bool* progress);
  bool StepSides(Outbox& out);
  bool TakeEvents(std::string* failure);
  bool CloseRoundIfStopped();
  std::string NoProgress() const;
  void Finish(Outbox& out, const std::string& failure);
  void FillCounters();

  const UdpPushServerOptions& o_;
  UdpPushServerResult res_;  // datapath only
  // Datapath; the sidecar reads only its bound address, for WELCOME.
  UdpSocketPort port_;
  // Set before the sidecar thread starts, read-only after.
  UdpPortOptions popts_;
  LossSpec loss_spec_;
  uint32_t session_ = 0;
  uint32_t chunk_payload_ = 0;
  AuthBytes job_nonce_{};
  FrameKey frame_key_;
  ControlSidecar* sc_ = nullptr;

  // Join state: the sidecar writes it (under join_mu_) until `joined_`;
  // read-only after, by both threads (but for Link's departure fields). The
  // sides are made with the last JOIN, so the sidecar can hand them PROBEs as
  // soon as `joined_` is set.
  std::mutex join_mu_;
  Admission admission_{
      JoinPolicy{o_.workers, o_.mtu, o_.max_gradient_bytes, true}, o_.secret,
      "udp-server"};
  JoinDesk& desk_ = admission_.desk();
  uint64_t unpinned_ = 0;        // datapath: frames from an unpinned address
  std::vector<Departure> gone_;  // by worker rank, sized at the WELCOME
  std::vector<std::unique_ptr<ReceiveSide>> sides_;  // by worker rank
  std::atomic<bool> joined_{false};

  EventQueue<DatapathEvent> events_;     // sidecar -> datapath: BYE, gone
  EventQueue<ControlRequest> requests_;  // datapath -> sidecar
  std::vector<ControlRequest> sending_;  // sidecar only
  // The job's failure text: datapath wo before its FinishRequest; the
  // sidecar reads it when handling that request.
  std::string failure_;
  std::atomic<bool> finished_{false};  // sidecar: wo once finish went out

  // Datapath only, from SetUpJob on.
  ChunkLayout layout_;
  std::unique_ptr<MeanReducer> reducer_;
  std::vector<float> mean_;
  std::vector<Bitmap> arrived_;
  std::unique_ptr<LossInjector> loss_;
  std::vector<Packet> pkts_;
  std::vector<uint8_t> arrivals_;  // per worker: frames this turn
  std::vector<uint8_t> bye_;       // per worker: said BYE
  std::vector<DatapathEvent> taken_;
  uint64_t it_ = 0;
  uint64_t poll_gen_ = 0, drained_gen_ = 0;
  uint64_t round_open_ns_ = 0;
  // Datapath only: the rows, streamed as the rounds close and kept for
  // the summary.
  RowStream row_stream_;
  RunReport report_;
};

std::string PushServer::CheckOptions() {
  if (std::string e = CheckCommon(o_.mtu, o_.round_timeout_ms); !e.empty()) {
    return e;
  }
  if (o_.workers == 0 || o_.workers >= 0xFFFF) {
    return "workers=" + std::to_string(o_.workers) +
           " is out of range: use 1..65534";
  }
  if (!(o_.p >= 0 && o_.p < 1)) {
    return "p=" + std::to_string(o_.p) + " must be in [0, 1)";
  }
  std::string err;
  if (!CheckCpu(o_.cpu, &err)) return "server datapath: " + err;
  try {
    loss_spec_ = ParseLossSpec(o_.loss);
  } catch (const std::exception& e) {
    return std::string("loss: ") + e.what();
  }
  return "";
}

UdpPushServerResult PushServer::Run() {
  if (std::string e = CheckOptions(); !e.empty()) return Fail(2, e);
  std::string err;
  // Before anything else: a directory that cannot take the rows fails the
  // server now, not after the whole job.
  if (!o_.out_dir.empty() && !row_stream_.Open(o_.out_dir, &err)) {
    return Fail(2, err);
  }
  popts_.max_datagram = o_.mtu - kIpUdpHeaders;
  if (!port_.Open(o_.data, popts_, &err)) return Fail(1, err);
  if (o_.secret.insecure() && o_.frame_auth != FrameAuthMode::kNone) {
    return Fail(2, "frame authentication needs a job secret");
  }
  job_nonce_ = RandomAuthBytes();
  session_ = DeriveSession(o_.secret, job_nonce_);
  frame_key_ = DeriveFrameKey(o_.secret, job_nonce_, o_.frame_auth);
  chunk_payload_ = ChunkPayloadForMtu(o_.mtu, FrameTagBytes(o_.frame_auth));

  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId c, const ControlMessage& m) {
    OnMessage(c, m);
  };
  cb.on_close = [this](ConnId c, const std::string& r) { OnClose(c, r); };
  cb.on_wakeup = [this] { OnWakeup(); };
  ControlSidecar sidecar(cb);
  sc_ = &sidecar;
  if (!sidecar.Listen(o_.control, &err)) return Fail(1, "control: " + err);
  if (!o_.quiet) {
    std::printf("udp-server: control %s port %u, data %s\n", o_.control.c_str(),
                sidecar.bound_port(),
                FormatIpv4Endpoint(port_.bound_addr()).c_str());
    std::fflush(stdout);
  }
  if (o_.on_listening) {
    o_.on_listening(sidecar.bound_port(), port_.bound_port());
  }
  // The sidecar thread starts before the pinning, so it does not inherit
  // the datapath's CPU.
  SidecarThread sidecar_thread(sidecar);
  if (!PinThisThread(o_.cpu, &err)) return Fail(2, err);
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
  report_.role = "server";
  report_.policy = "fixed p=" + std::to_string(o_.p);
  report_.info = {{"transport", "kernel-udp"},
                  {"loss", o_.loss},
                  {"chunks", std::to_string(layout_.num_chunks())},
                  {"chunk_bytes", std::to_string(layout_.chunk_payload())}};
  FinishReport(row_stream_, std::move(report_), &res_);
  return res_;
}

// ---- sidecar thread -------------------------------------------------------

void PushServer::OnMessage(ConnId c, const ControlMessage& m) {
  Admission::Step step;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    step = admission_.OnMessage(*sc_, c, m);
    if (step == Admission::Step::kAdmitted && desk_.full()) Welcome();
  }
  if (step != Admission::Step::kMember) return;
  if (!joined_.load(std::memory_order_acquire)) return;
  const auto peer = static_cast<uint16_t>(desk_.RankOf(c));
  // A PROBE goes to the worker's side, which answers it after an RX poll
  // that started later (so the BITMAP counts every frame sent before it).
  if (DeliverToSides(m, nullptr, sides_[peer].get(), NowNs())) return;
  if (std::holds_alternative<ByeMsg>(m)) {
    events_.Push(PeerByeEvent{peer});
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    TellGone(peer, true, e->text);
  }
}

// The last JOIN: the sides, then WELCOME to every worker, then `joined_`.
void PushServer::Welcome() {
  desk_.Close();
  gone_.resize(o_.workers);
  const ChunkLayout layout(desk_.first().total_bytes, chunk_payload_);
  for (uint32_t w = 0; w < o_.workers; ++w) {
    ReceiveSideConfig rc;
    rc.receiver = ReceiverConfig{
        session_,   FrameType::kPush, static_cast<int32_t>(w), layout, 0,
        UINT32_MAX, frame_key_};
    rc.direction = Direction::kPush;
    rc.peer = static_cast<uint16_t>(w);
    sides_.push_back(std::make_unique<ReceiveSide>(rc));
  }
  for (uint32_t w = 0; w < o_.workers; ++w) {
    WelcomeMsg wm = desk_.Welcome(w, chunk_payload_);
    wm.session = session_;
    wm.udp_base_port = port_.bound_port();
    wm.server_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr);
    wm.policy = "fixed p=" + std::to_string(o_.p);
    wm.frame_auth = static_cast<uint8_t>(o_.frame_auth);
    wm.job_nonce = job_nonce_;
    // Frames of worker w count only from the address it named at JOIN
    // (its control connection's IPv4 if it named none).
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

void PushServer::OnClose(ConnId c, const std::string& reason) {
  std::lock_guard<std::mutex> lock(join_mu_);
  const int w = admission_.OnClose(c);  // frees a slot during the join
  if (w < 0 || !joined_.load()) return;
  TellGone(static_cast<uint32_t>(w), false, reason);
}

// Only the first of a worker's ERROR and close is told: the datapath may be
// reading the text of the first while a second would write it.
void PushServer::TellGone(uint32_t w, bool failed, const std::string& why) {
  Departure& d = gone_[w];
  if (d.told) return;
  d.told = true;
  d.failed = failed;
  d.why = why;
  events_.Push(PeerGoneEvent{static_cast<uint16_t>(w)});
}

void PushServer::OnWakeup() {
  if (!requests_.Drain(&sending_)) return;
  for (const ControlRequest& r : sending_) {
    std::visit(
        Overloaded{
            [&](const RoundBeginRequest& rb) {
              const RoundBeginMsg m{rb.round, rb.round / 2,   rb.direction,
                                    rb.p,     rb.deadline_ns, rb.min_fraction};
              for (const auto& w : desk_.members()) sc_->Send(w.conn, m);
            },
            [&](const FinishRequest& f) {
              // ERROR (with the cause) or a plain close to every worker.
              for (const auto& w : desk_.members()) {
                if (!f.ok) sc_->Send(w.conn, ErrorMsg{2, failure_});
                sc_->Close(w.conn, f.ok ? "job finished" : failure_);
              }
              finished_.store(true, std::memory_order_release);
            },
            [&](const auto& side) {  // STOP or BITMAP of worker side.peer
              if (size_t{side.peer} >= sides_.size()) return;
              for (const ControlMessage& m :
                   SideRequestMessages(r, sides_[side.peer].get())) {
                sc_->Send(desk_.members()[side.peer].conn, m);
              }
            }},
        r);
  }
}

// ---- datapath thread ------------------------------------------------------

std::string PushServer::AwaitWorkers() {
  if (WaitFor([&] { return joined_.load(std::memory_order_acquire); },
              o_.join_timeout_ms)) {
    return "";
  }
  size_t have;
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    have = desk_.members().size();
  }
  return "only " + std::to_string(have) + " of " + std::to_string(o_.workers) +
         " workers joined within " + std::to_string(o_.join_timeout_ms) +
         " ms: start the workers with the server's control address";
}

std::string PushServer::SetUpJob() {
  const uint32_t W = o_.workers;
  layout_ = ChunkLayout(desk_.first().total_bytes, chunk_payload_);
  res_.chunks = layout_.num_chunks();
  try {
    reducer_ = std::make_unique<MeanReducer>(layout_, W);
    mean_.assign(layout_.total_bytes() / sizeof(float), 0.0f);
  } catch (const std::bad_alloc&) {
    return "cannot allocate the sums of a " +
           std::to_string(layout_.total_bytes()) +
           "-byte gradient: lower the workers' size or give the server more "
           "memory";
  }
  arrived_.resize(W);
  loss_ = std::make_unique<LossInjector>(loss_spec_, BurstSchedule{},
                                         HashMix(o_.seed, 0xB0));
  pkts_.resize(kRxBurst);
  for (Packet& p : pkts_) p.bytes.reserve(popts_.max_datagram);
  arrivals_.assign(W, 0);
  bye_.assign(W, 0);
  return "";
}

std::string PushServer::ServeRounds(Outbox& out) {
  Backoff backoff(o_.idle_sleep_us);
  Watchdog watchdog(o_.round_timeout_ms);
  std::string failure;
  OpenRound(out);
  for (;;) {
    // `work` ends the idle back-off; only `progress` (a new chunk, a new
    // round) feeds the watchdog, so a round whose every frame is lost
    // still times out.
    bool progress = false;
    bool work = Receive(&progress);
    work = TakeEvents(&failure) || work;
    if (!failure.empty()) return failure;
    work = StepSides(out) || work;
    if (std::all_of(bye_.begin(), bye_.end(), [](uint8_t b) { return b; })) {
      return "";
    }
    if (CloseRoundIfStopped()) {
      OpenRound(out);
      work = progress = true;
    }
    if (progress) watchdog.Progress();
    if (work) {
      backoff.Work();
    } else {
      backoff.Idle();
    }
    if (!progress && watchdog.Expired()) return NoProgress();
  }
}

void PushServer::OpenRound(Outbox& out) {
  reducer_->BeginRound();
  const uint32_t round = PushRound(it_);
  const uint64_t now = NowNs();
  for (auto& side : sides_) side->Begin(round, o_.p, 0, 0, now);
  round_open_ns_ = now;
  out.Post(RoundBeginRequest{Direction::kPush, round, o_.p, 0, 0});
}

// One RX poll: each frame to its worker's side, accepted chunks summed.
bool PushServer::Receive(bool* progress) {
  const uint32_t W = o_.workers;
  ++poll_gen_;
  const uint16_t n = port_.RxBurst(pkts_.data(), kRxBurst);
  if (n < kRxBurst) drained_gen_ = poll_gen_;
  std::fill(arrivals_.begin(), arrivals_.end(), 0);
  auto accumulate = [&](const DataHeader& h, const uint8_t* payload) {
    reducer_->Accumulate(h.seq, payload);
  };
  for (uint16_t i = 0; i < n; ++i) {
    const uint8_t* buf = pkts_[i].bytes.data();
    const size_t len = pkts_[i].bytes.size();
    // A frame too short to be one is never "lost": the receiver counts it
    // malformed.
    if (len >= kDataHeaderBytes && loss_->ShouldDrop()) continue;
    // Unknown ranks go to worker 0's side, which counts them as
    // wrong-sender (or malformed) without accepting anything.
    const uint32_t rank = PeekSenderRank(buf, len);
    const uint32_t w = rank < W ? rank : 0;
    if (pkts_[i].src != w) {  // not from where worker w was pinned
      ++unpinned_;
      continue;
    }
    arrivals_[w] = 1;
    if (sides_[w]->OnFrame(buf, len, accumulate) == Verdict::kAccepted) {
      *progress = true;
    }
  }
  return n > 0;
}

bool PushServer::StepSides(Outbox& out) {
  const uint64_t now = NowNs();
  bool asked = false;
  for (uint32_t w = 0; w < o_.workers; ++w) {
    const RxProgress rx{arrivals_[w] != 0, poll_gen_, drained_gen_};
    asked = sides_[w]->Step(now, rx, out) || asked;
  }
  return asked;
}

bool PushServer::TakeEvents(std::string* failure) {
  if (!events_.Drain(&taken_)) return false;
  for (const DatapathEvent& e : taken_) {
    if (const auto* bye = std::get_if<PeerByeEvent>(&e)) {
      bye_[bye->peer] = 1;
      continue;
    }
    const auto* gone = std::get_if<PeerGoneEvent>(&e);
    if (gone == nullptr || !failure->empty()) continue;
    const Departure& d = gone_[gone->peer];
    const std::string who = "worker " + std::to_string(gone->peer) + " (" +
                            desk_.members()[gone->peer].name + ")";
    if (d.failed) {
      *failure = who + " failed: " + d.why;
    } else if (!bye_[gone->peer]) {
      *failure = who + " disconnected in iteration " + std::to_string(it_) +
                 ": " + d.why;
    }
  }
  return true;
}

// Every side sent its STOP: the round's mean, then the next round.
bool PushServer::CloseRoundIfStopped() {
  for (const auto& side : sides_) {
    if (!side->stopped()) return false;
  }
  for (uint32_t w = 0; w < o_.workers; ++w) {
    ReceiveSide& side = *sides_[w];
    side.Close();
    side.receiver().SnapshotBitmap(arrived_[w]);
    res_.rounds.push_back(
        UdpServerRound{it_, w, side.receiver().delivered_fraction()});
    // The row as the DPDK server writes it: round open to this side's STOP.
    IterationRecord row;
    row.iteration = it_;
    row.rank = w;
    row.send_latency_us =
        side.stop_ns() > round_open_ns_
            ? static_cast<double>(side.stop_ns() - round_open_ns_) / 1e3
            : 0;
    row.delivered_fraction = side.receiver().delivered_fraction();
    row.p = o_.p;
    report_.rows.push_back(row);
    row_stream_.Append(row);  // on disk before on_round: kill -9 keeps it
  }
  reducer_->Finalize(FillMode::kZero, mean_);
  if (o_.on_round) o_.on_round(UdpServerRoundView{it_, mean_, arrived_});
  ++it_;
  return true;
}

std::string PushServer::NoProgress() const {
  std::string s = "push round " + std::to_string(PushRound(it_)) +
                  " made no progress for " +
                  std::to_string(o_.round_timeout_ms) + " ms; chunks received:";
  for (uint32_t w = 0; w < o_.workers; ++w) {
    s += " w" + std::to_string(w) + "=" +
         std::to_string(sides_[w]->receiver().received()) + "/" +
         std::to_string(layout_.num_chunks());
  }
  return s;
}

// ERROR (with the cause) or a plain close to every worker, flushed before
// the sidecar stops.
void PushServer::Finish(Outbox& out, const std::string& failure) {
  failure_ = failure;  // before the request: the sidecar reads it then
  out.Post(FinishRequest{failure.empty()});
  WaitFor([&] { return finished_.load(std::memory_order_acquire); }, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void PushServer::FillCounters() {
  auto sum = [&](Verdict v) {
    uint64_t s = 0;
    for (const auto& side : sides_) s += side->receiver().verdict_count(v);
    return s;
  };
  res_.counters = {
      {"rx_frames", port_.rx_frames()},
      {"injected_drops", loss_->dropped()},
      {"socket_drops", port_.socket_drops()},
      {"rx_truncated", port_.rx_truncated()},
      {"rcvbuf_bytes", static_cast<uint64_t>(port_.rcvbuf_bytes())},
      {"unpinned_source", unpinned_},
      {"control_auth_failures", admission_.auth_failures()},
      {"control_refused_joins", admission_.refused_joins()},
      {"control_out_of_state", admission_.out_of_state()},
  };
  // Every verdict and decode error by index, so one added to the enums is
  // written without a change here.
  for (int v = 0; v < kNumVerdicts; ++v) {
    res_.counters[VerdictName(static_cast<Verdict>(v))] =
        sum(static_cast<Verdict>(v));
  }
  for (int d = 1; d < kNumDecodeStatus; ++d) {
    const auto s = static_cast<DecodeStatus>(d);
    uint64_t n = 0;
    for (const auto& side : sides_) n += side->receiver().decode_error_count(s);
    res_.counters[std::string("decode_") + DecodeStatusName(s)] = n;
  }
}

// ---------------------------------------------------------------------------
// Worker: one SendSide pushing the bench gradient to the server.
// ---------------------------------------------------------------------------

class PushWorker {
 public:
  explicit PushWorker(const UdpPushWorkerOptions& o) : o_(o) {}
  UdpPushWorkerResult Run();

 private:
  UdpPushWorkerResult Fail(int code, const std::string& msg) {
    return Failed(&res_, code, msg);
  }
  std::string CheckOptions();

  // Sidecar thread.
  void OnMessage(const ControlMessage& m);
  void OnWakeup();
  void ServerGone(const std::string& why);

  // Datapath thread.
  std::string AwaitWelcome();
  void SetUpJob();
  bool TakeEvents();
  std::string AwaitRoundBegin(uint32_t round);
  std::string PushOneRound(uint64_t it, Outbox& out);
  void RecordRound(uint64_t it);
  void Finish(Outbox& out, const std::string& failure);

  const UdpPushWorkerOptions& o_;
  UdpPushWorkerResult res_;    // datapath only
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
  // The push direction: made by the datapath once WELCOME named the
  // session and rank, then published (release) for the sidecar, which
  // hands it STOP and BITMAP; null before.
  std::unique_ptr<SendSide> push_;
  std::atomic<SendSide*> push_live_{nullptr};
  EventQueue<DatapathEvent> events_;     // sidecar -> datapath: ROUND_BEGIN
  EventQueue<ControlRequest> requests_;  // datapath -> sidecar
  std::vector<ControlRequest> sending_;  // sidecar only
  // The job's failure text: datapath wo before its FinishRequest; the
  // sidecar reads it when handling that request.
  std::string failure_;

  // Datapath only, from SetUpJob on.
  ChunkLayout layout_;
  std::vector<float> grad_;
  std::optional<SendOrder> order_;
  std::vector<uint32_t> order_buf_;
  std::unique_ptr<PacketFrames<UdpSocketPort>> frames_;
  std::optional<Backoff> backoff_;
  std::vector<DatapathEvent> taken_;
  bool have_go_ = false;  // a ROUND_BEGIN came; go_round_ is its round
  uint32_t go_round_ = 0;
  uint64_t bitmaps_ = 0;  // BITMAPs that started a pass or ended a round
  // Datapath only: the rows, streamed as the rounds end and kept for the
  // summary.
  RowStream row_stream_;
  RunReport report_;
};

std::string PushWorker::CheckOptions() {
  if (std::string e = CheckCommon(o_.mtu, o_.round_timeout_ms); !e.empty()) {
    return e;
  }
  if (o_.size_bytes == 0 || o_.size_bytes % 4 != 0) {
    return "gradient size " + std::to_string(o_.size_bytes) +
           " bytes must be a positive multiple of 4";
  }
  if (o_.burst == 0 || o_.burst > UdpSocketPort::kMaxBurst) {
    return "burst=" + std::to_string(o_.burst) + " must be in 1.." +
           std::to_string(UdpSocketPort::kMaxBurst);
  }
  std::string err;
  if (!CheckCpu(o_.cpu, &err)) return "worker datapath: " + err;
  if (!ParseIpv4Endpoint(o_.server, false, false, "127.0.0.1:9100",
                         &server_ctrl_, &err)) {
    return "server: " + err;
  }
  return "";
}

UdpPushWorkerResult PushWorker::Run() {
  if (std::string e = CheckOptions(); !e.empty()) return Fail(2, e);
  std::string err;
  // Before the JOIN: a directory that cannot take the rows fails the
  // worker now, not after the whole job.
  if (!o_.out_dir.empty() && !row_stream_.Open(o_.out_dir, &err)) {
    return Fail(2, err);
  }
  UdpPortOptions popts;
  popts.max_datagram = o_.mtu - kIpUdpHeaders;
  if (!port_.Open(o_.data, popts, &err)) return Fail(1, err);

  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId, const ControlMessage& m) { OnMessage(m); };
  cb.on_close = [this](ConnId, const std::string& reason) {
    ServerGone("control connection to the server closed: " + reason);
    closed_.store(true, std::memory_order_release);
  };
  cb.on_wakeup = [this] { OnWakeup(); };
  ControlSidecar sidecar(cb);
  sc_ = &sidecar;
  if (!sidecar.Connect(o_.server, o_.join_timeout_ms, &conn_, &err)) {
    return Fail(1, "cannot reach the server at " + o_.server + ": " + err +
                       " (start the server first and check its control "
                       "address)");
  }
  JoinMsg join;
  join.worker_name = o_.name;
  join.total_bytes = o_.size_bytes;
  join.mtu = o_.mtu;
  // Our data socket, which the server pins (0.0.0.0: the address it sees
  // our control connection come from).
  join.data_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr);
  join.data_udp_port = port_.bound_port();
  handshake_.Start(&join);
  join_ = join;
  sidecar.Send(conn_, join);
  SidecarThread sidecar_thread(sidecar);
  if (!PinThisThread(o_.cpu, &err)) return Fail(2, err);
  if (std::string e = AwaitWelcome(); !e.empty()) return Fail(1, e);
  SetUpJob();

  Outbox out(&requests_, &sidecar);
  std::string failure;
  for (uint64_t it = 0; it < o_.iterations && failure.empty(); ++it) {
    failure = AwaitRoundBegin(PushRound(it));
    if (failure.empty()) failure = PushOneRound(it, out);
    if (failure.empty()) RecordRound(it);
  }
  Finish(out, failure);
  sidecar_thread.Stop();
  if (!failure.empty()) {
    res_.exit_code = 1;
    res_.error = failure;
  }
  res_.counters = {
      {"tx_frames", port_.tx_frames()},
      {"tx_eagain", port_.tx_eagain()},
      {"tx_errors", port_.tx_errors()},
      {"probes", push_->probes_sent()},
      {"bitmaps", bitmaps_},
  };
  report_.role = "worker";
  report_.rank = static_cast<int32_t>(res_.rank);
  report_.policy = welcome_.policy;
  report_.info = {{"transport", "kernel-udp"},
                  {"chunks", std::to_string(layout_.num_chunks())},
                  {"chunk_bytes", std::to_string(layout_.chunk_payload())}};
  FinishReport(row_stream_, std::move(report_), &res_);
  return res_;
}

// ---- sidecar thread -------------------------------------------------------

void PushWorker::OnMessage(const ControlMessage& m) {
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
  } else if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
    if (rb->direction == Direction::kPush) {
      events_.Push(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                   rb->deadline_ns, rb->min_fraction});
    }
  } else if (DeliverToSides(m, push_live_.load(std::memory_order_acquire),
                            nullptr, NowNs())) {
    // STOP or BITMAP: the send side has it (or turned it away).
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    ServerGone("server: " + e->text);
  } else if (std::holds_alternative<ByeMsg>(m)) {
    ServerGone("server said BYE");
  }
}

void PushWorker::ServerGone(const std::string& why) {
  if (server_gone_.load()) return;  // the first cause is the one told
  gone_why_ = why;
  server_gone_.store(true, std::memory_order_release);
}

void PushWorker::OnWakeup() {
  if (!requests_.Drain(&sending_)) return;
  for (const ControlRequest& r : sending_) {
    if (const auto* f = std::get_if<FinishRequest>(&r)) {
      if (f->ok) {
        sc_->Send(conn_, ByeMsg{"done"});
      } else {
        sc_->Send(conn_, ErrorMsg{2, failure_});
      }
      sc_->Close(conn_, "job finished");
    } else {
      for (const ControlMessage& m : SideRequestMessages(r, nullptr)) {
        sc_->Send(conn_, m);  // the send side's PROBE
      }
    }
  }
}

// ---- datapath thread ------------------------------------------------------

std::string PushWorker::AwaitWelcome() {
  if (!WaitFor([&] { return welcomed_.load() || server_gone_.load(); },
               o_.join_timeout_ms) ||
      !welcomed_.load()) {
    return "no WELCOME from the server at " + o_.server +
           (server_gone_.load()
                ? " (" + gone_why_ + ")"
                : " within " + std::to_string(o_.join_timeout_ms) + " ms");
  }
  // OnMessage authenticated and validated it (ValidateWelcome).
  const WelcomeMsg& w = welcome_;
  layout_ = ChunkLayout(w.total_bytes, w.chunk_payload);
  return "";
}

// The server's data address, the gradient, the send order and the side.
void PushWorker::SetUpJob() {
  const WelcomeMsg& w = welcome_;
  res_.rank = w.rank;
  res_.chunks = layout_.num_chunks();
  sockaddr_in server_data = server_ctrl_;
  if (w.server_ipv4 != 0) server_data.sin_addr.s_addr = htonl(w.server_ipv4);
  server_data.sin_port = htons(w.udp_base_port);
  port_.AddPeer(kServerEndpoint, server_data);

  grad_.resize(o_.size_bytes / sizeof(float));
  FillBenchGradient(w.rank, grad_);
  order_.emplace(kDefaultSendOrder, w.rank, w.num_workers, o_.seed);
  frames_ = std::make_unique<PacketFrames<UdpSocketPort>>(
      &port_, kServerEndpoint, reinterpret_cast<const uint8_t*>(grad_.data()),
      &layout_, o_.burst);
  frames_->set_auth(DeriveFrameKey(o_.secret, w.job_nonce,
                                   static_cast<FrameAuthMode>(w.frame_auth)));
  SendSideConfig sc;
  sc.type = FrameType::kPush;
  sc.session = w.session;
  sc.sender_rank = w.rank;
  sc.peer = 0;  // the server
  sc.direction = Direction::kPush;
  sc.burst = o_.burst;
  push_ = std::make_unique<SendSide>(sc);
  push_live_.store(push_.get(), std::memory_order_release);
  backoff_.emplace(o_.idle_sleep_us);
}

bool PushWorker::TakeEvents() {
  if (!events_.Drain(&taken_)) return false;
  for (const DatapathEvent& e : taken_) {
    if (const auto* rb = std::get_if<RoundBeginEvent>(&e)) {
      have_go_ = true;
      go_round_ = rb->round;
      res_.p = rb->p;
    }
  }
  return true;
}

// Waits for the server to open `round` (its ROUND_BEGIN).
std::string PushWorker::AwaitRoundBegin(uint32_t round) {
  Watchdog watchdog(o_.round_timeout_ms);
  while (!(have_go_ && go_round_ == round)) {
    const bool any = TakeEvents();
    if (server_gone_.load(std::memory_order_acquire)) return gone_why_;
    if (any) {
      backoff_->Work();
      continue;
    }
    if (watchdog.Expired()) {
      return "the server never opened push round " + std::to_string(round) +
             " (waited " + std::to_string(o_.round_timeout_ms) + " ms)";
    }
    backoff_->Idle();
  }
  return "";
}

// Drives the send side until STOP (or a BITMAP with nothing missing).
std::string PushWorker::PushOneRound(uint64_t it, Outbox& out) {
  SendSide& push = *push_;
  const uint32_t round = PushRound(it);
  order_->Fill(round, layout_.num_chunks(), order_buf_);
  push.Begin(round, order_buf_, NowNs());
  Watchdog watchdog(o_.round_timeout_ms);
  for (;;) {
    const uint64_t sent = push.sender().packets_sent();
    const bool events = TakeEvents();
    const bool stepped = push.Step(NowNs(), *frames_, out);
    if (push.done()) return "";
    if (server_gone_.load(std::memory_order_acquire)) return gone_why_;
    // A PROBE retry is work but no progress: only frames sent (a new pass)
    // and control events feed the watchdog, so a silent server still
    // times the round out.
    if (events || push.sender().packets_sent() != sent) watchdog.Progress();
    if (events || stepped) {
      backoff_->Work();
      continue;
    }
    if (watchdog.Expired()) {
      const bool probed =
          push.sender().state() == SenderRound::State::kAwaitingBitmap;
      return "iteration " + std::to_string(it) + ": push round " +
             std::to_string(round) + " made no progress for " +
             std::to_string(o_.round_timeout_ms) + " ms (" +
             std::to_string(push.sender().passes()) + " passes, " +
             std::to_string(push.sender().packets_sent()) + " packets sent, " +
             (probed ? "BITMAP never came" : "no STOP") + ")";
    }
    backoff_->Idle();
  }
}

void PushWorker::RecordRound(uint64_t it) {
  const SendSide& push = *push_;
  // Each BITMAP the round used started a pass after the first, or showed
  // nothing missing (ended the round without STOP).
  bitmaps_ +=
      push.sender().passes() - 1 + (push.sender().stop_requested() ? 0 : 1);
  UdpRoundRecord r;
  r.iteration = it;
  // From the first send to STOP's arrival (the sidecar's clock).
  r.latency_us =
      push.done_ns() > push.begin_ns()
          ? static_cast<double>(push.done_ns() - push.begin_ns()) / 1e3
          : 0;
  r.packets_sent = push.sender().packets_sent();
  r.passes = push.sender().passes();
  r.delivered_fraction =
      static_cast<double>(push.stop_received()) / layout_.num_chunks();
  res_.rounds.push_back(r);
  // The row as the DPDK worker writes it (no broadcast over kernel UDP).
  IterationRecord row;
  row.iteration = it;
  row.rank = res_.rank;
  row.send_latency_us = r.latency_us;
  row.passes = r.passes;
  row.packets_sent = r.packets_sent;
  row.packets_resent = push.sender().packets_resent();
  row.delivered_fraction = r.delivered_fraction;
  row.p = res_.p;
  row.control_rtt_us = push.mean_rtt_us();
  report_.rows.push_back(row);
  row_stream_.Append(row);  // on disk before on_round: kill -9 keeps it
  if (o_.on_round) o_.on_round(r);
}

// BYE when done, ERROR with the reason otherwise: the server must not
// mistake a finished worker for a lost one.
void PushWorker::Finish(Outbox& out, const std::string& failure) {
  failure_ = failure;  // before the request: the sidecar reads it then
  out.Post(FinishRequest{failure.empty()});
  WaitFor([&] { return closed_.load(std::memory_order_acquire); }, 1000);
}

}  // namespace

void FillBenchGradient(uint32_t rank, std::span<float> out) {
  // Exact in float32 (multiples of 1/1024 below 2^13), so a mean over one
  // worker reproduces it bit for bit; distinct per rank and per position.
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(
                 static_cast<int>((i * 7919 + rank * 104729) % 8191) - 4095) /
             1024.0f;
  }
}

UdpPushServerResult RunUdpPushServer(const UdpPushServerOptions& o) {
  return PushServer(o).Run();
}

UdpPushWorkerResult RunUdpPushWorker(const UdpPushWorkerOptions& o) {
  return PushWorker(o).Run();
}

// ---------------------------------------------------------------------------
// Bench: both in one process
// ---------------------------------------------------------------------------

UdpPushBenchResult RunUdpPushBench(const UdpPushBenchOptions& o) {
  UdpPushBenchResult res;
  if (!(o.size_mb > 0) || !std::isfinite(o.size_mb) || o.size_mb > 4096) {
    res.exit_code = 2;
    res.error = "size_mb must be in (0, 4096]";
    return res;
  }
  res.size_bytes = std::max<uint64_t>(
      4, static_cast<uint64_t>(o.size_mb * 1048576.0) / 4 * 4);
  sockaddr_in ctrl{};
  std::string err;
  // Both sides' option errors up front: a side that fails alone would
  // leave the other waiting for its join timeout.
  if (!CheckCpu(o.server_cpu, &err) || !CheckCpu(o.worker_cpu, &err)) {
    res.exit_code = 2;
    res.error = err;
    return res;
  }
  if (std::string e = CheckCommon(o.mtu, o.round_timeout_ms); !e.empty()) {
    res.exit_code = 2;
    res.error = e;
    return res;
  }
  if (o.burst == 0 || o.burst > UdpSocketPort::kMaxBurst) {
    res.exit_code = 2;
    res.error =
        "burst must be in 1.." + std::to_string(UdpSocketPort::kMaxBurst);
    return res;
  }
  if (!ParseIpv4Endpoint(o.control, true, true, "127.0.0.1:9100", &ctrl,
                         &err)) {
    res.exit_code = 2;
    res.error = "control: " + err;
    return res;
  }
  if (ctrl.sin_addr.s_addr == htonl(INADDR_ANY)) {
    ctrl.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  // Both sides' directories up front, like the other option errors (each
  // side opens its own again when it starts).
  for (const char* side : {"/server", "/worker"}) {
    RowStream probe;
    if (!o.out_dir.empty() && !probe.Open(o.out_dir + side, &err)) {
      res.exit_code = 2;
      res.error = err;
      return res;
    }
  }

  UdpPushServerOptions so;
  so.secret = o.secret;
  if (so.secret.insecure() && o.frame_auth != FrameAuthMode::kNone) {
    const AuthBytes key = RandomAuthBytes();
    so.secret = JobSecret::FromBytes(key);
  }
  so.frame_auth = o.frame_auth;
  so.control = o.control;
  so.data = "127.0.0.1:" + std::to_string(o.udp_port);
  so.mtu = o.mtu;
  so.p = o.p;
  so.loss = o.loss;
  so.seed = o.seed;
  so.round_timeout_ms = o.round_timeout_ms;
  so.join_timeout_ms = std::min<uint32_t>(o.round_timeout_ms, 30000);
  so.cpu = o.server_cpu;
  so.idle_sleep_us = o.idle_sleep_us;
  so.on_round = o.on_server_round;
  if (!o.out_dir.empty()) so.out_dir = o.out_dir + "/server";
  std::promise<uint16_t> control_port;
  bool told = false;  // server thread only
  so.on_listening = [&](uint16_t c, uint16_t u) {
    told = true;
    if (o.on_server_listening) o.on_server_listening(u);
    control_port.set_value(c);
  };
  UdpPushServerResult sres;
  std::thread server([&] {
    sres = RunUdpPushServer(so);
    if (!told) control_port.set_value(0);
  });
  const uint16_t cport = control_port.get_future().get();
  UdpPushWorkerResult wres;
  if (cport != 0) {
    UdpPushWorkerOptions wo;
    wo.secret = so.secret;
    ctrl.sin_port = htons(cport);
    wo.server = FormatIpv4Endpoint(ctrl);
    wo.data = "127.0.0.1:0";
    wo.size_bytes = res.size_bytes;
    wo.mtu = o.mtu;
    wo.burst = o.burst;
    wo.iterations = o.iterations;
    wo.seed = o.seed;
    wo.round_timeout_ms = o.round_timeout_ms;
    wo.join_timeout_ms = so.join_timeout_ms;
    wo.cpu = o.worker_cpu;
    wo.idle_sleep_us = o.idle_sleep_us;
    wo.name = "bench-worker";
    wo.on_round = o.on_round;
    if (!o.out_dir.empty()) wo.out_dir = o.out_dir + "/worker";
    std::thread worker([&] { wres = RunUdpPushWorker(wo); });
    worker.join();
  }
  server.join();

  res.chunks = wres.chunks ? wres.chunks : sres.chunks;
  res.rounds = wres.rounds;
  res.server_rounds = sres.rounds;
  res.exit_code = std::max(sres.exit_code, wres.exit_code);
  // Option errors (2) win over the run failures they cause on the peer.
  if (sres.exit_code == 2 || wres.exit_code == 2) res.exit_code = 2;
  if (!sres.error.empty()) res.error = "server: " + sres.error;
  // A worker that failed because the server did repeats the server's cause.
  if (!wres.error.empty() && wres.error != "server: " + sres.error) {
    res.error +=
        (res.error.empty() ? "" : "; ") + std::string("worker: ") + wres.error;
  }
  res.counters = sres.counters;
  for (const auto& [k, v] : wres.counters) res.counters[k] = v;
  return res;
}

std::string FormatUdpBenchJson(const UdpPushBenchOptions& o,
                               const UdpPushBenchResult& r) {
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      if (static_cast<unsigned char>(c) < 0x20) continue;
      q += c;
    }
    return q + "\"";
  };
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  auto counter = [&](const char* k) {
    const auto f = r.counters.find(k);
    return std::to_string(f == r.counters.end() ? 0 : f->second);
  };
  std::ostringstream s;
  s << "{\"transport\":\"kernel-udp\",\"size_bytes\":" << r.size_bytes
    << ",\"chunks\":" << r.chunks << ",\"mtu\":" << o.mtu
    << ",\"loss\":" << quote(o.loss) << ",\"p\":" << num(o.p)
    << ",\"rounds\":[";
  for (size_t i = 0; i < r.rounds.size(); ++i) {
    const UdpRoundRecord& x = r.rounds[i];
    s << (i ? "," : "") << "{\"iteration\":" << x.iteration
      << ",\"latency_us\":" << num(x.latency_us)
      << ",\"packets_sent\":" << x.packets_sent << ",\"passes\":" << x.passes
      << ",\"delivered_fraction\":" << num(x.delivered_fraction) << "}";
  }
  // These first, always (readers index them), then every other counter
  // the run kept, by name: each drop reason of the receive side included.
  const std::vector<std::string> first = {"rx_frames",      "tx_frames",
                                          "injected_drops", "socket_drops",
                                          "tx_eagain",      "malformed"};
  s << "],\"counters\":{";
  for (size_t i = 0; i < first.size(); ++i) {
    s << (i ? "," : "") << quote(first[i]) << ":" << counter(first[i].c_str());
  }
  for (const auto& [k, v] : r.counters) {
    if (std::find(first.begin(), first.end(), k) == first.end()) {
      s << "," << quote(k) << ":" << v;
    }
  }
  s << "}";
  if (r.exit_code != 0) s << ",\"error\":" << quote(r.error);
  s << "}\n";
  return s.str();
}

}  // namespace dblp
