// ServerIteration over server shards (phase_link.h): S iterations, each
// over one partition's local layout and linked by one phase, decide what
// one iteration over the whole layout decides: the same mean bits
// partition by partition (the clip share counts the whole model), the
// same norm bits and the same p every iteration; a shard that never
// reports ends the others' iteration naming it.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "dblp/job/phase_link.h"
#include "dblp/job/server_iteration.h"
#include "dblp/job/server_job.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/wire/chunking.h"

namespace dblp {
namespace {

constexpr uint32_t kWorkers = 3;
constexpr uint32_t kPayload = 1440;  // 360 floats a chunk
constexpr uint32_t kChunks = 333;    // 6 norm blocks, the last short

ServerJobSettings Settings() {
  ServerJobSettings s;
  s.policy.kind = PolicyKind::kDblp;
  s.policy.p_low = 0.01;
  s.policy.p_high = 0.3;
  s.policy.clr.freq = 2;
  s.policy.clr.eta = 0.2;
  s.push_fill = FillMode::kZero;
  s.clip_norm = 3.0;  // clips the jumps: the share must be the model's
  return s;
}

// Worker w's gradient of iteration `it`; the norm jumps every 5th.
std::vector<float> Gradient(uint32_t w, uint64_t it, size_t floats) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * it + w));
  std::normal_distribution<float> d(0.0f, it % 5 == 4 ? 0.05f : 0.004f);
  std::vector<float> g(floats);
  for (float& x : g) x = d(rng);
  return g;
}

// Whether worker w's global chunk c arrives in iteration `it` (some lost).
bool Arrives(uint32_t w, uint64_t it, uint32_t c) {
  return (c * 7 + w * 3 + it) % 11 != 0;
}

// Feeds every arriving chunk of [first, first + n) global chunks into `si`
// (local seqs from 0).
void Push(ServerIteration& si, const ChunkLayout& whole, uint64_t it,
          uint32_t first, uint32_t n) {
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const auto g = Gradient(w, it, whole.total_bytes() / 4);
    const auto* bytes = reinterpret_cast<const uint8_t*>(g.data());
    for (uint32_t i = 0; i < n; ++i) {
      if (!Arrives(w, it, first + i)) continue;
      si.reducer().Accumulate(w, i, bytes + whole.Offset(first + i));
    }
  }
}

struct Step {
  uint64_t norm_bits = 0;
  double next_p = 0;
  bool critical = false;
  std::vector<float> mean;
};

std::vector<Step> RunWhole(const ChunkLayout& whole, uint64_t iters) {
  const ServerJobSettings s = Settings();
  ServerIteration si(s, TolerancePolicy::Create(s.policy), whole, kWorkers, 9,
                     "whole");
  std::vector<Step> out;
  for (uint64_t it = 0; it < iters; ++it) {
    Push(si, whole, it, 0, whole.num_chunks());
    const ReducedPush r = si.Reduce(it, 1000);
    EXPECT_EQ(r.failure, "");
    out.push_back({std::bit_cast<uint64_t>(r.norm),
                   r.next.p,
                   r.next.critical,
                   {si.mean().begin(), si.mean().end()}});
  }
  return out;
}

