#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/emul/loss_model.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

std::vector<bool> Draw(LossInjector& inj, size_t n) {
  std::vector<bool> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = inj.ShouldDrop();
  return out;
}

size_t CountTrue(const std::vector<bool>& v) {
  size_t c = 0;
  for (const bool b : v) c += b;
  return c;
}

// Mean length of maximal runs of consecutive drops.
double MeanDropRun(const std::vector<bool>& v) {
  size_t runs = 0, dropped = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i]) continue;
    ++dropped;
    if (i == 0 || !v[i - 1]) ++runs;
  }
  return runs == 0 ? 0 : static_cast<double>(dropped) / runs;
}

LossSpec Bernoulli(double p) {
  LossSpec s;
  s.kind = LossKind::kBernoulli;
  s.p = p;
  return s;
}

LossSpec Ge(double gb, double bg, double lg, double lb) {
  LossSpec s;
  s.kind = LossKind::kGilbertElliott;
  s.ge_good_to_bad = gb;
  s.ge_bad_to_good = bg;
  s.ge_loss_good = lg;
  s.ge_loss_bad = lb;
  return s;
}

// 5-sigma binomial bound on the number of successes in n draws.
void ExpectBinomial(size_t hits, size_t n, double p, const std::string& what) {
  const double mean = static_cast<double>(n) * p;
  const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
  EXPECT_LE(std::abs(static_cast<double>(hits) - mean), 5 * sigma + 1)
      << what << ": " << hits << " hits in " << n << " draws at p=" << p;
}

TEST(LossInjector, SameSeedSameSequence) {
  for (const LossSpec& spec : {Bernoulli(0.3), Ge(0.05, 0.2, 0.01, 0.8)}) {
    LossInjector a(spec, {}, 42), b(spec, {}, 42);
    EXPECT_EQ(Draw(a, 10000), Draw(b, 10000)) << FormatLossSpec(spec);
  }
}

TEST(LossInjector, DifferentSeedsDiffer) {
  for (const LossSpec& spec : {Bernoulli(0.3), Ge(0.05, 0.2, 0.01, 0.8)}) {
    LossInjector a(spec, {}, 1), b(spec, {}, 2);
    const auto da = Draw(a, 10000), db = Draw(b, 10000);
    size_t differ = 0;
    for (size_t i = 0; i < da.size(); ++i) differ += da[i] != db[i];
    // Independent streams at these rates disagree on ~40% / ~25% of packets.
    EXPECT_GT(differ, 1000u) << FormatLossSpec(spec);
  }
}

TEST(LossInjector, BernoulliRateWithinBinomialBound) {
  constexpr size_t kN = 200000;
  for (const double p : {0.001, 0.01, 0.1, 0.3, 0.5, 0.9}) {
    LossInjector inj(Bernoulli(p), {}, 7);
    const size_t hits = CountTrue(Draw(inj, kN));
    ExpectBinomial(hits, kN, p, "bernoulli");
    EXPECT_EQ(inj.considered(), kN);
    EXPECT_EQ(inj.dropped(), hits);
    EXPECT_EQ(inj.dropped_in_burst(), 0u);
  }
}

TEST(LossInjector, ZeroAndOneAreExact) {
  LossInjector never(Bernoulli(0), {}, 3), always(Bernoulli(1), {}, 3);
  LossInjector none(LossSpec{}, {}, 3);
  for (int i = 0; i < 100000; ++i) {
    ASSERT_FALSE(never.ShouldDrop());
    ASSERT_TRUE(always.ShouldDrop());
    ASSERT_FALSE(none.ShouldDrop());
  }
  EXPECT_EQ(always.dropped(), 100000u);
  EXPECT_EQ(none.considered(), 100000u);
}

TEST(LossInjector, GilbertElliottStationaryRate) {
  constexpr size_t kN = 1000000;
  for (const LossSpec& spec : {Ge(0.01, 0.1, 0, 1), Ge(0.05, 0.2, 0.01, 0.6),
                               Ge(0.3, 0.5, 0.1, 0.9)}) {
    const double mean = MeanLossRate(spec);
    // Asymptotic variance of the sample mean: the Markov chain part
    // (correlated, lag-1 correlation lambda) plus at most 1/4 of independent
    // per-packet coin noise.
    const double pi_bad =
        spec.ge_good_to_bad / (spec.ge_good_to_bad + spec.ge_bad_to_good);
    const double lambda = 1 - spec.ge_good_to_bad - spec.ge_bad_to_good;
    const double dl = spec.ge_loss_bad - spec.ge_loss_good;
    const double var =
        (dl * dl * pi_bad * (1 - pi_bad) * (1 + lambda) / (1 - lambda) + 0.25) /
        kN;
    LossInjector inj(spec, {}, 11);
    const double rate = static_cast<double>(CountTrue(Draw(inj, kN))) / kN;
    EXPECT_NEAR(rate, mean, 5 * std::sqrt(var)) << FormatLossSpec(spec);
  }
}

