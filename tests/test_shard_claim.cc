// A worker's side of joining a sharded job: the directory's shard map is
// checked, each shard k > 0 gets the claim the map gives, and a shard's
// WELCOME that does not confirm the claim is caught.
#include <gtest/gtest.h>

#include "dblp/control/shard_claim.h"

namespace dblp {
namespace {

constexpr uint32_t kPayload = 1024;

// A directory WELCOME of 2 shards over 200 chunks (128 + 72), rank 1 of 3.
WelcomeMsg Directory() {
  WelcomeMsg d;
  d.rank = 1;
  d.num_workers = 3;
  d.chunk_payload = kPayload;
  d.model_bytes = 200ull * kPayload - 100;  // the last chunk is short
  d.total_bytes = 128ull * kPayload;
  d.num_chunks = 128;
  d.shard_count = 2;
  d.worker_ipv4 = 0x0a000003;
  d.job_nonce[0] = 7;
  ShardEntry e0{0x7f000001, 9100, 0x0a000001, {}, 9200, 1, 0, 128};
  ShardEntry e1{0x7f000001, 9101, 0x0a000101, {}, 9300, 2, 128, 72};
  d.shards = {e0, e1};
  return d;
}

// What shard 1 answers to an honest claim.
WelcomeMsg ShardOne(const WelcomeMsg& d) {
  WelcomeMsg w;
  w.rank = d.rank;
  w.num_workers = d.num_workers;
  w.chunk_payload = kPayload;
  w.model_bytes = d.model_bytes;
  w.total_bytes = 72ull * kPayload - 100;
  w.num_chunks = 72;
  w.shard_index = 1;
  w.shard_count = 2;
  w.first_chunk = 128;
  w.server_ipv4 = 0x0a000101;
  w.udp_base_port = 9300;
  w.lanes = 2;
  return w;
}

TEST(ShardClaimTest, AConsistentMapPasses) {
  const WelcomeMsg d = Directory();
  EXPECT_TRUE(IsShardedWelcome(d));
  EXPECT_EQ(CheckShardMap(d), "");
  EXPECT_EQ(ShardControlAddress(d.shards[1]), "127.0.0.1:9101");
  EXPECT_FALSE(IsShardedWelcome(WelcomeMsg{}));
}

TEST(ShardClaimTest, AMapWithAGapOrUnalignedPartitionIsRefused) {
  WelcomeMsg d = Directory();
  d.shards[1].first_chunk = 129;
  EXPECT_NE(CheckShardMap(d).find("shard 1's partition starts at chunk 129"),
            std::string::npos);
  d = Directory();
  d.shards[1].num_chunks = 71;  // does not cover the gradient
  EXPECT_NE(CheckShardMap(d).find("hold 199 chunks, the gradient 200"),
            std::string::npos);
  d = Directory();
  d.shards.pop_back();
  EXPECT_NE(CheckShardMap(d), "");
}

TEST(ShardClaimTest, TheClaimCarriesTheMapsPartitionAndTheDirectorysRank) {
  const WelcomeMsg d = Directory();
  JoinMsg base;
  base.total_bytes = d.model_bytes;
  const JoinMsg j = ShardJoin(base, d, 1, d.shards[1]);
  EXPECT_EQ(j.shard_index, 1);
  EXPECT_EQ(j.shard_count, 2);
  EXPECT_EQ(j.first_chunk, 128u);
  EXPECT_EQ(j.shard_chunks, 72u);
  EXPECT_EQ(j.rank_plus_one, 2);
  EXPECT_EQ(j.directory_nonce, d.job_nonce);
  EXPECT_EQ(j.data_ipv4, d.worker_ipv4);
  EXPECT_EQ(j.total_bytes, d.model_bytes);
}

TEST(ShardClaimTest, AWelcomeThatDoesNotConfirmTheClaimIsCaught) {
  const WelcomeMsg d = Directory();
  const JoinMsg claim = ShardJoin(JoinMsg{}, d, 1, d.shards[1]);
  EXPECT_EQ(CheckShardWelcome(d, claim, d.shards[1], ShardOne(d)), "");
  WelcomeMsg w = ShardOne(d);
  w.first_chunk = 64;
  EXPECT_EQ(CheckShardWelcome(d, claim, d.shards[1], w),
            "first chunk 64, expected 128");
  w = ShardOne(d);
  w.rank = 2;
  EXPECT_EQ(CheckShardWelcome(d, claim, d.shards[1], w),
            "rank + 1 3, expected 2");
  w = ShardOne(d);
  w.total_bytes += 4;
  EXPECT_NE(CheckShardWelcome(d, claim, d.shards[1], w).find("partition bytes"),
            std::string::npos);
  w = ShardOne(d);
  w.udp_base_port = 9400;
  EXPECT_EQ(CheckShardWelcome(d, claim, d.shards[1], w),
            "UDP base port 9400, expected 9300");
}

}  // namespace
}  // namespace dblp
