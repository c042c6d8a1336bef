#include "dblp/control/job_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "dblp/security/hmac.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

// SHA-256 of the JOIN's canonical encoding: the proofs cover every field
// the worker sent, so none can be changed on the way.
AuthBytes JoinDigest(const JoinMsg& j) {
  const std::vector<uint8_t> bytes = EncodeControl(j);
  AuthBytes d{};
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), d.data(), &len, EVP_sha256(),
                 nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed in libcrypto");
  }
  return d;
}

AuthBytes ServerProof(const JobSecret& k, const JoinMsg& j,
                      const AuthBytes& ns) {
  const AuthBytes h = JoinDigest(j);
  return k.Mac("dblp/4 server", {j.nonce, ns, h});
}

AuthBytes WorkerProof(const JobSecret& k, const JoinMsg& j,
                      const AuthBytes& ns) {
  const AuthBytes h = JoinDigest(j);
  return k.Mac("dblp/4 worker", {ns, j.nonce, h});
}

AuthBytes WelcomeMac(const JobSecret& k, const AuthBytes& nw,
                     const AuthBytes& ns, WelcomeMsg wm) {
  wm.mac = AuthBytes{};
  const std::vector<uint8_t> bytes = EncodeControl(wm);
  return k.Mac("dblp/4 welcome", {nw, ns, bytes});
}

}  // namespace

std::optional<JobSecret> JobSecret::Load(const std::string& path,
                                         std::string* error) {
  const auto fail = [&](const std::string& why) {
    if (error) *error = "job secret " + path + ": " + why;
    return std::nullopt;
  };
  // Symlinks are followed (Kubernetes mounts secrets as links); fstat
  // checks the file itself. O_NONBLOCK: a FIFO must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return fail(std::string(std::strerror(errno)) +
                " (create one with: head -c 32 /dev/urandom > " + path +
                " && chmod 600 " + path +
                ", and give every app of the job "
                "the same file)");
  }
  struct stat st {};
  std::vector<uint8_t> key;
  std::string why;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if ((st.st_mode & 077) != 0) {
    why =
        "readable or writable by group or others (run chmod 600 " + path + ")";
  } else if (st.st_size < static_cast<off_t>(kMinSecretBytes) ||
             st.st_size > static_cast<off_t>(kMaxSecretBytes)) {
    why = std::to_string(st.st_size) + " bytes; a secret has " +
          std::to_string(kMinSecretBytes) + " to " +
          std::to_string(kMaxSecretBytes) +
          " (head -c 32 /dev/urandom makes one)";
  } else {
    key.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < key.size()) {
      const ssize_t n = ::read(fd, key.data() + got, key.size() - got);
      if (n <= 0) {
        why = "read failed";
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!why.empty()) {
    OPENSSL_cleanse(key.data(), key.size());
    return fail(why);
  }
  JobSecret s;
  s.key_ = std::move(key);
  return s;
}

JobSecret::~JobSecret() { OPENSSL_cleanse(key_.data(), key_.size()); }

JobSecret JobSecret::FromBytes(std::span<const uint8_t> key) {
  JobSecret s;
  s.key_.assign(key.begin(), key.end());
  return s;
}

AuthBytes JobSecret::Mac(
    std::string_view label,
    std::initializer_list<std::span<const uint8_t>> parts) const {
  return HmacSha256(key_, label, parts);
}

AuthBytes RandomAuthBytes() {
  AuthBytes b{};
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
    throw std::runtime_error(
        "the random number generator failed (RAND_bytes); check that the "
        "kernel's getrandom works");
  }
  return b;
}

