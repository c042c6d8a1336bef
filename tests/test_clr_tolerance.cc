// CLR detector schedule and the tolerance policies built on it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/policy/clr_detector.h"
#include "dblp/policy/round_time_window.h"
#include "dblp/policy/tolerance.h"

namespace dblp {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Feeds norms[i] as iteration first + i and returns, for each iteration,
// whether it ran critical: element 0 is the state before the first call,
// element i+1 what Observe() of iteration first + i returned.
std::vector<bool> Feed(ClrDetector& d, const std::vector<double>& norms,
                       uint64_t first = 0) {
  std::vector<bool> critical{d.critical()};
  for (size_t i = 0; i < norms.size(); ++i) {
    critical.push_back(d.Observe(first + i, norms[i]));
  }
  return critical;
}

// Expects exactly the iterations in [lo, hi) of `critical` to be critical.
void ExpectCriticalExactly(const std::vector<bool>& critical, size_t lo,
                           size_t hi) {
  for (size_t i = 0; i < critical.size(); ++i) {
    EXPECT_EQ(critical[i], i >= lo && i < hi) << "iteration " << i;
  }
}

template <class F>
std::string ThrowMessage(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no std::invalid_argument thrown>";
}

TEST(ClrDetector, StartsCritical) {
  ClrDetector d(ClrParams{});
  EXPECT_TRUE(d.critical());
  EXPECT_EQ(d.checks(), 0u);
  EXPECT_EQ(d.switches(), 0u);
  EXPECT_TRUE(std::isnan(d.last_relative_change()));
}

TEST(ClrDetector, ConstantNormIsCriticalForTheFirstTwoWindowsOnly) {
  ClrDetector d(ClrParams{.freq = 10, .eta = 0.5});
  const auto critical = Feed(d, std::vector<double>(40, 3.0));
  // Window 0 (0..9) starts critical; the check at 9 has no reference, so
  // window 1 (10..19) is critical too; the check at 19 sees no change.
  ExpectCriticalExactly(critical, 0, 20);
  EXPECT_EQ(d.checks(), 4u);  // iterations 9, 19, 29, 39
  EXPECT_EQ(d.switches(), 1u);
  EXPECT_DOUBLE_EQ(d.last_relative_change(), 0.0);
}

TEST(ClrDetector, JumpAtACheckIsCriticalForExactlyOneWindow) {
  ClrDetector d(ClrParams{.freq = 10, .eta = 0.5});
  std::vector<double> norms(70, 1.0);
  // Norms between checks do not count, however wild.
  for (size_t i = 0; i < norms.size(); ++i) {
    if (i % 10 != 9) norms[i] = 100.0 + static_cast<double>(i);
  }
  norms[39] = 2.0;  // +100% at the check closing window 3 -> 40..49 critical
  norms[49] = 2.0;  // no change -> back to non-critical from 50 on
  norms[59] = 2.0;
  norms[69] = 2.0;
  const auto critical = Feed(d, norms);
  for (size_t i = 20; i <= 70; ++i) {
    EXPECT_EQ(critical[i], i >= 40 && i < 50) << "iteration " << i;
  }
  EXPECT_DOUBLE_EQ(d.last_relative_change(), 0.0);
  EXPECT_EQ(d.switches(), 3u);  // ->non-critical at 20, ->critical at 40, back
}

TEST(ClrDetector, RelativeChangeExactlyAtEtaIsCritical) {
  // freq = 1: every iteration is a check, so the schedule is easy to read.
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  d.Observe(0, 2.0);               // first check: reference only
  EXPECT_TRUE(d.Observe(1, 1.0));  // |2 - 1| / 2 = 0.5 >= eta
  EXPECT_DOUBLE_EQ(d.last_relative_change(), 0.5);
  EXPECT_FALSE(d.Observe(2, 1.0));  // 0
  EXPECT_TRUE(d.Observe(3, 1.5));   // +0.5 exactly, increase counts too
}

TEST(ClrDetector, RelativeChangeJustBelowAndAboveEta) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  d.Observe(0, 1.0);
  EXPECT_FALSE(d.Observe(1, 0.5 + 1e-9));  // drop of 0.5 - 1e-9
  EXPECT_LT(d.last_relative_change(), 0.5);
  // Reference is now 0.5 + 1e-9; a fall to half of it minus a hair.
  EXPECT_TRUE(d.Observe(2, (0.5 + 1e-9) * 0.5 - 1e-9));
  EXPECT_GT(d.last_relative_change(), 0.5);
}

