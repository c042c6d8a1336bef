// dblp-server's control plane: the sidecar that admits workers (JOIN
// checks, WELCOME), and the bridge between control messages and each
// worker's round sides (its push ReceiveSide and broadcast SendSide).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dblp/control/accepted_mail.h"
#include "dblp/control/admission.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/job/shard_links.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "port/datapath.h"
#include "port/port.h"

namespace dblp {

struct ServerJoinConfig {
  uint32_t workers = 0;
  uint32_t session = 0;
  uint32_t mtu = 1500;
  uint32_t local_ip = 0;
  uint16_t udp_port = 0;
  rte_ether_addr mac{};
  uint64_t max_gradient_bytes = 0;
  bool rank_by_name = false;          // JoinPolicy::rank_by_name
  std::string policy;                 // described in the WELCOME
  uint16_t ports = 1;                 // for the banner
  uint16_t lanes = 1;                 // datapath lcores: a round's chunk ranges
  uint32_t resync_every = 0;          // told to the workers in WELCOME
  bool push_feedback = false;         // likewise
  bool consistent_broadcast = false;  // likewise
  const JobSecret* secret = nullptr;  // the job's (insecure: empty)
  FrameAuthMode frame_auth = FrameAuthMode::kNone;  // told in WELCOME
  AuthBytes job_nonce{};  // the frame key and session derive from it
  // A server shard of a sharded job (--shards > 1): its place, the
  // directory, the phase's settings (dblp/job/shard_links.h).
  std::optional<ShardLinksConfig> sharding;
};

class ServerControl {
 public:
  // `ctr` (one per datapath lcore) feeds the stats line every
  // `stats_period_s` (0 = none). `limits` bound the control connections
  // (--control_* flags).
  ServerControl(const ServerJoinConfig& join,
                std::vector<const DatapathCounters*> ctr, double stats_period_s,
                const ControlLimits& limits = {});
  ~ServerControl();
  ServerControl(const ServerControl&) = delete;
  ServerControl& operator=(const ServerControl&) = delete;

  // Listens on `listen` and waits until every worker joined; ends the
  // process with a message naming the fix otherwise. Returns the first
  // JOIN (the job's gradient size and layers).
  // Fails (the channel stopped) when it cannot listen, or when not every
  // worker joined within timeout_ms (or `quit`): the shortfall and the fix.
  AppFailure AdmitWorkers(const std::string& listen, uint32_t timeout_ms,
                          const std::atomic<bool>& quit, bool realtime);
  // The first JOIN (every JOIN's gradient), once AdmitWorkers succeeded.
  const JoinMsg& first_join() const { return admission_.desk().first(); }
  // A server shard's links to the others (null unsharded): the job's
  // phase and this shard's partition, once AdmitWorkers succeeded.
  ShardLinks* shard_links() { return shards_.get(); }
  // The job ended well: peer server shards get a BYE (so the close that
  // follows is no loss). Bounded, like Fail.
  void Finish();
  // Datapath, once, before the first round: worker w's sides, one per
  // shard (lcore): push[w][k], bcast[w][k].
  void Attach(std::vector<std::vector<ReceiveSide*>> push,
              std::vector<std::vector<SendSide*>> bcast);

  TypedRing<DatapathEvent>& events() { return events_; }
  RingOutbox outbox() { return RingOutbox{&requests_, &sidecar_}; }
  // A control ring refused a message (TypedRing::Overflow): "" if none.
  std::string RingFailure() const {
    std::string e = events_.Overflow();
    return e.empty() ? requests_.Overflow() : e;
  }
  // The control plane failed (a ROUND_BEGIN the wire cannot carry).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& failure() const { return failure_; }
  const std::string& worker_name(uint32_t w) const {
    return admission_.desk().members()[w].name;
  }
  // Why worker w failed (its ERROR), valid after its PeerGoneEvent.
  std::string worker_error(uint32_t w);
  // Datapath: worker w is gone; it gets no more ROUND_BEGIN.
  void MarkLost(uint32_t w) { alive_[w].store(false); }
  void Publish(uint64_t iteration, double p, bool critical) {
    iteration_.store(iteration, std::memory_order_relaxed);
    p_.store(p, std::memory_order_relaxed);
    critical_.store(critical, std::memory_order_relaxed);
  }
  void Stop() { thread_.reset(); }
  // The job failed: every live worker gets an ERROR naming `why` (so its
  // trainer learns which worker ended the job, not just "closed"), then
  // the channel stops. Bounded: at most about a second.
  void Fail(const std::string& why);
  // Coordinator (lcore 0), once per closed push with --push_feedback: the
  // ACCEPTED for each worker (ServerJob::ClosePush stages it), sent when
  // its AcceptedRequest is drained (after everything posted before it,
  // before everything posted after).
  AcceptedSlots* accepted() { return &accepted_; }

