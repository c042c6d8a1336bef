// Authenticated jobs: a pre-shared job secret (--secret_file), a mutual
// challenge-response at JOIN, an authenticated WELCOME, and the keys the
// job's data frames are tagged with (frame_auth.h). HMAC-SHA256 and the
// random numbers come from OpenSSL's libcrypto.
//
// The handshake (control protocol v4; K the secret, H = SHA-256, "||"
// concatenation of length-prefixed parts):
//   worker -> JOIN      {..., nonce Nw, data source}
//   server -> CHALLENGE {Ns, HMAC(K, "server" || Nw || Ns || H(JOIN))}
//   worker    checks the server's proof: a server without K is refused
//   worker -> PROOF     {HMAC(K, "worker" || Ns || Nw || H(JOIN))}
//   server    checks it; only now does the JOIN take a slot (JoinDesk)
//   server -> WELCOME   {..., job nonce J, mac = HMAC(K, "welcome" || Nw ||
//                        Ns || WELCOME with mac zeroed)}
//   worker    checks the mac, then validates the layout (ValidateWelcome)
// Control channel: from the worker's PROOF on (both directions), every
// message is followed by a TAG: HMAC(Kc, seq || message) under a key per
// direction, Kc = HMAC(K, "control s2w" | Nw | Ns) and its w2s twin, with a
// sequence number per direction (ControlSidecar::Authenticate), so no
// message can be injected, changed, replayed, reordered or dropped.
// Frame keys, one per member: HMAC(K, "member frames" || J || rank || Nw ||
//             Ns), first 16 bytes. The server verifies a push frame with
//             its sender's key and seals a broadcast frame with its
//             recipient's, so a member's key speaks only for its own rank.
//             Nw and Ns are that member's handshake nonces: another member
//             holds K too, so without them it could derive every key. They
//             cross the control connection in the clear, so a member that
//             also sees another's handshake could still derive its key
//             (closing that needs a key exchange; docs/SECURITY.md).
// Session:    HMAC(K, "session" || J), first 4 bytes (never 0).
// Both nonces are fresh per connection and J per job, so a recorded
// handshake or frame cannot be replayed into another.
//
// An insecure job (--insecure, no secret) runs the same steps with an empty
// key: it proves nothing and tags no frames, and both apps say so.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/security/frame_auth.h"

namespace dblp {

inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;

class JobSecret {
 public:
  // No key: an insecure job.
  JobSecret() = default;
  JobSecret(const JobSecret&) = default;
  JobSecret(JobSecret&&) = default;
  JobSecret& operator=(const JobSecret&) = default;
  JobSecret& operator=(JobSecret&&) = default;
  ~JobSecret();  // wipes the key
  // Reads the secret from `path` (its raw bytes). Refuses, with an error
  // naming the fix, a file that is missing, not a regular file, readable
  // or writable by group or others, shorter than kMinSecretBytes or longer
  // than kMaxSecretBytes. The secret's bytes never appear in an error.
  static std::optional<JobSecret> Load(const std::string& path,
                                       std::string* error);
  // For tests and the in-memory job.
  static JobSecret FromBytes(std::span<const uint8_t> key);

  bool insecure() const { return key_.empty(); }
  // HMAC-SHA256(key, label || parts), each part length-prefixed so no two
  // lists of parts give the same input.
  AuthBytes Mac(std::string_view label,
                std::initializer_list<std::span<const uint8_t>> parts) const;

 private:
  std::vector<uint8_t> key_;
};

// Cryptographically random bytes (RAND_bytes). Throws std::runtime_error if
// the generator fails (never silently a predictable value).
AuthBytes RandomAuthBytes();
// Constant-time equality.
bool AuthEqual(const AuthBytes& a, const AuthBytes& b);

// Whose frame key: a member's rank and its connection's handshake nonces.
struct FrameKeyOwner {
  uint16_t rank = 0;
  AuthBytes worker_nonce{};  // the JOIN's (Nw)
  AuthBytes server_nonce{};  // the CHALLENGE's (Ns)
};

// What the job's nonce derives.
FrameKey DeriveFrameKey(const JobSecret& secret, const AuthBytes& job_nonce,
                        const FrameKeyOwner& owner, FrameAuthMode mode);
uint32_t DeriveSession(const JobSecret& secret, const AuthBytes& job_nonce);

// The server's side, one state per connection. Control thread only.
class ServerHandshake {
 public:
  explicit ServerHandshake(JobSecret secret) : secret_(std::move(secret)) {}

  // A JOIN from `c`: the CHALLENGE to send. Returns "" or a refusal
  // (a second JOIN on the connection).
  std::string OnJoin(ConnId c, const JoinMsg& j, ChallengeMsg* challenge);
  // A PROOF from `c`: "" and the authenticated JOIN in *join, or a refusal
  // (no JOIN before it, a second PROOF, a wrong proof).
  std::string OnProof(ConnId c, const ProofMsg& p, JoinMsg* join);
  bool Authenticated(ConnId c) const;
  // Sets wm->mac for the authenticated connection `c`.
  void SealWelcome(ConnId c, WelcomeMsg* wm) const;
  // The frame key of the member on the authenticated connection `c`.
  FrameKey MemberFrameKey(ConnId c, const AuthBytes& job_nonce, uint16_t rank,
                          FrameAuthMode mode) const;
  // The control channel's keys for the authenticated connection `c`
  // (ControlSidecar::Authenticate): fresh per connection.
  ChannelKeys Keys(ConnId c) const;
  void Forget(ConnId c) { pending_.erase(c); }

 private:
  struct Pending {
    JoinMsg join;
    AuthBytes server_nonce{};
    bool proven = false;
  };
  JobSecret secret_;
  std::map<ConnId, Pending> pending_;
};

// The worker's side. Control thread only.
class WorkerHandshake {
 public:
  explicit WorkerHandshake(JobSecret secret) : secret_(std::move(secret)) {}
  // Fills j->nonce with a fresh nonce and remembers the JOIN.
  void Start(JoinMsg* j);
  // "" and the PROOF to send, or why the server is not trusted.
  std::string OnChallenge(const ChallengeMsg& c, ProofMsg* proof);
  // The whole answer on connection `conn`: the PROOF, then everything
  // after it, both ways, travels with its TAG. "" or why the server is
  // not trusted (the connection is then closed).
  std::string AnswerChallenge(ControlSidecar& sc, ConnId conn,
                              const ChallengeMsg& c);
  // "" if the WELCOME's mac is the server's, else why not.
  std::string CheckWelcome(const WelcomeMsg& wm) const;
  // The control channel's keys, once OnChallenge succeeded.
  ChannelKeys Keys() const;
  // This member's frame key (the WELCOME's job nonce and rank), once
  // OnChallenge succeeded.
  FrameKey MemberFrameKey(const AuthBytes& job_nonce, uint16_t rank,
                          FrameAuthMode mode) const;

 private:
  JobSecret secret_;
  JoinMsg join_;
  AuthBytes server_nonce_{};
  bool challenged_ = false;
};

// Checks what a WELCOME announces against what the worker knows: its own
// JOIN (gradient size, layers, MTU) and the limits its buffers and ports
// can take. "" or the first inconsistency, worded for the error line.
std::string ValidateWelcome(const WelcomeMsg& wm, const JoinMsg& join);

}  // namespace dblp
