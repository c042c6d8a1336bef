// SenderRound: first pass, retransmission passes driven by BITMAP, early
// stop, counters, and a full sender <-> receiver loop over a lossy channel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/round/receiver_round.h"
#include "dblp/round/sender_round.h"
#include "dblp/round/stop_decision.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

using State = SenderRound::State;

std::vector<uint32_t> Permutation(uint32_t n, uint64_t seed) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  Rng rng(seed);
  for (uint32_t i = n; i > 1; --i) {
    std::swap(order[i - 1], order[rng.NextBelow(i)]);
  }
  return order;
}

// Drains the current pass with bursts of the given sizes (cycled).
std::vector<uint32_t> DrainPass(SenderRound& tx,
                                const std::vector<uint32_t>& burst_sizes) {
  std::vector<uint32_t> out;
  std::vector<uint32_t> buf(1024);
  for (size_t i = 0;; ++i) {
    const uint32_t max = burst_sizes[i % burst_sizes.size()];
    const uint32_t remaining = tx.pass_remaining();
    const uint32_t got = tx.NextBurst(buf.data(), max);
    EXPECT_LE(got, max);
    if (got == 0) break;
    EXPECT_EQ(got, std::min(max, remaining));
    out.insert(out.end(), buf.begin(), buf.begin() + got);
  }
  return out;
}

Bitmap RandomBitmap(uint32_t n, double density, Rng& rng) {
  Bitmap b(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (rng.Bernoulli(density)) b.Set(i);
  }
  return b;
}

TEST(SenderRoundTest, IdleBeforeBegin) {
  SenderRound tx;
  uint32_t buf[8];
  EXPECT_EQ(tx.state(), State::kIdle);
  EXPECT_EQ(tx.NextBurst(buf, 8), 0u);
  EXPECT_FALSE(tx.OnBitmap(Bitmap(0)));
  EXPECT_FALSE(tx.finished());
  EXPECT_EQ(tx.packets_sent(), 0u);
}

TEST(SenderRoundTest, FirstPassYieldsOrderExactlyOnceInOrder) {
  for (uint32_t n : {1u, 2u, 63u, 64u, 65u, 1000u}) {
    const std::vector<uint32_t> order = Permutation(n, n);
    SenderRound tx;
    tx.Begin(9, order);
    EXPECT_EQ(tx.state(), State::kSending);
    EXPECT_EQ(tx.round(), 9u);
    EXPECT_EQ(tx.num_chunks(), n);
    EXPECT_EQ(tx.passes(), 1u);
    EXPECT_EQ(tx.pass_remaining(), n);
    EXPECT_EQ(DrainPass(tx, {1, 7, 32, 500}), order) << n;
    EXPECT_EQ(tx.state(), State::kAwaitingBitmap);
    EXPECT_EQ(tx.pass_remaining(), 0u);
    EXPECT_FALSE(tx.finished());
    EXPECT_EQ(tx.packets_sent(), n);
    EXPECT_EQ(tx.packets_resent(), 0u);
    EXPECT_EQ(tx.passes(), 1u);
    uint32_t buf[4];
    EXPECT_EQ(tx.NextBurst(buf, 4), 0u);  // nothing until a BITMAP arrives
    EXPECT_EQ(tx.packets_sent(), n);
  }
}

// Backpressure: seqs a full TX ring refused come back, in order, and are
// neither lost nor counted twice.
TEST(SenderRoundTest, UnsendGivesTheTailOfABurstBack) {
  const std::vector<uint32_t> order = Permutation(10, 3);
  SenderRound tx;
  tx.Begin(0, order);
  uint32_t buf[10];
  ASSERT_EQ(tx.NextBurst(buf, 4), 4u);
  tx.Unsend(3);  // only buf[0] went out
  EXPECT_EQ(tx.packets_sent(), 1u);
  EXPECT_EQ(tx.pass_remaining(), 9u);
  std::vector<uint32_t> sent = {buf[0]};
  const std::vector<uint32_t> rest = DrainPass(tx, {3});
  sent.insert(sent.end(), rest.begin(), rest.end());
  EXPECT_EQ(sent, order);
  EXPECT_EQ(tx.packets_sent(), 10u);
  // The whole last burst refused: the pass is open again, no PROBE yet.
  EXPECT_EQ(tx.state(), State::kAwaitingBitmap);
  tx.Unsend(2);
  EXPECT_EQ(tx.state(), State::kSending);
  EXPECT_EQ(tx.NextBurst(buf, 10), 2u);
  EXPECT_EQ(buf[0], order[8]);
  EXPECT_EQ(buf[1], order[9]);
  // More than was handed out is clamped, never underflows.
  tx.Unsend(1000);
  EXPECT_EQ(tx.packets_sent(), 0u);
  EXPECT_EQ(tx.pass_remaining(), 10u);
}

