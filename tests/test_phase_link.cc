// The phase of a sharded job (lib/dblp/job/phase_link.h): the block
// squares' norm, the leader's gathering and its refusals, and the
// in-process link's wait for a shard that never reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "dblp/job/phase_link.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/float_ops.h"

namespace dblp {
namespace {

std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-2f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<double> Squares(std::span<const float> v, uint32_t chunk_floats) {
  const size_t per = size_t{kNormBlockChunks} * chunk_floats;
  std::vector<double> out(NormBlocks(v.size(), per));
  BlockSquares(v, per, out);
  return out;
}

// The lanes as float_ops.h defines them, written out in scalar code: float
// i to lane i % 8, each lane in index order, then the fixed pairwise tree.
double ReferenceBlockSquares(std::span<const float> v) {
  double lanes[kSquareLanes] = {};
  for (size_t i = 0; i < v.size(); ++i) {
    lanes[i % kSquareLanes] += static_cast<double>(v[i]) * v[i];
  }
  for (size_t width = kSquareLanes / 2; width > 0; width /= 2) {
    for (size_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

// The vector clone this CPU runs gives the scalar definition's bits, and
// squaring as the buffer fills (the server's fused reduce) gives
// BlockSquares' bits, whatever the steps; a block is never squared before
// its last float is final.
TEST(PhaseNorm, BlockSquaresMatchTheirDefinitionInAnyStepping) {
  const size_t per = 1000;  // blocks of 1000 floats, the last one shorter
  auto g = Gradient(10 * per + 123, 3);
  g[17] = 1e30f;  // a large value: any reassociation would show
  std::vector<double> whole(NormBlocks(g.size(), per));
  BlockSquares(g, per, whole);
  for (size_t b = 0; b < whole.size(); ++b) {
    const size_t lo = b * per;
    const size_t n = std::min(per, g.size() - lo);
    EXPECT_EQ(std::bit_cast<uint64_t>(whole[b]),
              std::bit_cast<uint64_t>(ReferenceBlockSquares(
                  std::span<const float>(g).subspan(lo, n))))
        << "block " << b;
  }
  for (size_t step : {size_t{1}, size_t{363}, size_t{999}, size_t{4096}}) {
    std::vector<float> v(g.size(), 0.0f);
    std::vector<double> out(whole.size(), -1.0);
    IncrementalBlockSquares inc(v, per, out);
    for (size_t done = 0; done < v.size();) {
      const size_t next = std::min(v.size(), done + step);
      std::copy(g.begin() + done, g.begin() + next, v.begin() + done);
      done = next;
      inc.Advance(done);
      // Only complete blocks so far: the rest untouched.
      for (size_t b = done / per; b < out.size(); ++b) {
        if ((b + 1) * per > done && done < v.size()) {
          EXPECT_EQ(out[b], -1.0) << "step " << step << " block " << b;
        }
      }
    }
    inc.Finish();
    for (size_t b = 0; b < out.size(); ++b) {
      EXPECT_EQ(std::bit_cast<uint64_t>(out[b]),
                std::bit_cast<uint64_t>(whole[b]))
          << "step " << step << " block " << b;
    }
  }
}

// Partitions cut by ChunkRanges hold whole blocks, so their blocks in shard
// order are the whole gradient's: the same norm, bit for bit.
TEST(PhaseNorm, PartitionsGiveTheWholeNormBits) {
  const uint32_t chunk_floats = 363;  // ChunkPayloadForMtu(1500) / 4
  const ChunkLayout whole(uint64_t{chunk_floats} * 4 * 1000 - 8,
                          chunk_floats * 4);
  const auto g = Gradient(whole.total_bytes() / 4, 7);
  const double one = NormOfBlockSquares(Squares(g, chunk_floats));
  for (uint32_t S : {2u, 3u, 5u}) {
    const ChunkRanges map(whole.num_chunks(), S);
    std::vector<double> all;
    for (uint32_t k = 0; k < S; ++k) {
      const size_t lo = size_t{map.begin(k)} * chunk_floats;
      const size_t hi = std::min(g.size(), size_t{map.end(k)} * chunk_floats);
      const auto part =
          Squares(std::span(g).subspan(lo, hi - lo), chunk_floats);
      EXPECT_EQ(part.size(), PartitionNormBlocks(map.end(k) - map.begin(k)));
      all.insert(all.end(), part.begin(), part.end());
    }
    EXPECT_EQ(std::bit_cast<uint64_t>(NormOfBlockSquares(all)),
              std::bit_cast<uint64_t>(one))
        << S << " shards";
  }
  // Not a tautology: index-order summation of the same floats differs in
  // the last bits, which is why every server uses the blocks.
  EXPECT_NEAR(L2Norm(g), one, 1e-12 * one);
}

// The documented order (float_ops.h), written out plainly: float i of a
// block into lane i % 8, lanes added pairwise. Every CPU must give these
// bits, whatever it vectorises.
TEST(PhaseNorm, BlockSquaresAddInTheDocumentedLaneOrder) {
  const auto g = Gradient(1000 + 5, 11);  // blocks of 96, the last 45
  const size_t per = 96;
  std::vector<double> got(NormBlocks(g.size(), per));
  BlockSquares(g, per, got);
  ASSERT_EQ(got.size(), 11u);
  long double exact_all = 0;
  for (size_t b = 0; b < got.size(); ++b) {
    double lane[8] = {};
    long double exact = 0;
    for (size_t i = b * per; i < std::min(g.size(), (b + 1) * per); ++i) {
      const double sq = static_cast<double>(g[i]) * g[i];
      lane[(i - b * per) % 8] += sq;
      exact += static_cast<long double>(g[i]) * g[i];
    }
    const double want = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                        ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    EXPECT_EQ(std::bit_cast<uint64_t>(got[b]), std::bit_cast<uint64_t>(want))
        << "block " << b;
    EXPECT_NEAR(static_cast<double>(exact), got[b], 1e-13 * got[b]);
    exact_all += exact;
  }
  EXPECT_NEAR(std::sqrt(static_cast<double>(exact_all)),
              NormOfBlockSquares(got), 1e-13);
}

PolicyConfig Dblp() {
  PolicyConfig c;
  c.kind = PolicyKind::kDblp;
  c.clr.freq = 2;
  c.clr.eta = 0.2;
  return c;
}

TEST(PhaseLeader, GathersEveryShardThenRunsThePolicyOnce) {
  PhaseLeader leader(TolerancePolicy::Create(Dblp()), 0, {2, 1});
  auto replay = TolerancePolicy::Create(Dblp());
  const std::vector<double> a = {1.0, 2.0}, b = {6.0};
  for (uint64_t it = 0; it < 6; ++it) {
    const double scale = it == 3 ? 9.0 : 1.0;  // a norm jump
    const std::vector<double> sa = {a[0] * scale, a[1] * scale};
    const std::vector<double> sb = {b[0] * scale};
    // Shard 1 first: arrival order does not matter, shard order does.
    EXPECT_EQ(leader.Add(1, it, false, sb, 50), "");
    EXPECT_FALSE(leader.complete());
    EXPECT_EQ(leader.Add(0, it, false, sa, 70), "");
    ASSERT_TRUE(leader.complete());
    const PhaseDecision d = leader.Decide();
    EXPECT_EQ(d.failure, "");
    EXPECT_EQ(d.norm, std::sqrt((1.0 + 2.0 + 6.0) * scale));
    replay->OnIterationEnd(it, d.norm, 70);
    EXPECT_EQ(d.next.p, replay->Current().p) << "iteration " << it;
    EXPECT_EQ(d.next.critical, replay->Current().critical);
  }
}

TEST(PhaseLeader, RefusesPartialsThatCannotBeRight) {
  PhaseLeader leader(TolerancePolicy::Create(Dblp()), 0, {2, 1});
  const std::vector<double> two = {1, 2}, one = {3};
  EXPECT_NE(leader.Add(2, 0, false, one, 0).find("server shard 2"),
            std::string::npos);
  EXPECT_NE(leader.Add(1, 1, false, one, 0).find("iteration 1"),
            std::string::npos);
  EXPECT_NE(leader.Add(1, 0, false, two, 0).find("2 norm blocks"),
            std::string::npos);
  EXPECT_EQ(leader.Add(1, 0, false, one, 0), "");
  EXPECT_NE(leader.Add(1, 0, false, one, 0).find("second partial"),
            std::string::npos);
  EXPECT_NE(leader.Add(0, 0, true, two, 0).find("resync"), std::string::npos);
  EXPECT_FALSE(leader.complete());
  const std::string missing = leader.Missing(250);
  EXPECT_NE(missing.find("server shard 0 sent no partial of iteration 0 "
                         "within 250 ms"),
            std::string::npos)
      << missing;
}

TEST(InProcessPhase, ThreadsGetOneDecisionAndAMissingShardIsNamed) {
  InProcessPhase phase(TolerancePolicy::Create(Dblp()), 0, {1, 1, 1},
                       std::chrono::milliseconds(2000));
  std::vector<PhaseDecision> got(3);
  std::vector<std::thread> t;
  for (uint32_t k = 0; k < 3; ++k) {
    t.emplace_back([&, k] {
      const std::vector<double> sq = {double(k + 1)};
      got[k] = phase.link(k).Decide(0, false, sq, 0);
    });
  }
  for (auto& x : t) x.join();
  for (const PhaseDecision& d : got) {
    EXPECT_EQ(d.failure, "");
    EXPECT_EQ(d.norm, std::sqrt(6.0));
  }
  // Iteration 1: shard 2 never reports.
  InProcessPhase short_wait(TolerancePolicy::Create(Dblp()), 0, {1, 1, 1},
                            std::chrono::milliseconds(100));
  std::vector<PhaseDecision> late(2);
  t.clear();
  for (uint32_t k = 0; k < 2; ++k) {
    t.emplace_back([&, k] {
      const std::vector<double> sq = {1.0};
      late[k] = short_wait.link(k).Decide(0, false, sq, 0);
    });
  }
  for (auto& x : t) x.join();
  for (const PhaseDecision& d : late) {
    EXPECT_NE(d.failure.find("server shard 2 sent no partial"),
              std::string::npos)
        << d.failure;
  }
}

}  // namespace
}  // namespace dblp
