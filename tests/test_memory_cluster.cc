// The in-memory cluster: the protocol's promises, checked end to end over
// real frames, real control messages, loss, bursts and stale replays.
//
// Gradients are small integers, so every partial sum the server forms is
// exact in float whatever the arrival order, and the expected mean can be
// computed independently from the arrival bitmaps and compared bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/policy/clr_detector.h"
#include "dblp/round/stop_decision.h"
#include "dblp/wire/float_ops.h"
#include "sim/memory_cluster.h"

namespace dblp {
namespace {

// In [-5, 5] on even iterations and [11, 21] on odd ones: consecutive
// iterations differ in every element, so one accepted stale frame changes
// the mean.
float IntGrad(uint64_t it, uint32_t rank, uint64_t i) {
  const int base = static_cast<int>((i * 7 + rank * 13 + (i >> 6)) % 11) - 5;
  return static_cast<float>(base + 16 * static_cast<int>(it % 2));
}

std::vector<std::vector<float>> IntGrads(uint32_t workers, uint64_t floats,
                                         uint64_t it) {
  std::vector<std::vector<float>> g(workers, std::vector<float>(floats));
  for (uint32_t r = 0; r < workers; ++r) {
    for (uint64_t i = 0; i < floats; ++i) g[r][i] = IntGrad(it, r, i);
  }
  return g;
}

// Fewest chunks a receiver may STOP with under `tol`.
uint32_t MinChunks(uint32_t n, const RoundTolerance& tol) {
  const uint32_t by_p = StopThreshold(n, tol.p);
  if (tol.deadline_ns == 0) return by_p;
  return std::min(by_p, FractionFloor(n, tol.min_fraction));
}

ClusterConfig SmallConfig(uint64_t seed) {
  ClusterConfig c;
  c.num_workers = 3;
  c.gradient_floats = 8192;  // 23 chunks at MTU 1500
  c.seed = seed;
  return c;
}

LossSpec Bernoulli(double p) { return LossSpec{LossKind::kBernoulli, p}; }

// Runs a cluster and checks, after every iteration, everything the protocol
// promises: bounded loss per round and direction, the exact mean, the
// workers' copies, stale replays refused, counters consistent.
class CheckedCluster {
 public:
  explicit CheckedCluster(const ClusterConfig& c)
      : cluster_(c),
        prev_mean_(c.gradient_floats, 0.0f),
        prev_avg_(c.num_workers, std::vector<float>(c.gradient_floats, 0.0f)) {
  }

  IterationOutcome Step() {
    const ClusterConfig& c = cluster_.config();
    return Step(IntGrads(c.num_workers, c.gradient_floats, iteration_));
  }

  IterationOutcome Step(const std::vector<std::vector<float>>& grads) {
    const ClusterConfig& c = cluster_.config();
    const uint32_t w = c.num_workers;
    const ChunkLayout& layout = cluster_.layout();
    const uint32_t n = layout.num_chunks();
    SCOPED_TRACE("iteration " + std::to_string(iteration_));
    IterationOutcome out = cluster_.RunIteration(grads);

    EXPECT_EQ(out.iteration, iteration_);
    EXPECT_EQ(out.push_round,
              static_cast<uint32_t>(c.first_round + 2 * iteration_));
    EXPECT_EQ(out.bcast_round, static_cast<uint32_t>(out.push_round + 1));
    EXPECT_EQ(out.workers.size(), w);
    EXPECT_EQ(out.bcast_delivered.size(), w);

    // Bounded loss, push and broadcast, every worker.
    uint64_t accepted = 0;
    for (uint32_t r = 0; r < w && r < out.workers.size(); ++r) {
      const IterationRecord& rec = out.workers[r];
      const uint32_t pushed = cluster_.push_arrived(r).Count();
      const uint32_t got = cluster_.bcast_arrived(r).Count();
      accepted += pushed + got;
      EXPECT_EQ(rec.rank, r);
      EXPECT_EQ(rec.iteration, iteration_);
      EXPECT_EQ(rec.p, out.push_tolerance.p);
      EXPECT_EQ(rec.critical, out.push_tolerance.critical);
      EXPECT_EQ(rec.delivered_fraction, static_cast<double>(pushed) / n);
      EXPECT_GE(pushed, MinChunks(n, out.push_tolerance))
          << "push of rank " << r << " delivered " << rec.delivered_fraction
          << " with p=" << out.push_tolerance.p;
      if (out.push_tolerance.deadline_ns == 0) {
        EXPECT_GE(rec.delivered_fraction, 1 - out.push_tolerance.p - 1e-12)
            << "rank " << r;
      }
      EXPECT_EQ(out.bcast_delivered[r], static_cast<double>(got) / n);
      EXPECT_GE(got, MinChunks(n, out.bcast_tolerance))
          << "broadcast to rank " << r << " delivered "
          << out.bcast_delivered[r] << " with p=" << out.bcast_tolerance.p;
      EXPECT_GE(rec.passes, 1u);
      EXPECT_GE(rec.packets_sent, pushed);
    }

    // The server's mean, bit for bit.
    const std::vector<float>& mean = cluster_.server_mean();
    EXPECT_TRUE(MeanIsExact(grads, mean, c.push_fill));
    // The server's norm: 64-chunk blocks' squares, summed in order.
    const size_t per = size_t{kNormBlockChunks} * layout.chunk_payload() / 4;
    std::vector<double> blocks(NormBlocks(mean.size(), per));
    BlockSquares(mean, per, blocks);
    EXPECT_EQ(out.grad_norm, NormOfBlockSquares(blocks));

    // Each worker's copy: the mean where the broadcast arrived, the fill
    // elsewhere.
    for (uint32_t r = 0; r < w; ++r) {
      EXPECT_TRUE(AverageIsExact(r, mean, c.bcast_fill)) << "rank " << r;
      prev_avg_[r] = cluster_.worker_average(r);
    }
    prev_mean_ = mean;

    // Counters: every accepted frame is in a bitmap; every replayed frame
    // of the previous push was refused as stale; nothing else went wrong.
    accepted_ += accepted;
    const ClusterCounters k = cluster_.counters();
    EXPECT_EQ(k.accepted, accepted_);
    EXPECT_EQ(k.stale, stale_expected_);
    EXPECT_EQ(k.future, 0u);
    EXPECT_EQ(k.malformed, 0u);
    EXPECT_EQ(k.rejected_other, 0u);
    EXPECT_EQ(k.ring_drops, 0u);
    for (const IterationRecord& rec : out.workers) {
      stale_expected_ += std::min<uint64_t>(c.stale_replay, rec.packets_sent);
    }
    ++iteration_;
    return out;
  }

