// The idle back-off of every poll loop (the DPDK lcores, the kernel-UDP
// threads, the server's lcore barrier): after `spin_polls` empty polls
// (each a CPU pause, or a sched_yield for a loop whose own threads may
// share its core), sleeps of 1, 2, 4 ... microseconds up to
// `max_sleep_us`, then DeepIdle's second stage. Any work resets it. Poll
// mode (max_sleep_us = 0) never sleeps.
#pragma once

#include <cstdint>

#include "dblp/base/deep_idle.h"

namespace dblp {

class IdleBackoff {
 public:
  enum class Spin : uint8_t { kPause, kYield };
  IdleBackoff(uint32_t spin_polls, uint32_t max_sleep_us, DeepIdle deep = {},
              Spin spin = Spin::kPause)
      : spin_polls_(spin_polls),
        max_sleep_us_(max_sleep_us),
        deep_(deep),
        spin_(spin) {}
  void Work() {
    empty_ = 0;
    sleep_us_ = 1;
    idle_us_ = 0;
  }
  void Idle();
  uint64_t sleeps() const { return sleeps_; }

 private:
  void SpinOnce() const;

  uint32_t spin_polls_;
  uint32_t max_sleep_us_;
  DeepIdle deep_;
  Spin spin_;
  uint32_t empty_ = 0;
  uint32_t sleep_us_ = 1;
  uint64_t sleeps_ = 0;
  uint64_t idle_us_ = 0;  // slept since the last Work()
};

}  // namespace dblp