TEST(ClrDetector, EtaIsConfigurable) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.1});
  d.Observe(0, 1.0);
  EXPECT_TRUE(d.Observe(1, 1.2));    // 0.2 >= 0.1
  EXPECT_FALSE(d.Observe(2, 1.25));  // ~0.04
}

TEST(ClrDetector, PreviousNormZero) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  d.Observe(0, 0.0);
  EXPECT_FALSE(d.Observe(1, 0.0));  // 0 -> 0: no change
  EXPECT_DOUBLE_EQ(d.last_relative_change(), 0.0);
  EXPECT_TRUE(d.Observe(2, 1e-12));  // 0 -> anything: infinitely large change
  EXPECT_EQ(d.last_relative_change(), kInf);
  EXPECT_TRUE(d.Observe(3, 0.0));  // 1e-12 -> 0 is -100%
}

TEST(ClrDetector, InvalidNormBetweenChecksIsCriticalUntilTheNextCheck) {
  ClrDetector d(ClrParams{.freq = 10, .eta = 0.5});
  std::vector<double> norms(40, 1.0);
  norms[33] = kNaN;
  const auto critical = Feed(d, norms);
  // 0..19 as usual, then non-critical, then NaN at 33 -> 34..39 critical;
  // the check at 39 compares 1.0 with the last valid reference (29) -> calm.
  for (size_t i = 0; i <= 40; ++i) {
    EXPECT_EQ(critical[i], i < 20 || (i >= 34 && i < 40)) << "iteration " << i;
  }
  EXPECT_EQ(d.nonfinite(), 1u);
  EXPECT_DOUBLE_EQ(d.last_relative_change(), 0.0);
}

TEST(ClrDetector, InvalidNormAtACheckKeepsTheLastValidReference) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  d.Observe(0, 4.0);
  EXPECT_FALSE(d.Observe(1, 4.0));
  EXPECT_TRUE(d.Observe(2, kInf));
  EXPECT_TRUE(std::isnan(d.last_relative_change()));
  EXPECT_TRUE(d.Observe(3, -1.0));  // negative: no L2 norm, also invalid
  EXPECT_TRUE(d.Observe(4, -kInf));
  // Reference is still 4.0 from iteration 1, not the garbage.
  EXPECT_FALSE(d.Observe(5, 4.0));
  EXPECT_EQ(d.nonfinite(), 3u);
  EXPECT_EQ(d.checks(), 6u);
}

TEST(ClrDetector, InvalidFirstCheckLeavesNoReference) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  EXPECT_TRUE(d.Observe(0, kNaN));
  EXPECT_TRUE(d.Observe(1, 5.0));  // behaves as the first check
  EXPECT_FALSE(d.Observe(2, 5.0));
}

TEST(ClrDetector, FreqOneChecksEveryIteration) {
  ClrDetector d(ClrParams{.freq = 1, .eta = 0.5});
  const auto critical = Feed(d, {1, 1, 1, 3, 3, 3});
  // 0 and 1 critical (start, first check without reference), 2..3 calm,
  // the jump observed at 3 makes only iteration 4 critical.
  EXPECT_EQ(critical,
            (std::vector<bool>{true, true, false, false, true, false, false}));
  EXPECT_EQ(d.checks(), 6u);
  EXPECT_EQ(d.switches(), 3u);
}

TEST(ClrDetector, CheckPositionsFollowTheIterationNumber) {
  ClrDetector d(ClrParams{.freq = 10, .eta = 0.5});
  // A run resumed at iteration 505: the first check is at 509, not 514.
  Feed(d, std::vector<double>(5, 1.0), 505);
  EXPECT_EQ(d.checks(), 1u);
  Feed(d, std::vector<double>(10, 1.0), 510);
  EXPECT_EQ(d.checks(), 2u);
  EXPECT_FALSE(d.critical());
}