  MemoryCluster& cluster() { return cluster_; }
  // Replays refused so far: frames of iteration k replayed in iteration k+1.
  uint64_t stale_refused() const { return cluster_.counters().stale; }

 private:
  ::testing::AssertionResult MeanIsExact(
      const std::vector<std::vector<float>>& grads,
      const std::vector<float>& mean, FillMode mode) const {
    const ChunkLayout& layout = cluster_.layout();
    const uint32_t w = cluster_.config().num_workers;
    if (mean.size() != cluster_.config().gradient_floats) {
      return ::testing::AssertionFailure() << "mean size " << mean.size();
    }
    for (uint32_t seq = 0; seq < layout.num_chunks(); ++seq) {
      uint32_t k = 0;
      for (uint32_t r = 0; r < w; ++r) k += cluster_.push_arrived(r).Test(seq);
      const uint64_t first = layout.Offset(seq) / sizeof(float);
      const uint64_t end = first + layout.Length(seq) / sizeof(float);
      for (uint64_t i = first; i < end; ++i) {
        int sum = 0;
        for (uint32_t r = 0; r < w; ++r) {
          if (cluster_.push_arrived(r).Test(seq)) {
            sum += static_cast<int>(grads[r][i]);
          }
        }
        const auto fsum = static_cast<float>(sum);
        const auto fw = static_cast<float>(w);
        float want = 0;
        switch (mode) {
          case FillMode::kZero:
            want = fsum / fw;
            break;
          case FillMode::kRescale:
            want = k == 0 ? 0.0f : fsum / static_cast<float>(k);
            break;
          case FillMode::kPrevious:
            want = k == w ? fsum / fw
                          : (fsum + static_cast<float>(w - k) * prev_mean_[i]) /
                                fw;
            break;
        }
        if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(mean[i])) {
          return ::testing::AssertionFailure()
                 << "mean[" << i << "] (chunk " << seq << ", " << k
                 << " contributions, fill " << FillModeName(mode) << ") is "
                 << mean[i] << ", expected " << want;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult AverageIsExact(uint32_t r,
                                            const std::vector<float>& mean,
                                            FillMode mode) const {
    const ChunkLayout& layout = cluster_.layout();
    const std::vector<float>& avg = cluster_.worker_average(r);
    const Bitmap& arrived = cluster_.bcast_arrived(r);
    if (avg.size() != mean.size() || arrived.size() != layout.num_chunks()) {
      return ::testing::AssertionFailure() << "sizes differ";
    }
    for (uint64_t i = 0; i < avg.size(); ++i) {
      const uint32_t seq = layout.ChunkOf(i * sizeof(float));
      float want = 0.0f;
      if (arrived.Test(seq)) {
        want = mean[i];
      } else if (mode == FillMode::kPrevious) {
        want = prev_avg_[r][i];
      }
      if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(avg[i])) {
        return ::testing::AssertionFailure()
               << "average[" << i << "] (chunk " << seq
               << (arrived.Test(seq) ? ", arrived" : ", missing") << ") is "
               << avg[i] << ", expected " << want;
      }
    }
    return ::testing::AssertionSuccess();
  }

  MemoryCluster cluster_;
  uint64_t iteration_ = 0;
  uint64_t accepted_ = 0;
  uint64_t stale_expected_ = 0;
  std::vector<float> prev_mean_;
  std::vector<std::vector<float>> prev_avg_;
};

// ---- bounded loss, exact mean, stale replays, over many seeds -------------

TEST(MemoryClusterTest, PromisesHoldOverSeedsLossesAndPolicies) {
  PolicyConfig fixed_low;
  fixed_low.kind = PolicyKind::kFixed;
  fixed_low.p_fixed = 0.05;
  PolicyConfig fixed_high = fixed_low;
  fixed_high.p_fixed = 0.408;
  PolicyConfig dblp_fast;  // checks every iteration: p moves around
  dblp_fast.clr.freq = 1;
  const PolicyConfig policies[] = {fixed_low, fixed_high, dblp_fast};

  uint64_t lossy_rounds = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    for (double loss : {0.0, 0.1, 0.3}) {
      for (const PolicyConfig& policy : policies) {
        ClusterConfig c = SmallConfig(seed);
        c.policy = policy;
        c.push_loss = Bernoulli(loss);
        c.bcast_loss = Bernoulli(loss);
        c.bursts = ParseBurstIterations("2", 0.7);
        SCOPED_TRACE("seed " + std::to_string(seed) + " loss " +
                     std::to_string(loss) + " policy p_fixed " +
                     std::to_string(policy.p_fixed) + " kind " +
                     PolicyKindName(policy.kind));
        CheckedCluster cc(c);
        for (int it = 0; it < 4; ++it) {
          const IterationOutcome out = cc.Step();
          EXPECT_EQ(out.burst, it == 2);
          for (const IterationRecord& r : out.workers) {
            lossy_rounds += r.delivered_fraction < 1.0;
          }
          if (HasFailure()) return;
        }
        // Replays of iterations 0..2 were offered to the server and refused.
        EXPECT_GE(cc.stale_refused(), 3u * 3u * 1u);
      }
    }
  }
  // The suite actually exercised bounded loss, not only complete rounds.
  EXPECT_GT(lossy_rounds, 500u);
}

TEST(MemoryClusterTest, ExactMeanWithRescaleAndPreviousFill) {
  for (FillMode push_fill :
       {FillMode::kZero, FillMode::kRescale, FillMode::kPrevious}) {
    for (FillMode bcast_fill : {FillMode::kZero, FillMode::kPrevious}) {
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        ClusterConfig c = SmallConfig(seed);
        c.policy.kind = PolicyKind::kFixed;
        c.policy.p_fixed = 0.3;
        c.push_loss = Bernoulli(0.25);
        c.bcast_loss = Bernoulli(0.25);
        c.push_fill = push_fill;
        c.bcast_fill = bcast_fill;
        c.send_order = SendOrderKind::kSequential;  // chunks nobody sent
        SCOPED_TRACE(std::string("push fill ") + FillModeName(push_fill) +
                     " bcast fill " + FillModeName(bcast_fill) + " seed " +
                     std::to_string(seed));
        CheckedCluster cc(c);
        for (int it = 0; it < 5; ++it) cc.Step();
        if (HasFailure()) return;
      }
    }
  }
}

// One test that shows, on its own, that a replay is refused: the replayed
// frames carry iteration 0's values (5..21 apart from iteration 1's), yet
// the mean of iteration 1 is exactly the mean of iteration 1's gradients.
TEST(MemoryClusterTest, StaleReplaysAreCountedAndNeverAccepted) {
  ClusterConfig c = SmallConfig(3);
  c.policy.kind = PolicyKind::kReliable;
  c.stale_replay = 16;
  MemoryCluster cluster(c);
  const auto g0 = IntGrads(3, c.gradient_floats, 0);
  const auto g1 = IntGrads(3, c.gradient_floats, 1);
  cluster.RunIteration(g0);
  EXPECT_EQ(cluster.counters().stale, 0u);
  cluster.RunIteration(g1);
  EXPECT_EQ(cluster.counters().stale, 3u * 16u);
  const std::vector<float>& mean = cluster.server_mean();
  for (uint64_t i = 0; i < c.gradient_floats; ++i) {
    const float want = (g1[0][i] + g1[1][i] + g1[2][i]) / 3.0f;
    ASSERT_EQ(mean[i], want) << "element " << i;
    ASSERT_NE(mean[i], (g0[0][i] + g0[1][i] + g0[2][i]) / 3.0f);
  }
  EXPECT_EQ(cluster.counters().duplicate, 0u);
}

TEST(MemoryClusterTest, ReliablePolicyDeliversEverythingUnderLoss) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    ClusterConfig c = SmallConfig(seed);
    c.policy.kind = PolicyKind::kReliable;
    c.push_loss = Bernoulli(0.3);
    c.bcast_loss = Bernoulli(0.3);
    c.bursts = ParseBurstIterations("1", 0.7);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckedCluster cc(c);
    for (int it = 0; it < 3; ++it) {
      const IterationOutcome out = cc.Step();
      EXPECT_EQ(out.push_tolerance.p, 0.0);
      EXPECT_EQ(out.bcast_tolerance.p, 0.0);
      for (uint32_t r = 0; r < 3; ++r) {
        EXPECT_EQ(out.workers[r].delivered_fraction, 1.0);
        EXPECT_EQ(out.bcast_delivered[r], 1.0);
        EXPECT_GT(out.workers[r].passes, 1u);  // loss forced retransmission
        EXPECT_EQ(cc.cluster().worker_average(r), cc.cluster().server_mean());
      }
    }
    EXPECT_GT(cc.cluster().counters().injected_drops, 0u);
  }
}