TEST(SenderRoundTest, UnsendInARetransmissionPassFixesResentCount) {
  const std::vector<uint32_t> order = Permutation(8, 5);
  SenderRound tx;
  tx.Begin(1, order);
  DrainPass(tx, {8});
  Bitmap got(8);
  for (uint32_t s : {0u, 1u, 2u, 3u, 4u}) got.Set(s);
  ASSERT_TRUE(tx.OnBitmap(got));
  uint32_t buf[8];
  ASSERT_EQ(tx.NextBurst(buf, 8), 3u);
  tx.Unsend(2);
  EXPECT_EQ(tx.packets_resent(), 1u);
  EXPECT_EQ(tx.packets_sent(), 9u);
}

TEST(SenderRoundTest, BurstOfZeroSendsNothing) {
  const std::vector<uint32_t> order = Permutation(10, 1);
  SenderRound tx;
  tx.Begin(0, order);
  uint32_t buf[1];
  EXPECT_EQ(tx.NextBurst(buf, 0), 0u);
  EXPECT_EQ(tx.state(), State::kSending);
  EXPECT_EQ(tx.pass_remaining(), 10u);
  EXPECT_EQ(tx.packets_sent(), 0u);
}

TEST(SenderRoundTest, RetransmitsOnlyMissingInFirstPassOrder) {
  Rng rng(5);
  for (uint32_t n : {1u, 65u, 1000u}) {
    for (double density : {0.0, 0.3, 0.9}) {
      const std::vector<uint32_t> order = Permutation(n, n + 100);
      SenderRound tx;
      tx.Begin(1, order);
      DrainPass(tx, {64});
      const Bitmap got = RandomBitmap(n, density, rng);
      std::vector<uint32_t> want;
      for (uint32_t s : order) {
        if (!got.Test(s)) want.push_back(s);
      }
      if (want.empty()) continue;  // covered by CompleteBitmapFinishes
      ASSERT_TRUE(tx.OnBitmap(got));
      EXPECT_EQ(tx.state(), State::kSending);
      EXPECT_EQ(tx.passes(), 2u);
      EXPECT_EQ(tx.pass_remaining(), want.size());
      const std::vector<uint32_t> resent = DrainPass(tx, {3, 17});
      EXPECT_EQ(resent, want) << "n=" << n << " density=" << density;
      for (uint32_t s : resent) ASSERT_FALSE(got.Test(s)) << s;
      EXPECT_EQ(tx.packets_sent(), n + want.size());
      EXPECT_EQ(tx.packets_resent(), want.size());
    }
  }
}

TEST(SenderRoundTest, CountersExactOverSeveralPasses) {
  constexpr uint32_t kN = 500;
  const std::vector<uint32_t> order = Permutation(kN, 42);
  SenderRound tx;
  tx.Begin(2, order);
  Rng rng(8);
  Bitmap have(kN);
  uint64_t expect_sent = 0, expect_resent = 0;
  uint32_t expect_passes = 1;
  while (true) {
    const std::vector<uint32_t> sent = DrainPass(tx, {50});
    expect_sent += sent.size();
    if (expect_passes > 1) expect_resent += sent.size();
    ASSERT_EQ(tx.packets_sent(), expect_sent);
    ASSERT_EQ(tx.packets_resent(), expect_resent);
    ASSERT_EQ(tx.passes(), expect_passes);
    ASSERT_EQ(sent.size(), have.MissingCount());
    for (uint32_t s : sent) {
      ASSERT_FALSE(have.Test(s)) << "re-sent seq the bitmap already had";
      if (rng.Bernoulli(0.5)) have.Set(s);
    }
    ASSERT_TRUE(tx.OnBitmap(have));
    if (have.MissingCount() == 0) break;
    ++expect_passes;
    ASSERT_LT(expect_passes, 100u);
  }
  EXPECT_EQ(tx.state(), State::kStopped);
  EXPECT_TRUE(tx.finished());
  EXPECT_FALSE(tx.stop_requested());
  EXPECT_GT(expect_passes, 3u);  // the loop really did several passes
  EXPECT_EQ(tx.passes(), expect_passes);
  EXPECT_EQ(tx.packets_sent() - tx.packets_resent(), kN);
}