TEST(ClrDetector, ValidationNamesTheFlag) {
  EXPECT_NO_THROW(ValidateClrParams(ClrParams{}));
  EXPECT_NE(ThrowMessage([] {
              ValidateClrParams({.freq = 0, .eta = 0.5});
            }).find("--clr_freq"),
            std::string::npos);
  for (double eta : {0.0, -0.5, kNaN, kInf}) {
    EXPECT_NE(ThrowMessage([&] {
                ValidateClrParams({.freq = 10, .eta = eta});
              }).find("--clr_eta"),
              std::string::npos)
        << eta;
  }
  EXPECT_THROW(ClrDetector(ClrParams{.freq = 0, .eta = 0.5}),
               std::invalid_argument);
}

// ---------------------------------------------------------------- policies

constexpr PolicyKind kAllKinds[] = {
    PolicyKind::kReliable, PolicyKind::kFixed,    PolicyKind::kDblp,
    PolicyKind::kLtp,      PolicyKind::kDeadline, PolicyKind::kCombined};

std::unique_ptr<TolerancePolicy> Make(PolicyKind kind, PolicyConfig c = {}) {
  c.kind = kind;
  return TolerancePolicy::Create(c);
}

TEST(TolerancePolicy, ReliableNeedsEveryChunk) {
  auto pol = Make(PolicyKind::kReliable);
  for (uint64_t it = 0; it < 30; ++it) {
    const RoundTolerance t = pol->Current();
    EXPECT_EQ(t.p, 0.0);
    EXPECT_EQ(t.deadline_ns, 0u);
    EXPECT_FALSE(t.critical);
    pol->OnIterationEnd(it, it % 2 ? 1.0 : 100.0, 1000);
  }
  EXPECT_EQ(pol->kind(), PolicyKind::kReliable);
  EXPECT_EQ(pol->Describe(), "reliable");
}

TEST(TolerancePolicy, FixedKeepsItsP) {
  PolicyConfig c;
  c.p_fixed = 0.024;
  auto pol = Make(PolicyKind::kFixed, c);
  for (uint64_t it = 0; it < 30; ++it) {
    EXPECT_EQ(pol->Current().p, 0.024);
    EXPECT_EQ(pol->Current().deadline_ns, 0u);
    pol->OnIterationEnd(it, it % 2 ? 1.0 : 100.0, 1000);
  }
  EXPECT_EQ(pol->kind(), PolicyKind::kFixed);
  EXPECT_EQ(pol->Describe(), "fixed(p=0.024)");
}

TEST(TolerancePolicy, DblpFollowsTheDetector) {
  PolicyConfig c;
  c.clr = {.freq = 5, .eta = 0.5};
  auto pol = Make(PolicyKind::kDblp, c);
  EXPECT_EQ(pol->Describe(), "dblp(p_low=0.008,p_high=0.408,freq=5,eta=0.5)");
  // Checks at 4, 9, 14, 19, 24, 29; the norm halves at 19 (-> 20..24
  // critical) and the trace is NaN at 27 (-> 28..29 critical).
  std::vector<double> norms(30, 8.0);
  for (size_t i = 19; i < norms.size(); ++i) norms[i] = 4.0;
  norms[27] = kNaN;
  std::vector<bool> expect_critical(30, false);
  for (size_t i = 0; i < 10; ++i) expect_critical[i] = true;
  for (size_t i = 20; i < 25; ++i) expect_critical[i] = true;
  expect_critical[28] = expect_critical[29] = true;
  for (uint64_t it = 0; it < norms.size(); ++it) {
    const RoundTolerance t = pol->Current();
    EXPECT_EQ(t.critical, expect_critical[it]) << "iteration " << it;
    EXPECT_EQ(t.p, expect_critical[it] ? 0.008 : 0.408) << "iteration " << it;
    EXPECT_EQ(t.deadline_ns, 0u);
    pol->OnIterationEnd(it, norms[it], 1000);
  }
  EXPECT_EQ(pol->kind(), PolicyKind::kDblp);
}