// ---- early stop and passes --------------------------------------------------

TEST(MemoryClusterTest, EarlyStopCutsTheFirstPassAtOneMinusP) {
  ClusterConfig c = SmallConfig(5);
  c.gradient_floats = 1 << 16;  // 180 chunks
  c.policy.kind = PolicyKind::kFixed;
  c.policy.p_fixed = 0.408;
  c.burst = 8;
  CheckedCluster cc(c);
  const uint32_t n = cc.cluster().layout().num_chunks();
  const uint32_t threshold = StopThreshold(n, 0.408);
  for (int it = 0; it < 3; ++it) {
    const IterationOutcome out = cc.Step();
    for (const IterationRecord& r : out.workers) {
      EXPECT_EQ(r.passes, 1u);
      EXPECT_EQ(r.packets_resent, 0u);
      // Sent until STOP landed: at least the threshold, at most the burst in
      // which it was reached plus the one sent while STOP was in flight.
      EXPECT_GE(r.packets_sent, threshold);
      EXPECT_LE(r.packets_sent, threshold + 2 * c.burst);
      EXPECT_LT(r.packets_sent, n);
      EXPECT_NEAR(static_cast<double>(r.packets_sent) / n, 0.592, 0.1);
      EXPECT_LT(r.delivered_fraction, 1.0);
    }
    for (double d : out.bcast_delivered) EXPECT_LT(d, 1.0);
  }
  EXPECT_GE(cc.cluster().counters().stops_sent, 3u * 2u * 3u);
}

TEST(MemoryClusterTest, DblpOutsideClrNeedsFarFewerPassesInABurst) {
  constexpr uint64_t kBurstIteration = 4;
  auto run = [&](const PolicyConfig& policy, uint64_t seed) {
    ClusterConfig c = SmallConfig(seed);
    c.gradient_floats = 1 << 16;
    c.policy = policy;
    c.bursts = ParseBurstIterations(std::to_string(kBurstIteration), 0.7);
    MemoryCluster cluster(c);
    // Constant gradients: the CLR detector sees no change and leaves the
    // critical regime after two checks.
    std::vector<std::vector<float>> g(3, std::vector<float>(c.gradient_floats));
    for (uint32_t r = 0; r < 3; ++r) {
      for (uint64_t i = 0; i < c.gradient_floats; ++i) g[r][i] = IntGrad(0, r, i);
    }
    IterationOutcome burst;
    for (uint64_t it = 0; it <= kBurstIteration; ++it) {
      burst = cluster.RunIteration(g);
    }
    return burst;
  };
  PolicyConfig fixed;
  fixed.kind = PolicyKind::kFixed;
  fixed.p_fixed = 0.008;
  PolicyConfig dblp;
  dblp.clr.freq = 1;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const IterationOutcome f = run(fixed, seed);
    const IterationOutcome d = run(dblp, seed);
    ASSERT_TRUE(f.burst);
    ASSERT_TRUE(d.burst);
    ASSERT_FALSE(d.push_tolerance.critical);
    ASSERT_EQ(d.push_tolerance.p, 0.408);
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_GE(f.workers[r].passes, 10u);
      EXPECT_LE(d.workers[r].passes, 4u);
      EXPECT_GE(d.workers[r].delivered_fraction, 0.592);
      EXPECT_GE(f.workers[r].delivered_fraction, 0.992);
      EXPECT_LT(d.workers[r].packets_sent, f.workers[r].packets_sent);
    }
    // The model (DESIGN.md section 1): ~1.97N vs ~3.32N packets per worker.
    EXPECT_LT(d.push_round_ns * 1.4, f.push_round_ns);
  }
}