TEST(SenderRoundTest, RequestStopMidPassStopsAtNextBurst) {
  const std::vector<uint32_t> order = Permutation(100, 3);
  SenderRound tx;
  tx.Begin(4, order);
  uint32_t buf[10];
  ASSERT_EQ(tx.NextBurst(buf, 10), 10u);
  tx.RequestStop();
  EXPECT_TRUE(tx.stop_requested());
  EXPECT_TRUE(tx.finished());
  EXPECT_EQ(tx.NextBurst(buf, 10), 0u);
  EXPECT_EQ(tx.state(), State::kStopped);
  EXPECT_EQ(tx.pass_remaining(), 90u);  // early stop: seqs were left
  EXPECT_EQ(tx.packets_sent(), 10u);
  EXPECT_EQ(tx.NextBurst(buf, 10), 0u);
  EXPECT_FALSE(tx.OnBitmap(Bitmap(100)));  // no probe outstanding any more
}

TEST(SenderRoundTest, RequestStopDuringRetransmissionPass) {
  const std::vector<uint32_t> order = Permutation(100, 4);
  SenderRound tx;
  tx.Begin(4, order);
  DrainPass(tx, {100});
  ASSERT_TRUE(tx.OnBitmap(Bitmap(100)));  // nothing arrived
  uint32_t buf[10];
  ASSERT_EQ(tx.NextBurst(buf, 10), 10u);
  tx.RequestStop();
  EXPECT_EQ(tx.NextBurst(buf, 10), 0u);
  EXPECT_EQ(tx.packets_sent(), 110u);
  EXPECT_EQ(tx.packets_resent(), 10u);
  EXPECT_EQ(tx.passes(), 2u);
}

TEST(SenderRoundTest, RequestStopFromAnotherThread) {
  const std::vector<uint32_t> order = Permutation(1000, 5);
  SenderRound tx;
  tx.Begin(6, order);
  uint32_t buf[1];
  ASSERT_EQ(tx.NextBurst(buf, 1), 1u);
  std::thread control([&] { tx.RequestStop(); });
  control.join();
  EXPECT_EQ(tx.NextBurst(buf, 1), 0u);
  EXPECT_EQ(tx.packets_sent(), 1u);
  EXPECT_TRUE(tx.finished());
}

// STOP arrives while the sender waits for a BITMAP (e.g. the pass's last
// packet crossed the threshold). The late BITMAP must not start a pass -
// nor count one as started.
TEST(SenderRoundTest, StopWhileAwaitingBitmapStartsNoPass) {
  const std::vector<uint32_t> order = Permutation(50, 6);
  SenderRound tx;
  tx.Begin(7, order);
  DrainPass(tx, {50});
  ASSERT_EQ(tx.state(), State::kAwaitingBitmap);
  tx.RequestStop();
  EXPECT_TRUE(tx.finished());
  Bitmap some(50);
  some.Set(0);
  tx.OnBitmap(some);
  uint32_t buf[50];
  EXPECT_EQ(tx.NextBurst(buf, 50), 0u);
  EXPECT_EQ(tx.state(), State::kStopped);
  EXPECT_EQ(tx.passes(), 1u) << "a pass that sends nothing was never started";
  EXPECT_EQ(tx.packets_sent(), 50u);
  EXPECT_EQ(tx.packets_resent(), 0u);
}

TEST(SenderRoundTest, CompleteBitmapFinishes) {
  const std::vector<uint32_t> order = Permutation(65, 7);
  SenderRound tx;
  tx.Begin(8, order);
  DrainPass(tx, {16});
  Bitmap all(65);
  for (uint32_t i = 0; i < 65; ++i) all.Set(i);
  ASSERT_TRUE(tx.OnBitmap(all));
  EXPECT_EQ(tx.state(), State::kStopped);
  EXPECT_TRUE(tx.finished());
  EXPECT_FALSE(tx.stop_requested());
  EXPECT_EQ(tx.passes(), 1u);
  uint32_t buf[4];
  EXPECT_EQ(tx.NextBurst(buf, 4), 0u);
  EXPECT_FALSE(tx.OnBitmap(all));  // round over: ignored
}

