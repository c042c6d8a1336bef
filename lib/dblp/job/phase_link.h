// One phase for a job of S server shards (dblp-server --shards): each
// shard reduces its own partition, but the CLR detector needs the whole
// mean's norm, and every shard must run the next iteration under the same
// p. Once per iteration (never per packet) each shard hands its
// partition's block squares (float_ops.h: one double per 64 chunks) to the
// job's leader (shard 0), which concatenates them in shard order, runs the
// policy once and hands every shard the same decision. The blocks are the
// whole gradient's, summed in the same order, so the norm is bit-identical
// to one server's over the whole gradient.
//
// This file is transport-free: PhaseLeader is the gathering and the policy
// (shard 0's TCP side feeds it, shard_links.h),
// InProcessPhase links shards that run as threads of one process (tests, the
// simulator).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dblp/policy/resync.h"
#include "dblp/policy/tolerance.h"

namespace dblp {

// What the job decided after an iteration: the whole mean's norm and the
// next push's tolerance (the policy's Current() after OnIterationEnd).
struct PhaseDecision {
  double norm = 0;
  RoundTolerance next;
  std::string failure;  // non-empty: the job ends (names the shard)
};

class PhaseLink {  // null in an unsharded job
 public:
  virtual ~PhaseLink() = default;
  // Every shard's ServerIteration::Reduce, once per iteration (never per
  // packet): this shard's block squares; blocks until the job's decision
  // (or failure naming the missing shard).
  virtual PhaseDecision Decide(uint64_t it, bool resync,
                               std::span<const double> block_squares,
                               uint64_t push_ns) = 0;
};

// "server shard 2": how every text names a server shard.
std::string ServerShardLabel(uint32_t k);

// The norm blocks of a partition of `chunks` chunks (its partial's size).
uint32_t PartitionNormBlocks(uint32_t chunks);

// Shard 0's gathering of one iteration's partials and the job's policy.
// Not thread-safe: one owner (who serialises Add and Decide).
class PhaseLeader {
 public:
  // `blocks[k]`: shard k's partial's block count (PartitionNormBlocks of
  // its partition); at least one shard. `resync_every` as the job's
  // (--resync): the policy counts training steps.
  PhaseLeader(std::unique_ptr<TolerancePolicy> policy, uint32_t resync_every,
              std::vector<uint32_t> blocks);

  // Shard k's partial for iteration `it`: "" or why it is refused (an
  // unknown shard, not the iteration being gathered, a second partial, a
  // block count that is not its partition's, a resync flag unlike the
  // others'). A refused partial changes nothing.
  std::string Add(uint32_t k, uint64_t it, bool resync,
                  std::span<const double> squares, uint64_t push_ns);
  // Every shard's partial is in.
  bool complete() const { return reported_ == blocks_.size(); }
  // The iteration being gathered.
  uint64_t iteration() const { return it_; }
  // Once complete(): runs the policy once (unless resync) and starts
  // gathering the next iteration.
  PhaseDecision Decide();
  // The failure when the partials did not all come within `timeout_ms`:
  // names every shard that never reported.
  std::string Missing(uint32_t timeout_ms) const;

  uint32_t shards() const { return static_cast<uint32_t>(blocks_.size()); }
  const TolerancePolicy& policy() const { return *policy_; }

 private:
  std::unique_ptr<TolerancePolicy> policy_;
  const ResyncSchedule resync_;
  const std::vector<uint32_t> blocks_;
  std::vector<size_t> offset_;  // shard k's first block in squares_
  std::vector<double> squares_;
  std::vector<bool> have_;
  uint32_t reported_ = 0;
  uint64_t it_ = 0;
  bool resync_flag_ = false;
  uint64_t push_ns_ = 0;  // the slowest shard's push
};

// S shards in one process, each on its own thread: shard k's link is
// link(k). Decide waits (at most `timeout`) for the others' partials; the
// last one in decides. A failure is sticky: every later Decide fails.
class InProcessPhase {
 public:
  InProcessPhase(std::unique_ptr<TolerancePolicy> policy, uint32_t resync_every,
                 std::vector<uint32_t> blocks,
                 std::chrono::milliseconds timeout);
  ~InProcessPhase();
  PhaseLink& link(uint32_t k);

 private:
  class Link;
  PhaseDecision Decide(uint32_t k, uint64_t it, bool resync,
                       std::span<const double> squares, uint64_t push_ns);

  std::mutex mu_;
  std::condition_variable cv_;
  PhaseLeader leader_;             // under mu_
  uint64_t decided_ = UINT64_MAX;  // the last decided iteration, under mu_
  PhaseDecision decision_;         // its decision, under mu_
  std::string failure_;            // under mu_
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace dblp