// ---- the current p governs the broadcast -----------------------------------

// Gradients whose mean norm is constant, then jumps by 4x at `jump`.
std::vector<std::vector<float>> JumpGrads(uint64_t floats, uint64_t it,
                                          uint64_t jump) {
  std::vector<std::vector<float>> g(3, std::vector<float>(floats));
  const float scale = it == jump ? 4.0f : 1.0f;
  for (uint32_t r = 0; r < 3; ++r) {
    for (uint64_t i = 0; i < floats; ++i) g[r][i] = scale * IntGrad(0, r, i);
  }
  return g;
}

// With freq = 1 the detector checks after every push: iterations 0 and 1
// are critical, 2 is not (no change), and the 4x jump in iteration 2's norm
// makes iteration 3 critical again. So iteration 2 pushes with P_high and
// broadcasts with P_low; the workers must STOP the broadcast by P_low even
// though the previous broadcast (and this push) used P_high.
// Regression: the worker's broadcast receiver used to be opened with the
// previous broadcast's p (P_high) and, served a burst before the new
// ROUND_BEGIN landed, sent STOP at ~60-90% delivered under p = 0.008.
TEST(MemoryClusterTest, BroadcastUsesThePAfterTheClrSwitch) {
  for (uint64_t floats : {4096ull, 8192ull, 65536ull}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      ClusterConfig c = SmallConfig(seed);
      c.gradient_floats = floats;
      c.policy.clr.freq = 1;
      c.bcast_loss = Bernoulli(0.3);
      if (floats == 65536) c.burst = 256;  // a whole pass before ROUND_BEGIN
      SCOPED_TRACE("floats " + std::to_string(floats) + " seed " +
                   std::to_string(seed));
      CheckedCluster cc(c);
      for (uint64_t it = 0; it < 5; ++it) {
        const IterationOutcome out = cc.Step(JumpGrads(floats, it, 2));
        if (it == 2) {
          EXPECT_FALSE(out.push_tolerance.critical);
          EXPECT_EQ(out.push_tolerance.p, 0.408);
          EXPECT_TRUE(out.bcast_tolerance.critical);
          EXPECT_EQ(out.bcast_tolerance.p, 0.008);
          for (const IterationRecord& r : out.workers) {
            EXPECT_EQ(r.p, 0.408);  // the record shows the push's p
            EXPECT_FALSE(r.critical);
          }
          for (double d : out.bcast_delivered) EXPECT_GE(d, 0.992);
        }

        if (it == 1) {
          EXPECT_EQ(out.bcast_tolerance.p, 0.408);
        }
        if (it == 3) {
          EXPECT_EQ(out.push_tolerance.p, 0.008);
          // Back to the old norm: 4x -> 1x is a change of 75%: critical.
          EXPECT_EQ(out.bcast_tolerance.p, 0.008);
        }
      }
      if (HasFailure()) return;
    }
  }
}

// The other direction: leaving the critical regime right after a push lets
// the broadcast stop early at P_high.
TEST(MemoryClusterTest, BroadcastRelaxesToPHighRightAfterTheSwitch) {
  ClusterConfig c = SmallConfig(9);
  c.gradient_floats = 1 << 16;
  c.policy.clr.freq = 1;
  CheckedCluster cc(c);
  for (uint64_t it = 0; it < 2; ++it) {
    const IterationOutcome out = cc.Step(JumpGrads(c.gradient_floats, it, 99));
    EXPECT_EQ(out.push_tolerance.p, 0.008);
    if (it == 0) {
      EXPECT_EQ(out.bcast_tolerance.p, 0.008);
    } else {
      EXPECT_EQ(out.bcast_tolerance.p, 0.408);
      EXPECT_FALSE(out.bcast_tolerance.critical);
      // No loss: the broadcast ends by STOP, well before the whole buffer.
      for (double d : out.bcast_delivered) EXPECT_LT(d, 0.9);
    }
  }
}

// ---- round counter, LTP, determinism, config errors -------------------------

TEST(MemoryClusterTest, RoundCounterWrapsCleanly) {
  ClusterConfig c = SmallConfig(21);
  c.first_round = 0xFFFFFFF0u;
  c.policy.clr.freq = 2;
  c.push_loss = Bernoulli(0.1);
  c.bcast_loss = Bernoulli(0.1);
  c.bursts = ParseBurstIterations("7,8", 0.7);  // around the wrap
  CheckedCluster cc(c);
  bool wrapped = false;
  for (int it = 0; it < 20; ++it) {
    const IterationOutcome out = cc.Step();
    wrapped |= out.push_round < 0x10u;
    if (HasFailure()) return;
  }
  EXPECT_TRUE(wrapped);
  EXPECT_EQ(cc.cluster().counters().future, 0u);
  EXPECT_GE(cc.stale_refused(), 19u * 3u);
}

// A dead link ends the round after --round_timeout_ms of modelled time
// without progress, naming the round and the workers; it never spins.
TEST(MemoryClusterTest, TotalLossTimesOutNamingTheRound) {
  for (const bool on_push : {true, false}) {
    ClusterConfig c = SmallConfig(3);
    c.round_timeout_ms = 50;
    (on_push ? c.push_loss : c.bcast_loss) = Bernoulli(1.0);
    MemoryCluster cluster(c);
    std::vector<std::vector<float>> grads(
        c.num_workers, std::vector<float>(c.gradient_floats, 1.0f));
    try {
      cluster.RunIteration(grads);
      ADD_FAILURE() << "a round with 100% loss finished";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(on_push ? "push round" : "broadcast round"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("worker 0 ("), std::string::npos) << what;
      EXPECT_NE(what.find("no progress for 50 ms"), std::string::npos) << what;
    }
  }
}

