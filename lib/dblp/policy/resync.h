// Periodic re-synchronisation of the replicas (server --resync_every=K).
//
// A truncated broadcast gives each worker a different subset of the mean,
// so the replicas drift apart. Every K training steps the job runs one
// extra iteration in which each worker pushes its *parameters* instead of a
// gradient and loads the average, both rounds reliable (p = 0): afterwards
// every replica holds the same bytes. The schedule is a pure function of
// the protocol iteration, so the server and the workers agree on it without
// a message: with K = 3 the protocol iterations run
//   train 0, train 1, train 2, resync, train 3, train 4, train 5, resync...
#pragma once

#include <cstdint>

namespace dblp {

class ResyncSchedule {
 public:
  // every = 0: never.
  explicit constexpr ResyncSchedule(uint32_t every = 0) : every_(every) {}

  constexpr uint32_t every() const { return every_; }
  constexpr bool enabled() const { return every_ != 0; }
  // Is protocol iteration `it` a re-synchronisation?
  constexpr bool IsResync(uint64_t it) const {
    return every_ != 0 && (it + 1) % (uint64_t{every_} + 1) == 0;
  }
  // The training step protocol iteration `it` runs (for a resync: the
  // number of steps before it).
  constexpr uint64_t TrainStep(uint64_t it) const {
    if (every_ == 0) return it;
    const uint64_t resyncs_through_it = (it + 1) / (uint64_t{every_} + 1);
    return it - resyncs_through_it + (IsResync(it) ? 1 : 0);
  }
  // Protocol iterations that run `steps` training steps (no trailing
  // resync: nothing trains after it).
  constexpr uint64_t ProtocolIterations(uint64_t steps) const {
    if (every_ == 0 || steps == 0) return steps;
    return steps + (steps - 1) / every_;
  }

 private:
  uint32_t every_;
};

}  // namespace dblp