TEST(TolerancePolicy, LtpDeadlineIsFactorTimesMedianOfTheWindow) {
  PolicyConfig c;
  c.ltp_window = 4;
  c.ltp_deadline_factor = 2.0;
  c.ltp_min_fraction = 0.75;
  auto pol = Make(PolicyKind::kLtp, c);
  EXPECT_EQ(pol->Current().deadline_ns, 0u);  // no history, no initial
  EXPECT_EQ(pol->Current().p, 0.0);
  EXPECT_EQ(pol->Current().min_fraction, 0.75);

  pol->OnIterationEnd(0, 1.0, 300);
  EXPECT_EQ(pol->Current().deadline_ns, 600u);
  pol->OnIterationEnd(1, 1.0, 100);
  EXPECT_EQ(pol->Current().deadline_ns, 400u);  // median of {100,300} = 200
  pol->OnIterationEnd(2, 1.0, 10000);           // a burst: the median holds
  EXPECT_EQ(pol->Current().deadline_ns, 600u);
  pol->OnIterationEnd(3, 1.0, 0);  // not measured: ignored
  EXPECT_EQ(pol->Current().deadline_ns, 600u);
  pol->OnIterationEnd(4, 1.0, 200);  // {300,100,10000,200} -> 250
  EXPECT_EQ(pol->Current().deadline_ns, 500u);
  pol->OnIterationEnd(5, 1.0, 50);  // 300 leaves: {100,10000,200,50} -> 150
  EXPECT_EQ(pol->Current().deadline_ns, 300u);
  pol->OnIterationEnd(6, 1.0, 60);  // 100 leaves: {10000,200,50,60} -> 130
  EXPECT_EQ(pol->Current().deadline_ns, 260u);
  EXPECT_EQ(pol->kind(), PolicyKind::kLtp);
  EXPECT_FALSE(pol->Current().critical);
  EXPECT_EQ(pol->Describe(),
            "ltp(deadline_factor=2,window=4,initial_deadline_ns=0,"
            "min_fraction=0.75)");
}

TEST(TolerancePolicy, LtpInitialDeadlineUntilTheFirstRound) {
  PolicyConfig c;
  c.ltp_initial_deadline_ns = 5'000'000;
  auto pol = Make(PolicyKind::kLtp, c);
  EXPECT_EQ(pol->Current().deadline_ns, 5'000'000u);
  pol->OnIterationEnd(0, 1.0, 1'000'000);
  EXPECT_EQ(pol->Current().deadline_ns, 1'500'000u);  // default factor 1.5
}

TEST(RoundTimeWindow, NearestRankPercentileAndMedian) {
  RoundTimeWindow w(20);
  EXPECT_EQ(w.Percentile(95), 0.0);  // empty
  EXPECT_EQ(w.Median(), 0.0);
  EXPECT_FALSE(w.Add(0));  // not measured
  EXPECT_TRUE(w.empty());
  // 100, 200, ..., 2000 in a scrambled order (7 is coprime with 20).
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(w.Add((i * 7 % 20 + 1) * 100));
  EXPECT_EQ(w.size(), 20u);
  // Rank ceil(0.95 * 20) = 19: the second-longest, not the longest (one
  // burst does not set the deadline) and not an interpolation.
  EXPECT_EQ(w.Percentile(95), 1900.0);
  EXPECT_EQ(w.Percentile(100), 2000.0);
  EXPECT_EQ(w.Percentile(50), 1000.0);   // rank 10, the lower middle
  EXPECT_EQ(w.Percentile(0.1), 100.0);   // rank 1
  EXPECT_EQ(w.Percentile(5.01), 200.0);  // rank ceil(1.002) = 2
  EXPECT_EQ(w.Median(), 1050.0);
  // The window slides: the oldest (100) leaves for 5000.
  EXPECT_TRUE(w.Add(5000));
  EXPECT_EQ(w.size(), 20u);
  EXPECT_EQ(w.Percentile(95), 2000.0);
  EXPECT_EQ(w.Percentile(100), 5000.0);
  EXPECT_EQ(ScaledDeadlineNs(1.0, 0.2), 1u);      // 0 would mean no deadline
  EXPECT_EQ(ScaledDeadlineNs(1.5, 1001), 1502u);  // 1501.5 rounds up
  EXPECT_EQ(ScaledDeadlineNs(2.0, 1e30), UINT64_MAX);
}

