// Lanes: the chunk ranges, the STOP decided together by the lanes' lcores
// (exact under concurrency), the merged BITMAP answer, and a closed push
// gathered over lanes as every server gathers it (ClosedPushSides).
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

#include "dblp/job/server_job.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

TEST(ChunkRanges, RangesAreWordAlignedDisjointAndCoverEveryChunk) {
  for (uint32_t n : {1u, 46u, 64u, 65u, 723u, 18051u}) {
    for (uint32_t s : {1u, 2u, 3u, 4u, 8u}) {
      const ChunkRanges map(n, s);
      uint32_t next = 0;
      for (uint32_t k = 0; k < s; ++k) {
        EXPECT_EQ(map.begin(k), next);
        if (map.begin(k) < n) {  // empty shards start at n
          EXPECT_EQ(map.begin(k) % 64, 0u) << "n=" << n << " s=" << s;
        }
        next = map.end(k);
        for (uint32_t seq = map.begin(k); seq < map.end(k); ++seq) {
          ASSERT_EQ(map.RangeOf(seq), k);
        }
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_THROW(ChunkRanges(10, 0), std::invalid_argument);
}

TEST(ChunkRanges, FilterKeepsTheOrder) {
  const ChunkRanges map(200, 2);  // [0,128) [128,200)
  const std::vector<uint32_t> order{150, 3, 199, 127, 128, 0};
  std::vector<uint32_t> out;
  map.Filter(order, 0, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{3, 127, 0}));
  map.Filter(order, 1, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{150, 199, 128}));
}

std::vector<uint8_t> Frame(uint32_t session, uint32_t round, uint32_t seq,
                           const ChunkLayout& layout, uint16_t sender = 0) {
  DataHeader h{FrameType::kPush,
               session,
               sender,
               static_cast<uint16_t>(layout.Length(seq)),
               round,
               seq};
  std::vector<uint8_t> f(kDataHeaderBytes + h.payload_len, 0);
  EncodeDataHeader(h, f.data());
  return f;
}

struct Collect {
  std::vector<ControlRequest> posted;
  void Post(const ControlRequest& r) { posted.push_back(r); }
};

// Two lanes' lcores receive one round's chunks concurrently, each its own
// range. Exactly one STOP per round, never before the threshold, and every
// round that reaches it is stopped.
TEST(StopGroup, ExactlyOneStopNeverEarlyUnderConcurrency) {
  const ChunkLayout layout(uint64_t{1000} * 64, 64);  // 1000 chunks
  const ChunkRanges map(layout.num_chunks(), 2);
  const double p = 0.3;
  const uint32_t threshold = StopThreshold(layout.num_chunks(), p);
  for (int trial = 0; trial < 200; ++trial) {
    StopGroup group;
    std::vector<std::unique_ptr<ReceiveSide>> sides;
    for (uint16_t s = 0; s < 2; ++s) {
      ReceiverConfig rc{7,      FrameType::kPush, 0,
                        layout, map.begin(s),     map.end(s)};
      sides.push_back(std::make_unique<ReceiveSide>(
          ReceiveSideConfig{rc, Direction::kPush, 0, &group, s}));
      group.Add(&sides.back()->receiver());
    }
    const uint32_t round = 2 * trial;
    for (auto& s : sides) s->Begin(round, p, 0, 0, 0);
    // Each lane gets just enough that only together they pass the
    // threshold, delivered in small bursts.
    const uint32_t per_shard[2] = {threshold / 2, threshold - threshold / 2};
    std::atomic<int> stops{0};
    std::atomic<uint32_t> received_at_stop{0};
    auto run = [&](uint16_t s) {
      Collect out;
      uint32_t sent = 0;
      uint64_t gen = 0;
      while (sent < per_shard[s]) {
        const uint32_t k = std::min(7u, per_shard[s] - sent);
        for (uint32_t i = 0; i < k; ++i) {
          const auto f = Frame(7, round, map.begin(s) + sent + i, layout);
          ASSERT_EQ(sides[s]->OnFrame(f.data(), f.size(),
                                      [](const DataHeader&, const uint8_t*) {}),
                    Verdict::kAccepted);
        }
        sent += k;
        ++gen;
        sides[s]->Step(0, RxProgress{true, gen, gen}, out);
      }
      for (const auto& r : out.posted) {
        if (const auto* st = std::get_if<StopRequest>(&r)) {
          stops.fetch_add(1);
          received_at_stop.store(st->received);
        }
      }
    };
    std::thread a(run, 0), b(run, 1);
    a.join();
    b.join();
    ASSERT_EQ(stops.load(), 1) << "trial " << trial;
    EXPECT_GE(received_at_stop.load(), threshold);
    EXPECT_TRUE(sides[0]->stopped());
    EXPECT_TRUE(sides[1]->stopped());
  }
}

TEST(StopGroup, ALaneThatHasNotBegunCountsNothing) {
  const ChunkLayout layout(uint64_t{256} * 64, 64);
  const ChunkRanges map(layout.num_chunks(), 2);
  StopGroup group;
  ReceiverRound a(ReceiverConfig{1, FrameType::kPush, 0, layout, 0, 128});
  ReceiverRound b(ReceiverConfig{1, FrameType::kPush, 0, layout, 128, 256});
  group.Add(&a);
  group.Add(&b);
  a.Begin(2, 0.0);
  b.Begin(0, 0.0);  // still on the previous round
  for (uint32_t seq = 128; seq < 256; ++seq) {
    const auto f = Frame(1, 0, seq, layout);
    DataHeader h;
    const uint8_t* pl;
    b.OnFrame(f.data(), f.size(), &h, &pl);
  }
  EXPECT_EQ(group.Received(2), 0u);
  EXPECT_EQ(group.Received(0), 128u);
}

TEST(StopGroup, TheStopWordNeverMovesBackToAnOlderRound) {
  const ChunkLayout layout(uint64_t{128} * 64, 64);
  StopGroup group;
  ReceiverRound a(ReceiverConfig{1, FrameType::kPush, 0, layout, 0, 128});
  group.Add(&a);
  a.Begin(4, 0.0);
  uint32_t total = 0;
  const StopRule zero{0, 0, 0};  // every count closes
  EXPECT_EQ(group.Poll(4, zero, 0, &total), StopTrigger::kThreshold);
  EXPECT_TRUE(group.taken(4));
  // A lagging shard still deciding round 2 (and one across the u32 wrap)
  // must not take the word back.
  EXPECT_EQ(group.Poll(2, zero, 0, &total), StopTrigger::kNone);
  EXPECT_TRUE(group.taken(4));
  EXPECT_EQ(group.Poll(0xFFFFFFFEu, zero, 0, &total), StopTrigger::kNone);
  EXPECT_TRUE(group.taken(4));
  // The next round is handed out once.
  EXPECT_EQ(group.Poll(6, zero, 0, &total), StopTrigger::kThreshold);
  EXPECT_EQ(group.Poll(6, zero, 0, &total), StopTrigger::kNone);
}

TEST(StopGroup, MisroutedFramesAreCountedNotAccepted) {
  const ChunkLayout layout(uint64_t{256} * 64, 64);
  ReceiverRound a(ReceiverConfig{1, FrameType::kPush, 0, layout, 0, 128});
  a.Begin(0, 0.0);
  const auto f = Frame(1, 0, 200, layout);
  DataHeader h;
  const uint8_t* pl;
  EXPECT_EQ(a.OnFrame(f.data(), f.size(), &h, &pl), Verdict::kMisrouted);
  EXPECT_EQ(a.received(), 0u);
  EXPECT_EQ(a.verdict_count(Verdict::kMisrouted), 1u);
}

// Two workers' pushes over two lanes ([0, 128) and [128, 200)): the
// gathered push of each worker is the union of its lanes' chunks, its STOP
// the later lane's, and the push's first chunk the earliest side's; the
// expected values are written out, not computed by the code under test.
TEST(ClosedPushSides, GathersEachWorkersLanes) {
  const ChunkLayout layout(uint64_t{200} * 64, 64);
  const ChunkRanges lanes(layout.num_chunks(), 2);
  std::vector<std::unique_ptr<ReceiveSide>> sides;  // [w * 2 + lane]
  std::vector<std::vector<const ReceiveSide*>> by_worker(2);
  for (uint16_t w = 0; w < 2; ++w) {
    for (uint16_t k = 0; k < 2; ++k) {
      ReceiveSideConfig c = PushReceiveConfig(7, w, layout);
      c.receiver.seq_begin = lanes.begin(k);
      c.receiver.seq_end = lanes.end(k);
      c.lane = k;
      sides.push_back(std::make_unique<ReceiveSide>(c));
      // p so high one chunk is a lane's threshold: each side STOPs at the
      // Step that sees its first chunks.
      sides.back()->Begin(0, 0.999, 0, 0, 0);
      by_worker[w].push_back(sides.back().get());
    }
  }
  // (worker, lane, its chunks, when its Step saw them): worker 1's lane 0
  // gets nothing and never STOPs.
  const struct {
    uint16_t w, k;
    std::vector<uint32_t> seqs;
    uint64_t at;
  } arrivals[] = {{0, 0, {1, 5}, 500}, {0, 1, {130}, 300}, {1, 1, {199}, 900}};
  Collect out;
  uint64_t gen = 0;
  for (const auto& a : arrivals) {
    ReceiveSide& side = *sides[a.w * 2 + a.k];
    for (const uint32_t seq : a.seqs) {
      const auto f = Frame(7, 0, seq, layout, a.w);
      ASSERT_EQ(side.OnFrame(f.data(), f.size(),
                             [](const DataHeader&, const uint8_t*) {}),
                Verdict::kAccepted);
    }
    ++gen;
    side.Step(a.at, RxProgress{true, gen, gen}, out);
    ASSERT_TRUE(side.stopped());
  }
  EXPECT_FALSE(sides[1 * 2 + 0]->stopped());
  for (auto& side : sides) side->Close();
  ClosedPushSides gathered;
  gathered.Gather(2, layout.num_chunks(), [&](uint32_t w) {
    return std::span<const ReceiveSide* const>(by_worker[w]);
  });
  const ClosedPush c = gathered.View(5000, true);
  ASSERT_EQ(c.arrived.size(), 2u);
  std::vector<uint32_t> got0, got1;
  c.arrived[0].ForEachSet([&](uint32_t i) { got0.push_back(i); });
  c.arrived[1].ForEachSet([&](uint32_t i) { got1.push_back(i); });
  EXPECT_EQ(got0, (std::vector<uint32_t>{1, 5, 130}));
  EXPECT_EQ(got1, (std::vector<uint32_t>{199}));
  EXPECT_EQ(c.arrived[0].size(), 200u);
  EXPECT_EQ(c.stop_ns[0], 500u);  // the later of its lanes' STOPs
  EXPECT_EQ(c.stop_ns[1], 900u);
  EXPECT_EQ(c.first_ns, 300u);  // worker 0's lane 1
  EXPECT_EQ(c.now_ns, 5000u);
  EXPECT_TRUE(c.burst);
  // Gathered again (the next iteration) into the same storage: nothing of
  // the first stays.
  for (auto& side : sides) side->Begin(2, 0.0, 0, 0, 0);
  gathered.Gather(2, layout.num_chunks(), [&](uint32_t w) {
    return std::span<const ReceiveSide* const>(by_worker[w]);
  });
  EXPECT_EQ(gathered.arrived()[0].Count(), 0u);
  EXPECT_EQ(gathered.first_ns(), 0u);
}

}  // namespace
}  // namespace dblp