TEST(SenderRoundTest, OnBitmapIgnoredWithoutProbeOrWithWrongSize) {
  const std::vector<uint32_t> order = Permutation(100, 8);
  SenderRound tx;
  tx.Begin(9, order);
  uint32_t buf[100];
  ASSERT_EQ(tx.NextBurst(buf, 40), 40u);
  // Mid-pass: no probe outstanding.
  Bitmap all(100);
  for (uint32_t i = 0; i < 100; ++i) all.Set(i);
  EXPECT_FALSE(tx.OnBitmap(all));
  EXPECT_EQ(tx.state(), State::kSending);
  EXPECT_EQ(tx.pass_remaining(), 60u);
  EXPECT_EQ(tx.passes(), 1u);
  ASSERT_EQ(tx.NextBurst(buf, 100), 60u);
  EXPECT_TRUE(std::equal(buf, buf + 60, order.begin() + 40));
  // Awaiting: wrong sizes are rejected and change nothing.
  EXPECT_FALSE(tx.OnBitmap(Bitmap(99)));
  EXPECT_FALSE(tx.OnBitmap(Bitmap(101)));
  EXPECT_FALSE(tx.OnBitmap(Bitmap(0)));
  EXPECT_EQ(tx.state(), State::kAwaitingBitmap);
  EXPECT_EQ(tx.passes(), 1u);
  // The right size is accepted; a second BITMAP for the same probe is not.
  Bitmap half(100);
  for (uint32_t i = 0; i < 100; i += 2) half.Set(i);
  EXPECT_TRUE(tx.OnBitmap(half));
  EXPECT_FALSE(tx.OnBitmap(all));
  EXPECT_EQ(tx.pass_remaining(), 50u);
  EXPECT_EQ(tx.state(), State::kSending);
}

TEST(SenderRoundTest, BeginResetsEverything) {
  SenderRound tx;
  tx.Begin(1, Permutation(30, 1));
  DrainPass(tx, {30});
  tx.OnBitmap(Bitmap(30));
  uint32_t buf[30];
  tx.NextBurst(buf, 5);
  tx.RequestStop();
  const std::vector<uint32_t> order = Permutation(20, 2);
  tx.Begin(2, order);
  EXPECT_FALSE(tx.stop_requested());
  EXPECT_FALSE(tx.finished());
  EXPECT_EQ(tx.state(), State::kSending);
  EXPECT_EQ(tx.round(), 2u);
  EXPECT_EQ(tx.num_chunks(), 20u);
  EXPECT_EQ(tx.passes(), 1u);
  EXPECT_EQ(tx.packets_sent(), 0u);
  EXPECT_EQ(tx.packets_resent(), 0u);
  EXPECT_EQ(DrainPass(tx, {7}), order);
}

TEST(SenderRoundTest, EmptyOrderIsFinishedImmediately) {
  SenderRound tx;
  tx.Begin(1, {});
  EXPECT_EQ(tx.state(), State::kStopped);
  EXPECT_TRUE(tx.finished());
  uint32_t buf[1];
  EXPECT_EQ(tx.NextBurst(buf, 1), 0u);
}

// ---------------------------------------------------------------------------
// Sender <-> receiver over a lossy channel, STOP and BITMAP delivered by the
// test (the control channel is reliable).

struct LoopResult {
  uint32_t passes = 0;
  uint64_t sent = 0;
  uint32_t received = 0;
  uint32_t stops = 0;
  bool stopped_by_stop = false;
};