TEST(TolerancePolicy, DeadlineIsAPercentileOfTheWindow) {
  PolicyConfig c;
  c.deadline_window = 4;
  c.deadline_percentile = 75;
  c.deadline_factor = 1.5;
  c.deadline_min_fraction = 0.2;
  // Knobs of the other kinds must not leak in.
  c.ltp_deadline_factor = 3;
  c.ltp_min_fraction = 0.9;
  c.p_fixed = 0.3;
  auto pol = Make(PolicyKind::kDeadline, c);
  // No history, no initial deadline: nothing closes the round early.
  EXPECT_EQ(pol->Current().deadline_ns, 0u);
  EXPECT_EQ(pol->Current().p, 0.0);
  EXPECT_EQ(pol->Current().min_fraction, 0.2);
  EXPECT_FALSE(pol->Current().critical);

  // Rank ceil(0.75 * n) of the window, times 1.5.
  const struct {
    uint64_t round_ns;
    uint64_t deadline_ns;
  } steps[] = {
      {300, 450},      // {300}: rank 1
      {100, 450},      // {100,300}: rank 2 = 300
      {10000, 15000},  // {100,300,10000}: rank 3, the burst
      {0, 15000},      // not measured: ignored
      {200, 450},      // {100,200,300,10000}: rank 3 = 300
      {50, 300},       // 300 leaves: {50,100,200,10000} -> 200
      {60, 300},       // 100 leaves: {50,60,200,10000} -> 200
      {70, 105},       // the burst leaves: {50,60,70,200} -> 70
  };
  uint64_t it = 0;
  for (const auto& s : steps) {
    // A norm that jumps every time: no detector behind this policy.
    pol->OnIterationEnd(it, it % 2 ? 1.0 : 100.0, s.round_ns);
    const RoundTolerance t = pol->Current();
    EXPECT_EQ(t.deadline_ns, s.deadline_ns) << "iteration " << it;
    EXPECT_EQ(t.p, 0.0);
    EXPECT_EQ(t.min_fraction, 0.2);
    EXPECT_FALSE(t.critical);
    ++it;
  }
  EXPECT_EQ(pol->kind(), PolicyKind::kDeadline);
  EXPECT_EQ(pol->nonfinite_norms(), 0u);
  EXPECT_EQ(pol->Describe(),
            "deadline(percentile=75,factor=1.5,window=4,"
            "initial_deadline_ns=0,min_fraction=0.2)");
}

TEST(TolerancePolicy, DeadlineDefaultsAreTheNinetyFifthOfTwenty) {
  PolicyConfig c;
  c.deadline_initial_ns = 5'000'000;
  auto pol = Make(PolicyKind::kDeadline, c);
  EXPECT_EQ(pol->Describe(),
            "deadline(percentile=95,factor=1,window=20,"
            "initial_deadline_ns=5000000,min_fraction=0.1)");
  EXPECT_EQ(pol->Current().deadline_ns, 5'000'000u);  // before any round
  EXPECT_EQ(pol->Current().min_fraction, 0.1);
  pol->OnIterationEnd(0, 1.0, 0);  // not measured: the initial one holds
  EXPECT_EQ(pol->Current().deadline_ns, 5'000'000u);
  // 1..20 ms: the deadline is the 19 ms round (no margin), where ltp's
  // default would give 1.5 x the 10.5 ms median.
  for (uint64_t i = 1; i <= 20; ++i) {
    pol->OnIterationEnd(i, 1.0, (21 - i) * 1'000'000);
  }
  EXPECT_EQ(pol->Current().deadline_ns, 19'000'000u);
}

