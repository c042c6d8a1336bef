#include "worker/worker_control.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <variant>

#include "dblp/round/round_control.h"
#include "runtime/eal_app.h"

namespace dblp {

namespace {
// rte_ring names are global to the process: one pair per link.
std::string RingName(const char* base, uint16_t link) {
  return link == 0 ? base : base + std::to_string(link);
}
}  // namespace

WorkerControl::WorkerControl(const JobSecret& secret,
                             const DatapathCounters* ctr, double stats_period_s,
                             uint16_t link)
    : events_(RingName("dblp_w_ev", link), 1024),
      // Multi-producer: a worker's helper lcores post their push sides'
      // requests too (PushCrew, lcore_loop.h).
      requests_(RingName("dblp_w_req", link), 1024, true),
      sidecar_(MakeCallbacks(ctr, stats_period_s)),
      handshake_(secret) {}

WorkerControl::~WorkerControl() { StopThread(); }

ControlSidecar::Callbacks WorkerControl::MakeCallbacks(
    const DatapathCounters* ctr, double stats_period_s) {
  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId, const ControlMessage& m) { OnMessage(m); };
  cb.on_close = [this](ConnId, const std::string& reason) {
    if (!server_gone_.load()) {
      failure_ = "control connection to dblp-server at " + server_ +
                 " closed: " + reason;
      server_gone_.store(true, std::memory_order_release);
    }
    closed_.store(true, std::memory_order_release);
  };
  cb.on_wakeup = [this] { SendRequests(); };
  if (stats_period_s > 0) {
    cb.tick_ms = static_cast<uint32_t>(stats_period_s * 1000);
    cb.on_tick = [this, ctr, stats_period_s, last_tx = uint64_t{0},
                  last_rx = uint64_t{0}]() mutable {
      const uint64_t tx = ctr->tx_frames.load(std::memory_order_relaxed);
      const uint64_t rx = ctr->rx_frames.load(std::memory_order_relaxed);
      std::printf(
          "[worker %u] iter %llu  tx %.0f pps  rx %.0f pps  "
          "injected drops %llu\n",
          welcomed_.load() ? welcome_.rank : 0,
          static_cast<unsigned long long>(iteration_.load()),
          static_cast<double>(tx - last_tx) / stats_period_s,
          static_cast<double>(rx - last_rx) / stats_period_s,
          static_cast<unsigned long long>(
              ctr->injected_drops.load(std::memory_order_relaxed)));
      std::fflush(stdout);
      last_tx = tx;
      last_rx = rx;
    };
  }
  return cb;
}

void WorkerControl::Gone(std::string why) {
  if (server_gone_.load()) return;
  failure_ = std::move(why);
  server_gone_.store(true, std::memory_order_release);
}

// Authenticated first, then checked against what this worker can hold: a
// WELCOME that fails either ends the join (ERROR to the server, then the
// process exits naming the fix).
void WorkerControl::OnWelcome(const WelcomeMsg& w) {
  if (welcomed_.load()) {
    return Gone("the server sent WELCOME twice: a broken or hostile server");
  }
  std::string why = handshake_.CheckWelcome(w);
  if (why.empty()) {
    if (std::string bad = ValidateWelcome(w, join_); !bad.empty()) {
      why = "the server's WELCOME is inconsistent: " + bad +
            " (run the same DBLP build and model on the server and every "
            "worker)";
    }
  }
  if (!why.empty()) {
    sidecar_.Send(conn_, ErrorMsg{3, why});
    sidecar_.Close(conn_, why);
    return Gone(why);
  }
  welcome_ = w;
  welcomed_.store(true, std::memory_order_release);
}

