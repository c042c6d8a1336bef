// A server's door: the authenticated JOIN (job_auth.h) in front of the
// JoinDesk. Strangers, wrong secrets, surplus or duplicate workers and
// messages out of order are refused with a reason (ERROR, then the
// connection closes) and counted; a worker takes a slot only once it proved
// the secret, and its connection is then Trust()ed by the sidecar (no join
// deadline, full-size frames). Shared by dblp-server and the kernel-UDP
// server. Sidecar thread only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/join.h"
#include "dblp/control/server_shards.h"

namespace dblp {

// What every WELCOME of a job says beyond the layout the desk holds: the
// job's settings, the server's data address and the frames' keys. The
// same for every worker; a server fills it once.
struct JobWelcome {
  uint32_t session = 0;
  uint32_t resync_every = 0;
  bool push_feedback = false;
  bool consistent_broadcast = false;
  uint16_t lanes = 1;  // the server's datapath lcores (WELCOME lanes)
  uint32_t server_ipv4 = 0;
  std::array<uint8_t, 6> server_mac{};  // zero over kernel UDP
  uint16_t udp_base_port = 0;
  std::string policy;  // described
  FrameAuthMode frame_auth = FrameAuthMode::kNone;
  AuthBytes job_nonce{};
};

class Admission {
 public:
  // `secret` must outlive this.
  Admission(const JoinPolicy& policy, const JobSecret& secret, const char* app)
      : desk_(policy), handshake_(secret), app_(app) {}

  enum class Step {
    kHandled,   // a handshake step (answered or refused): nothing to do
    kAdmitted,  // a worker took a slot: WELCOME everyone once desk().full()
    kMember,    // a round message of an admitted worker: the caller's
    // The directory of a sharded job: server shard registration() proved
    // the secret (trusted now); its SHARD_HELLO is next. The caller's.
    kShard,
    // A server shard k > 0: a worker's claim proved the secret before the
    // directory assigned the partition; Assign() decides it.
    kHeld,
  };
  // This server's place in a sharded job (dblp/control/server_shards.h): JOINs
  // not for it are refused naming the directory. Before the first message.
  void set_role(const ShardRole& role) { role_ = role; }
  // A server shard k > 0: the directory's assignment. Decides the held
  // claims (refused, or admitted: kAdmitted for any means check full()).
  Step Assign(ControlSidecar& sc, const ShardAssignMsg& a);
  // The last kShard's JOIN.
  const JoinMsg& registration() const { return registration_; }
  // Every message of connection `c` goes here first.
  Step OnMessage(ControlSidecar& sc, ConnId c, const ControlMessage& m);
  // A connection closed: forgets its handshake and, before the job
  // started, frees its slot. Returns its rank, or -1.
  int OnClose(ConnId c);

  // Once desk().full(): worker w's WELCOME (its rank, the layout of the
  // first JOIN at `chunk_payload`, and `job`), not yet sealed. The
  // transport adds the address w's frames come from (worker_ipv4); a
  // server shard describes its partition (ShardLinks::FillWelcome).
  WelcomeMsg Welcome(uint32_t w, uint32_t chunk_payload,
                     const JobWelcome& job) const;
  // After desk().full(): closes the desk and seals w's WELCOME.
  void SealWelcome(uint32_t w, WelcomeMsg* wm) const {
    handshake_.SealWelcome(desk_.members()[w].conn, wm);
  }
  // Member w's frame key (job_auth.h), from its connection's handshake.
  FrameKey MemberFrameKey(uint32_t w, const AuthBytes& job_nonce,
                          FrameAuthMode mode) const {
    return handshake_.MemberFrameKey(desk_.members()[w].conn, job_nonce,
                                     static_cast<uint16_t>(w), mode);
  }

  JoinDesk& desk() { return desk_; }
  const JoinDesk& desk() const { return desk_; }
  uint64_t auth_failures() const { return auth_failures_.load(); }
  uint64_t refused_joins() const { return refused_joins_.load(); }
  uint64_t out_of_state() const { return out_of_state_.load(); }

 private:
  void Refuse(ControlSidecar& sc, ConnId c, const std::string& why,
              std::atomic<uint64_t>* counter);

  // A proven JOIN takes its slot (a server shard k > 0: if its claim is
  // right).
  Step Admit(ControlSidecar& sc, ConnId c, const JoinMsg& j);

  JoinDesk desk_;
  ServerHandshake handshake_;
  ShardRole role_;
  JoinMsg registration_;
  bool assigned_ = false;
  ShardAssignMsg assignment_;
  std::vector<std::pair<ConnId, JoinMsg>> held_;
  const char* app_;
  uint64_t refusals_ = 0;  // sidecar only
  // Sidecar: wo; any thread (the report): ro.
  std::atomic<uint64_t> auth_failures_{0}, refused_joins_{0}, out_of_state_{0};
};

}  // namespace dblp
