#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dblp/emul/token_bucket.h"

namespace dblp {
namespace {

constexpr uint32_t kFrame = 1538;  // 1500 B MTU frame on the wire

TEST(TokenBucket, UnlimitedAdmitsEverything) {
  TokenBucket b;
  EXPECT_TRUE(b.unlimited());
  EXPECT_EQ(b.Admit(0, kFrame, 32), 32u);
  TokenBucket zero(0.0, 1000);
  EXPECT_EQ(zero.Admit(5, kFrame, 7), 7u);
}

TEST(TokenBucket, StartsWithOneBurstThenPacesToTheRate) {
  // 1 Gb/s = 0.125 B/ns; depth = 4 frames.
  TokenBucket b(1.0, 4 * kFrame);
  uint64_t t = 1000;
  EXPECT_EQ(b.Admit(t, kFrame, 32), 4u);  // the initial burst
  EXPECT_EQ(b.Admit(t, kFrame, 32), 0u);  // nothing until time passes
  // Over 10 ms at 1 Gb/s the wire carries 1.25 MB = 812.7 frames.
  uint64_t sent = 0;
  for (int i = 0; i < 10000; ++i) {
    t += 1000;  // poll every microsecond
    sent += b.Admit(t, kFrame, 32);
  }
  const double expect = 10e6 * 0.125 / kFrame;
  EXPECT_NEAR(static_cast<double>(sent), expect, 1.0);
}

TEST(TokenBucket, IdleTimeBuildsAtMostOneBurst) {
  TokenBucket b(10.0, 8 * kFrame);
  EXPECT_EQ(b.Admit(1, kFrame, 64), 8u);
  // A whole second idle at 10 Gb/s would be 812k frames; the depth caps it.
  EXPECT_EQ(b.Admit(1'000'000'001ull, kFrame, 64), 8u);
}

TEST(TokenBucket, RefundReturnsUnsentFrames) {
  TokenBucket b(1.0, 4 * kFrame);
  EXPECT_EQ(b.Admit(10, kFrame, 4), 4u);
  b.Refund(3, kFrame);
  EXPECT_EQ(b.Admit(10, kFrame, 4), 3u);
  b.Refund(100, kFrame);  // never above the depth
  EXPECT_EQ(b.Admit(10, kFrame, 100), 4u);
}

TEST(TokenBucket, ClockGoingBackwardsAddsNothing) {
  TokenBucket b(1.0, kFrame);
  EXPECT_EQ(b.Admit(1'000'000, kFrame, 1), 1u);
  EXPECT_EQ(b.Admit(10, kFrame, 1), 0u);
}

TEST(TokenBucket, RejectsBadParameters) {
  EXPECT_THROW(TokenBucket(std::numeric_limits<double>::quiet_NaN(), 100),
               std::invalid_argument);
  EXPECT_THROW(TokenBucket(1.0, 0), std::invalid_argument);
  EXPECT_THROW(TokenBucket(1e9, 100), std::invalid_argument);
}

}  // namespace
}  // namespace dblp