bool AuthEqual(const AuthBytes& a, const AuthBytes& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

FrameKey DeriveFrameKey(const JobSecret& secret, const AuthBytes& job_nonce,
                        const FrameKeyOwner& owner, FrameAuthMode mode) {
  FrameKey k;
  k.mode = mode;
  if (mode == FrameAuthMode::kNone) return k;
  const uint8_t rank[2] = {static_cast<uint8_t>(owner.rank >> 8),
                           static_cast<uint8_t>(owner.rank)};
  const AuthBytes m =
      secret.Mac("dblp/4 member frames",
                 {job_nonce, rank, owner.worker_nonce, owner.server_nonce});
  std::memcpy(k.key.data(), m.data(), k.key.size());
  return k;
}

uint32_t DeriveSession(const JobSecret& secret, const AuthBytes& job_nonce) {
  const AuthBytes m = secret.Mac("dblp/4 session", {job_nonce});
  const uint32_t s = (uint32_t{m[0]} << 24) | (uint32_t{m[1]} << 16) |
                     (uint32_t{m[2]} << 8) | m[3];
  return s == 0 ? 1 : s;
}

std::string ServerHandshake::OnJoin(ConnId c, const JoinMsg& j,
                                    ChallengeMsg* challenge) {
  if (pending_.count(c) != 0) return "JOIN sent twice on one connection";
  Pending& p = pending_[c];
  p.join = j;
  p.server_nonce = RandomAuthBytes();
  challenge->nonce = p.server_nonce;
  challenge->proof = ServerProof(secret_, j, p.server_nonce);
  return "";
}

std::string ServerHandshake::OnProof(ConnId c, const ProofMsg& m,
                                     JoinMsg* join) {
  auto it = pending_.find(c);
  if (it == pending_.end()) return "PROOF before JOIN";
  Pending& p = it->second;
  if (p.proven) return "PROOF sent twice";
  if (!AuthEqual(m.proof, WorkerProof(secret_, p.join, p.server_nonce))) {
    return "authentication failed: the worker's proof does not match this "
           "server's job secret (give every app the same --secret_file)";
  }
  p.proven = true;
  *join = p.join;
  return "";
}

bool ServerHandshake::Authenticated(ConnId c) const {
  auto it = pending_.find(c);
  return it != pending_.end() && it->second.proven;
}

ChannelKeys ServerHandshake::Keys(ConnId c) const {
  const Pending& p = pending_.at(c);
  return ChannelKeys{
      secret_.Mac("dblp/4 control s2w", {p.join.nonce, p.server_nonce}),
      secret_.Mac("dblp/4 control w2s", {p.join.nonce, p.server_nonce})};
}

ChannelKeys WorkerHandshake::Keys() const {
  return ChannelKeys{
      secret_.Mac("dblp/4 control w2s", {join_.nonce, server_nonce_}),
      secret_.Mac("dblp/4 control s2w", {join_.nonce, server_nonce_})};
}

FrameKey ServerHandshake::MemberFrameKey(ConnId c, const AuthBytes& job_nonce,
                                         uint16_t rank,
                                         FrameAuthMode mode) const {
  const Pending& p = pending_.at(c);
  return DeriveFrameKey(secret_, job_nonce,
                        FrameKeyOwner{rank, p.join.nonce, p.server_nonce},
                        mode);
}

FrameKey WorkerHandshake::MemberFrameKey(const AuthBytes& job_nonce,
                                         uint16_t rank,
                                         FrameAuthMode mode) const {
  return DeriveFrameKey(secret_, job_nonce,
                        FrameKeyOwner{rank, join_.nonce, server_nonce_}, mode);
}

void ServerHandshake::SealWelcome(ConnId c, WelcomeMsg* wm) const {
  const Pending& p = pending_.at(c);
  wm->mac = WelcomeMac(secret_, p.join.nonce, p.server_nonce, *wm);
}

void WorkerHandshake::Start(JoinMsg* j) {
  j->nonce = RandomAuthBytes();
  join_ = *j;
  challenged_ = false;
}

std::string WorkerHandshake::AnswerChallenge(ControlSidecar& sc, ConnId conn,
                                             const ChallengeMsg& c) {
  ProofMsg proof;
  if (std::string why = OnChallenge(c, &proof); !why.empty()) {
    sc.Close(conn, why);
    return why;
  }
  sc.Send(conn, proof);
  sc.Authenticate(conn, Keys());
  return "";
}

std::string WorkerHandshake::OnChallenge(const ChallengeMsg& c,
                                         ProofMsg* proof) {
  if (challenged_) return "the server sent CHALLENGE twice";
  if (!AuthEqual(c.proof, ServerProof(secret_, join_, c.nonce))) {
    return "authentication failed: the server's proof does not match this "
           "worker's job secret (give every app the same --secret_file, or "
           "check --server points at this job's server)";
  }
  challenged_ = true;
  server_nonce_ = c.nonce;
  proof->proof = WorkerProof(secret_, join_, c.nonce);
  return "";
}

std::string WorkerHandshake::CheckWelcome(const WelcomeMsg& wm) const {
  if (!challenged_) return "WELCOME before the server proved the secret";
  if (!AuthEqual(wm.mac, WelcomeMac(secret_, join_.nonce, server_nonce_, wm))) {
    return "WELCOME failed authentication: it was not sent (or was changed "
           "on the way) by the server that proved the job secret";
  }
  return "";
}

std::string ValidateWelcome(const WelcomeMsg& wm, const JoinMsg& join) {
  if (wm.num_workers == 0 || wm.rank >= wm.num_workers) {
    return "rank " + std::to_string(wm.rank) + " is not below the worker " +
           "count " + std::to_string(wm.num_workers);
  }
  // A server shard's WELCOME describes its partition; the whole gradient
  // is model_bytes (v6).
  const uint64_t whole = wm.shard_count > 1 ? wm.model_bytes : wm.total_bytes;
  if (whole != join.total_bytes) {
    return "gradient of " + std::to_string(whole) +
           " bytes, but this worker's is " + std::to_string(join.total_bytes);
  }
  if (wm.layers != join.layers) {
    return "layer list differs from this worker's model";
  }
  if (wm.mtu != join.mtu) {
    return "MTU " + std::to_string(wm.mtu) + ", but this worker's is " +
           std::to_string(join.mtu);
  }
  if (wm.frame_auth > kMaxFrameAuthMode) return "unknown frame_auth mode";
  const uint32_t tag = FrameTagBytes(static_cast<FrameAuthMode>(wm.frame_auth));
  uint32_t room = 0;
  try {
    room = ChunkPayloadForMtu(wm.mtu);
  } catch (const std::exception& e) {
    return e.what();
  }
  // room >= tag for every MTU ChunkPayloadForMtu accepts; no sum that
  // could wrap.
  if (wm.chunk_payload == 0 || wm.chunk_payload % 4 != 0 ||
      wm.chunk_payload > room - tag) {
    return "chunk payload " + std::to_string(wm.chunk_payload) +
           " B does not fit a " + std::to_string(wm.mtu) +
           "-byte MTU frame (a positive multiple of 4 up to " +
           std::to_string(room - tag) + ")";
  }
  const uint64_t chunks =
      (wm.total_bytes + wm.chunk_payload - 1) / wm.chunk_payload;
  if (chunks != wm.num_chunks) {
    return std::to_string(wm.num_chunks) + " chunks announced, the layout " +
           "makes " + std::to_string(chunks);
  }
  if (wm.lanes == 0 || wm.lanes > 64) {
    return std::to_string(wm.lanes) + " shards (1 to 64)";
  }
  if (wm.udp_base_port == 0 ||
      uint32_t{wm.udp_base_port} + 1 + wm.num_workers > 65535) {
    return "UDP ports " + std::to_string(wm.udp_base_port) + " + 1 + rank " +
           "run past 65535 for " + std::to_string(wm.num_workers) + " workers";
  }
  return "";
}

}  // namespace dblp
