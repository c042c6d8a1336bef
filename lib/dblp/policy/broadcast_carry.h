// The consistent truncated broadcast (dblp-server
// --bcast_tolerance=consistent).
//
// A lossy broadcast stopped at 1-p hands each worker a *different* subset of
// the mean, so the replicas drift apart (docs/EXPERIMENTS.md). Here the
// server picks ONE subset per iteration, StopThreshold(N, p) chunks, and
// sends only those, reliably: every worker's receiver STOPs exactly when it
// holds the whole subset, and nothing else was sent, so every worker applies
// the same chunks. The rest of the mean is carried into the next
// iteration's mean, identically for all, and goes first then: nothing the
// workers pushed is lost, only delayed, and a chunk waits as long as
// nothing older is waiting.
//
// Conservation (tests/test_broadcast_carry.cc): over any run, what the
// workers applied plus carried() equals the sum of the means, exactly for
// values whose sums float32 holds exactly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dblp/wire/chunking.h"

namespace dblp {

class BroadcastCarry {
 public:
  explicit BroadcastCarry(const ChunkLayout& layout, uint64_t seed = 0);

  // Adds what was carried into `mean` (layout.total_bytes() / 4 floats,
  // else std::invalid_argument), picks iteration `it`'s subset for
  // tolerance p (StopThreshold(N, p) chunks: the longest-carried first,
  // then a seeded per-iteration shuffle) and carries the other chunks'
  // values. Returns the subset in send order, valid until the next Plan.
  std::span<const uint32_t> Plan(uint64_t it, double p, std::span<float> mean);

  // The values waiting for a later iteration (zero on chunks sent).
  std::span<const float> carried() const { return carry_; }
  uint32_t carried_chunks() const { return carried_chunks_; }
  // The longest any chunk has waited so far, in iterations.
  uint32_t max_wait() const { return max_wait_; }

 private:
  ChunkLayout layout_;
  uint64_t seed_;
  std::vector<float> carry_;
  std::vector<uint32_t> waited_;  // per chunk: iterations carried so far
  std::vector<uint32_t> order_;
  uint32_t carried_chunks_ = 0;
  uint32_t max_wait_ = 0;
};

}  // namespace dblp
