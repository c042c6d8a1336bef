// The simulator at a size this machine cannot run as processes: 64 workers
// x 200 iterations of a 1 MiB gradient under microbursts and base loss, in
// one process (sim/memory_cluster.h, the servers' own ServerIteration).
// Checked: the protocol's promises every round (delivered >= 1 - p in both
// directions, the mean exact for what arrived), and determinism: two runs
// with the same seed give identical rows, means and counters. The run's
// time is printed, never asserted (docs/ARCHITECTURE.md quotes it).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dblp/round/stop_decision.h"
#include "sim/memory_cluster.h"

namespace dblp {
namespace {

constexpr uint32_t kWorkers = 64;
constexpr uint64_t kFloats = 262144;  // 1 MiB
constexpr uint64_t kIterations = 200;

ClusterConfig ScaleConfig() {
  ClusterConfig c;
  c.num_workers = kWorkers;
  c.gradient_floats = kFloats;
  c.seed = 20;
  c.policy.kind = PolicyKind::kDblp;
  c.policy.p_low = 0.008;
  c.policy.p_high = 0.408;
  c.policy.clr.freq = 10;
  c.push_fill = FillMode::kRescale;
  c.push_loss = LossSpec{LossKind::kBernoulli, 0.01};
  c.bcast_loss = LossSpec{LossKind::kBernoulli, 0.01};
  c.bursts = ParseBurstIterations("20,95,160", 0.7);
  return c;
}

// What a run leaves: every row, a digest of every mean, the counters.
struct RunTrace {
  std::vector<IterationRecord> rows;
  std::vector<uint64_t> mean_digests;
  ClusterCounters counters;
  double seconds = 0;
};

uint64_t Digest(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

RunTrace RunScale() {
  const auto start = std::chrono::steady_clock::now();
  MemoryCluster cluster(ScaleConfig());
  const uint32_t n = cluster.layout().num_chunks();
  // One gradient per worker, nudged each iteration (a few floats, so the
  // norm moves and the CLR detector has something to see).
  std::vector<std::vector<float>> grads(kWorkers);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    grads[w].resize(kFloats);
    for (uint64_t i = 0; i < kFloats; ++i) {
      grads[w][i] = static_cast<float>((i * 7 + w * 13) % 97) / 97.0f - 0.5f;
    }
  }
  RunTrace t;
  for (uint64_t it = 0; it < kIterations; ++it) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      grads[w][it % kFloats] += it % 40 < 20 ? 4.0f : -4.0f;
    }
    const IterationOutcome out = cluster.RunIteration(grads);
    for (uint32_t w = 0; w < kWorkers; ++w) {
      const IterationRecord& r = out.workers[w];
      EXPECT_GE(cluster.push_arrived(w).Count(),
                StopThreshold(n, out.push_tolerance.p))
          << "push of worker " << w << " in iteration " << it;
      EXPECT_GE(cluster.bcast_arrived(w).Count(),
                StopThreshold(n, out.bcast_tolerance.p))
          << "broadcast to worker " << w << " in iteration " << it;
      t.rows.push_back(r);
    }
    t.mean_digests.push_back(Digest(cluster.server_mean()));
  }
  t.counters = cluster.counters();
  t.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return t;
}

bool SameRow(const IterationRecord& a, const IterationRecord& b) {
  return a.iteration == b.iteration && a.rank == b.rank &&
         a.send_latency_us == b.send_latency_us &&
         a.bcast_latency_us == b.bcast_latency_us && a.passes == b.passes &&
         a.bcast_passes == b.bcast_passes && a.packets_sent == b.packets_sent &&
         a.packets_resent == b.packets_resent &&
         a.delivered_fraction == b.delivered_fraction && a.p == b.p &&
         a.critical == b.critical && a.grad_norm == b.grad_norm &&
         a.burst == b.burst;
}

TEST(SimScale, SixtyFourWorkersTwoHundredIterationsDeterministic) {
  const RunTrace a = RunScale();
  const RunTrace b = RunScale();
  std::printf(
      "sim: %u workers x %llu iterations of %llu floats: %.1f s and "
      "%.1f s\n",
      kWorkers, static_cast<unsigned long long>(kIterations),
      static_cast<unsigned long long>(kFloats), a.seconds, b.seconds);
  ASSERT_EQ(a.rows.size(), kWorkers * kIterations);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    ASSERT_TRUE(SameRow(a.rows[i], b.rows[i])) << "row " << i;
  }
  EXPECT_EQ(a.mean_digests, b.mean_digests);
  EXPECT_EQ(a.counters.accepted, b.counters.accepted);
  EXPECT_EQ(a.counters.injected_drops, b.counters.injected_drops);
  EXPECT_EQ(a.counters.control_messages, b.counters.control_messages);
  // The bursts hit, and the policy used both of its tolerances.
  bool burst = false, low = false, high = false;
  for (const IterationRecord& r : a.rows) {
    burst |= r.burst;
    low |= r.p == 0.008;
    high |= r.p == 0.408;
  }
  EXPECT_TRUE(burst);
  EXPECT_TRUE(low);
  EXPECT_TRUE(high);
}

}  // namespace
}  // namespace dblp
