// A server's side of a sharded job (--shards=S --shard_index=k
// --directory=HOST:PORT) over its control sidecar, whatever its transport
// (dblp-server, dblp-udp-server): shard k > 0 registers
// with the directory (shard 0) over an authenticated connection (the
// workers' handshake, then SHARD_HELLO) and gets its partition
// (SHARD_ASSIGN); the directory registers every shard, cuts the gradient
// into partitions (ChunkRanges) and lists the shards in its WELCOMEs. Then
// the job's one phase (PhaseLink, lib/dblp/job/phase_link.h): every shard
// sends PHASE_PARTIAL once per iteration, the directory's PhaseLeader
// decides and sends PHASE_DECISION back. A shard that goes away ends the
// others' jobs naming it.
//
// Threads: the sidecar thread runs everything but Decide (the coordinator:
// DPDK's lcore 0, the UDP server's datapath thread; once per iteration);
// they share the phase's state under mu_.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/server_shards.h"
#include "dblp/job/phase_link.h"
#include "dblp/policy/tolerance.h"

namespace dblp {

struct ShardLinksConfig {
  std::string app = "dblp-server";  // names this server in its lines
  ShardRole role;
  std::string listen;     // this server's --listen
  std::string job_flags;  // "--name=value" lines every shard must share
  uint32_t local_ip = 0;
  std::array<uint8_t, 6> mac{};  // the data port's (DPDK; zero over UDP)
  uint16_t udp_port = 0;
  uint16_t queues = 1;  // datapath lcores
  uint32_t mtu = 0;
  const JobSecret* secret = nullptr;
  PolicyConfig policy;  // the directory's leader runs it
  uint32_t resync_every = 0;
  uint32_t round_timeout_ms = 30000;  // how long a phase waits
};

class ShardLinks : public PhaseLink {
 public:
  // `on_failure` (sidecar thread) ends the job: a shard or the directory
  // went away or refused.
  ShardLinks(const ShardLinksConfig& cfg, ControlSidecar& sc,
             std::function<void(const std::string&)> on_failure);

  // ---- shard k > 0, before the sidecar thread runs ----
  // Connects to the directory (retrying until timeout_ms: start order does
  // not matter) and sends the registration JOIN. "" or why not, with the
  // fix.
  std::string ConnectDirectory(uint32_t timeout_ms);

  // ---- sidecar thread ----
  // The directory's connection (k > 0) or a registered shard's.
  bool Owns(ConnId c) const;
  // The directory: connection `c` proved the secret with `j`, a
  // registration.
  void OnRegistration(ConnId c, const JoinMsg& j);
  enum class Event { kNone, kRegistered, kAssigned };
  Event OnMessage(ConnId c, const ControlMessage& m);
  void OnClose(ConnId c, const std::string& reason);
  // On every wake-up: the coordinator's partial or decision to send.
  void Flush();
  // The job ended: an ERROR (`error` non-empty) or a BYE to every peer
  // shard, so a later close is no loss.
  void Finish(const std::string& error);
  // The directory: every shard registered. Shard k > 0: assigned.
  bool ready() const;
  // The directory, once every worker joined: cuts `model_bytes` into
  // partitions and assigns them (SHARD_ASSIGN), or says why it cannot.
  std::string AssignPartitions(uint64_t model_bytes, uint32_t chunk_payload,
                               const AuthBytes& job_nonce);
  // Why the job did not start, for the join's shortfall ("" if nothing
  // of the shards is missing).
  std::string Shortfall() const;
  // Worker wm->rank's WELCOME, once every worker joined and ready(): the
  // directory assigns the partitions at rank 0's; then every WELCOME
  // describes this shard's partition and, from the directory, lists every
  // shard. "" or why the job cannot start (the other shards are told; the
  // caller tells its workers).
  std::string FillWelcome(WelcomeMsg* wm, const AuthBytes& job_nonce);

  // ---- after ready() / AssignPartitions ----
  // Every shard in index order (the directory's WELCOME).
  const std::vector<ShardEntry>& entries() const { return entries_; }
  const ShardAssignMsg& partition() const { return own_; }
  uint64_t PartitionBytes() const;

  // ---- coordinator ----
  PhaseDecision Decide(uint64_t it, bool resync,
                       std::span<const double> block_squares,
                       uint64_t push_ns) override;

 private:
  std::string ShardName(uint16_t k) const;
  void SendDecisions();              // the directory, sidecar thread
  void FailLocked(std::string why);  // under mu_
  void Fail(std::string why);
  Event OnDirectoryMessage(const ControlMessage& m);
  Event OnShardMessage(uint16_t k, const ControlMessage& m);

  const ShardLinksConfig cfg_;
  ControlSidecar& sc_;
  std::function<void(const std::string&)> on_failure_;

  // Sidecar only.
  ShardRegistry registry_;  // the directory's
  std::vector<bool> bye_;   // per shard (the directory: [k]; k > 0: [0])
  ConnId directory_ = 0;    // shard k > 0
  WorkerHandshake handshake_;
  bool assigned_ = false;
  // Shard k > 0: the directory proved the job secret (its CHALLENGE);
  // until then only CHALLENGE and ERROR are taken from it. Sidecar only.
  bool directory_trusted_ = false;
  std::vector<ShardEntry> entries_;
  ShardAssignMsg own_;

  // The phase, shared with the coordinator.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<PhaseLeader> leader_;  // the directory's
  uint64_t decided_ = UINT64_MAX;        // the last decided iteration
  PhaseDecision decision_;
  bool send_decision_ = false;              // the directory: to every shard
  std::optional<PhasePartialMsg> partial_;  // shard k > 0: to send
  std::string failure_;                     // sticky
};

}  // namespace dblp