  uint64_t messages_in() const { return sidecar_.messages_in(); }
  uint64_t messages_out() const { return sidecar_.messages_out(); }
  uint64_t protocol_errors() const { return sidecar_.protocol_errors(); }
  // Refused at the door: failed proofs, JOINs the desk refused (surplus,
  // duplicate name, layout), messages out of order (then closed).
  uint64_t auth_failures() const { return admission_.auth_failures(); }
  uint64_t refused_joins() const { return admission_.refused_joins(); }
  // The control port's limits (ControlLimits) at work on strangers.
  uint64_t connections_refused() const {
    return sidecar_.connections_refused();
  }
  uint64_t connections_evicted() const {
    return sidecar_.connections_evicted();
  }
  uint64_t join_timeouts() const { return sidecar_.join_timeouts(); }
  uint64_t out_of_state() const { return admission_.out_of_state(); }
  // Where worker w's data frames must come from (its JOIN's MAC, the IPv4
  // in its WELCOME, UDP port base + 1 + w). Valid once AdmitWorkers
  // returned.
  const Endpoint& pinned_source(uint32_t w) const { return pinned_[w]; }
  // Worker w's frame key (job_auth.h): its pushes verify under it, its
  // broadcast is sealed with it. Valid once AdmitWorkers returned.
  const FrameKey& member_frame_key(uint32_t w) const { return keys_[w]; }
  const ControlSidecar& sidecar() const { return sidecar_; }

 private:
  ControlSidecar::Callbacks MakeCallbacks(
      std::vector<const DatapathCounters*> ctr, double stats_period_s);
  void Welcome();
  void OnMessage(ConnId c, const ControlMessage& m);
  void OnClose(ConnId c, const std::string& reason);
  void SendRequests();
  void Announce(const RoundBeginRequest& r);
  void SendJobError();
  // Under mu_, sidecar: WELCOME everyone once every worker (and, in a
  // sharded job, every shard or the partition) is in.
  void MaybeWelcome();
  void OnShardMessage(ConnId c, const ControlMessage& m);
  void FailFromSidecar(const std::string& why);

  ServerJoinConfig cfg_;
  TypedRing<DatapathEvent> events_{"dblp_s_ev", 4096};  // sidecar -> dp
  // Every lcore posts requests: a multi-producer ring.
  TypedRing<ControlRequest> requests_{"dblp_s_req", 4096, true};
  ControlSidecar sidecar_;
  std::unique_ptr<ShardLinks> shards_;  // sharded jobs only
  std::string admit_failure_;  // sidecar: wo under mu_; AdmitWorkers: ro
  std::unique_ptr<SidecarThread> thread_;
  // Fail() writes it before posting the FinishRequest the sidecar answers.
  std::string job_error_;
  std::atomic<bool> job_error_sent_{false};

  // Join state: the sidecar writes it under mu_ until joined_; read-only
  // for everyone after (its counters: any thread).
  std::mutex mu_;
  Admission admission_;
  std::vector<Endpoint> pinned_;  // likewise
  std::vector<FrameKey> keys_;    // likewise
  // Why worker w failed (its ERROR): sidecar: wo under mu_; datapath:
  // reads under mu_ (worker_error).
  std::vector<std::string> errors_;
  std::vector<bool> bye_seen_;  // sidecar only
  // Per worker: the coordinator stages (StageAccepted); the sidecar takes
  // it when the AcceptedRequest comes.
  AcceptedSlots accepted_;
  std::atomic<bool> joined_{false};  // sidecar: wo; datapath: ro
  // Rounds: set by the datapath once (Attach); read by the sidecar.
  std::vector<std::vector<ReceiveSide*>> push_;
  std::vector<std::vector<SendSide*>> bcast_;
  std::atomic<bool> attached_{false};           // datapath: wo; sidecar: ro
  std::unique_ptr<std::atomic<bool>[]> alive_;  // datapath: wo; sidecar: ro
  std::string failure_;                         // sidecar: wo before failed_
  std::atomic<bool> failed_{false};             // sidecar: wo; datapath: ro
  // For the stats line. Datapath: wo; sidecar: ro.
  std::atomic<uint64_t> iteration_{0};
  std::atomic<double> p_{0};
  std::atomic<bool> critical_{false};
};

}  // namespace dblp
