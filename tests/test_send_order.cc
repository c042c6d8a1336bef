// SendOrder: every kind is a permutation, deterministic per seed, the
// value-free orders spread early-stop loss evenly over the buffer instead
// of starving its tail, and the default (by magnitude) makes early stop
// drop the smallest chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/round/send_order.h"
#include "dblp/round/stop_decision.h"

namespace dblp {
namespace {

constexpr SendOrderKind kAllKinds[] = {SendOrderKind::kSequential,
                                       SendOrderKind::kRotating,
                                       SendOrderKind::kPermuted,
                                       SendOrderKind::kBlocked,
                                       SendOrderKind::kMagnitude};

::testing::AssertionResult IsPermutation(const std::vector<uint32_t>& v,
                                         uint32_t n) {
  if (v.size() != n) {
    return ::testing::AssertionFailure()
           << "size " << v.size() << ", expected " << n;
  }
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n) {
      return ::testing::AssertionFailure()
             << "entry " << i << " is " << v[i] << " >= n = " << n;
    }
    if (seen[v[i]]) {
      return ::testing::AssertionFailure()
             << "entry " << i << " repeats " << v[i];
    }
    seen[v[i]] = true;
  }
  return ::testing::AssertionSuccess();
}

TEST(SendOrderTest, EveryKindYieldsAPermutation) {
  const uint32_t sizes[] = {1, 2, 3, 7, 64, 100, 181, 1000};
  const uint32_t rounds[] = {0, 1, 2, 17, 0x7FFFFFFFu, 0xFFFFFFFFu};
  std::vector<uint32_t> out = {42, 42, 42};  // Fill must resize and overwrite
  for (SendOrderKind kind : kAllKinds) {
    for (uint32_t senders : {1u, 3u, 5u}) {
      for (uint32_t rank = 0; rank < senders; ++rank) {
        const SendOrder order(kind, rank, senders, 0xABCDEF);
        for (uint32_t n : sizes) {
          for (uint32_t round : rounds) {
            order.Fill(round, n, out);
            ASSERT_TRUE(IsPermutation(out, n))
                << SendOrderName(kind) << " rank " << rank << "/" << senders
                << " n " << n << " round " << round;
          }
        }
      }
    }
  }
}

TEST(SendOrderTest, EmptyAndSingleChunk) {
  for (SendOrderKind kind : kAllKinds) {
    const SendOrder order(kind, 2, 3, 7);
    std::vector<uint32_t> out = {5, 6};
    order.Fill(3, 0, out);
    EXPECT_TRUE(out.empty()) << SendOrderName(kind);
    order.Fill(3, 1, out);
    EXPECT_EQ(out, std::vector<uint32_t>{0}) << SendOrderName(kind);
  }
}

TEST(SendOrderTest, SequentialIsIdentityWhateverTheRoundAndRank) {
  const SendOrder order(SendOrderKind::kSequential, 2, 3, 99);
  std::vector<uint32_t> out;
  for (uint32_t round : {0u, 5u, 1234u}) {
    order.Fill(round, 50, out);
    for (uint32_t i = 0; i < 50; ++i) ASSERT_EQ(out[i], i);
  }
}

TEST(SendOrderTest, DeterministicPerSeedAndVariesWithSeedAndRound) {
  constexpr uint32_t kN = 200;
  for (SendOrderKind kind : {SendOrderKind::kRotating, SendOrderKind::kPermuted,
                             SendOrderKind::kBlocked}) {
    SCOPED_TRACE(SendOrderName(kind));
    const SendOrder a(kind, 1, 3, 12345);
    const SendOrder b(kind, 1, 3, 12345);
    const SendOrder other_seed(kind, 1, 3, 54321);
    std::vector<uint32_t> x, y, z;
    uint32_t differs_by_seed = 0;
    for (uint32_t round = 0; round < 20; ++round) {
      a.Fill(round, kN, x);
      b.Fill(round, kN, y);
      EXPECT_EQ(x, y) << "round " << round;
      // Calling again gives the same answer (no hidden state).
      a.Fill(round, kN, y);
      EXPECT_EQ(x, y) << "round " << round;
      other_seed.Fill(round, kN, z);
      differs_by_seed += x != z;
    }
    // A rotation has only kN possible starts: allow a rare coincidence.
    EXPECT_GE(differs_by_seed, 18u);
  }
}