// Mirrors DblpFollowsTheDetector: the same schedule, and in each regime
// the deadline part too.
TEST(TolerancePolicy, CombinedIsStrictInsideACriticalRegime) {
  PolicyConfig c;
  c.clr = {.freq = 5, .eta = 0.5};
  c.ltp_window = 4;
  c.ltp_deadline_factor = 2.0;
  c.ltp_min_fraction = 0.75;
  c.deadline_min_fraction = 0.2;  // the deadline kind's: not used here
  auto pol = Make(PolicyKind::kCombined, c);
  EXPECT_EQ(pol->Describe(),
            "combined(p_low=0.008,p_high=0.408,freq=5,eta=0.5,"
            "deadline_factor=2,window=4,initial_deadline_ns=0,"
            "min_fraction=0.75)");
  // Checks at 4, 9, 14, 19, 24, 29; the norm halves at 19 (-> 20..24
  // critical) and the trace is NaN at 27 (-> 28..29 critical).
  std::vector<double> norms(30, 8.0);
  for (size_t i = 19; i < norms.size(); ++i) norms[i] = 4.0;
  norms[27] = kNaN;
  std::vector<bool> expect_critical(30, false);
  for (size_t i = 0; i < 10; ++i) expect_critical[i] = true;
  for (size_t i = 20; i < 25; ++i) expect_critical[i] = true;
  expect_critical[28] = expect_critical[29] = true;
  // Rounds of 1000 ns with a 50000 ns burst at 12: the median holds, so
  // outside a CLR the deadline is 2 x 1000 throughout.
  std::vector<uint64_t> round_ns(30, 1000);
  round_ns[12] = 50000;
  for (uint64_t it = 0; it < norms.size(); ++it) {
    const RoundTolerance t = pol->Current();
    SCOPED_TRACE("iteration " + std::to_string(it));
    EXPECT_EQ(t.critical, expect_critical[it]);
    if (expect_critical[it]) {
      EXPECT_EQ(t.p, 0.008);
      EXPECT_EQ(t.deadline_ns, 0u);
      EXPECT_EQ(t.min_fraction, 1.0);
    } else {
      EXPECT_EQ(t.p, 0.408);
      EXPECT_EQ(t.deadline_ns, 2000u);
      EXPECT_EQ(t.min_fraction, 0.75);
    }
    pol->OnIterationEnd(it, norms[it], round_ns[it]);
  }
  EXPECT_EQ(pol->kind(), PolicyKind::kCombined);
  EXPECT_EQ(pol->nonfinite_norms(), 1u);
}

TEST(TolerancePolicy, CombinedDeadlineFollowsTheMedianOutsideACriticalRegime) {
  PolicyConfig c;
  c.clr = {.freq = 1, .eta = 0.5};  // critical for iterations 0 and 1 only
  c.ltp_initial_deadline_ns = 7000;
  auto pol = Make(PolicyKind::kCombined, c);
  EXPECT_TRUE(pol->Current().critical);
  EXPECT_EQ(pol->Current().deadline_ns, 0u);  // strict, initial or not
  pol->OnIterationEnd(0, 3.0, 0);
  pol->OnIterationEnd(1, 3.0, 0);
  // Out of the CLR before any measured round: the initial deadline.
  ASSERT_FALSE(pol->Current().critical);
  EXPECT_EQ(pol->Current().deadline_ns, 7000u);
  EXPECT_EQ(pol->Current().min_fraction, 0.5);  // ltp's default floor
  pol->OnIterationEnd(2, 3.0, 1000);
  EXPECT_EQ(pol->Current().deadline_ns, 1500u);  // default factor 1.5
  pol->OnIterationEnd(3, 3.0, 3000);             // median 2000
  EXPECT_EQ(pol->Current().deadline_ns, 3000u);
  // A norm jump: strict again, and the window keeps learning meanwhile.
  pol->OnIterationEnd(4, 9.0, 5000);  // median of {1000,3000,5000}
  EXPECT_TRUE(pol->Current().critical);
  EXPECT_EQ(pol->Current().p, 0.008);
  EXPECT_EQ(pol->Current().deadline_ns, 0u);
  pol->OnIterationEnd(5, 9.0, 5000);  // {1000,3000,5000,5000} -> 4000
  ASSERT_FALSE(pol->Current().critical);
  EXPECT_EQ(pol->Current().p, 0.408);
  EXPECT_EQ(pol->Current().deadline_ns, 6000u);
}

