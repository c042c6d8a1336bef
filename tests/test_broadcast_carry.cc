// The consistent truncated broadcast through the real round code: every
// worker receives exactly the subset the server picked (never a chunk more
// or less, whatever the loss, stale or duplicate frames), and nothing is
// counted twice or lost for good: applied + carried == produced, exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "dblp/base/rng.h"
#include "dblp/policy/broadcast_carry.h"
#include "dblp/round/stop_decision.h"
#include "fake_link.h"

namespace dblp {
namespace {

using testing_link::FakeLink;

constexpr uint32_t kFloats = 16 * 150;  // 150 chunks of 64 B
constexpr uint32_t kWorkers = 3;

// Integer-valued floats: every sum below stays exact in float32.
void IntegerMean(uint64_t seed, uint64_t it, std::vector<float>& mean) {
  Rng rng(HashMix(seed, it));
  for (float& v : mean) v = static_cast<float>(rng.NextBelow(17)) - 8.0f;
}

struct Lossy {
  double loss;
  uint64_t seed;
};

void RunConservation(const Lossy& cfg, uint32_t rounds) {
  std::vector<std::unique_ptr<FakeLink>> links;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    links.push_back(std::make_unique<FakeLink>());
    links[w]->SetUpLink(kFloats, 8, 8 + 4 * w);
  }
  const ChunkLayout& layout = links[0]->layout_;
  BroadcastCarry carry(layout, cfg.seed);
  std::vector<float> mean(kFloats);
  std::vector<int64_t> produced(kFloats, 0);
  std::vector<std::vector<int64_t>> applied(kWorkers,
                                            std::vector<int64_t>(kFloats, 0));
  Rng drop_rng(HashMix(cfg.seed, 0xD));
  for (uint64_t it = 0; it < rounds; ++it) {
    IntegerMean(cfg.seed, it, mean);
    for (uint32_t i = 0; i < kFloats; ++i) produced[i] += mean[i];
    // The policy's p moves between P_high and P_low, as in a job.
    const double p = (it / 50) % 4 == 3 ? 0.008 : 0.408;
    // A 70% burst every 97 rounds.
    const double loss = it % 97 == 13 ? 0.7 : cfg.loss;
    const std::span<const uint32_t> subset = carry.Plan(it, p, mean);
    ASSERT_EQ(subset.size(), StopThreshold(layout.num_chunks(), p));
    const std::set<uint32_t> want(subset.begin(), subset.end());
    const auto round = static_cast<uint32_t>(2 * it + 1);
    for (uint32_t w = 0; w < kWorkers; ++w) {
      FakeLink& l = *links[w];
      l.grad_ = mean;  // what the server sends (its buffer, same address)
      std::fill(l.got_.begin(), l.got_.end(), 0.0f);
      l.consumed_.clear();
      l.frames_.drop = [&](uint32_t) {
        return drop_rng.NextBelow(1000) < loss * 1000;
      };
      // A frame of the previous round, replayed: stale.
      if (!l.frames_.last_frame.empty()) {
        l.frames_.wire.push_back(l.frames_.last_frame);
      }
      l.order_.assign(subset.begin(), subset.end());
      l.recv_->Begin(round, p, 0, 0, l.now_);
      l.send_->Begin(round, l.order_, l.now_, layout.num_chunks());
      for (int t = 0; t < 200000 && !l.send_->done(); ++t) {
        // Now and then a duplicate of the frame at the head of the wire.
        if (t % 7 == 3 && !l.frames_.wire.empty()) {
          l.frames_.wire.push_back(l.frames_.wire.front());
        }
        l.Turn();
      }
      ASSERT_TRUE(l.send_->done()) << "round " << round << " worker " << w;
      while (!l.frames_.wire.empty()) l.Turn();
      ASSERT_TRUE(l.recv_->stopped());
      // Exactly the subset, each chunk once.
      Bitmap got;
      l.recv_->receiver().SnapshotBitmap(got);
      std::set<uint32_t> have;
      for (uint32_t s = 0; s < layout.num_chunks(); ++s) {
        if (got.Test(s)) have.insert(s);
      }
      ASSERT_EQ(have, want) << "round " << round << " worker " << w;
      for (const auto& [seq, n] : l.consumed_) ASSERT_EQ(n, 1) << seq;
      for (uint32_t i = 0; i < kFloats; ++i) applied[w][i] += l.got_[i];
    }
  }
  // Conservation, every float, every worker; and the replicas applied the
  // same thing.
  const std::span<const float> left = carry.carried();
  for (uint32_t w = 0; w < kWorkers; ++w) {
    for (uint32_t i = 0; i < kFloats; ++i) {
      ASSERT_EQ(applied[w][i] + static_cast<int64_t>(left[i]), produced[i])
          << "worker " << w << " float " << i;
    }
    EXPECT_EQ(applied[w], applied[0]);
  }
  // Carried-first bounds the wait: with 1-p >= 1/2 of a round sent, a
  // chunk waits one iteration at most.
  EXPECT_LE(carry.max_wait(), 1u);
  EXPECT_GT(carry.max_wait(), 0u);
}

TEST(BroadcastCarry, ConservationAndOneSubsetForAllUnderBernoulliLoss) {
  RunConservation(Lossy{0.05, 1}, 1500);
}

TEST(BroadcastCarry, ConservationAndOneSubsetForAllOnACleanLink) {
  RunConservation(Lossy{0.0, 2}, 1000);
}

TEST(BroadcastCarry, ConservationUnderHeavyLoss) {
  RunConservation(Lossy{0.3, 3}, 600);
}

TEST(BroadcastCarry, CarriedChunksGoFirstAndWrongSizesAreRefused) {
  const ChunkLayout layout(uint64_t{16} * 4 * 10, 64);  // 10 chunks
  BroadcastCarry carry(layout, 9);
  std::vector<float> mean(160, 1.0f);
  const std::span<const uint32_t> first = carry.Plan(0, 0.4, mean);
  ASSERT_EQ(first.size(), 6u);
  std::set<uint32_t> sent(first.begin(), first.end());
  EXPECT_EQ(carry.carried_chunks(), 4u);
  std::vector<float> next(160, 2.0f);
  const std::span<const uint32_t> second = carry.Plan(1, 0.4, next);
  // The four carried chunks lead, holding 1 + 2.
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sent.count(second[i]), 0u);
    EXPECT_EQ(next[layout.Offset(second[i]) / 4], 3.0f);
  }
  std::vector<float> wrong(159);
  EXPECT_THROW(carry.Plan(2, 0.4, wrong), std::invalid_argument);
}

}  // namespace
}  // namespace dblp
