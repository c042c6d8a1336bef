// Authenticated jobs (lib/dblp/control/job_auth.h): the secret file, the mutual
// handshake, the WELCOME's MAC and what a worker checks in a WELCOME.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dblp/control/job_auth.h"
#include "dblp/round/receiver_round.h"
#include "dblp/wire/chunking.h"

namespace dblp {
namespace {

JobSecret Secret(uint8_t fill) {
  std::vector<uint8_t> k(32, fill);
  return JobSecret::FromBytes(k);
}

JoinMsg AJoin() {
  JoinMsg j;
  j.worker_name = "w0";
  j.total_bytes = 4000;
  j.mtu = 1500;
  j.layers = {LayerInfo{"fc", {1000}}};
  j.data_mac = {2, 0, 0, 0, 0, 1};
  return j;
}

// The whole handshake between a worker holding `w` and a server holding
// `s`: "" if it completes, else the first refusal.
std::string Handshake(const JobSecret& w, const JobSecret& s,
                      WelcomeMsg* welcome = nullptr) {
  WorkerHandshake worker(w);
  ServerHandshake server(s);
  JoinMsg j = AJoin();
  worker.Start(&j);
  ChallengeMsg ch;
  if (std::string e = server.OnJoin(1, j, &ch); !e.empty()) return e;
  ProofMsg proof;
  if (std::string e = worker.OnChallenge(ch, &proof); !e.empty()) return e;
  JoinMsg admitted;
  if (std::string e = server.OnProof(1, proof, &admitted); !e.empty()) {
    return e;
  }
  EXPECT_EQ(admitted, j);
  WelcomeMsg wm;
  wm.rank = 0;
  wm.num_workers = 1;
  server.SealWelcome(1, &wm);
  if (welcome) *welcome = wm;
  return worker.CheckWelcome(wm);
}

TEST(JobAuth, SameSecretCompletesTheHandshake) {
  EXPECT_EQ(Handshake(Secret(1), Secret(1)), "");
}

TEST(JobAuth, AWorkerWithAnotherSecretFindsTheServerUntrusted) {
  // The server proves itself first: a worker with another secret refuses
  // the CHALLENGE and never sends a proof.
  const std::string e = Handshake(Secret(1), Secret(2));
  EXPECT_NE(e.find("server's proof"), std::string::npos) << e;
}

TEST(JobAuth, AServerRefusesAProofMadeWithAnotherSecret) {
  ServerHandshake server(Secret(1));
  WorkerHandshake liar(Secret(2));
  JoinMsg j = AJoin();
  liar.Start(&j);
  ChallengeMsg ch;
  ASSERT_EQ(server.OnJoin(1, j, &ch), "");
  // The liar cannot check the server's proof; it answers anyway, with the
  // real formula under its own secret. The same formula under the job's
  // secret is accepted: the refusal is about the secret alone.
  const std::vector<uint8_t> join_bytes = EncodeControl(j);
  AuthBytes digest{};
  unsigned int len = 0;
  ASSERT_EQ(EVP_Digest(join_bytes.data(), join_bytes.size(), digest.data(),
                       &len, EVP_sha256(), nullptr),
            1);
  ProofMsg forged;
  forged.proof = Secret(2).Mac("dblp/4 worker", {ch.nonce, j.nonce, digest});
  JoinMsg admitted;
  const std::string e = server.OnProof(1, forged, &admitted);
  EXPECT_NE(e.find("authentication failed"), std::string::npos) << e;
  EXPECT_FALSE(server.Authenticated(1));
  ServerHandshake fresh(Secret(1));
  ASSERT_EQ(fresh.OnJoin(2, j, &ch), "");
  ProofMsg genuine;
  genuine.proof = Secret(1).Mac("dblp/4 worker", {ch.nonce, j.nonce, digest});
  EXPECT_EQ(fresh.OnProof(2, genuine, &admitted), "");
}

TEST(JobAuth, OutOfOrderStepsAreRefused) {
  ServerHandshake server(Secret(1));
  ProofMsg p;
  JoinMsg j;
  EXPECT_NE(server.OnProof(7, p, &j), "");  // PROOF before JOIN
  ChallengeMsg ch;
  JoinMsg join = AJoin();
  ASSERT_EQ(server.OnJoin(7, join, &ch), "");
  EXPECT_NE(server.OnJoin(7, join, &ch), "");  // JOIN twice
  WorkerHandshake worker(Secret(1));
  WelcomeMsg wm;
  EXPECT_NE(worker.CheckWelcome(wm), "");  // WELCOME before CHALLENGE
}

TEST(JobAuth, AChangedJoinFieldBreaksTheProof) {
  // The proofs cover the JOIN: a name or layout rewritten on the way is
  // caught by the server.
  ServerHandshake server(Secret(1));
  WorkerHandshake worker(Secret(1));
  JoinMsg j = AJoin();
  worker.Start(&j);
  JoinMsg rewritten = j;
  rewritten.total_bytes = 8000;
  ChallengeMsg ch;
  ASSERT_EQ(server.OnJoin(1, rewritten, &ch), "");
  ProofMsg proof;
  // The worker sees a server proof over another JOIN and refuses it.
  EXPECT_NE(worker.OnChallenge(ch, &proof), "");
}

TEST(JobAuth, AChangedWelcomeFailsItsMac) {
  WelcomeMsg wm;
  ServerHandshake server(Secret(1));
  WorkerHandshake worker(Secret(1));
  JoinMsg j = AJoin();
  worker.Start(&j);
  ChallengeMsg ch;
  ASSERT_EQ(server.OnJoin(1, j, &ch), "");
  ProofMsg proof;
  ASSERT_EQ(worker.OnChallenge(ch, &proof), "");
  ASSERT_EQ(server.OnProof(1, proof, &j), "");
  wm.num_workers = 2;
  server.SealWelcome(1, &wm);
  EXPECT_EQ(worker.CheckWelcome(wm), "");
  WelcomeMsg changed = wm;
  changed.rank = 1;
  EXPECT_NE(worker.CheckWelcome(changed), "");
}

TEST(JobAuth, InsecureJobsStillAgreeButProveNothing) {
  EXPECT_EQ(Handshake(JobSecret(), JobSecret()), "");
  EXPECT_NE(Handshake(JobSecret(), Secret(1)), "");
}

TEST(JobAuth, DerivedValuesDependOnSecretAndNonce) {
  const AuthBytes n1 = RandomAuthBytes(), n2 = RandomAuthBytes();
  EXPECT_NE(n1, n2);
  EXPECT_EQ(DeriveSession(Secret(1), n1), DeriveSession(Secret(1), n1));
  EXPECT_NE(DeriveSession(Secret(1), n1), DeriveSession(Secret(1), n2));
  EXPECT_NE(DeriveSession(Secret(1), n1), DeriveSession(Secret(2), n1));
  EXPECT_NE(DeriveSession(Secret(1), n1), 0u);
  const FrameKeyOwner m{0, RandomAuthBytes(), RandomAuthBytes()};
  const FrameKey a = DeriveFrameKey(Secret(1), n1, m, FrameAuthMode::kFull);
  const FrameKey b = DeriveFrameKey(Secret(2), n1, m, FrameAuthMode::kFull);
  EXPECT_NE(a.key, b.key);
  EXPECT_NE(a.key, DeriveFrameKey(Secret(1), n2, m, FrameAuthMode::kFull).key);
  EXPECT_EQ(DeriveFrameKey(Secret(1), n1, m, FrameAuthMode::kNone).mode,
            FrameAuthMode::kNone);
}

// Members of one job, each through its own handshake with one server: the
// frame keys each worker derives, and the server's for each.
struct MemberKeys {
  std::vector<FrameKey> at_worker, at_server;
};
MemberKeys JoinMembers(uint16_t members, const AuthBytes& job) {
  MemberKeys k;
  auto& [at_worker, at_server] = k;
  ServerHandshake server(Secret(1));
  for (uint16_t rank = 0; rank < members; ++rank) {
    WorkerHandshake worker(Secret(1));
    JoinMsg j = AJoin();
    worker.Start(&j);
    ChallengeMsg ch;
    EXPECT_EQ(server.OnJoin(rank + 1, j, &ch), "");
    ProofMsg proof;
    EXPECT_EQ(worker.OnChallenge(ch, &proof), "");
    JoinMsg admitted;
    EXPECT_EQ(server.OnProof(rank + 1, proof, &admitted), "");
    at_worker.push_back(worker.MemberFrameKey(job, rank, FrameAuthMode::kFull));
    at_server.push_back(
        server.MemberFrameKey(rank + 1, job, rank, FrameAuthMode::kFull));
  }
  return k;
}

// Each side of a connection derives the same key for it, and no member's
// key is another's (its rank and its connection's nonces are in it).
TEST(JobAuth, EveryMemberHasItsOwnFrameKey) {
  const AuthBytes job = RandomAuthBytes();
  const MemberKeys k = JoinMembers(2, job);
  EXPECT_EQ(k.at_worker, k.at_server);
  EXPECT_NE(k.at_worker[0].key, k.at_worker[1].key);
  // The same connection nonces under another rank give another key: a
  // member cannot take over a rank by claiming it.
  EXPECT_NE(DeriveFrameKey(Secret(1), job, FrameKeyOwner{1, {}, {}},
                           FrameAuthMode::kFull)
                .key,
            DeriveFrameKey(Secret(1), job, FrameKeyOwner{0, {}, {}},
                           FrameAuthMode::kFull)
                .key);
}

// Member 0 seals a push frame that claims member 1's rank, with its own
// key (the only one it has): the server's receiver for member 1 refuses
// it; member 1's own frame gets in. With one key per job (before issue
// #21) member 0's frame verified.
TEST(JobAuth, AMemberCannotSpeakForAnother) {
  const MemberKeys k = JoinMembers(2, RandomAuthBytes());
  const ChunkLayout layout(4 * 300, 400);
  const ReceiverConfig rc{7,          FrameType::kPush, 1, layout, 0,
                          UINT32_MAX, k.at_server[1]};
  ReceiverRound rx(rc);
  rx.Begin(3, 0.0);
  std::vector<uint8_t> payload(400, 0x5A);
  const auto frame = [&](const FrameKey& key, uint32_t seq) {
    const DataHeader h{FrameType::kPush, 7, 1, 400, 3, seq};
    std::vector<uint8_t> f(kDataHeaderBytes + 400 + kFrameTagBytes);
    BuildDataFrame(h, payload.data(), f.data());
    FrameAuth(key).Seal(f.data(), kDataHeaderBytes + 400,
                        f.data() + kDataHeaderBytes + 400);
    return f;
  };
  DataHeader hdr;
  const uint8_t* out = nullptr;
  for (uint32_t seq = 0; seq < 3; ++seq) {
    const auto impostor = frame(k.at_worker[0], seq);
    EXPECT_EQ(rx.OnFrame(impostor.data(), impostor.size(), &hdr, &out),
              Verdict::kBadTag);
    const auto genuine = frame(k.at_worker[1], seq);
    EXPECT_EQ(rx.OnFrame(genuine.data(), genuine.size(), &hdr, &out),
              Verdict::kAccepted);
  }
  EXPECT_EQ(rx.received(), 3u);
}

class SecretFile : public ::testing::Test {
 protected:
  std::string path_ =
      ::testing::TempDir() + "dblp-secret-" + std::to_string(getpid());
  void Write(const std::string& bytes, mode_t mode) {
    ::unlink(path_.c_str());
    std::ofstream(path_, std::ios::binary) << bytes;
    ::chmod(path_.c_str(), mode);
  }
  void TearDown() override { ::unlink(path_.c_str()); }
};

TEST_F(SecretFile, LoadsAPrivateFile) {
  Write(std::string(32, 'k'), 0600);
  std::string err;
  std::optional<JobSecret> s = JobSecret::Load(path_, &err);
  ASSERT_TRUE(s) << err;
  EXPECT_FALSE(s->insecure());
  EXPECT_EQ(s->Mac("x", {}), Secret('k').Mac("x", {}));
}

TEST_F(SecretFile, RefusesWhatIsNotASecret) {
  std::string err;
  Write(std::string(32, 'k'), 0644);
  EXPECT_FALSE(JobSecret::Load(path_, &err));
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  Write("short", 0600);
  EXPECT_FALSE(JobSecret::Load(path_, &err));
  EXPECT_NE(err.find("head -c 32 /dev/urandom"), std::string::npos) << err;
  EXPECT_EQ(err.find("short"), std::string::npos) << "leaks the secret";
  ::unlink(path_.c_str());
  EXPECT_FALSE(JobSecret::Load(path_, &err));
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  EXPECT_FALSE(JobSecret::Load("/tmp", &err));
}

WelcomeMsg GoodWelcome(const JoinMsg& j) {
  WelcomeMsg wm;
  wm.rank = 1;
  wm.num_workers = 3;
  wm.mtu = j.mtu;
  wm.frame_auth = static_cast<uint8_t>(FrameAuthMode::kHeader);
  wm.chunk_payload = ChunkPayloadForMtu(j.mtu, kFrameTagBytes);
  wm.total_bytes = j.total_bytes;
  wm.num_chunks = ChunkLayout(j.total_bytes, wm.chunk_payload).num_chunks();
  wm.udp_base_port = 47000;
  wm.lanes = 1;
  wm.layers = j.layers;
  return wm;
}

TEST(ValidateWelcome, AcceptsWhatTheServerSends) {
  const JoinMsg j = AJoin();
  EXPECT_EQ(ValidateWelcome(GoodWelcome(j), j), "");
}

TEST(ValidateWelcome, RefusesEveryLie) {
  const JoinMsg j = AJoin();
  struct Lie {
    const char* what;
    void (*apply)(WelcomeMsg&);
  };
  const Lie lies[] = {
      {"oversized layout", [](WelcomeMsg& w) { w.total_bytes = 256u << 20; }},
      {"zero chunk payload", [](WelcomeMsg& w) { w.chunk_payload = 0; }},
      {"chunk past the MTU", [](WelcomeMsg& w) { w.chunk_payload = 1480; }},
      {"odd chunk payload", [](WelcomeMsg& w) { w.chunk_payload = 1001; }},
      {"chunk payload that wraps a 32-bit sum",
       [](WelcomeMsg& w) {
         w.chunk_payload = 0xFFFFFFF0u;
         w.num_chunks = 1;
       }},
      {"rank past the workers", [](WelcomeMsg& w) { w.rank = 3; }},
      {"no workers", [](WelcomeMsg& w) { w.num_workers = 0; }},
      {"chunk count", [](WelcomeMsg& w) { w.num_chunks += 1; }},
      {"no shards", [](WelcomeMsg& w) { w.lanes = 0; }},
      {"ports wrap", [](WelcomeMsg& w) { w.udp_base_port = 65534; }},
      {"another MTU", [](WelcomeMsg& w) { w.mtu = 9000; }},
      {"another model", [](WelcomeMsg& w) { w.layers.clear(); }},
      {"unknown tag mode", [](WelcomeMsg& w) { w.frame_auth = 9; }},
  };
  for (const Lie& lie : lies) {
    WelcomeMsg w = GoodWelcome(j);
    lie.apply(w);
    EXPECT_NE(ValidateWelcome(w, j), "") << lie.what;
  }
}

}  // namespace
}  // namespace dblp