// A member that goes silent (as a SIGSTOPped worker) under
// --on_worker_loss=continue: the servers wait one round timeout of
// modelled time, lose it, and the round closes without it; from the next
// iteration the mean is the live workers' exact mean (issue #35). Silent
// at the push and at the broadcast, with one and with two server shards.
TEST(MemoryClusterTest, ContinueGoesOnWithoutASilentMember) {
  for (const Direction from : {Direction::kPush, Direction::kBroadcast}) {
    for (const uint32_t shards : {1u, 2u}) {
      SCOPED_TRACE(std::string(from == Direction::kPush ? "push" : "bcast") +
                   " shards " + std::to_string(shards));
      ClusterConfig c = SmallConfig(7);
      c.gradient_floats = 65536;  // 176 chunks: 2 partitions of >= 64
      c.server_shards = shards;
      c.policy.kind = PolicyKind::kReliable;
      c.round_timeout_ms = 40;
      c.continue_on_worker_loss = true;
      c.silent = {1, 2, from};
      MemoryCluster cluster(c);
      for (uint64_t it = 0; it < 5; ++it) {
        SCOPED_TRACE("iteration " + std::to_string(it));
        const auto grads = IntGrads(3, c.gradient_floats, it);
        const IterationOutcome out = cluster.RunIteration(grads);
        ASSERT_TRUE(out.failure.empty()) << out.failure;
        const bool gone = it >= 2;
        const std::vector<uint32_t> lost_here =
            it == 2 ? std::vector<uint32_t>{1} : std::vector<uint32_t>{};
        EXPECT_EQ(out.lost, lost_here);
        const double round_ns =
            from == Direction::kPush ? out.push_round_ns : out.bcast_round_ns;
        if (it == 2) {  // it waited one timeout, not two, and went on
          EXPECT_GT(round_ns, 40e6);
          EXPECT_LT(round_ns, 80e6);
        } else {
          EXPECT_LT(round_ns, 40e6);
        }
        // Its rows stop; the others' go on.
        std::vector<uint32_t> ranks;
        for (const IterationRecord& r : out.workers) ranks.push_back(r.rank);
        const std::vector<uint32_t> in_job =
            gone ? std::vector<uint32_t>{0, 2} : std::vector<uint32_t>{0, 1, 2};
        EXPECT_EQ(ranks, in_job);
        // The mean divides by the workers in the round: all three until it
        // stops, the two live ones after. A member silent from a push sent
        // none of it, so that push is already the two's; one silent from
        // a broadcast pushed that iteration whole, and its next push
        // (opened before the loss) is the two's.
        const uint32_t divisor =
            it > 2 || (it == 2 && from == Direction::kPush) ? 2 : 3;
        const std::vector<float>& mean = cluster.server_mean();
        uint64_t wrong = 0;
        for (uint64_t i = 0; i < c.gradient_floats; ++i) {
          float sum = grads[0][i] + grads[2][i];
          if (divisor == 3) sum += grads[1][i];
          wrong += mean[i] != sum / static_cast<float>(divisor);
        }
        EXPECT_EQ(wrong, 0u);
        // Every worker still in the job holds that mean.
        for (const uint32_t r : ranks) {
          EXPECT_EQ(cluster.worker_average(r), mean) << "worker " << r;
        }
      }
      EXPECT_EQ(cluster.server_rows(0).size(), 5u * 3u);
    }
  }
}

// Under abort (the default) the same silence ends the job after one
// timeout, naming the member; under continue a round that waits for every
// live worker is the link's stall, not a member's, and ends too.
TEST(MemoryClusterTest, SilenceEndsTheJobUnderAbortOrWhenNobodyIsLeft) {
  ClusterConfig c = SmallConfig(8);
  c.round_timeout_ms = 40;
  c.silent = {2, 1, Direction::kPush};
  MemoryCluster abort_job(c);
  abort_job.RunIteration(IntGrads(3, c.gradient_floats, 0));
  try {
    abort_job.RunIteration(IntGrads(3, c.gradient_floats, 1));
    ADD_FAILURE() << "abort went on without a silent worker";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no progress for 40 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("worker 2 (simulated) 0/"), std::string::npos) << what;
  }

  c.num_workers = 1;
  c.silent = {0, 1, Direction::kBroadcast};
  c.continue_on_worker_loss = true;
  MemoryCluster alone(c);
  alone.RunIteration(IntGrads(1, c.gradient_floats, 0));
  try {
    alone.RunIteration(IntGrads(1, c.gradient_floats, 1));
    ADD_FAILURE() << "continue went on without its only worker";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("broadcast round 3 made no progress"),
              std::string::npos)
        << what;
  }
}