TEST(SendOrderTest, PermutedDiffersAcrossRoundsAndIsAShuffle) {
  constexpr uint32_t kN = 256;
  const SendOrder order(SendOrderKind::kPermuted, 0, 1, 2024);
  std::vector<std::vector<uint32_t>> seen;
  std::vector<uint32_t> out;
  for (uint32_t round = 0; round < 50; ++round) {
    order.Fill(round, kN, out);
    for (const auto& prev : seen) {
      ASSERT_NE(out, prev) << "round " << round << " repeats an earlier order";
    }
    // Not a mere rotation of 0..N-1: many adjacent pairs are not +1 steps.
    uint32_t steps = 0;
    for (uint32_t i = 1; i < kN; ++i) steps += out[i] == (out[i - 1] + 1) % kN;
    EXPECT_LT(steps, kN / 8) << "round " << round;
    seen.push_back(out);
  }
}

TEST(SendOrderTest, BlockedShufflesWholeContiguousBlocks) {
  constexpr uint32_t kN = 32 * 40 + 7;  // a short last block
  const SendOrder order(SendOrderKind::kBlocked, 0, 1, 99);
  std::vector<std::vector<uint32_t>> seen;
  std::vector<uint32_t> out;
  for (uint32_t round = 0; round < 30; ++round) {
    order.Fill(round, kN, out);
    ASSERT_TRUE(IsPermutation(out, kN));
    // Every block starts at a multiple of the block size and runs up by +1:
    // the only breaks between neighbours are block boundaries.
    uint32_t breaks = 0;
    for (uint32_t i = 1; i < kN; ++i) {
      if (out[i] != out[i - 1] + 1) {
        ++breaks;
        ASSERT_EQ(out[i] % kSendBlockChunks, 0u) << "round " << round;
      }
    }
    EXPECT_LE(breaks, kN / kSendBlockChunks);
    // The block order is a real shuffle, new every round.
    EXPECT_GE(breaks, kN / kSendBlockChunks / 2);
    for (const auto& prev : seen) ASSERT_NE(out, prev) << "round " << round;
    seen.push_back(out);
  }
}

// Ranks split the shared per-round order: the first n / S entries of each
// rank's order are disjoint, so S early-stopped senders start on different
// chunks.
TEST(SendOrderTest, RanksStartOnDisjointStretches) {
  for (SendOrderKind kind : {SendOrderKind::kRotating, SendOrderKind::kPermuted,
                             SendOrderKind::kBlocked}) {
    for (uint32_t senders : {2u, 3u, 4u}) {
      for (uint32_t n : {12u, 100u, 181u}) {
        for (uint32_t round = 0; round < 10; ++round) {
          std::vector<int> owner(n, -1);
          std::vector<uint32_t> out;
          for (uint32_t rank = 0; rank < senders; ++rank) {
            SendOrder(kind, rank, senders, 77).Fill(round, n, out);
            for (uint32_t i = 0; i < n / senders; ++i) {
              ASSERT_EQ(owner[out[i]], -1)
                  << SendOrderName(kind) << " chunk " << out[i]
                  << " starts both rank " << owner[out[i]] << " and rank "
                  << rank << " (S=" << senders << ", n=" << n
                  << ", round=" << round << ")";
              owner[out[i]] = static_cast<int>(rank);
            }
          }
        }
      }
    }
  }
}

// The property from the issue. 3 workers push with early stop at
// P_high = 0.408: each gets through only the first StopThreshold(n, p)
// entries of its first-pass order (59.2%) before STOP lands.
struct EarlyStopStats {
  std::vector<double> rate;         // per chunk: delivered / (senders*rounds)
  std::vector<uint32_t> covered;    // per round: chunks with >= 1 sender
};

