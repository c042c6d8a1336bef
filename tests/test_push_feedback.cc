// Error feedback on the push through the real round code: the worker's
// SendSide pushes over a lossy link to the server's ReceiveSide, which
// STOPs early; frames still in flight land after the STOP (summed) or after
// the close (refused); stale and duplicate frames come along. The server's
// final accepted set drives PushFeedback. Conservation, exactly: what the
// server summed plus what the worker still carries equals what it produced.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "dblp/base/rng.h"
#include "dblp/policy/push_feedback.h"
#include "dblp/round/stop_decision.h"
#include "fake_link.h"

namespace dblp {
namespace {

using testing_link::FakeLink;

constexpr uint32_t kFloats = 16 * 200;  // 200 chunks of 64 B

void RunConservation(double base_loss, uint64_t seed, uint32_t rounds) {
  FakeLink l;
  l.SetUpLink(kFloats, 8, 6);
  const ChunkLayout& layout = l.layout_;
  PushFeedback feedback(layout);
  std::vector<int64_t> produced(kFloats, 0), summed(kFloats, 0);
  std::vector<float> grad(kFloats);
  Rng rng(seed);
  uint64_t refused_after_close = 0, landed_after_stop = 0;
  for (uint32_t it = 0; it < rounds; ++it) {
    for (uint32_t i = 0; i < kFloats; ++i) {
      grad[i] = static_cast<float>(rng.NextBelow(17)) - 8.0f;
      produced[i] += static_cast<int64_t>(grad[i]);
    }
    feedback.AddCarried(grad);
    const double p = (it / 40) % 5 == 4 ? 0.008 : 0.408;
    const double loss = it % 89 == 7 ? 0.7 : base_loss;
    l.grad_ = grad;  // what the worker pushes
    std::fill(l.got_.begin(), l.got_.end(), 0.0f);
    l.consumed_.clear();
    l.frames_.drop = [&](uint32_t) {
      return rng.NextBelow(1000) < loss * 1000;
    };
    if (!l.frames_.last_frame.empty()) {
      l.frames_.wire.push_back(l.frames_.last_frame);  // stale
    }
    const auto round = static_cast<uint32_t>(2 * it);
    l.order_.resize(layout.num_chunks());
    std::iota(l.order_.begin(), l.order_.end(), 0u);
    std::shuffle(l.order_.begin(), l.order_.end(), std::mt19937(it));
    l.recv_->Begin(round, p, 0, 0, l.now_);
    l.send_->Begin(round, l.order_, l.now_, layout.num_chunks());
    for (int t = 0; t < 200000 && !l.send_->done(); ++t) {
      if (t % 5 == 2 && !l.frames_.wire.empty()) {
        l.frames_.wire.push_back(l.frames_.wire.front());  // duplicate
      }
      l.Turn();
    }
    ASSERT_TRUE(l.send_->done()) << "round " << round;
    const uint32_t at_stop = l.recv_->receiver().received();
    ASSERT_GE(at_stop, StopThreshold(layout.num_chunks(), p));
    // Half of what is still in flight lands before the close.
    const size_t in_flight = l.frames_.wire.size();
    for (size_t k = 0; k < in_flight / 2 && !l.frames_.wire.empty(); ++k) {
      const size_t before = l.frames_.wire.size();
      l.rx_poll_ = 1;
      l.Turn();
      ASSERT_LT(l.frames_.wire.size(), before);
    }
    l.rx_poll_ = 6;
    landed_after_stop += l.recv_->receiver().received() - at_stop;
    l.recv_->Close();
    const uint32_t closed_with = l.recv_->receiver().received();
    while (!l.frames_.wire.empty()) l.Turn();
    refused_after_close += in_flight - in_flight / 2;
    ASSERT_EQ(l.recv_->receiver().received(), closed_with)
        << "a frame was accepted after the close";
    // The server summed exactly what it consumed, each chunk once.
    for (const auto& [seq, n] : l.consumed_) ASSERT_EQ(n, 1) << seq;
    for (uint32_t i = 0; i < kFloats; ++i) {
      summed[i] += static_cast<int64_t>(l.got_[i]);
    }
    Bitmap accepted;
    l.recv_->receiver().SnapshotBitmap(accepted);
    ASSERT_EQ(accepted.Count(), l.consumed_.size());
    feedback.Settle(accepted, grad);
    ASSERT_EQ(feedback.carried_chunks(), accepted.MissingCount());
  }
  const std::span<const float> left = feedback.carried();
  for (uint32_t i = 0; i < kFloats; ++i) {
    ASSERT_EQ(summed[i] + static_cast<int64_t>(left[i]), produced[i])
        << "float " << i;
  }
  // The run exercised what it claims to.
  EXPECT_GT(landed_after_stop, 0u);
  EXPECT_GT(refused_after_close, 0u);
}

TEST(PushFeedback, ConservationUnderBernoulliLossAndBursts) {
  RunConservation(0.05, 1, 2000);
}

TEST(PushFeedback, ConservationOnACleanLink) { RunConservation(0.0, 2, 1000); }

TEST(PushFeedback, ConservationUnderHeavyLoss) { RunConservation(0.3, 3, 600); }

TEST(PushFeedback, WrongSizesAreRefused) {
  const ChunkLayout layout(uint64_t{64} * 10, 64);
  PushFeedback f(layout);
  std::vector<float> small(10);
  EXPECT_THROW(f.AddCarried(small), std::invalid_argument);
  std::vector<float> ok(160);
  EXPECT_THROW(f.Settle(Bitmap(9), ok), std::invalid_argument);
  EXPECT_THROW(f.Settle(Bitmap(10), small), std::invalid_argument);
}

}  // namespace
}  // namespace dblp