void WorkerControl::OnMessage(const ControlMessage& m) {
  if (const auto* w = std::get_if<WelcomeMsg>(&m)) return OnWelcome(*w);
  if (const auto* c = std::get_if<ChallengeMsg>(&m)) {
    if (std::string why = handshake_.AnswerChallenge(sidecar_, conn_, *c);
        !why.empty()) {
      Gone(why);
    }
    return;
  }
  const auto gone = [this](std::string why) { Gone(std::move(why)); };
  if (IsWorkerOnlyMessage(m) ||
      (!welcomed_.load() && !std::holds_alternative<ErrorMsg>(m))) {
    const std::string why = std::string("the server sent ") +
                            ControlTypeName(m) +
                            " out of order: a broken or hostile server";
    sidecar_.Close(conn_, why);
    return gone(why);
  }
  if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    return gone("dblp-server at " + server_ +
                (welcomed_.load() ? ": " : " refused: ") + e->text);
  }
  if (std::holds_alternative<ByeMsg>(m)) return gone("server said BYE");
  if (const auto* a = std::get_if<AcceptedMsg>(&m)) {
    accepted_.Put(*a);
    return;
  }
  if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
    // The datapath applies it: it owns the receiver's round, so a late
    // ROUND_BEGIN can never plant its p in a newer round.
    events_.Push(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                 rb->deadline_ns, rb->min_fraction,
                                 rb->critical});
    return;
  }
  if (!attached_.load(std::memory_order_acquire)) return;
  // STOP goes to every push side, a BITMAP to the shard that asked.
  const uint64_t now = NowNs();
  DeliverToSides(m, push_, std::span<ReceiveSide* const>(&bcast_, 1), now);
}

bool WorkerControl::TakeAccepted(uint32_t round, Bitmap* out) {
  return accepted_.Take(round, out);
}

void WorkerControl::SendRequests() {
  ControlRequest r;
  while (requests_.Pop(&r)) {
    if (std::holds_alternative<StopRequest>(r)) stops_sent_.fetch_add(1);
    // BYE or ERROR (Finish waits, bounded, for the server's close), or a
    // side's messages.
    SendWorkerRequest(sidecar_, conn_, r, bcast_, final_error_);
  }
}

AppFailure WorkerControl::Join(const std::string& server, JoinMsg join,
                               uint32_t timeout_ms,
                               const std::atomic<bool>& quit, bool realtime) {
  std::string err;
  server_ = server;
  if (!sidecar_.Connect(server, timeout_ms, &conn_, &err)) {
    return {"cannot reach dblp-server at " + server + ": " + err,
            "start dblp-server first and check --server=IP:PORT"};
  }
  handshake_.Start(&join);
  join_ = join;
  // A JOIN the codec refuses (a layer table that does not add up) is
  // said now, not found out at the server's join deadline.
  if (!sidecar_.Send(conn_, join, &err)) {
    return {"cannot send JOIN to dblp-server at " + server + ": " + err,
            "check the gradient source's layers (the field named above)"};
  }
  thread_ = std::make_unique<SidecarThread>(sidecar_);
  SetControlPriorities(*thread_, "dblp-worker", realtime);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!welcomed_.load(std::memory_order_acquire)) {
    if (server_gone()) {
      StopThread();
      return {"joining dblp-server at " + server + " failed: " + failure_,
              "see above; the server's log says what it refused"};
    }
    if (quit.load() || std::chrono::steady_clock::now() > deadline) {
      StopThread();
      return {"no WELCOME from dblp-server at " + server +
                  (failure_.empty() ? "" : " (" + failure_ + ")"),
              "check that the server expects this many workers (--workers) "
              "and that every worker sends the same gradient size (--floats)"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {};
}

void WorkerControl::Attach(std::vector<SendSide*> push, ReceiveSide* bcast) {
  push_ = std::move(push);
  bcast_ = bcast;
  attached_.store(true, std::memory_order_release);
}

void WorkerControl::Finish(bool ok, const std::string& error) {
  if (thread_ == nullptr) return;
  final_error_ = error;
  RingOutbox out = outbox();
  out.Post(FinishRequest{ok});
  // After a BYE the server closes at once; after an ERROR it may be the
  // peer that fell silent, so the wait is short (the close at exit tells
  // it too).
  const int waits = ok ? 200 : 40;
  for (int i = 0; i < waits && !closed_.load(std::memory_order_acquire); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  StopThread();
}

}  // namespace dblp
