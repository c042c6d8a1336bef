// The door of a sharded job (lib/dblp/control/server_shards.h): which
// JOINs each server shard admits and how it refuses the others (naming
// the directory), the claim check, the job-flag comparison, the
// directory's registry, ranks by claim, and over loopback TCP a plain
// worker's JOIN at server shard 1 refused naming the directory.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dblp/control/admission.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/join.h"
#include "dblp/control/server_shards.h"

namespace dblp {
namespace {

const ShardRole kDirectory{0, 3, "10.0.0.1:9100"};
const ShardRole kShard1{1, 3, "10.0.0.1:9100"};

JoinMsg Plain() {
  JoinMsg j;
  j.worker_name = "w";
  j.total_bytes = 4096;
  j.mtu = 1500;
  return j;
}
JoinMsg Registration(uint16_t k, uint16_t count = 3) {
  JoinMsg j = Plain();
  j.shard_index = k;
  j.shard_count = count;
  return j;
}
JoinMsg Claim(uint16_t k, uint16_t rank, uint32_t first = 128,
              uint32_t chunks = 128) {
  JoinMsg j = Registration(k);
  j.rank_plus_one = static_cast<uint16_t>(rank + 1);
  j.first_chunk = first;
  j.shard_chunks = chunks;
  j.directory_nonce.fill(7);
  return j;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ShardRole, EachServerRefusesTheJoinsNotForIt) {
  // Unsharded: plain only.
  EXPECT_EQ(CheckJoinForRole(Plain(), ShardRole{}), "");
  EXPECT_TRUE(Has(CheckJoinForRole(Claim(1, 0), ShardRole{}), "unsharded"));
  // The directory: plain and registrations of the same --shards.
  EXPECT_EQ(CheckJoinForRole(Plain(), kDirectory), "");
  EXPECT_EQ(CheckJoinForRole(Registration(2), kDirectory), "");
  EXPECT_TRUE(Has(CheckJoinForRole(Registration(1, 2), kDirectory),
                  "--shards=2, the directory with --shards=3"));
  EXPECT_TRUE(
      Has(CheckJoinForRole(Claim(1, 0), kDirectory), "sent to the directory"));
  // Shard 1: its own claims only, the rest sent to the directory.
  EXPECT_EQ(CheckJoinForRole(Claim(1, 2), kShard1), "");
  const std::string plain = CheckJoinForRole(Plain(), kShard1);
  EXPECT_TRUE(Has(plain, "not the job's directory")) << plain;
  EXPECT_TRUE(Has(plain, "--server=10.0.0.1:9100")) << plain;
  EXPECT_TRUE(Has(CheckJoinForRole(Registration(2), kShard1),
                  "register with the directory at 10.0.0.1:9100"));
  EXPECT_TRUE(Has(CheckJoinForRole(Claim(2, 0), kShard1),
                  "claims server shard 2 of 3, this is server shard 1 of 3"));
}

TEST(ShardClaim, MustMatchTheAssignment) {
  ShardAssignMsg a{.shard_index = 1,
                   .shard_count = 3,
                   .first_chunk = 128,
                   .num_chunks = 128,
                   .chunk_payload = 1440,
                   .model_bytes = 300 * 1440};
  a.directory_nonce.fill(7);
  const std::string dir = "10.0.0.1:9100";
  EXPECT_EQ(CheckClaim(Claim(1, 2), a, 3, dir), "");
  EXPECT_TRUE(Has(CheckClaim(Claim(1, 0, 64), a, 3, dir),
                  "claims chunks [64, 192), server shard 1 owns [128, 256)"));
  EXPECT_TRUE(Has(CheckClaim(Claim(1, 3), a, 3, dir), "rank 3 of a job of 3"));
  JoinMsg other = Claim(1, 0);
  other.directory_nonce.fill(8);
  const std::string why = CheckClaim(other, a, 3, dir);
  EXPECT_TRUE(Has(why, "another job's directory")) << why;
  EXPECT_TRUE(Has(why, "--server=10.0.0.1:9100")) << why;
}

TEST(ShardFlags, TheFirstDifferenceIsNamed) {
  const std::string mine = "--policy=dblp\n--p_low=0.01\n--workers=3\n";
  EXPECT_EQ(FlagDifference(mine, mine, 1), "");
  EXPECT_EQ(
      FlagDifference(mine, "--policy=dblp\n--p_low=0.02\n--workers=3\n", 2),
      "--p_low=0.01 at the directory, --p_low=0.02 at server shard 2: "
      "start every server shard with the same job flags");
  EXPECT_TRUE(Has(FlagDifference(mine, "--policy=dblp\n--p_low=0.01\n", 1),
                  "--workers=3 at the directory, no --workers"));
  EXPECT_TRUE(Has(FlagDifference(mine, mine + "--new=1\n", 1),
                  "no --new at the directory"));
}

ShardHelloMsg Hello(uint16_t k, const std::string& flags) {
  ShardHelloMsg h;
  h.shard_index = k;
  h.shard_count = 3;
  h.mtu = 1500;
  h.job_flags = flags;
  return h;
}

TEST(ShardRegistry, RegistersEveryShardOnceWithTheSameFlags) {
  ShardRegistry r(3, "--policy=dblp\n", 1500);
  EXPECT_EQ(r.Shortfall(),
            "server shards 1, 2 did not register with the "
            "directory");
  EXPECT_EQ(r.OnRegistration(11, 1), "");
  EXPECT_TRUE(Has(r.OnRegistration(12, 1), "already registered"));
  EXPECT_TRUE(Has(r.OnHello(11, Hello(2, "--policy=dblp\n")),
                  "names server "
                  "shard 2"));
  EXPECT_TRUE(Has(r.OnHello(11, Hello(1, "--policy=fixed\n")),
                  "--policy=dblp at the directory, --policy=fixed"));
  ShardHelloMsg big = Hello(1, "--policy=dblp\n");
  big.mtu = 9000;
  EXPECT_TRUE(Has(r.OnHello(11, big), "MTU is 9000"));
  EXPECT_EQ(r.OnHello(11, Hello(1, "--policy=dblp\n")), "");
  EXPECT_FALSE(r.complete());
  // Shard 2 registers, leaves before the job starts, and comes back.
  EXPECT_EQ(r.OnRegistration(13, 2), "");
  EXPECT_EQ(r.OnClose(13), 2);
  EXPECT_EQ(r.ShardOf(13), -1);
  EXPECT_EQ(r.Shortfall(),
            "server shard 2 did not register with the "
            "directory");
  EXPECT_EQ(r.OnRegistration(14, 2), "");
  EXPECT_EQ(r.OnHello(14, Hello(2, "--policy=dblp\n")), "");
  EXPECT_TRUE(r.complete());
  r.Close();
  EXPECT_EQ(r.OnClose(11), 1);  // a lost shard, named by the caller
  EXPECT_TRUE(Has(r.OnRegistration(15, 1), "too late"));
}

TEST(JoinDesk, RanksByClaimAtAServerShard) {
  JoinDesk desk(JoinPolicy{.workers = 3, .rank_by_claim = true});
  auto claim = [](const std::string& name, uint16_t rank) {
    JoinMsg j = Claim(1, rank);
    j.worker_name = name;
    return j;
  };
  EXPECT_EQ(desk.Admit(1, claim("c", 2)), "");
  EXPECT_TRUE(Has(desk.Admit(2, claim("d", 2)), "rank 2 already joined"));
  JoinMsg none = claim("e", 0);
  none.rank_plus_one = 0;
  EXPECT_TRUE(Has(desk.Admit(3, none), "claims no rank"));
  EXPECT_EQ(desk.Admit(4, claim("a", 0)), "");
  EXPECT_EQ(desk.Admit(5, claim("b", 1)), "");
  desk.Close();
  EXPECT_EQ(desk.RankOf(4), 0);
  EXPECT_EQ(desk.RankOf(5), 1);
  EXPECT_EQ(desk.RankOf(1), 2);
}

// A server shard 1's door over loopback TCP, and one worker's connection.
class ShardDoor : public ::testing::Test {
 protected:
  void SetUp() override {
    ControlSidecar::Callbacks cb;
    cb.on_message = [this](ConnId c, const ControlMessage& m) {
      std::lock_guard lock(mu_);
      steps_.push_back(admission_.OnMessage(*server_, c, m));
      cv_.notify_all();
    };
    cb.on_close = [this](ConnId c, const std::string&) {
      admission_.OnClose(c);
    };
    server_ = std::make_unique<ControlSidecar>(cb);
    admission_.set_role(ShardRole{1, 2, "127.0.0.1:9100"});
    std::string err;
    ASSERT_TRUE(server_->Listen("127.0.0.1:0", &err)) << err;
    server_thread_ = std::make_unique<SidecarThread>(*server_);
  }
  void TearDown() override {
    if (client_thread_) client_thread_->Stop();
    server_thread_.reset();
  }
  // Connects, sends `j` (the handshake follows) and waits for the end:
  // the ERROR's text, or "" once admitted or held.
  std::string Join(JoinMsg j) {
    ControlSidecar::Callbacks cb;
    cb.on_message = [this](ConnId c, const ControlMessage& m) {
      std::lock_guard lock(mu_);
      if (const auto* ch = std::get_if<ChallengeMsg>(&m)) {
        ProofMsg p;
        if (worker_.OnChallenge(*ch, &p).empty()) {
          client_->Send(c, p);
          client_->Authenticate(c, worker_.Keys());
          proven_ = true;
        }
      } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
        error_ = e->text;
      }
      cv_.notify_all();
    };
    client_ = std::make_unique<ControlSidecar>(cb);
    ConnId id;
    std::string err;
    EXPECT_TRUE(client_->Connect(
        "127.0.0.1:" + std::to_string(server_->bound_port()), 2000, &id, &err))
        << err;
    worker_.Start(&j);
    client_->Send(id, j);
    client_thread_ = std::make_unique<SidecarThread>(*client_);
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      return !error_.empty() || (proven_ && !steps_.empty() &&
                                 steps_.back() != Admission::Step::kHandled);
    });
    return error_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  JobSecret secret_;  // insecure: the door's checks are the point
  Admission admission_{JoinPolicy{.workers = 2, .rank_by_claim = true}, secret_,
                       "test"};
  WorkerHandshake worker_{JobSecret{}};
  std::unique_ptr<ControlSidecar> server_, client_;
  std::unique_ptr<SidecarThread> server_thread_, client_thread_;
  std::vector<Admission::Step> steps_;
  std::string error_;
  bool proven_ = false;
};

TEST_F(ShardDoor, APlainWorkerIsSentToTheDirectory) {
  const std::string why = Join(Plain());
  EXPECT_TRUE(Has(why, "not the job's directory")) << why;
  EXPECT_TRUE(Has(why, "--server=127.0.0.1:9100")) << why;
  EXPECT_EQ(admission_.refused_joins(), 1u);
}

TEST_F(ShardDoor, AClaimWaitsForTheAssignmentThenTakesItsRank) {
  JoinMsg j = Claim(1, 1, 64, 64);
  j.shard_count = 2;
  EXPECT_EQ(Join(j), "");
  std::lock_guard lock(mu_);
  ASSERT_FALSE(steps_.empty());
  EXPECT_EQ(steps_.back(), Admission::Step::kHeld);
}

}  // namespace
}  // namespace dblp
