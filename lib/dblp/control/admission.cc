#include "dblp/control/admission.h"

#include <cstdio>
#include <utility>
#include <variant>

#include "dblp/base/log.h"

namespace dblp {

Admission::Step Admission::OnMessage(ControlSidecar& sc, ConnId c,
                                     const ControlMessage& m) {
  if (const auto* j = std::get_if<JoinMsg>(&m)) {
    // The server proves the secret first (CHALLENGE); the JOIN takes a
    // slot only with the worker's PROOF.
    if (j->protocol_version != kControlVersion) {
      Refuse(sc, c,
             "control protocol version " + std::to_string(j->protocol_version) +
                 " != server's " + std::to_string(kControlVersion) +
                 ": run the same DBLP build everywhere",
             &refused_joins_);
      return Step::kHandled;
    }
    if (std::string why = CheckJoinForRole(*j, role_); !why.empty()) {
      Refuse(sc, c, why, &refused_joins_);
      return Step::kHandled;
    }
    ChallengeMsg ch;
    if (std::string why = handshake_.OnJoin(c, *j, &ch); !why.empty()) {
      Refuse(sc, c, why, &out_of_state_);
    } else {
      sc.Send(c, ch);
    }
    return Step::kHandled;
  }
  if (const auto* p = std::get_if<ProofMsg>(&m)) {
    JoinMsg j;
    if (std::string why = handshake_.OnProof(c, *p, &j); !why.empty()) {
      Refuse(sc, c, why,
             why.rfind("authentication", 0) == 0 ? &auth_failures_
                                                 : &out_of_state_);
      return Step::kHandled;
    }
    // Both sides hold the channel keys now: every later message, a
    // refusal included, travels with its TAG.
    sc.Authenticate(c, handshake_.Keys(c));
    if (role_.sharded() && IsShardRegistration(j)) {  // the directory only
      registration_ = j;
      sc.Trust(c);
      return Step::kShard;
    }
    if (role_.index > 0 && !assigned_) {
      held_.emplace_back(c, j);
      return Step::kHeld;
    }
    return Admit(sc, c, j);
  }
  if (desk_.RankOf(c) < 0 || IsServerMessage(m)) {
    // A stranger (or a worker mid-handshake) may send nothing else, and
    // no worker sends what only a server sends.
    Refuse(sc, c,
           std::string(ControlTypeName(m)) +
               " out of order (a worker sends JOIN, then PROOF, then round "
               "messages)",
           &out_of_state_);
    return Step::kHandled;
  }
  return Step::kMember;
}

Admission::Step Admission::Admit(ControlSidecar& sc, ConnId c,
                                 const JoinMsg& j) {
  if (role_.index > 0) {
    const std::string why =
        CheckClaim(j, assignment_, desk_.policy().workers, role_.directory);
    if (!why.empty()) {
      Refuse(sc, c, why, &refused_joins_);
      return Step::kHandled;
    }
  }
  if (std::string why = desk_.Admit(c, j); !why.empty()) {
    Refuse(sc, c, why, &refused_joins_);
    return Step::kHandled;
  }
  sc.Trust(c);
  return Step::kAdmitted;
}

Admission::Step Admission::Assign(ControlSidecar& sc, const ShardAssignMsg& a) {
  assigned_ = true;
  assignment_ = a;
  Step step = Step::kHandled;
  for (const auto& [c, j] : std::exchange(held_, {})) {
    if (Admit(sc, c, j) == Step::kAdmitted) step = Step::kAdmitted;
  }
  return step;
}

WelcomeMsg Admission::Welcome(uint32_t w, uint32_t chunk_payload,
                              const JobWelcome& job) const {
  WelcomeMsg wm = desk_.Welcome(w, chunk_payload);
  wm.model_bytes = wm.total_bytes;
  wm.session = job.session;
  wm.resync_every = job.resync_every;
  wm.push_feedback = job.push_feedback;
  wm.consistent_broadcast = job.consistent_broadcast;
  wm.lanes = job.lanes;
  wm.server_ipv4 = job.server_ipv4;
  wm.server_mac = job.server_mac;
  wm.udp_base_port = job.udp_base_port;
  wm.policy = job.policy;
  wm.frame_auth = static_cast<uint8_t>(job.frame_auth);
  wm.job_nonce = job.job_nonce;
  return wm;
}

int Admission::OnClose(ConnId c) {
  handshake_.Forget(c);
  std::erase_if(held_, [c](const auto& h) { return h.first == c; });
  const int w = desk_.RankOf(c);
  if (w >= 0) desk_.Leave(c);  // a no-op once the desk closed
  return w;
}

void Admission::Refuse(ControlSidecar& sc, ConnId c, const std::string& why,
                       std::atomic<uint64_t>* counter) {
  counter->fetch_add(1, std::memory_order_relaxed);
  // A flood of strangers must not flood the log: the first few, then one
  // line per hundred.
  const uint64_t n = ++refusals_;
  if (n <= 10 || n % 100 == 0) {
    DBLP_LOG(Warning, "%s: refused %s (%llu refused so far): %s", app_,
                 sc.PeerAddress(c).c_str(), static_cast<unsigned long long>(n),
                 why.c_str());
  }
  sc.Send(c, ErrorMsg{1, why});
  sc.Close(c, why);
}

}  // namespace dblp