TEST(LossInjector, GilbertElliottLossesAreBursty) {
  constexpr size_t kN = 1000000;
  const LossSpec ge = Ge(0.01, 0.1, 0, 1);
  LossInjector g(ge, {}, 5);
  const auto gd = Draw(g, kN);
  // Drops are exactly the bad-state packets, whose sojourn is geometric with
  // mean 1 / p_bad_to_good = 10 (~9000 runs: standard error ~0.1).
  EXPECT_NEAR(MeanDropRun(gd), 1 / ge.ge_bad_to_good, 0.6);

  LossInjector b(Bernoulli(MeanLossRate(ge)), {}, 5);
  const auto bd = Draw(b, kN);
  // Same mean rate, but independent: mean run 1 / (1 - p) ~ 1.1.
  EXPECT_NEAR(static_cast<double>(CountTrue(bd)) / kN, MeanLossRate(ge), 0.01);
  EXPECT_LT(MeanDropRun(bd), 1.2);
  EXPECT_GT(MeanDropRun(gd), 5 * MeanDropRun(bd));
}

TEST(LossInjector, BurstIterationsDropAtBurstRate) {
  const BurstSchedule bursts = ParseBurstIterations("5,7", 0.7);
  LossInjector inj(Bernoulli(0.01), bursts, 9);
  constexpr size_t kPerIter = 20000;
  size_t in_burst_drops = 0;
  for (uint64_t it = 0; it < 10; ++it) {
    inj.SetIteration(it);
    const bool burst = it == 5 || it == 7;
    EXPECT_EQ(inj.InBurst(), burst) << it;
    const size_t hits = CountTrue(Draw(inj, kPerIter));
    ExpectBinomial(hits, kPerIter, burst ? 0.7 : 0.01,
                   "iteration " + std::to_string(it));
    if (burst) in_burst_drops += hits;
  }
  EXPECT_EQ(inj.dropped_in_burst(), in_burst_drops);
  EXPECT_EQ(inj.considered(), 10 * kPerIter);
}

TEST(LossInjector, TimeWindowBurst) {
  BurstSchedule bursts;
  bursts.burst_loss = 0.7;
  bursts.window_start_ns = 1000;
  bursts.window_end_ns = 2000;
  LossInjector inj(LossSpec{}, bursts, 13);
  const struct {
    uint64_t t;
    bool in;
  } cases[] = {{0, false},   {999, false},  {1000, true}, {1500, true},
               {1999, true}, {2000, false}, {5000, false}};
  for (const auto& c : cases) {
    inj.SetTimeNs(c.t);
    EXPECT_EQ(inj.InBurst(), c.in) << c.t;
    const size_t hits = CountTrue(Draw(inj, 20000));
    if (c.in) {
      ExpectBinomial(hits, 20000, 0.7, "in window");
    } else {
      EXPECT_EQ(hits, 0u) << "base model is none, t=" << c.t;
    }
  }
  // An empty window [t, t) never bursts.
  bursts.window_end_ns = bursts.window_start_ns;
  LossInjector empty(LossSpec{}, bursts, 13);
  empty.SetTimeNs(1000);
  EXPECT_FALSE(empty.InBurst());
}

TEST(LossInjector, RejectsInvalidProbabilities) {
  EXPECT_THROW(LossInjector(Bernoulli(1.5), {}, 1), std::invalid_argument);
  EXPECT_THROW(LossInjector(Ge(0.1, 0, 0, 1), {}, 1), std::invalid_argument);
  BurstSchedule bad;
  bad.burst_loss = -0.1;
  EXPECT_THROW(LossInjector(LossSpec{}, bad, 1), std::invalid_argument);
}