EarlyStopStats SimulateEarlyStop(SendOrderKind kind, uint32_t n,
                                 uint32_t rounds, double p) {
  constexpr uint32_t kSenders = 3;
  const uint32_t reached = StopThreshold(n, p);
  std::vector<SendOrder> orders;
  for (uint32_t r = 0; r < kSenders; ++r) {
    orders.emplace_back(kind, r, kSenders, /*seed=*/0x5EED);
  }
  std::vector<uint64_t> delivered(n, 0);
  EarlyStopStats stats;
  std::vector<uint32_t> out;
  for (uint32_t round = 0; round < rounds; ++round) {
    std::vector<bool> any(n, false);
    // Push rounds of consecutive iterations are 2 apart.
    for (const SendOrder& o : orders) {
      o.Fill(2 * round, n, out);
      for (uint32_t i = 0; i < reached; ++i) {
        ++delivered[out[i]];
        any[out[i]] = true;
      }
    }
    stats.covered.push_back(
        static_cast<uint32_t>(std::count(any.begin(), any.end(), true)));
  }
  for (uint32_t c = 0; c < n; ++c) {
    stats.rate.push_back(static_cast<double>(delivered[c]) /
                         (kSenders * rounds));
  }
  return stats;
}

double MeanRate(const std::vector<double>& rate, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += rate[i];
  return s / static_cast<double>(end - begin);
}

TEST(SendOrderTest, DefaultOrderDeliversEveryChunkAtTheSameRate) {
  constexpr uint32_t kN = 180;  // 64k floats at MTU 1500
  constexpr uint32_t kRounds = 400;
  constexpr double kPHigh = 0.408;
  const double expected = static_cast<double>(StopThreshold(kN, kPHigh)) / kN;
  ASSERT_NEAR(expected, 0.592, 0.006);

  // kMagnitude without values (a bench) walks this same permuted order.
  for (SendOrderKind kind :
       {SendOrderKind::kPermuted, SendOrderKind::kMagnitude,
        SendOrderKind::kRotating}) {
    SCOPED_TRACE(SendOrderName(kind));
    const EarlyStopStats s = SimulateEarlyStop(kind, kN, kRounds, kPHigh);
    const auto [lo, hi] = std::minmax_element(s.rate.begin(), s.rate.end());
    EXPECT_GT(*lo, expected - 0.08);
    EXPECT_LT(*hi, expected + 0.08);
    EXPECT_LT(*hi / *lo, 1.25) << "min " << *lo << " max " << *hi;
    const double head = MeanRate(s.rate, 0, kN / 10);
    const double tail = MeanRate(s.rate, kN - kN / 10, kN);
    EXPECT_NEAR(tail / head, 1.0, 0.1) << "head " << head << " tail " << tail;
  }

  // The prototype's order: the tail is never delivered at all.
  const EarlyStopStats seq =
      SimulateEarlyStop(SendOrderKind::kSequential, kN, kRounds, kPHigh);
  EXPECT_EQ(MeanRate(seq.rate, kN - kN / 10, kN), 0.0);
  EXPECT_EQ(MeanRate(seq.rate, 0, kN / 10), 1.0);
  EXPECT_EQ(*std::min_element(seq.rate.begin(), seq.rate.end()), 0.0);
}

TEST(SendOrderTest, PermutedOrderGivesTheMeanAContributionForEveryChunk) {
  constexpr double kPHigh = 0.408;
  for (uint32_t n : {12u, 45u, 180u, 1000u}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const uint32_t reached = StopThreshold(n, kPHigh);
    const EarlyStopStats seq =
        SimulateEarlyStop(SendOrderKind::kSequential, n, 100, kPHigh);
    const EarlyStopStats def =
        SimulateEarlyStop(SendOrderKind::kPermuted, n, 100, kPHigh);
    for (uint32_t round = 0; round < 100; ++round) {
      // Sequential: all three senders stop on the same chunk, so 40.8% of
      // the mean has no contribution at all.
      ASSERT_EQ(seq.covered[round], reached) << "round " << round;
      // Permuted: the rank offsets make 3 x 59.2% cover the whole buffer.
      ASSERT_EQ(def.covered[round], n) << "round " << round;
    }
  }
}

