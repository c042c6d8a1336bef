// The second stage of a poll loop's idle back-off.
//
// A poll loop sleeps at most --idle_sleep_us (tens of microseconds) when
// idle, so that a round's next frame is seen at once. Between rounds a
// trainer computes for milliseconds to seconds, and a loop that wakes every
// 20 us all that time takes a share of the cores the trainer needs. Once
// idle for longer than `after_us`, the loop may sleep up to `sleep_us`: it
// sees the next round's first frame that much later, once per round, and
// otherwise sleeps through the trainer's step.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dblp {

struct DeepIdle {
  uint32_t after_us = 0;  // idle this long (summed sleeps) before deepening
  uint32_t sleep_us = 0;  // the longest sleep then; 0 = no second stage

  // The longest sleep after `idle_us` of idleness, for a loop whose first
  // stage sleeps at most `cap_us`.
  constexpr uint32_t Cap(uint64_t idle_us, uint32_t cap_us) const {
    return sleep_us > cap_us && idle_us >= after_us ? sleep_us : cap_us;
  }
};

}  // namespace dblp
