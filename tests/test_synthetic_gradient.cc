// The synthetic gradient source: the mean over ranks follows the norm
// trace, ranks differ, everything is deterministic per seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/handoff/synthetic_gradient.h"

namespace dblp {
namespace {

double MeanNorm(const std::vector<std::vector<float>>& grads) {
  double s = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    double m = 0;
    for (const auto& g : grads) m += g[i];
    m /= static_cast<double>(grads.size());
    s += m * m;
  }
  return std::sqrt(s);
}

TEST(SyntheticGradientTest, MeanOfRanksFollowsTheTrace) {
  NormTrace trace;
  trace.jumps = {30, 60};
  for (uint64_t floats : {4096ull, 65536ull}) {
    for (uint32_t workers : {1u, 3u, 8u}) {
      std::vector<SyntheticGradientSource> src;
      for (uint32_t r = 0; r < workers; ++r) src.emplace_back(floats, r, 7, trace);
      for (uint64_t it : {0ull, 1ull, 5ull, 20ull, 30ull, 39ull, 40ull, 65ull,
                          500ull}) {
        std::vector<std::vector<float>> grads;
        for (const auto& s : src) grads.push_back(s.Make(it));
        const double want = trace.At(it);
        EXPECT_NEAR(MeanNorm(grads), want, 0.05 * want)
            << "floats " << floats << " workers " << workers << " it " << it;
      }
    }
  }
}

TEST(SyntheticGradientTest, TraceShape) {
  NormTrace t;
  EXPECT_DOUBLE_EQ(t.At(0), t.plateau + t.initial);
  for (uint64_t it = 1; it < 100; ++it) EXPECT_LT(t.At(it), t.At(it - 1));
  EXPECT_NEAR(t.At(1000), t.plateau, 1e-9);
  t.jumps = {40, 90};
  t.jump_length = 5;
  EXPECT_DOUBLE_EQ(t.At(39), NormTrace{}.At(39));
  EXPECT_DOUBLE_EQ(t.At(40), 3.0 * NormTrace{}.At(40));
  EXPECT_DOUBLE_EQ(t.At(44), 3.0 * NormTrace{}.At(44));
  EXPECT_DOUBLE_EQ(t.At(45), NormTrace{}.At(45));
  EXPECT_DOUBLE_EQ(t.At(92), 3.0 * NormTrace{}.At(92));
  // A jump is big enough for the CLR detector (eta = 0.5) to notice.
  EXPECT_GE(std::abs(t.At(40) - t.At(39)) / t.At(39), 0.5);
}

TEST(SyntheticGradientTest, RanksDifferButAgreeOnDirection) {
  const NormTrace trace;
  const SyntheticGradientSource a(4096, 0, 11, trace);
  const SyntheticGradientSource b(4096, 1, 11, trace);
  const std::vector<float> ga = a.Make(3);
  const std::vector<float> gb = b.Make(3);
  ASSERT_EQ(ga.size(), 4096u);
  uint32_t differ = 0, same_sign = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    differ += ga[i] != gb[i];
    same_sign += (ga[i] > 0) == (gb[i] > 0);
    ASSERT_TRUE(std::isfinite(ga[i]));
  }
  EXPECT_GT(differ, 4000u);
  EXPECT_EQ(same_sign, 4096u);  // the shared direction
}

TEST(SyntheticGradientTest, DeterministicPerSeed) {
  const NormTrace trace;
  const SyntheticGradientSource a(8192, 2, 99, trace);
  const SyntheticGradientSource b(8192, 2, 99, trace);
  const SyntheticGradientSource c(8192, 2, 100, trace);
  EXPECT_EQ(a.Make(4), b.Make(4));
  EXPECT_EQ(a.Make(4), a.Make(4));
  EXPECT_NE(a.Make(4), c.Make(4));
  EXPECT_NE(a.Make(4), a.Make(5));
  std::vector<float> buf(8192, -1.0f);
  a.Fill(4, buf);
  EXPECT_EQ(buf, a.Make(4));
  EXPECT_EQ(a.floats(), 8192u);
}

TEST(SyntheticGradientTest, RejectsBadSizes) {
  EXPECT_THROW(SyntheticGradientSource(0, 0, 1, NormTrace{}),
               std::invalid_argument);
  const SyntheticGradientSource s(16, 0, 1, NormTrace{});
  std::vector<float> small(15), big(17);
  EXPECT_THROW(s.Fill(0, small), std::invalid_argument);
  EXPECT_THROW(s.Fill(0, big), std::invalid_argument);
}

TEST(SyntheticGradientTest, ParseIterationList) {
  EXPECT_TRUE(ParseIterationList("").empty());
  EXPECT_TRUE(ParseIterationList("none").empty());
  EXPECT_EQ(ParseIterationList("40"), std::vector<uint64_t>{40});
  EXPECT_EQ(ParseIterationList("40,90"), (std::vector<uint64_t>{40, 90}));
  EXPECT_EQ(ParseIterationList("0,18446744073709551615"),
            (std::vector<uint64_t>{0, UINT64_MAX}));
  for (const char* bad :
       {",", "40,", ",40", "40,,90", "a", "-1", " 40", "40 ", "40x", "1,2,three",
        "18446744073709551616", "None", "4.5"}) {
    try {
      ParseIterationList(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos)
          << "the message should quote the input: " << e.what();
    }
  }
}

}  // namespace
}  // namespace dblp