TEST(SendOrderTest, ParseAndNameRoundTrip) {
  for (SendOrderKind kind : kAllKinds) {
    EXPECT_EQ(ParseSendOrder(SendOrderName(kind)), kind);
  }
  EXPECT_STREQ(SendOrderName(SendOrderKind::kSequential), "sequential");
  EXPECT_STREQ(SendOrderName(SendOrderKind::kRotating), "rotating");
  EXPECT_STREQ(SendOrderName(SendOrderKind::kPermuted), "permuted");
  EXPECT_STREQ(SendOrderName(SendOrderKind::kMagnitude), "magnitude");
  EXPECT_EQ(kDefaultSendOrder, SendOrderKind::kMagnitude);
  EXPECT_STREQ(SendOrderName(static_cast<SendOrderKind>(200)), "unknown");
}

TEST(SendOrderTest, ParseRejectsJunkNamingTheChoices) {
  for (const char* bad : {"", "random", "Permuted", "permuted ", "seq"}) {
    try {
      ParseSendOrder(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("sequential"), std::string::npos) << what;
      EXPECT_NE(what.find("rotating"), std::string::npos) << what;
      EXPECT_NE(what.find("permuted"), std::string::npos) << what;
      EXPECT_NE(what.find("magnitude"), std::string::npos) << what;
    }
  }
}

TEST(SendOrderTest, ConstructorRejectsBadRank) {
  EXPECT_THROW(SendOrder(SendOrderKind::kPermuted, 0, 0, 1),
               std::invalid_argument);
  EXPECT_THROW(SendOrder(SendOrderKind::kPermuted, 3, 3, 1),
               std::invalid_argument);
  EXPECT_THROW(SendOrder(SendOrderKind::kSequential, 7, 3, 1),
               std::invalid_argument);
  EXPECT_NO_THROW(SendOrder(SendOrderKind::kRotating, 2, 3, 1));
}

// ---- by magnitude ----

// A gradient shaped like a network's: layers of very different scales
// (lognormal per chunk) and Gaussian floats inside each chunk.
std::vector<float> LayeredGradient(const ChunkLayout& layout, uint64_t seed) {
  Rng rng(seed);
  const auto uniform = [&rng] {
    return (static_cast<double>(rng.NextBelow(1u << 30)) + 0.5) /
           static_cast<double>(1u << 30);
  };
  std::vector<float> v(layout.total_bytes() / sizeof(float));
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    const double scale = std::exp(1.5 * std::sqrt(-2 * std::log(uniform())) *
                                  std::cos(6.283185307 * uniform()));
    const size_t first = layout.Offset(c) / sizeof(float);
    for (size_t i = 0; i < layout.Length(c) / sizeof(float); ++i) {
      v[first + i] = static_cast<float>(
          scale * std::sqrt(-2 * std::log(uniform())) *
          std::cos(6.283185307 * uniform()));
    }
  }
  return v;
}

double ChunkSquares(const std::vector<float>& v, const ChunkLayout& layout,
                    uint32_t c) {
  double s = 0;
  const size_t first = layout.Offset(c) / sizeof(float);
  for (size_t i = 0; i < layout.Length(c) / sizeof(float); ++i) {
    s += static_cast<double>(v[first + i]) * v[first + i];
  }
  return s;
}

TEST(SendOrderByMagnitude, LargestChunksFirstTiesInTheGivenOrder) {
  // 7 chunks of 4 floats, the last one 2 floats long.
  const ChunkLayout layout(26 * sizeof(float), 4 * sizeof(float));
  ASSERT_EQ(layout.num_chunks(), 7u);
  std::vector<float> v(26, 0.0f);
  v[4 * 3 + 1] = 5.0f;   // chunk 3: 25
  v[4 * 1 + 0] = -3.0f;  // chunk 1: 9 (the sign does not matter)
  v[4 * 6 + 1] = 3.0f;   // chunk 6 (short): 9, a tie with chunk 1
  v[4 * 0 + 2] = 1.0f;   // chunk 0: 1
  // chunks 2, 4, 5: zero, a three-way tie
  std::vector<uint32_t> order = {5, 6, 2, 1, 0, 4, 3};
  std::vector<double> norms;
  OrderByMagnitude(v, layout, order, norms);
  EXPECT_EQ(order, (std::vector<uint32_t>{3, 6, 1, 0, 5, 2, 4}));
}