TEST(LossSpecParse, AcceptsEachForm) {
  EXPECT_EQ(ParseLossSpec("none"), LossSpec{});
  EXPECT_EQ(ParseLossSpec("bernoulli:0.01"), Bernoulli(0.01));
  EXPECT_EQ(ParseLossSpec("bernoulli:1"), Bernoulli(1));
  EXPECT_EQ(ParseLossSpec("bernoulli:1e-3"), Bernoulli(0.001));
  EXPECT_EQ(ParseLossSpec("ge:0.01,0.3,0,1"), Ge(0.01, 0.3, 0, 1));
  EXPECT_EQ(ParseLossSpec("ge:0.05,0.25,0.001,0.75"),
            Ge(0.05, 0.25, 0.001, 0.75));
}

TEST(LossSpecParse, FormatRoundTrips) {
  for (const LossSpec& spec :
       {LossSpec{}, Bernoulli(0.01), Bernoulli(1.0 / 3), Ge(0.01, 0.3, 0, 1),
        Ge(0.1 / 3, 0.7, 0.001, 0.95)}) {
    const std::string text = FormatLossSpec(spec);
    EXPECT_EQ(ParseLossSpec(text), spec) << text;
  }
  EXPECT_EQ(FormatLossSpec(Bernoulli(0.01)), "bernoulli:0.01");
  EXPECT_EQ(FormatLossSpec(Ge(0.01, 0.3, 0, 1)), "ge:0.01,0.3,0,1");
}