// S shards, each on its own thread, through one InProcessPhase.
std::vector<Step> RunSharded(const ChunkLayout& whole, uint32_t S,
                             uint64_t iters) {
  const ChunkRanges map(whole.num_chunks(), S);
  std::vector<uint32_t> blocks;
  for (uint32_t k = 0; k < S; ++k) {
    blocks.push_back(PartitionNormBlocks(map.end(k) - map.begin(k)));
  }
  const ServerJobSettings base = Settings();
  InProcessPhase phase(TolerancePolicy::Create(base.policy), 0, blocks,
                       std::chrono::seconds(10));
  std::vector<std::vector<Step>> per(S);
  std::vector<std::thread> threads;
  for (uint32_t k = 0; k < S; ++k) {
    threads.emplace_back([&, k] {
      ServerJobSettings s = base;
      s.phase = &phase.link(k);
      s.model_floats = whole.total_bytes() / 4;
      const uint32_t first = map.begin(k), n = map.end(k) - map.begin(k);
      const uint64_t end = std::min(
          whole.total_bytes(), whole.Offset(first) + uint64_t{n} * kPayload);
      const ChunkLayout local(end - whole.Offset(first), kPayload);
      ServerIteration si(s, TolerancePolicy::Create(s.policy), local, kWorkers,
                         9, "shard");
      for (uint64_t it = 0; it < iters; ++it) {
        Push(si, whole, it, first, n);
        const ReducedPush r = si.Reduce(it, 1000);
        EXPECT_EQ(r.failure, "");
        per[k].push_back({std::bit_cast<uint64_t>(r.norm),
                          r.next.p,
                          r.next.critical,
                          {si.mean().begin(), si.mean().end()}});
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<Step> out;
  for (uint64_t it = 0; it < iters; ++it) {
    Step s = per[0][it];
    s.mean.clear();
    for (uint32_t k = 0; k < S; ++k) {
      EXPECT_EQ(per[k][it].norm_bits, per[0][it].norm_bits);
      EXPECT_EQ(per[k][it].next_p, per[0][it].next_p);
      s.mean.insert(s.mean.end(), per[k][it].mean.begin(),
                    per[k][it].mean.end());
    }
    out.push_back(std::move(s));
  }
  return out;
}

TEST(ServerIterationShards, SplitDecidesWhatOneServerDecides) {
  const ChunkLayout whole(uint64_t{kChunks} * kPayload - 16, kPayload);
  constexpr uint64_t kIters = 12;
  const std::vector<Step> one = RunWhole(whole, kIters);
  // The p must move both ways, or the comparison proves little.
  bool low = false, high = false;
  for (const Step& s : one) (s.next_p < 0.1 ? low : high) = true;
  ASSERT_TRUE(low && high);
  for (uint32_t S : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(S) + " shards");
    const std::vector<Step> split = RunSharded(whole, S, kIters);
    for (uint64_t it = 0; it < kIters; ++it) {
      EXPECT_EQ(split[it].norm_bits, one[it].norm_bits) << "iteration " << it;
      EXPECT_EQ(split[it].next_p, one[it].next_p) << "iteration " << it;
      EXPECT_EQ(split[it].critical, one[it].critical) << "iteration " << it;
      ASSERT_EQ(split[it].mean.size(), one[it].mean.size());
      EXPECT_EQ(std::memcmp(split[it].mean.data(), one[it].mean.data(),
                            one[it].mean.size() * 4),
                0)
          << "iteration " << it;
    }
  }
}

TEST(ServerIterationShards, MissingShardEndsTheIterationNamingIt) {
  const ChunkLayout whole(uint64_t{kChunks} * kPayload, kPayload);
  const ChunkRanges map(whole.num_chunks(), 3);
  const ServerJobSettings base = Settings();
  InProcessPhase phase(TolerancePolicy::Create(base.policy), 0,
                       {PartitionNormBlocks(map.end(0)),
                        PartitionNormBlocks(map.end(1) - map.begin(1)),
                        PartitionNormBlocks(map.end(2) - map.begin(2))},
                       std::chrono::milliseconds(200));
  ServerJobSettings s = base;
  s.phase = &phase.link(0);
  s.model_floats = whole.total_bytes() / 4;
  const ChunkLayout local(uint64_t{map.end(0)} * kPayload, kPayload);
  ServerIteration si(s, TolerancePolicy::Create(s.policy), local, kWorkers, 9,
                     "shard0");
  Push(si, whole, 0, 0, map.end(0));
  const ReducedPush r = si.Reduce(0, 1000);
  EXPECT_NE(r.failure.find("server shards 1, 2 sent no partial of iteration 0"),
            std::string::npos)
      << r.failure;
}

}  // namespace
}  // namespace dblp

namespace dblp {
namespace {

// Issue #35: a stalled round under --on_worker_loss=continue loses the
// workers it still waits for, once each, unless it waits for every live
// one (the link's or the server's stall); under abort it always ends.
TEST(ServerJobLoseSilent, LosesTheWaitedForOnlyWhenOthersAreDone) {
  ServerJobSettings s = Settings();
  s.continue_on_worker_loss = true;
  const ChunkLayout layout(uint64_t{kChunks} * kPayload, kPayload);
  ServerJob job(s, TolerancePolicy::Create(s.policy), layout, {"a", "b", "c"},
                kDefaultSendOrder, 9, "test");
  std::vector<uint32_t> dropped;
  // Every live worker waited for: not a member's silence.
  EXPECT_EQ(
      job.LoseSilent(
          0, false, 100, [](uint32_t) { return true; }, "stalled", &dropped),
      "stalled");
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(job.live_count(), 3u);
  // Worker 2 alone is waited for: lost, told once, the round goes on.
  EXPECT_EQ(job.LoseSilent(
                0, false, 100, [](uint32_t w) { return w == 2; }, "stalled",
                &dropped),
            "");
  EXPECT_EQ(dropped, std::vector<uint32_t>{2});
  EXPECT_FALSE(job.alive(2));
  // Another lcore naming it too, after: nobody left to wait for.
  EXPECT_EQ(job.LoseSilent(
                0, false, 100, [](uint32_t w) { return w == 2; }, "stalled",
                &dropped),
            "");
  EXPECT_EQ(dropped.size(), 1u);
  // Of the two left, both waited for: the job's own stall.
  EXPECT_EQ(
      job.LoseSilent(
          1, true, 100, [](uint32_t) { return true; }, "stalled", &dropped),
      "stalled");

  s.continue_on_worker_loss = false;
  ServerJob strict(s, TolerancePolicy::Create(s.policy), layout,
                   {"a", "b", "c"}, kDefaultSendOrder, 9, "test");
  EXPECT_EQ(strict.LoseSilent(
                0, false, 100, [](uint32_t w) { return w == 2; }, "stalled",
                &dropped),
            "stalled");
  EXPECT_TRUE(strict.alive(2));
}

}  // namespace
}  // namespace dblp
