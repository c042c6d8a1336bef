// The re-synchronisation schedule the server and the workers derive
// independently: which protocol iterations resync, and the training step
// every other one runs.
#include <gtest/gtest.h>

#include <vector>

#include "dblp/policy/resync.h"

namespace dblp {
namespace {

TEST(ResyncSchedule, NeverWhenDisabled) {
  const ResyncSchedule s(0);
  for (uint64_t it = 0; it < 100; ++it) {
    EXPECT_FALSE(s.IsResync(it));
    EXPECT_EQ(s.TrainStep(it), it);
  }
  EXPECT_EQ(s.ProtocolIterations(37), 37u);
}

TEST(ResyncSchedule, EveryKStepsOneResyncAndEveryStepRunsOnce) {
  for (uint32_t k : {1u, 2u, 3u, 10u}) {
    const ResyncSchedule s(k);
    for (uint64_t steps : {1u, 2u, 9u, 10u, 11u, 30u, 31u}) {
      const uint64_t n = s.ProtocolIterations(steps);
      std::vector<uint64_t> trained;
      uint64_t since_resync = 0, resyncs = 0;
      for (uint64_t it = 0; it < n; ++it) {
        if (s.IsResync(it)) {
          EXPECT_EQ(since_resync, k) << "k " << k << " it " << it;
          EXPECT_EQ(s.TrainStep(it), trained.size());
          since_resync = 0;
          ++resyncs;
        } else {
          trained.push_back(s.TrainStep(it));
          ++since_resync;
        }
      }
      ASSERT_EQ(trained.size(), steps) << "k " << k;
      for (uint64_t i = 0; i < steps; ++i) EXPECT_EQ(trained[i], i);
      EXPECT_EQ(resyncs, (steps - 1) / k);
      EXPECT_FALSE(s.IsResync(n - 1)) << "no trailing resync";
    }
  }
}

TEST(ResyncSchedule, KThreeRunsTheDocumentedSequence) {
  const ResyncSchedule s(3);
  const bool want[] = {false, false, false, true, false, false, false, true};
  for (uint64_t it = 0; it < 8; ++it) EXPECT_EQ(s.IsResync(it), want[it]);
  EXPECT_EQ(s.TrainStep(4), 3u);
  EXPECT_EQ(s.TrainStep(7), 6u);
}

}  // namespace
}  // namespace dblp