TEST(LossSpecParse, RejectsEachBadForm) {
  const char* bad[] = {
      "",                  // empty
      "None",              // case matters
      " none",             // no stray spaces
      "drop:0.1",          // unknown model
      "bernoulli",         // missing p
      "bernoulli:",        // empty p
      "bernoulli:abc",     // not a number
      "bernoulli:0.1x",    // trailing junk
      "bernoulli:1.5",     // > 1
      "bernoulli:-0.1",    // < 0
      "bernoulli:nan",     // not finite
      "bernoulli:inf",     // not finite
      "ge:0.1,0.2,0",      // 3 values
      "ge:0.1,0.2,0,1,1",  // 5 values
      "ge:0.1,,0,1",       // empty value
      "ge:0.1,0,0,1",      // p_bad_to_good = 0
      "ge:0.1,0.2,0,2",    // loss_bad > 1
      "ge:0.1;0.2;0;1",    // wrong separator
  };
  for (const char* text : bad) {
    try {
      ParseLossSpec(text);
      ADD_FAILURE() << "accepted \"" << text << "\"";
    } catch (const std::invalid_argument& e) {
      // The message teaches the syntax.
      EXPECT_NE(std::string(e.what()).find("bernoulli:<p>"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("ge:<p_good_to_bad>"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(LossSpec, MeanLossRate) {
  EXPECT_EQ(MeanLossRate(LossSpec{}), 0);
  EXPECT_EQ(MeanLossRate(Bernoulli(0.25)), 0.25);
  // pi_bad = 0.01 / 0.11.
  EXPECT_NEAR(MeanLossRate(Ge(0.01, 0.1, 0, 1)), 1.0 / 11, 1e-15);
  // pi_bad = 0.2 / 0.8 = 0.25: 0.25 * 0.6 + 0.75 * 0.02.
  EXPECT_NEAR(MeanLossRate(Ge(0.2, 0.6, 0.02, 0.6)), 0.165, 1e-15);
}

TEST(BurstSchedule, ParseIterations) {
  BurstSchedule s = ParseBurstIterations("279,651", 0.7);
  EXPECT_EQ(s.iterations, (std::vector<uint64_t>{279, 651}));
  EXPECT_EQ(s.burst_loss, 0.7);
  EXPECT_TRUE(s.Contains(279));
  EXPECT_TRUE(s.Contains(651));
  EXPECT_FALSE(s.Contains(280));
  EXPECT_FALSE(s.Contains(0));

  s = ParseBurstIterations("651, 279 ,651,3", 0.5);
  EXPECT_EQ(s.iterations, (std::vector<uint64_t>{3, 279, 651}));

  s = ParseBurstIterations("", 0.7);
  EXPECT_TRUE(s.iterations.empty());
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(s.Contains(0));
}

TEST(BurstSchedule, ParseRejectsJunk) {
  for (const char* bad : {"a", "1,,2", "1,", ",1", "-1", "1.5", "0x10", "1 2",
                          "99999999999999999999999"}) {
    EXPECT_THROW(ParseBurstIterations(bad, 0.7), std::invalid_argument) << bad;
  }
  EXPECT_THROW(ParseBurstIterations("1", 1.5), std::invalid_argument);
  EXPECT_THROW(ParseBurstIterations("1", std::nan("")), std::invalid_argument);
}

TEST(BurstSchedule, RandomIterationsDistinctSortedInRange) {
  const BurstSchedule s = RandomBurstIterations(20, 100, 1000, 77, 0.7);
  ASSERT_EQ(s.iterations.size(), 20u);
  EXPECT_EQ(s.burst_loss, 0.7);
  for (size_t i = 0; i < s.iterations.size(); ++i) {
    EXPECT_GE(s.iterations[i], 100u);
    EXPECT_LE(s.iterations[i], 1000u);
    if (i > 0) {
      EXPECT_LT(s.iterations[i - 1], s.iterations[i]);
    }
  }
  EXPECT_EQ(RandomBurstIterations(20, 100, 1000, 77, 0.7).iterations,
            s.iterations);
  EXPECT_NE(RandomBurstIterations(20, 100, 1000, 78, 0.7).iterations,
            s.iterations);
}

TEST(BurstSchedule, RandomIterationsEdges) {
  // The whole range.
  EXPECT_EQ(RandomBurstIterations(5, 10, 14, 1, 0.7).iterations,
            (std::vector<uint64_t>{10, 11, 12, 13, 14}));
  EXPECT_TRUE(RandomBurstIterations(0, 10, 14, 1, 0.7).iterations.empty());
  EXPECT_THROW(RandomBurstIterations(6, 10, 14, 1, 0.7), std::invalid_argument);
  EXPECT_THROW(RandomBurstIterations(1, 15, 14, 1, 0.7), std::invalid_argument);
  EXPECT_THROW(RandomBurstIterations(1, 0, 14, 1, 2.0), std::invalid_argument);
  // A range whose size does not fit in 64 bits.
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const BurstSchedule wide = RandomBurstIterations(3, 0, kMax, 1, 0.7);
  ASSERT_EQ(wide.iterations.size(), 3u);
  EXPECT_LT(wide.iterations[0], wide.iterations[1]);
  EXPECT_LT(wide.iterations[1], wide.iterations[2]);
  // A single-point range at the top.
  EXPECT_EQ(RandomBurstIterations(1, kMax, kMax, 1, 0.7).iterations,
            (std::vector<uint64_t>{kMax}));
}

TEST(BurstSchedule, RandomIterationsUniform) {
  // Picking 2 of [0, 9] over many seeds: each value is picked with
  // probability 1/5, so ~4000 of 20000; 5-sigma binomial bound.
  constexpr size_t kSeeds = 20000;
  size_t hist[10] = {};
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    for (const uint64_t v :
         RandomBurstIterations(2, 0, 9, seed, 0.7).iterations) {
      ++hist[v];
    }
  }
  for (size_t v = 0; v < 10; ++v) {
    ExpectBinomial(hist[v], kSeeds, 0.2, "value " + std::to_string(v));
  }
}

// The receive side's injector judges each frame by its own iteration
// (round / 2): a burst hits both rounds of its iteration and no other, and
// a frame too short to carry a round is left to the protocol.
TEST(RxLossInjector, BurstFollowsTheFramesIteration) {
  const BurstSchedule bursts = ParseBurstIterations("3", 1.0);
  RxLossInjector loss(ParseLossSpec("none"), bursts, 1);
  auto frame = [](uint32_t round) {
    std::vector<uint8_t> f(kDataHeaderBytes + 4, 0);
    EncodeDataHeader(DataHeader{FrameType::kPush, 1, 0, 4, round, 0}, f.data());
    return f;
  };
  for (uint32_t round : {4u, 5u, 8u}) {
    const auto f = frame(round);
    EXPECT_FALSE(loss.ShouldDrop(f.data(), f.size(), 0)) << round;
  }
  for (uint32_t round : {6u, 7u}) {
    const auto f = frame(round);
    EXPECT_TRUE(loss.ShouldDrop(f.data(), f.size(), 0)) << round;
  }
  const auto f = frame(6);
  EXPECT_FALSE(loss.ShouldDrop(f.data(), kDataHeaderBytes - 1, 0));
  EXPECT_TRUE(loss.InBurst(3));
  EXPECT_FALSE(loss.InBurst(2));
  EXPECT_EQ(loss.dropped(), 2u);
}

}  // namespace
}  // namespace dblp