LoopResult RunRound(uint32_t n, double p, double loss, uint64_t seed,
                    uint32_t burst, uint32_t stop_delay_bursts) {
  constexpr uint32_t kChunk = 64;
  ReceiverConfig config;
  config.session = 77;
  config.layout = ChunkLayout(uint64_t{kChunk} * n - 12, kChunk);
  ReceiverRound rx(config);
  SenderRound tx;
  const uint32_t round = static_cast<uint32_t>(seed) * 2654435761u;
  const std::vector<uint32_t> order = Permutation(n, seed);
  rx.Begin(round, p);
  tx.Begin(round, order);
  Rng loss_rng(seed ^ 0xABCDEF);
  std::vector<uint8_t> payload(kChunk, 0x5A);
  std::vector<uint8_t> frame(kDataHeaderBytes + kChunk);
  std::vector<uint32_t> seqs(burst);
  LoopResult r;
  int stop_countdown = -1;  // bursts until the STOP reaches the sender
  for (int step = 0; step < 1'000'000 && !tx.finished(); ++step) {
    const uint32_t k = tx.NextBurst(seqs.data(), burst);
    for (uint32_t i = 0; i < k; ++i) {
      if (loss_rng.Bernoulli(loss)) continue;
      DataHeader h;
      h.type = FrameType::kPush;
      h.session = 77;
      h.round = round;
      h.seq = seqs[i];
      h.payload_len = static_cast<uint16_t>(config.layout.Length(seqs[i]));
      const size_t len = BuildDataFrame(h, payload.data(), frame.data());
      DataHeader got;
      const uint8_t* data = nullptr;
      const Verdict v = rx.OnFrame(frame.data(), len, &got, &data);
      EXPECT_TRUE(v == Verdict::kAccepted || v == Verdict::kDuplicate);
      if (rx.PollStop() != StopTrigger::kNone) {
        ++r.stops;
        stop_countdown = static_cast<int>(stop_delay_bursts);
      }
    }
    if (stop_countdown == 0) {
      tx.RequestStop();
      r.stopped_by_stop = true;
    }
    if (stop_countdown >= 0) --stop_countdown;
    if (k == 0 && tx.state() == State::kAwaitingBitmap) {
      Bitmap have;
      rx.SnapshotBitmap(have);
      EXPECT_TRUE(tx.OnBitmap(have));
    }
  }
  rx.Close();
  r.passes = tx.passes();
  r.sent = tx.packets_sent();
  r.received = rx.received();
  EXPECT_TRUE(tx.finished());
  return r;
}

TEST(SenderReceiverLoopTest, LossyRoundsTerminateAboveThreshold) {
  constexpr uint32_t kBurst = 32;
  int cases = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (uint32_t n : {1u, 97u, 1000u}) {
      for (double p : {0.0, 0.008, 0.1, 0.408}) {
        for (double loss : {0.0, 0.1, 0.5, 0.7}) {
          ++cases;
          const LoopResult r = RunRound(n, p, loss, seed, kBurst, 0);
          const uint32_t threshold = StopThreshold(n, p);
          SCOPED_TRACE(::testing::Message() << "seed=" << seed << " n=" << n
                                            << " p=" << p << " loss=" << loss);
          EXPECT_GE(r.received, threshold);
          EXPECT_EQ(r.stops, 1u);
          EXPECT_TRUE(r.stopped_by_stop);
          // STOP reaches the sender right after the burst that crossed the
          // threshold: only the rest of that burst (in flight) can follow.
          EXPECT_LT(r.received, threshold + kBurst);
          EXPECT_GE(r.sent, threshold);
          // Each pass recovers a (1 - loss) share of what is missing; allow
          // a generous margin over log(0.5 / n) / log(loss).
          const double need =
              loss == 0 ? 1 : std::log(0.5 / n) / std::log(loss) + 1;
          EXPECT_LE(r.passes, static_cast<uint32_t>(2 * need + 10));
          if (loss == 0) {
            // Early stop mid first pass: the burst that crossed the
            // threshold is the last one.
            EXPECT_EQ(r.passes, 1u);
            EXPECT_EQ(r.sent, std::min<uint64_t>(n, (threshold + kBurst - 1) /
                                                        kBurst * kBurst));
            EXPECT_EQ(r.received, r.sent);
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 3 * 4 * 4);
}

TEST(SenderReceiverLoopTest, DelayedStopStillEndsRoundAboveThreshold) {
  // STOP takes a few bursts to reach the sender: the sender keeps sending
  // meanwhile (in-flight data), then stops even with seqs left.
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const LoopResult r = RunRound(2000, 0.408, 0.3, seed, 16, 3);
    EXPECT_EQ(r.stops, 1u);
    EXPECT_GE(r.received, StopThreshold(2000, 0.408));
    EXPECT_LT(r.received, 2000u);
    EXPECT_LE(r.sent, static_cast<uint64_t>(2000 * 1.2));
  }
}

TEST(SenderReceiverLoopTest, PassCountMatchesDesignExampleRoughly) {
  // DESIGN.md: at L = 0.7, p = 0.408 takes 3 passes, p = 0.008 about 14.
  uint32_t high = 0, low = 0;
  constexpr int kSeeds = 20;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    high += RunRound(1000, 0.408, 0.7, seed, 32, 0).passes;
    low += RunRound(1000, 0.008, 0.7, seed, 32, 0).passes;
  }
  EXPECT_NEAR(static_cast<double>(high) / kSeeds, 3.0, 0.6);
  EXPECT_NEAR(static_cast<double>(low) / kSeeds, 14.0, 1.5);
}

}  // namespace
}  // namespace dblp
