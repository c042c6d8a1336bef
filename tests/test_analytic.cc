// Analytic round model vs DESIGN.md's figures and vs Monte-Carlo simulation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "dblp/policy/analytic.h"
#include "dblp/policy/tolerance.h"

namespace dblp {
namespace {

// DESIGN.md's recipe written out pass by pass, independently of the closed
// form in analytic.cc: full passes of L^(k-1) N while L^k > p, then a last
// pass cut short at (M - pN) / (1 - L).
double DesignPacketsOverN(double loss, double p) {
  double missing = 1.0;  // fraction missing before the pass
  double sent = 0;
  while (missing * loss > p) {
    sent += missing;
    missing *= loss;
  }
  return sent + (missing - p) / (1 - loss);
}

TEST(ExpectedPasses, DesignFigureLowTolerance) {
  const PassEstimate e = ExpectedPasses(1000, 0.7, 0.008);
  EXPECT_EQ(e.passes, 14u);
  EXPECT_NEAR(e.packets_over_n, 3.31, 0.005);
  EXPECT_NEAR(e.packets_over_n, 0.992 / 0.3, 1e-9);
  EXPECT_DOUBLE_EQ(e.packets, e.packets_over_n * 1000);
}

TEST(ExpectedPasses, DesignFigureHighTolerance) {
  const PassEstimate e = ExpectedPasses(1000, 0.7, 0.408);
  EXPECT_EQ(e.passes, 3u);
  EXPECT_NEAR(e.packets_over_n, 1.97, 0.005);
  // 1 + 0.7 full passes, then (0.49 - 0.408) / 0.3 cut short by STOP.
  EXPECT_NEAR(e.packets_over_n, 1.7 + 0.082 / 0.3, 1e-9);
}

TEST(ExpectedPasses, ClosedFormMatchesThePassByPassRecipe) {
  // p * 1000 is an integer here, so the integer tolerance equals p N.
  for (double loss : {0.01, 0.1, 0.3, 0.5, 0.7, 0.9}) {
    for (double p : {0.001, 0.008, 0.024, 0.1, 0.408, 0.9}) {
      const PassEstimate e = ExpectedPasses(1000, loss, p);
      EXPECT_NEAR(e.packets_over_n, DesignPacketsOverN(loss, p), 1e-9)
          << "loss " << loss << " p " << p;
      // passes: smallest k with loss^k <= p.
      EXPECT_LE(std::pow(loss, e.passes), p * (1 + 1e-12));
      if (e.passes > 1) {
        EXPECT_GT(std::pow(loss, e.passes - 1), p);
      }
    }
  }
}

TEST(ExpectedPasses, BoundaryLossPowerEqualToToleranceNeedsNoExtraPass) {
  // 0.5^3 * 1000 = 125 = p N exactly: three passes, the third ends the round.
  const PassEstimate e = ExpectedPasses(1000, 0.5, 0.125);
  EXPECT_EQ(e.passes, 3u);
  EXPECT_DOUBLE_EQ(e.packets, 875 / 0.5);
}

TEST(ExpectedPasses, NoLossIsOnePassUpToTheStopThreshold) {
  EXPECT_EQ(ExpectedPasses(1000, 0.0, 0.408).passes, 1u);
  EXPECT_DOUBLE_EQ(ExpectedPasses(1000, 0.0, 0.408).packets, 592);
  EXPECT_DOUBLE_EQ(ExpectedPasses(1001, 0.0, 0.5).packets, 501);  // ceil
  EXPECT_EQ(ExpectedPasses(1000, 0.0, 0.0).passes, 1u);
  EXPECT_DOUBLE_EQ(ExpectedPasses(1000, 0.0, 0.0).packets, 1000);
}

TEST(ExpectedPasses, ReliableCountsPassesUntilUnderHalfAChunkMissing) {
  // 0.7^21 * 1000 = 0.56 >= 0.5, 0.7^22 * 1000 = 0.39 < 0.5.
  const PassEstimate e = ExpectedPasses(1000, 0.7, 0.0);
  EXPECT_EQ(e.passes, 22u);
  EXPECT_NEAR(e.packets, 1000 / 0.3, 1e-6);
  // Fewer chunks, fewer passes: 0.7^k * 10 < 0.5 first at k = 9.
  EXPECT_EQ(ExpectedPasses(10, 0.7, 0.0).passes, 9u);
}

TEST(ExpectedPasses, ToleranceBelowOneChunkIsReliable) {
  // p N = 0.5: the receiver still needs every chunk.
  const PassEstimate tiny = ExpectedPasses(1000, 0.7, 0.0005);
  const PassEstimate reliable = ExpectedPasses(1000, 0.7, 0.0);
  EXPECT_EQ(tiny.passes, reliable.passes);
  EXPECT_DOUBLE_EQ(tiny.packets, reliable.packets);
}

TEST(ExpectedPasses, EmptyRoundAndBadArguments) {
  const PassEstimate e = ExpectedPasses(0, 0.7, 0.1);
  EXPECT_EQ(e.passes, 0u);
  EXPECT_EQ(e.packets, 0.0);
  EXPECT_EQ(e.packets_over_n, 0.0);
  EXPECT_EQ(ExpectedRoundTimeNs(e, 1000, 1e6), 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {1.0, -0.1, nan}) {
    EXPECT_THROW(ExpectedPasses(10, bad, 0.1), std::invalid_argument) << bad;
    EXPECT_THROW(ExpectedPasses(10, 0.1, bad), std::invalid_argument) << bad;
    EXPECT_THROW(SimulatePasses(10, bad, 0.1, 1), std::invalid_argument);
    EXPECT_THROW(SimulatePasses(10, 0.1, bad, 1), std::invalid_argument);
  }
  // So close to 1 that the pass count would not fit in 32 bits.
  EXPECT_THROW(ExpectedPasses(1000, 1 - 1e-15, 0.0), std::invalid_argument);
  EXPECT_THROW(ExpectedRoundTimeNs(PassEstimate{1, 1, 1}, -1, 0),
               std::invalid_argument);
  EXPECT_THROW(ExpectedRoundTimeNs(PassEstimate{1, 1, 1}, 0, nan),
               std::invalid_argument);
}

TEST(ExpectedRoundTime, TransmitPlusOneRttPerExtraPassPlusHalfForStop) {
  const PassEstimate e{3, 1973, 1.973};
  // 1973 packets * 1 us + 2 PROBE/BITMAP exchanges + STOP one way.
  EXPECT_DOUBLE_EQ(ExpectedRoundTimeNs(e, 1000, 50'000),
                   1'973'000 + 2 * 50'000 + 25'000);
  EXPECT_DOUBLE_EQ(ExpectedRoundTimeNs(PassEstimate{1, 10, 1}, 100, 0), 1000);
  // The burst story in numbers: at 70% loss p_high is far cheaper.
  const double slow =
      ExpectedRoundTimeNs(ExpectedPasses(1000, 0.7, 0.008), 1000, 50'000);
  const double fast =
      ExpectedRoundTimeNs(ExpectedPasses(1000, 0.7, 0.408), 1000, 50'000);
  EXPECT_DOUBLE_EQ(slow, (0.992 / 0.3) * 1e6 + 13 * 50'000 + 25'000);
  EXPECT_GT(slow / fast, 1.8);
}

TEST(SimulatePasses, DeterministicPerSeedAndStopsAtTheThreshold) {
  const PassEstimate a = SimulatePasses(5000, 0.3, 0.05, 42);
  const PassEstimate b = SimulatePasses(5000, 0.3, 0.05, 42);
  EXPECT_EQ(a.passes, b.passes);
  EXPECT_EQ(a.packets, b.packets);
  bool any_differs = false;
  for (uint64_t seed = 43; seed < 53; ++seed) {
    any_differs |= SimulatePasses(5000, 0.3, 0.05, seed).packets != a.packets;
  }
  EXPECT_TRUE(any_differs);
  // Loss-free: exactly the threshold, one pass, cut short by STOP.
  const PassEstimate clean = SimulatePasses(1000, 0.0, 0.408, 7);
  EXPECT_EQ(clean.passes, 1u);
  EXPECT_EQ(clean.packets, StopThreshold(1000, 0.408));
  EXPECT_DOUBLE_EQ(clean.packets_over_n, 0.592);
  EXPECT_EQ(SimulatePasses(0, 0.5, 0.1, 1).passes, 0u);
}

struct McCase {
  uint32_t n;
  double loss;
  double p;
};

class FormulaVsMonteCarlo : public ::testing::TestWithParam<McCase> {};

TEST_P(FormulaVsMonteCarlo, MeanOverSeedsWithinAFewPercent) {
  const McCase c = GetParam();
  constexpr int kSeeds = 200;
  double packets = 0;
  double passes = 0;
  for (int s = 0; s < kSeeds; ++s) {
    const PassEstimate sim = SimulatePasses(c.n, c.loss, c.p, 1000 + s);
    packets += sim.packets;
    passes += sim.passes;
  }
  packets /= kSeeds;
  passes /= kSeeds;
  const PassEstimate e = ExpectedPasses(c.n, c.loss, c.p);
  // Packets: the formula is the exact mean, so only sampling noise remains.
  EXPECT_NEAR(packets / e.packets, 1.0, 0.01);
  // Passes: the formula gives a typical count, not the mean: a round near a
  // pass boundary finishes a pass early or late, and a reliable round lasts
  // as long as its unluckiest chunk. Within a few percent for bounded loss,
  // within one pass for reliable rounds.
  const double pass_slack = c.p > 0 ? 0.03 * e.passes : 1.0;
  EXPECT_NEAR(passes, e.passes, pass_slack);
  std::printf("n=%u loss=%g p=%g: passes %.3f vs %u, packets/n %.4f vs %.4f\n",
              c.n, c.loss, c.p, passes, e.passes, packets / c.n,
              e.packets_over_n);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FormulaVsMonteCarlo,
    ::testing::Values(McCase{10000, 0.7, 0.008},  // DESIGN.md, P_low
                      McCase{10000, 0.7, 0.408},  // DESIGN.md, P_high
                      McCase{5000, 0.3, 0.024}, McCase{2000, 0.7, 0.0},
                      McCase{2000, 0.05, 0.0}));

}  // namespace
}  // namespace dblp