TEST(MemoryClusterTest, LtpDeadlineClosesWithTheMinimumFraction) {
  uint64_t closed_early = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    ClusterConfig c = SmallConfig(seed);
    c.policy.kind = PolicyKind::kLtp;
    c.policy.ltp_initial_deadline_ns = 40000;  // shorter than one pass
    c.policy.ltp_min_fraction = 0.6;
    c.push_loss = Bernoulli(0.3);
    c.bcast_loss = Bernoulli(0.3);
    c.bursts = ParseBurstIterations("3", 0.7);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckedCluster cc(c);
    const uint32_t n = cc.cluster().layout().num_chunks();
    for (int it = 0; it < 6; ++it) {
      const IterationOutcome out = cc.Step();
      EXPECT_EQ(out.push_tolerance.p, 0.0);
      EXPECT_GT(out.push_tolerance.deadline_ns, 0u);
      EXPECT_EQ(out.push_tolerance.min_fraction, 0.6);
      for (const IterationRecord& r : out.workers) {
        EXPECT_GE(r.delivered_fraction, 0.6);
        closed_early += r.delivered_fraction < 1.0;
      }
      for (double d : out.bcast_delivered) {
        EXPECT_GE(d * n, FractionFloor(n, 0.6));
        closed_early += d < 1.0;
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(closed_early, 0u);
}

// The deadline policy closes rounds early end to end: p = 0, so a round
// short of a chunk was closed by its deadline, which after the first round
// is the 95th percentile of the push times so far (with fewer than 20, the
// longest: rank ceil(0.95 n) = n). A push's time, as the servers measure
// it, runs from its first chunk (push_first_chunk_ns) to its close.
TEST(MemoryClusterTest, DeadlinePolicyClosesAtThePercentileOfRoundTimes) {
  // Per direction: the server closes pushes, the workers broadcasts.
  uint64_t push_closed_early = 0, bcast_closed_early = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    ClusterConfig c = SmallConfig(seed);
    c.policy.kind = PolicyKind::kDeadline;
    c.policy.deadline_initial_ns = 40000;  // shorter than one pass
    c.policy.deadline_min_fraction = 0.6;
    c.push_loss = Bernoulli(0.3);
    c.bcast_loss = Bernoulli(0.3);
    c.bursts = ParseBurstIterations("3", 0.7);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckedCluster cc(c);
    const uint32_t n = cc.cluster().layout().num_chunks();
    double longest_push_ns = 0;
    for (int it = 0; it < 6; ++it) {
      const IterationOutcome out = cc.Step();
      EXPECT_EQ(out.push_tolerance.p, 0.0);
      EXPECT_FALSE(out.push_tolerance.critical);
      EXPECT_EQ(out.push_tolerance.min_fraction, 0.6);
      if (it == 0) {
        EXPECT_EQ(out.push_tolerance.deadline_ns, 40000u);
      } else {
        // The server's clock reads whole ns; the outcome's is a double.
        EXPECT_NEAR(static_cast<double>(out.push_tolerance.deadline_ns),
                    longest_push_ns, 2.0);
      }
      longest_push_ns = std::max(longest_push_ns,
                                 out.push_round_ns - out.push_first_chunk_ns);
      for (const IterationRecord& r : out.workers) {
        EXPECT_GE(r.delivered_fraction, 0.6);
        push_closed_early += r.delivered_fraction < 1.0;
      }
      for (double d : out.bcast_delivered) {
        EXPECT_GE(d * n, FractionFloor(n, 0.6));
        bcast_closed_early += d < 1.0;
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(push_closed_early, 0u);
  EXPECT_GT(bcast_closed_early, 0u);
}

// The combined policy end to end: strict rounds (p_low, no deadline) while
// the CLR detector says critical, and outside it rounds the deadline closed
// with fewer chunks than p_high alone would allow.
TEST(MemoryClusterTest, CombinedClosesEarlyOnlyOutsideACriticalRegime) {
  uint64_t strict = 0, relaxed = 0;
  uint64_t closed_by_deadline[2] = {0, 0};  // push, broadcast
  // Checks one direction's deliveries against the tolerance it ran under
  // (the broadcast's is the policy's after this iteration's CLR check).
  auto check = [&](const RoundTolerance& t, uint32_t n, double delivered,
                   int direction) {
    if (t.critical) {
      ++strict;
      EXPECT_EQ(t.p, 0.0);
      EXPECT_EQ(t.deadline_ns, 0u);
      EXPECT_EQ(delivered, 1.0);
      return;
    }
    ++relaxed;
    EXPECT_EQ(t.p, 0.1);
    EXPECT_GT(t.deadline_ns, 0u);
    EXPECT_EQ(t.min_fraction, 0.6);
    EXPECT_GE(delivered * n, FractionFloor(n, 0.6));
    closed_by_deadline[direction] += delivered * n < StopThreshold(n, 0.1);
  };
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    ClusterConfig c = SmallConfig(seed);
    c.policy.kind = PolicyKind::kCombined;
    // IntGrad alternates its range every iteration: checks at odd
    // iterations compare like with like, so 0..3 are critical and the
    // rest not, unless the loss moves the norm by half.
    c.policy.clr = {.freq = 2, .eta = 0.5};
    c.policy.p_low = 0.0;
    c.policy.p_high = 0.1;
    c.policy.ltp_initial_deadline_ns = 40000;  // shorter than one pass
    c.policy.ltp_min_fraction = 0.6;
    c.push_loss = Bernoulli(0.3);
    c.bcast_loss = Bernoulli(0.3);
    c.bursts = ParseBurstIterations("5", 0.7);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckedCluster cc(c);
    const uint32_t n = cc.cluster().layout().num_chunks();
    for (int it = 0; it < 8; ++it) {
      const IterationOutcome out = cc.Step();
      if (it < 4) {
        EXPECT_TRUE(out.push_tolerance.critical) << "iteration " << it;
      }
      for (const IterationRecord& r : out.workers) {
        check(out.push_tolerance, n, r.delivered_fraction, 0);
      }
      for (double d : out.bcast_delivered) check(out.bcast_tolerance, n, d, 1);
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(strict, 0u);
  EXPECT_GT(relaxed, 0u);
  EXPECT_GT(closed_by_deadline[0], 0u);
  // The broadcast runs under the next push's deadline: learnt from the
  // pushes' times from their first chunk, not from their opening beside
  // the broadcast before them (which made it a push and a broadcast long,
  // and no broadcast was cut: docs/RELIABILITY.md).
  EXPECT_GT(closed_by_deadline[1], 0u);
}

bool SameOutcome(const IterationOutcome& a, const IterationOutcome& b) {
  if (a.workers.size() != b.workers.size()) return false;
  for (size_t r = 0; r < a.workers.size(); ++r) {
    const IterationRecord& x = a.workers[r];
    const IterationRecord& y = b.workers[r];
    if (x.send_latency_us != y.send_latency_us ||
        x.bcast_latency_us != y.bcast_latency_us || x.passes != y.passes ||
        x.bcast_passes != y.bcast_passes || x.packets_sent != y.packets_sent ||
        x.packets_resent != y.packets_resent ||
        x.delivered_fraction != y.delivered_fraction || x.p != y.p ||
        x.grad_norm != y.grad_norm) {
      return false;
    }
  }
  return a.push_round == b.push_round && a.push_tolerance.p == b.push_tolerance.p &&
         a.bcast_tolerance.p == b.bcast_tolerance.p &&
         a.grad_norm == b.grad_norm && a.push_round_ns == b.push_round_ns &&
         a.bcast_round_ns == b.bcast_round_ns &&
         a.bcast_delivered == b.bcast_delivered;
}

TEST(MemoryClusterTest, SameConfigAndSeedGiveIdenticalOutcomes) {
  ClusterConfig c = SmallConfig(77);
  c.policy.clr.freq = 1;
  c.push_loss = Bernoulli(0.2);
  c.bcast_loss = LossSpec{LossKind::kGilbertElliott, 0, 0.05, 0.3, 0, 1};
  c.bursts = ParseBurstIterations("2", 0.7);
  MemoryCluster a(c), b(c);
  ClusterConfig other = c;
  other.seed = 78;
  MemoryCluster d(other);
  bool any_difference = false;
  for (uint64_t it = 0; it < 5; ++it) {
    const auto g = IntGrads(3, c.gradient_floats, it);
    const IterationOutcome oa = a.RunIteration(g);
    const IterationOutcome ob = b.RunIteration(g);
    const IterationOutcome od = d.RunIteration(g);
    EXPECT_TRUE(SameOutcome(oa, ob)) << "iteration " << it;
    EXPECT_EQ(a.server_mean(), b.server_mean());
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_EQ(a.push_arrived(r), b.push_arrived(r));
      EXPECT_EQ(a.bcast_arrived(r), b.bcast_arrived(r));
      EXPECT_EQ(a.worker_average(r), b.worker_average(r));
    }
    any_difference |= !SameOutcome(oa, od);
  }
  const ClusterCounters ka = a.counters(), kb = b.counters();
  EXPECT_EQ(ka.accepted, kb.accepted);
  EXPECT_EQ(ka.injected_drops, kb.injected_drops);
  EXPECT_EQ(ka.control_messages, kb.control_messages);
  EXPECT_TRUE(any_difference) << "the seed should matter under loss";
}

TEST(MemoryClusterTest, ConfigErrorsThrowInvalidArgument) {
  auto expect_bad = [](ClusterConfig c, const char* what) {
    EXPECT_THROW(MemoryCluster{c}, std::invalid_argument) << what;
  };
  ClusterConfig c = SmallConfig(1);
  c.num_workers = 0;
  expect_bad(c, "0 workers");
  c = SmallConfig(1);
  c.gradient_floats = 0;
  expect_bad(c, "empty gradient");
  c = SmallConfig(1);
  c.mtu = 100;
  expect_bad(c, "MTU below the minimum");
  c = SmallConfig(1);
  c.mtu = 65000;
  expect_bad(c, "MTU above the maximum");
  c = SmallConfig(1);
  c.burst = 0;
  expect_bad(c, "burst 0");
  c = SmallConfig(1);
  c.policy.kind = PolicyKind::kFixed;
  c.policy.p_fixed = 1.0;
  expect_bad(c, "p = 1");
  c = SmallConfig(1);
  c.push_loss = Bernoulli(1.5);
  expect_bad(c, "loss probability 1.5");
  c = SmallConfig(1);
  c.silent.rank = 3;
  expect_bad(c, "a silent member that is no worker");

  MemoryCluster ok(SmallConfig(1));
  EXPECT_THROW(ok.RunIteration(IntGrads(2, 8192, 0)), std::invalid_argument);
  EXPECT_THROW(ok.RunIteration(IntGrads(3, 8191, 0)), std::invalid_argument);
  // A rejected call leaves the cluster usable.
  const IterationOutcome out = ok.RunIteration(IntGrads(3, 8192, 0));
  EXPECT_EQ(out.iteration, 0u);
  EXPECT_EQ(out.workers.size(), 3u);
}

TEST(MemoryClusterTest, SingleWorkerAndJumboMtu) {
  ClusterConfig c = SmallConfig(4);
  c.num_workers = 1;
  c.mtu = 9000;
  c.gradient_floats = 40000;
  c.push_loss = Bernoulli(0.2);
  c.bcast_loss = Bernoulli(0.2);
  CheckedCluster cc(c);
  EXPECT_EQ(cc.cluster().layout().num_chunks(),
            ChunkLayout::ForMtu(40000 * 4, 9000).num_chunks());
  for (int it = 0; it < 4; ++it) cc.Step();
}

// The servers' consistent broadcast in the simulator (the same
// ServerIteration): every worker gets the one subset, exactly the STOP
// threshold's size, under loss; and what the workers applied plus what is
// still carried equals the sum of the pushes' means (integer gradients:
// the sums are exact).
TEST(MemoryClusterTest, ConsistentBroadcastOneSubsetAndConservation) {
  ClusterConfig c = SmallConfig(31);
  c.policy.kind = PolicyKind::kFixed;
  c.policy.p_fixed = 0.2;
  c.consistent_broadcast = true;
  c.push_loss = Bernoulli(0.05);
  c.bcast_loss = Bernoulli(0.1);
  MemoryCluster cluster(c);
  const uint32_t n = cluster.layout().num_chunks();
  std::vector<double> pushed(c.gradient_floats, 0), applied(c.gradient_floats);
  std::vector<std::vector<double>> got(c.num_workers, applied);
  for (uint64_t it = 0; it < 8; ++it) {
    const auto grads = IntGrads(c.num_workers, c.gradient_floats, it);
    const IterationOutcome out = cluster.RunIteration(grads);
    // The mean the pushes make (zero fill), before the carry is added.
    const ChunkLayout& layout = cluster.layout();
    for (uint32_t ch = 0; ch < n; ++ch) {
      const size_t first = layout.Offset(ch) / 4, k = layout.Length(ch) / 4;
      for (size_t j = first; j < first + k; ++j) {
        double s = 0;
        for (uint32_t r = 0; r < c.num_workers; ++r) {
          if (cluster.push_arrived(r).Test(ch)) s += grads[r][j];
        }
        pushed[j] += static_cast<float>(s / c.num_workers);
      }
    }
    for (uint32_t r = 0; r < c.num_workers; ++r) {
      EXPECT_EQ(cluster.bcast_arrived(r).Count(), StopThreshold(n, 0.2))
          << "iteration " << it << " rank " << r;
      EXPECT_TRUE(cluster.bcast_arrived(r) == cluster.bcast_arrived(0))
          << "iteration " << it << " rank " << r;
      const std::vector<float>& avg = cluster.worker_average(r);
      for (size_t j = 0; j < avg.size(); ++j) got[r][j] += avg[j];
    }
    EXPECT_EQ(out.bcast_tolerance.deadline_ns, 0u);
  }
  // Carried now: the last mean's chunks outside the last subset.
  const std::vector<float>& mean = cluster.server_mean();
  const ChunkLayout& layout = cluster.layout();
  for (uint32_t r = 0; r < c.num_workers; ++r) {
    for (uint32_t ch = 0; ch < n; ++ch) {
      if (cluster.bcast_arrived(r).Test(ch)) continue;
      const size_t first = layout.Offset(ch) / 4, k = layout.Length(ch) / 4;
      for (size_t j = first; j < first + k; ++j) got[r][j] += mean[j];
    }
    for (size_t j = 0; j < pushed.size(); ++j) {
      ASSERT_NEAR(got[r][j], pushed[j], 1e-3) << "rank " << r << " float " << j;
    }
  }
}

// --send_order=magnitude (the default): every worker pushes its own
// gradient's largest chunks first, and every worker's broadcast walks the
// mean's chunks largest first, so a clean broadcast
// cut at 1 - p hands every worker the largest StopThreshold chunks - the
// same chunks, so the replicas stay together. The permuted order (the
// control) hands each worker another subset.
TEST(MemoryClusterTest, MagnitudeOrderSendsTheLargestChunksFirstBothWays) {
  for (SendOrderKind kind :
       {SendOrderKind::kMagnitude, SendOrderKind::kPermuted}) {
    SCOPED_TRACE(SendOrderName(kind));
    ClusterConfig c = SmallConfig(33);
    c.gradient_floats = 1 << 16;  // 180 chunks: STOP cuts the first pass
    c.burst = 8;
    c.policy.kind = PolicyKind::kFixed;
    c.policy.p_fixed = 0.408;
    c.send_order = kind;
    MemoryCluster cluster(c);
    const ChunkLayout& layout = cluster.layout();
    const uint32_t n = layout.num_chunks();
    const uint32_t top = StopThreshold(n, 0.408);
    for (uint64_t it = 0; it < 6; ++it) {
      // Chunk c's floats scale with a per-iteration shuffle of 1..n, so
      // the mean's largest chunks move around from one iteration to the
      // next.
      auto grads = IntGrads(c.num_workers, c.gradient_floats, it);
      std::vector<uint32_t> scale(n);
      for (uint32_t ch = 0; ch < n; ++ch) scale[ch] = 1 + (ch * 37 + it * 11) % n;
      for (auto& g : grads) {
        for (uint32_t ch = 0; ch < n; ++ch) {
          const size_t first = layout.Offset(ch) / 4, k = layout.Length(ch) / 4;
          for (size_t j = first; j < first + k; ++j) {
            g[j] = std::fabs(g[j]) + 1.0f;
            g[j] *= static_cast<float>(scale[ch]);
          }
        }
      }
      cluster.RunIteration(grads);
      // Each worker's push: its own largest chunks first, as WorkerJob
      // ranks them.
      for (uint32_t r = 0; r < c.num_workers; ++r) {
        std::vector<std::pair<double, uint32_t>> mine;
        for (uint32_t ch = 0; ch < n; ++ch) {
          double sq = 0;
          const size_t first = layout.Offset(ch) / 4, k = layout.Length(ch) / 4;
          for (size_t j = first; j < first + k; ++j) {
            sq += double(grads[r][j]) * grads[r][j];
          }
          mine.emplace_back(-sq, ch);
        }
        std::sort(mine.begin(), mine.end());
        uint32_t largest = 0;
        for (uint32_t i = 0; i < top; ++i) {
          largest += cluster.push_arrived(r).Test(mine[i].second);
        }
        if (kind == SendOrderKind::kMagnitude) {
          EXPECT_EQ(largest, top) << "push, iteration " << it << " rank " << r;
        } else {
          EXPECT_LT(largest, top) << "push, iteration " << it << " rank " << r;
        }
      }
      const std::vector<float>& mean = cluster.server_mean();
      std::vector<std::pair<double, uint32_t>> by_size;
      for (uint32_t ch = 0; ch < n; ++ch) {
        double sq = 0;
        const size_t first = layout.Offset(ch) / 4, k = layout.Length(ch) / 4;
        for (size_t j = first; j < first + k; ++j) sq += double(mean[j]) * mean[j];
        by_size.emplace_back(-sq, ch);
      }
      std::sort(by_size.begin(), by_size.end());
      for (uint32_t r = 0; r < c.num_workers; ++r) {
        const Bitmap& got = cluster.bcast_arrived(r);
        // The cut: the threshold plus what was in flight with the STOP.
        EXPECT_LE(got.Count(), top + 2 * c.burst);
        uint32_t largest = 0;
        for (uint32_t i = 0; i < top; ++i) largest += got.Test(by_size[i].second);
        if (kind == SendOrderKind::kMagnitude) {
          EXPECT_EQ(largest, top) << "iteration " << it << " rank " << r;
        } else {
          EXPECT_LT(largest, top) << "iteration " << it << " rank " << r;
        }
      }
    }
  }
}

// A resync iteration in the simulator: both rounds reliable whatever the
// policy (ServerIteration::PushTolerance, the broadcast's), so every
// worker holds the whole average.
TEST(MemoryClusterTest, ResyncRoundsAreReliable) {
  ClusterConfig c = SmallConfig(32);
  c.policy.kind = PolicyKind::kFixed;
  c.policy.p_fixed = 0.3;
  c.resync_every = 2;  // iterations 2, 5, ... are resyncs
  c.push_loss = Bernoulli(0.1);
  c.bcast_loss = Bernoulli(0.1);
  CheckedCluster cc(c);
  for (uint64_t it = 0; it < 6; ++it) {
    const IterationOutcome out = cc.Step();
    const bool resync = it == 2 || it == 5;
    EXPECT_EQ(out.push_tolerance.p, resync ? 0.0 : 0.3) << "iteration " << it;
    EXPECT_EQ(out.bcast_tolerance.p, resync ? 0.0 : 0.3) << "iteration " << it;
    if (!resync) continue;
    for (uint32_t r = 0; r < c.num_workers; ++r) {
      EXPECT_EQ(cc.cluster().bcast_arrived(r).MissingCount(), 0u);
      EXPECT_EQ(cc.cluster().worker_average(r), cc.cluster().server_mean());
    }
  }
}

}  // namespace
}  // namespace dblp