TEST(SendOrderByMagnitude, ABadChunkGoesFirstSoTheServerCanRefuseIt) {
  const ChunkLayout layout(12 * sizeof(float), 4 * sizeof(float));
  std::vector<float> v(12, 1.0f);
  v[9] = std::numeric_limits<float>::quiet_NaN();
  v[1] = 1e30f;  // squares overflow float: ranks first as well
  std::vector<uint32_t> order = {0, 1, 2};
  std::vector<double> norms;
  OrderByMagnitude(v, layout, order, norms);
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 2, 1}));
}

TEST(SendOrderByMagnitude, RefusesValuesOrChunksThatDoNotFitTheLayout) {
  const ChunkLayout layout(12 * sizeof(float), 4 * sizeof(float));
  std::vector<double> norms;
  std::vector<uint32_t> order = {0, 1, 2};
  std::vector<float> short_values(11, 1.0f);
  EXPECT_THROW(OrderByMagnitude(short_values, layout, order, norms),
               std::invalid_argument);
  std::vector<float> v(12, 1.0f);
  order = {0, 3, 1};
  EXPECT_THROW(OrderByMagnitude(v, layout, order, norms),
               std::invalid_argument);
}

// The point of the order: with early stop at 1 - P_high a push keeps far
// more of the gradient's energy than the same count of chunks picked by
// the permuted order, and W workers' subsets agree on the chunks that
// carry it (so the mean averages over W there, not over one).
TEST(SendOrderByMagnitude, EarlyStopKeepsMostOfTheEnergyAndTheWorkersAgree) {
  constexpr double kPHigh = 0.408;
  constexpr uint32_t kWorkers = 3;
  const ChunkLayout layout(180 * 363 * sizeof(float), 363 * sizeof(float));
  const uint32_t n = layout.num_chunks();
  const uint32_t reached = StopThreshold(n, kPHigh);
  // Shared layer scales, per-worker noise: what data-parallel replicas see.
  const std::vector<float> shared = LayeredGradient(layout, 7);
  std::vector<double> norms;
  std::vector<uint32_t> count(n, 0);
  double kept_magnitude = 0, kept_permuted = 0, total = 0;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    std::vector<float> g = LayeredGradient(layout, 100 + w);
    for (size_t i = 0; i < g.size(); ++i) g[i] = shared[i] + 0.3f * g[i];
    const SendOrder magnitude(SendOrderKind::kMagnitude, w, kWorkers, 5);
    const SendOrder permuted(SendOrderKind::kPermuted, w, kWorkers, 5);
    std::vector<uint32_t> by_size, shuffled;
    magnitude.Fill(3, n, by_size);
    permuted.Fill(3, n, shuffled);
    EXPECT_EQ(by_size, shuffled) << "without values: the permuted order";
    OrderByMagnitude(g, layout, by_size, norms);
    ASSERT_TRUE(IsPermutation(by_size, n));
    for (uint32_t i = 0; i < n; ++i) {
      total += ChunkSquares(g, layout, i);
      if (i < reached) {
        kept_magnitude += ChunkSquares(g, layout, by_size[i]);
        kept_permuted += ChunkSquares(g, layout, shuffled[i]);
        ++count[by_size[i]];
      }
      if (i > 0) {
        ASSERT_GE(ChunkSquares(g, layout, by_size[i - 1]),
                  ChunkSquares(g, layout, by_size[i]) * (1 - 1e-5));
      }
    }
  }
  EXPECT_NEAR(kept_permuted / total, 0.592, 0.15);
  EXPECT_GT(kept_magnitude / total, 0.97)
      << "permuted kept " << kept_permuted / total;
  // Most delivered chunks came from every worker (the permuted order's
  // rank offsets give none: 3 x 59.2% starting a third apart).
  uint32_t all = 0, delivered = 0;
  for (uint32_t c : count) {
    all += c == kWorkers;
    delivered += c > 0;
  }
  EXPECT_GT(static_cast<double>(all) / delivered, 0.5)
      << all << " of " << delivered;
}

}  // namespace
}  // namespace dblp