TEST(TolerancePolicy, OnlyTheDeadlineKindsMayCloseEarly) {
  EXPECT_FALSE(PolicyMayCloseEarly(PolicyKind::kReliable));
  EXPECT_FALSE(PolicyMayCloseEarly(PolicyKind::kFixed));
  EXPECT_FALSE(PolicyMayCloseEarly(PolicyKind::kDblp));
  EXPECT_TRUE(PolicyMayCloseEarly(PolicyKind::kLtp));
  EXPECT_TRUE(PolicyMayCloseEarly(PolicyKind::kDeadline));
  EXPECT_TRUE(PolicyMayCloseEarly(PolicyKind::kCombined));
}

TEST(TolerancePolicy, EveryValidationErrorNamesItsFlag) {
  struct Case {
    const char* flag;
    void (*mutate)(PolicyConfig&);
  };
  const Case cases[] = {
      {"--p_fixed", [](PolicyConfig& c) { c.p_fixed = 1.0; }},
      {"--p_fixed", [](PolicyConfig& c) { c.p_fixed = -0.01; }},
      {"--p_fixed", [](PolicyConfig& c) { c.p_fixed = kNaN; }},
      {"--p_low", [](PolicyConfig& c) { c.p_low = kInf; }},
      {"--p_high", [](PolicyConfig& c) { c.p_high = 1.5; }},
      {"--p_high", [](PolicyConfig& c) { c.p_low = 0.5, c.p_high = 0.1; }},
      {"--clr_freq", [](PolicyConfig& c) { c.clr.freq = 0; }},
      {"--clr_eta", [](PolicyConfig& c) { c.clr.eta = 0; }},
      {"--ltp_deadline_factor",
       [](PolicyConfig& c) { c.ltp_deadline_factor = 0.9; }},
      {"--ltp_deadline_factor",
       [](PolicyConfig& c) { c.ltp_deadline_factor = kInf; }},
      {"--ltp_window", [](PolicyConfig& c) { c.ltp_window = 0; }},
      {"--ltp_min_fraction", [](PolicyConfig& c) { c.ltp_min_fraction = 0; }},
      {"--ltp_min_fraction",
       [](PolicyConfig& c) { c.ltp_min_fraction = 1.01; }},
      {"--deadline_percentile",
       [](PolicyConfig& c) { c.deadline_percentile = 0; }},
      {"--deadline_percentile",
       [](PolicyConfig& c) { c.deadline_percentile = 100.5; }},
      {"--deadline_percentile",
       [](PolicyConfig& c) { c.deadline_percentile = kNaN; }},
      {"--deadline_factor", [](PolicyConfig& c) { c.deadline_factor = 0.99; }},
      {"--deadline_factor", [](PolicyConfig& c) { c.deadline_factor = kInf; }},
      {"--deadline_window", [](PolicyConfig& c) { c.deadline_window = 0; }},
      {"--deadline_min_fraction",
       [](PolicyConfig& c) { c.deadline_min_fraction = 0; }},
      {"--deadline_min_fraction",
       [](PolicyConfig& c) { c.deadline_min_fraction = 1.5; }},
      {"--policy",
       [](PolicyConfig& c) { c.kind = static_cast<PolicyKind>(7); }},
  };
  for (const Case& tc : cases) {
    PolicyConfig c;
    tc.mutate(c);
    const std::string msg = ThrowMessage([&] { ValidatePolicyConfig(c); });
    EXPECT_NE(msg.find(tc.flag), std::string::npos) << msg;
    EXPECT_THROW(TolerancePolicy::Create(c), std::invalid_argument) << msg;
  }
  // Edges that are valid.
  PolicyConfig ok;
  ok.p_low = ok.p_high = 0.0;
  ok.ltp_deadline_factor = 1.0;
  ok.ltp_min_fraction = 1.0;
  ok.deadline_percentile = 100;
  ok.deadline_factor = 1.0;
  ok.deadline_window = 1;
  ok.deadline_min_fraction = 1.0;
  EXPECT_NO_THROW(ValidatePolicyConfig(ok));
  ok.deadline_percentile = 0.001;
  EXPECT_NO_THROW(ValidatePolicyConfig(ok));
  for (PolicyKind k : kAllKinds) EXPECT_NO_THROW(Make(k));
  // A bad deadline flag is refused whatever the kind, like the ltp ones.
  PolicyConfig bad;
  bad.kind = PolicyKind::kFixed;
  bad.deadline_window = 0;
  EXPECT_THROW(TolerancePolicy::Create(bad), std::invalid_argument);
  // The message says what to do, not only what is wrong.
  bad = PolicyConfig{};
  bad.deadline_factor = 0.5;
  EXPECT_NE(ThrowMessage([&] {
              ValidatePolicyConfig(bad);
            }).find("--deadline_percentile"),
            std::string::npos);
}

