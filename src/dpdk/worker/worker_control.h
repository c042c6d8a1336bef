// dblp-worker's control plane: the sidecar connection to the server, JOIN
// and WELCOME, and the bridge between control messages and the worker's
// round sides (the push SendSide and the broadcast ReceiveSide).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "port/datapath.h"

namespace dblp {

class WorkerControl {
 public:
  // `ctr` feeds the stats line every `stats_period_s` (0 = none); `secret`
  // (which must outlive this) authenticates the server. `link`: the server
  // shard this connection is to (shard_link.h), which names its rings.
  WorkerControl(const JobSecret& secret, const DatapathCounters* ctr,
                double stats_period_s, uint16_t link = 0);
  ~WorkerControl();
  WorkerControl(const WorkerControl&) = delete;
  WorkerControl& operator=(const WorkerControl&) = delete;

  // Connects to `server`, sends `join` (with a fresh nonce), proves the
  // secret and waits for the WELCOME, which must carry the server's MAC and
  // a layout this worker can hold (ValidateWelcome); then welcome() is it.
  // A server that cannot be reached, refuses, fails authentication, lies
  // or stays silent fails the join (the channel stopped) with a message
  // naming the fix; the engine exits with it (code 1, never a signal).
  AppFailure Join(const std::string& server, JoinMsg join, uint32_t timeout_ms,
                  const std::atomic<bool>& quit, bool realtime);
  const WelcomeMsg& welcome() const { return welcome_; }
  // This member's frame key (job_auth.h), once Join succeeded (the
  // handshake is done: the sidecar no longer writes it).
  FrameKey MemberFrameKey() const {
    return handshake_.MemberFrameKey(
        welcome_.job_nonce, static_cast<uint16_t>(welcome_.rank),
        static_cast<FrameAuthMode>(welcome_.frame_auth));
  }
  // Datapath, once, before the first round: the sides that STOP, BITMAP
  // and PROBE messages go to (a push side per server shard).
  void Attach(std::vector<SendSide*> push, ReceiveSide* bcast);

  TypedRing<DatapathEvent>& events() { return events_; }
  RingOutbox outbox() { return RingOutbox{&requests_, &sidecar_}; }
  // A control ring refused a message (TypedRing::Overflow): "" if none.
  std::string RingFailure() const {
    std::string e = events_.Overflow();
    return e.empty() ? requests_.Overflow() : e;
  }
  bool server_gone() const {
    return server_gone_.load(std::memory_order_acquire);
  }
  // Why the server is gone; valid once server_gone().
  const std::string& failure() const { return failure_; }
  void set_iteration(uint64_t it) {
    iteration_.store(it, std::memory_order_relaxed);
  }

  // BYE (ok), then the server's close; or ERROR with `error`, then our
  // graceful close. Either wait is bounded (about a second): the server
  // must not mistake a finished worker for a lost one, nor a failed one
  // for a finished one. Stops the sidecar thread.
  void Finish(bool ok, const std::string& error);

  uint64_t messages_in() const { return sidecar_.messages_in(); }
  uint64_t messages_out() const { return sidecar_.messages_out(); }
  uint64_t stops_sent() const { return stops_sent_.load(); }
  // Push feedback: the server's ACCEPTED for push `round`, if it came
  // (it precedes the broadcast's ROUND_BEGIN on the connection).
  bool TakeAccepted(uint32_t round, Bitmap* out);

 private:
  ControlSidecar::Callbacks MakeCallbacks(const DatapathCounters* ctr,
                                          double stats_period_s);
  void OnMessage(const ControlMessage& m);
  void OnWelcome(const WelcomeMsg& w);
  void Gone(std::string why);
  void SendRequests();
  void StopThread() { thread_.reset(); }

  TypedRing<DatapathEvent> events_;  // sidecar -> dp
  // dp -> sidecar; writers: every worker lcore with a push side of this
  // link (multi-producer); reader: the sidecar.
  TypedRing<ControlRequest> requests_;
  ControlSidecar sidecar_;
  std::unique_ptr<SidecarThread> thread_;
  ConnId conn_ = 0;
  std::string server_;         // Join: wo before the thread; then ro
  WorkerHandshake handshake_;  // sidecar only (Join starts it before)
  JoinMsg join_;               // Join: wo before the thread; sidecar: ro

  // Shared between the sidecar thread and the datapath lcore.
  WelcomeMsg welcome_;                 // sidecar: wo before welcomed_
  std::atomic<bool> welcomed_{false};  // sidecar: wo; datapath: ro
  // Datapath: wo once, before attached_; sidecar: ro after it.
  std::vector<SendSide*> push_;
  ReceiveSide* bcast_ = nullptr;
  std::atomic<bool> attached_{false};
  std::string failure_;                   // sidecar: wo before server_gone_
  std::atomic<bool> server_gone_{false};  // sidecar: wo; datapath: ro
  std::string final_error_;  // datapath: wo before FinishRequest; sidecar: ro
  // The latest ACCEPTED: the sidecar puts it, the datapath's model takes it.
  AcceptedInbox accepted_;
  std::atomic<bool> closed_{false};      // sidecar: wo; datapath: ro
  std::atomic<uint64_t> stops_sent_{0};  // sidecar: wo; report: ro
  std::atomic<uint64_t> iteration_{0};   // datapath: wo; stats: ro
};

}  // namespace dblp
