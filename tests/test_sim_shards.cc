// Server shards in the simulator (sim/memory_cluster.h): S shards, each a
// ServerJob over its partition, one phase for the whole model. On the same
// gradients, with every chunk arriving, the means and the CLR decisions of
// S = 2 and S = 3 must be bit-identical to one server's, for fixed, dblp
// and resync jobs. The control latency is set longer than a pass, so every
// chunk lands before a STOP takes effect and the means compare whole (with
// an early STOP, which chunks make it depends on the partition's timing).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sim/memory_cluster.h"
#include "sim/sim_costs.h"

namespace dblp {
namespace {

constexpr uint32_t kWorkers = 3;
constexpr uint64_t kFloats = 1 << 17;  // 361 chunks: partitions 128/128/105
constexpr uint64_t kIterations = 9;

// Worker r's gradient of iteration `it`: its norm jumps 4x at iterations
// 3 and 6 and back after, so the CLR detector switches p. Small integers,
// so a chunk's sum is exact in whatever order the workers' copies arrive
// (a partition's send order differs from the whole gradient's).
std::vector<std::vector<float>> Grads(uint64_t it) {
  std::vector<std::vector<float>> g(kWorkers, std::vector<float>(kFloats));
  const float scale = it % 3 == 0 && it > 0 ? 4.0f : 1.0f;
  for (uint32_t r = 0; r < kWorkers; ++r) {
    for (uint64_t i = 0; i < kFloats; ++i) {
      const auto v = static_cast<int>((i * 7 + r * 13 + it) % 97) - 48;
      g[r][i] = scale * static_cast<float>(v);
    }
  }
  return g;
}

struct Trace {
  std::vector<std::vector<float>> means;
  std::vector<RoundTolerance> push, bcast;
  std::vector<double> norms;
};

Trace RunJob(PolicyKind kind, uint32_t resync_every, uint32_t shards) {
  ClusterConfig c;
  c.num_workers = kWorkers;
  c.gradient_floats = kFloats;
  c.server_shards = shards;
  c.policy.kind = kind;
  c.policy.p_fixed = 0.2;
  c.policy.clr.freq = 1;
  c.resync_every = resync_every;
  c.costs.control_one_way_ns = 1e9;  // every chunk lands before STOP
  MemoryCluster cluster(c);
  Trace t;
  for (uint64_t it = 0; it < kIterations; ++it) {
    const IterationOutcome out = cluster.RunIteration(Grads(it));
    EXPECT_TRUE(out.failure.empty()) << out.failure;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(cluster.push_arrived(w).MissingCount(), 0u)
          << "shards " << shards << " iteration " << it << " worker " << w;
    }
    t.means.push_back(cluster.server_mean());
    t.push.push_back(out.push_tolerance);
    t.bcast.push_back(out.bcast_tolerance);
    t.norms.push_back(out.grad_norm);
  }
  return t;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameJob(PolicyKind kind, uint32_t resync_every) {
  const Trace one = RunJob(kind, resync_every, 1);
  for (uint32_t shards : {2u, 3u}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    const Trace many = RunJob(kind, resync_every, shards);
    for (uint64_t it = 0; it < kIterations; ++it) {
      SCOPED_TRACE("iteration " + std::to_string(it));
      EXPECT_TRUE(SameBits(one.means[it], many.means[it]));
      EXPECT_EQ(one.norms[it], many.norms[it]);
      EXPECT_EQ(one.push[it].p, many.push[it].p);
      EXPECT_EQ(one.push[it].critical, many.push[it].critical);
      EXPECT_EQ(one.bcast[it].p, many.bcast[it].p);
      EXPECT_EQ(one.bcast[it].critical, many.bcast[it].critical);
    }
  }
}

TEST(SimShardsTest, FixedMeansMatchOneServer) {
  ExpectSameJob(PolicyKind::kFixed, 0);
}

TEST(SimShardsTest, DblpMeansAndClrDecisionsMatchOneServer) {
  // The test means something only if p moves.
  const Trace one = RunJob(PolicyKind::kDblp, 0, 1);
  bool moved = false;
  for (const RoundTolerance& t : one.bcast) moved |= t.p != one.bcast[0].p;
  EXPECT_TRUE(moved);
  ExpectSameJob(PolicyKind::kDblp, 0);
}

TEST(SimShardsTest, ResyncMatchesOneServer) {
  ExpectSameJob(PolicyKind::kDblp, 4);
}

TEST(SimShardsTest, PartitionsAreWordAlignedAndCoverTheGradient) {
  ClusterConfig c;
  c.num_workers = 1;
  c.gradient_floats = kFloats;
  c.server_shards = 3;
  MemoryCluster cluster(c);
  uint32_t next = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(cluster.shard_first_chunk(k), next);
    EXPECT_EQ(cluster.shard_first_chunk(k) % 64, 0u);
    next += cluster.shard_layout(k).num_chunks();
  }
  EXPECT_EQ(next, cluster.layout().num_chunks());
  c.gradient_floats = 8192;  // 23 chunks: no chunk for shards 1 and 2
  EXPECT_THROW(MemoryCluster{c}, std::invalid_argument);
}

// The clock: W workers into one server link take W times one worker's
// push; S shards, each with its own link, divide that by S.
double PushMs(uint32_t workers, uint32_t shards) {
  ClusterConfig c;
  c.num_workers = workers;
  c.gradient_floats = kFloats;
  c.server_shards = shards;
  c.costs.worker_gbps = 25;
  c.costs.server_gbps = 25;
  c.costs.control_one_way_ns = 0;
  MemoryCluster cluster(c);
  std::vector<std::vector<float>> g(workers, std::vector<float>(kFloats, 1));
  return cluster.RunIteration(g).push_round_ns / 1e6;
}

TEST(SimShardsTest, IncastAtTheServerLinkAndShardsSplitIt) {
  const double one = PushMs(1, 1);
  // 361 frames of 1538 wire bytes at 25 Gb/s.
  EXPECT_NEAR(one, 361 * 1538 * 8 / 25e9 * 1e3, 0.02);
  EXPECT_NEAR(PushMs(4, 1) / one, 4.0, 0.2);
  EXPECT_NEAR(PushMs(4, 2) / one, 2.0, 0.2);
  EXPECT_NEAR(PushMs(4, 3) / one, 1.4, 0.2);  // the largest partition: 128
}

TEST(SimShardsTest, CalibrationFileLoadsAndNamesWhatIsMissing) {
  const std::string path = ::testing::TempDir() + "/cal.json";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(
      "{\"tx_ns\": 400.5, \"rx_ns\": 300, \"reduce_ns\": 100,\n"
      " \"control_one_way_ns\": 9000, \"measured\": {}}\n",
      f);
  std::fclose(f);
  SimCosts c;
  EXPECT_EQ(LoadSimCosts(path, &c), "");
  EXPECT_EQ(c.tx_ns, 400.5);
  EXPECT_EQ(c.rx_ns, 300);
  EXPECT_EQ(c.reduce_ns, 100);
  EXPECT_EQ(c.control_one_way_ns, 9000);
  EXPECT_EQ(c.server_gbps, 10);  // not in the file: kept
  f = std::fopen(path.c_str(), "w");
  std::fputs("{\"tx_ns\": 400}", f);
  std::fclose(f);
  EXPECT_NE(LoadSimCosts(path, &c).find("\"rx_ns\""), std::string::npos);
  EXPECT_NE(LoadSimCosts(path + ".none", &c).find("--calibrate"),
            std::string::npos);
}

}  // namespace
}  // namespace dblp
