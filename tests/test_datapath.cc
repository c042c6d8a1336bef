// The DPDK side's shared pieces (src/dpdk/port/datapath.h,
// src/dpdk/server/server_lcore.h, src/dpdk/runtime/numa_placement.h) under a
// real EAL (--no-huge, no port): typed rings, the pacer's watchdog, the lcores'
// phase barrier, NUMA placement.
#include <gtest/gtest.h>
#include <rte_eal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "eal_test_env.h"
#include "port/datapath.h"
#include "runtime/eal_app.h"
#include "runtime/numa_placement.h"
#include "server/server_lcore.h"

namespace dblp {
namespace {

TEST(TypedRing, CarriesEveryKindByValue) {
  TypedRing<ControlRequest> ring("test_req", 64, /*multi_producer=*/true);
  ring.Push(ProbeRequest{3, Direction::kBroadcast, 9, 2, 1});
  ring.Push(BitmapRequest{1, Direction::kPush, 2, 7, 0b101});
  ring.Push(FinishRequest{false});
  ControlRequest r;
  ASSERT_TRUE(ring.Pop(&r));
  EXPECT_EQ(std::get<ProbeRequest>(r).lane, 1u);
  EXPECT_EQ(std::get<ProbeRequest>(r).pass, 2u);
  ASSERT_TRUE(ring.Pop(&r));
  EXPECT_EQ(std::get<BitmapRequest>(r).askers, 0b101u);
  EXPECT_EQ(std::get<BitmapRequest>(r).side, 2u);
  ASSERT_TRUE(ring.Pop(&r));
  EXPECT_FALSE(std::get<FinishRequest>(r).ok);
  EXPECT_FALSE(ring.Pop(&r));
}

// A full ring refuses the message and says why; the loops end the job
// with that text (issue #35: it called std::exit from the pushing thread).
TEST(TypedRing, AFullRingRefusesAndRemembersInsteadOfExiting) {
  TypedRing<ControlRequest> ring("test_full", 4);  // holds 3
  EXPECT_EQ(ring.Overflow(), "");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ring.Push(FinishRequest{true}));
  EXPECT_FALSE(ring.Push(FinishRequest{false}));
  EXPECT_NE(ring.Overflow().find("control ring test_full was full"),
            std::string::npos);
  ControlRequest r;
  int n = 0;
  while (ring.Pop(&r)) ++n;
  EXPECT_EQ(n, 3);
  EXPECT_NE(ring.Overflow(), "");  // the job still ends: a message is lost
}

// Idle turns every 0.1 ms after `from` up to `to` (a running loop turns
// far more often than its timeout); the last turn's step, or the first
// that is not kContinue.
RoundPacer::Step IdleTurns(RoundPacer& p, uint64_t from, uint64_t to,
                           uint32_t patience = 1) {
  RoundPacer::Step s = RoundPacer::Step::kContinue;
  for (uint64_t t = from + 100'000; t <= to; t += 100'000) {
    s = p.After(false, false, t, patience);
    if (s != RoundPacer::Step::kContinue) break;
  }
  return s;
}

// A worker waiting for the server to open the next round allows two
// timeouts (the server may wait one for a silent member); the text says
// the limit that expired.
TEST(RoundPacer, PatienceMultipliesTheTimeoutForThatWaitOnly) {
  RoundPacer p(0, 0, /*timeout_ms=*/2, nullptr);
  const uint64_t t0 = 10'000'000'000;
  p.Start(t0);
  EXPECT_EQ(IdleTurns(p, t0, t0 + 3'000'000, 2), RoundPacer::Step::kContinue);
  EXPECT_EQ(p.After(false, false, t0 + 3'000'000, 1),
            RoundPacer::Step::kTimedOut);
  EXPECT_EQ(p.limit_ms(), 2u);
  EXPECT_EQ(IdleTurns(p, t0 + 3'000'000, t0 + 4'100'000, 2),
            RoundPacer::Step::kTimedOut);
  EXPECT_EQ(p.limit_ms(), 4u);
}

// A process stopped (SIGSTOP) past its timeout is not its peer's silence:
// its first turn after waking does not time out, and the next timeout
// counts from that turn; a loop that kept turning still times out.
TEST(RoundPacer, ATurnAfterTheProcessStoppedGetsAWholeTimeout) {
  RoundPacer p(0, 0, /*timeout_ms=*/2, nullptr);
  const uint64_t t0 = 10'000'000'000;
  p.Start(t0);
  EXPECT_EQ(IdleTurns(p, t0, t0 + 1'000'000), RoundPacer::Step::kContinue);
  const uint64_t woke = t0 + 60'000'000;  // stopped for 59 ms
  EXPECT_EQ(p.After(false, false, woke), RoundPacer::Step::kContinue);
  EXPECT_EQ(IdleTurns(p, woke, woke + 1'900'000), RoundPacer::Step::kContinue);
  EXPECT_EQ(IdleTurns(p, woke + 1'900'000, woke + 2'200'000),
            RoundPacer::Step::kTimedOut);
  // Turning all along, the same silence times out.
  RoundPacer q(0, 0, 2, nullptr);
  q.Start(t0);
  EXPECT_EQ(IdleTurns(q, t0, t0 + 60'000'000), RoundPacer::Step::kTimedOut);
}

TEST(DeepIdle, DeepensOnlyAfterItsIdleTimeAndNeverShortens) {
  const DeepIdle d{2000, 500};
  EXPECT_EQ(d.Cap(0, 20), 20u);
  EXPECT_EQ(d.Cap(1999, 20), 20u);
  EXPECT_EQ(d.Cap(2000, 20), 500u);
  EXPECT_EQ(DeepIdle{}.Cap(uint64_t{1} << 40, 20), 20u);  // off
  EXPECT_EQ((DeepIdle{0, 10}.Cap(100, 20)), 20u);  // never below stage one
}

TEST(RoundPacer, TimesOutOnlyWithoutProgressAnywhere) {
  std::atomic<bool> quit{false};
  std::atomic<uint64_t> shared{0};
  RoundPacer a(0, 0, /*timeout_ms=*/1, &quit, &shared);
  RoundPacer b(0, 0, 1, &quit, &shared);
  const uint64_t t0 = 10'000'000'000;
  a.Start(t0);
  b.Start(t0);
  // Lcore b keeps working; idle lcore a is not stuck.
  b.After(true, true, t0 + 3'000'000);
  EXPECT_EQ(IdleTurns(a, t0, t0 + 3'500'000), RoundPacer::Step::kContinue);
  // Nothing since: a times out a timeout after b's last progress.
  EXPECT_EQ(IdleTurns(a, t0 + 3'500'000, t0 + 4'200'000),
            RoundPacer::Step::kTimedOut);
  // Another lcore's progress stamped after our clock read is no timeout
  // (an unsigned underflow once read it as one).
  a.Start(t0 + 8'900'000);
  shared.store(t0 + 9'000'000);
  EXPECT_EQ(a.After(false, false, t0 + 8'999'000), RoundPacer::Step::kContinue);
  EXPECT_EQ(IdleTurns(a, t0 + 8'999'000, t0 + 10'500'000),
            RoundPacer::Step::kTimedOut);
  quit.store(true);
  EXPECT_EQ(a.After(false, false, t0 + 10'500'000), RoundPacer::Step::kQuit);
}

TEST(JobSync, PhasesStayInStepAndAFailureReleasesEveryone) {
  std::atomic<bool> quit{false};
  JobSync job(3, &quit);
  std::atomic<int> phase_sum[200] = {};
  auto run = [&] {
    for (int p = 0; p < 200; ++p) {
      phase_sum[p].fetch_add(1);
      ASSERT_TRUE(job.Barrier());
      // Everyone finished phase p before anyone starts p + 1.
      ASSERT_EQ(phase_sum[p].load(), 3);
    }
  };
  std::thread t1(run), t2(run);
  run();
  t1.join();
  t2.join();

  std::thread waiter([&] { EXPECT_FALSE(job.Barrier()); });
  usleep(20000);
  job.Fail("lcore 2 timed out");
  waiter.join();
  EXPECT_TRUE(job.failed());
  EXPECT_EQ(job.failure(), "lcore 2 timed out");
  job.Fail("a later failure");  // the first one is kept
  EXPECT_EQ(job.failure(), "lcore 2 timed out");
}

TEST(NumaPlacement, BuffersGoToAnExistingNodeOnly) {
  std::vector<float> buf(1 << 20, 1.0f);
  std::string error;
  EXPECT_TRUE(PlaceOnNode(buf.data(), buf.size() * sizeof(float),
                          static_cast<int>(rte_socket_id()), &error))
      << error;
  EXPECT_EQ(buf[12345], 1.0f);  // contents kept
  EXPECT_FALSE(PlaceOnNode(buf.data(), 4096, 4000, &error));
  EXPECT_NE(error.find("no NUMA node 4000"), std::string::npos) << error;
}

}  // namespace
}  // namespace dblp

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  dblp::testing_env::InitTestEal(argv[0], "datapath", {}, "128");
  const int rc = RUN_ALL_TESTS();
  rte_eal_cleanup();
  return rc;
}