TEST(TolerancePolicy, ParseNames) {
  for (PolicyKind k : kAllKinds) {
    EXPECT_EQ(ParsePolicyKind(PolicyKindName(k)), k);
    EXPECT_EQ(Make(k)->kind(), k);
  }
  EXPECT_EQ(ParsePolicyKind("DBLP"), PolicyKind::kDblp);
  EXPECT_EQ(ParsePolicyKind("Deadline"), PolicyKind::kDeadline);
  EXPECT_EQ(ParsePolicyKind("COMBINED"), PolicyKind::kCombined);
  EXPECT_STREQ(PolicyKindName(PolicyKind::kLtp), "ltp");
  EXPECT_STREQ(PolicyKindName(PolicyKind::kDeadline), "deadline");
  EXPECT_STREQ(PolicyKindName(PolicyKind::kCombined), "combined");
  EXPECT_STREQ(PolicyKindName(static_cast<PolicyKind>(9)), "unknown");
  for (const char* bad : {"", "mlt", "dblp ", "reliab", "optireduce"}) {
    const std::string msg = ThrowMessage([&] { ParsePolicyKind(bad); });
    for (const char* choice :
         {"reliable", "fixed", "dblp", "ltp", "deadline", "combined"}) {
      EXPECT_NE(msg.find(choice), std::string::npos) << msg;
    }
  }
  PolicyConfig c;
  c.kind = static_cast<PolicyKind>(7);
  EXPECT_NE(ThrowMessage([&] { ValidatePolicyConfig(c); }).find("combined"),
            std::string::npos);
}

TEST(StopThreshold, IsCeilOfOneMinusPTimesN) {
  EXPECT_EQ(StopThreshold(1000, 0.008), 992u);
  EXPECT_EQ(StopThreshold(1000, 0.408), 592u);
  EXPECT_EQ(StopThreshold(100, 0.07), 93u);  // 0.07*100 = 7.000000000000001
  EXPECT_EQ(StopThreshold(100, 0.29), 71u);  // 0.29*100 = 28.999999999999996
  EXPECT_EQ(StopThreshold(3, 0.5), 2u);      // ceil(1.5)
  EXPECT_EQ(StopThreshold(10, 0.0), 10u);
  EXPECT_EQ(StopThreshold(1, 0.99), 1u);  // never zero for a real round
  EXPECT_EQ(StopThreshold(0, 0.5), 0u);
  EXPECT_EQ(StopThreshold(4'000'000'000u, 0.25), 3'000'000'000u);
  EXPECT_THROW(StopThreshold(10, 1.0), std::invalid_argument);
  EXPECT_THROW(StopThreshold(10, kNaN), std::invalid_argument);
}

}  // namespace
}  // namespace dblp
