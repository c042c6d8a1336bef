#include "dblp/job/server_iteration.h"

#include <cmath>

#include "dblp/base/log.h"
#include "dblp/base/rng.h"
#include "dblp/wire/float_ops.h"  // BlockSquares

namespace dblp {

ServerIteration::ServerIteration(const ServerJobSettings& s,
                                 std::unique_ptr<TolerancePolicy> policy,
                                 const ChunkLayout& layout, uint32_t workers,
                                 uint64_t seed, std::string app,
                                 uint32_t shards)
    : s_(s),
      policy_(std::move(policy)),
      layout_(layout),
      resync_(s.resync_every),
      seed_(seed),
      app_(std::move(app)),
      reducer_(layout, workers, shards, s.model_floats),
      tallies_(workers),
      mean_(layout.total_bytes() / sizeof(float), 0.0f),
      block_floats_(size_t{kNormBlockChunks} * layout.chunk_payload() /
                    sizeof(float)),
      squares_(NormBlocks(mean_.size(), block_floats_), 0.0) {
  reducer_.set_clip_norm(ClipNormFor(0));
  // The fill is the job's for good: only prev reads the last mean.
  reducer_.set_keep_previous(s.push_fill == FillMode::kPrevious);
  if (s.consistent_broadcast) carry_.emplace(layout, HashMix(seed, 0xCA));
}

// A resync's broadcast is reliable; a push bench's is announced with a 1 ns
// deadline and a floor of zero chunks, so every worker closes it at once.
RoundTolerance ServerIteration::BroadcastTolerance(
    bool resync, const RoundTolerance& next) const {
  if (resync) return RoundTolerance{};
  RoundTolerance t = s_.reliable_broadcast ? RoundTolerance{} : next;
  if (s_.push_only) {
    t = RoundTolerance{};
    t.deadline_ns = 1;
    t.min_fraction = 0;
  }
  return t;
}

ReducedPush ServerIteration::Reduce(uint64_t it, uint64_t push_ns) {
  ReducedPush r;
  // A resync's "mean" is the average model: no policy, no zeroing, and
  // both rounds reliable. The policy and the zeroing window count
  // training steps.
  r.resync = resync_.IsResync(it);
  const uint64_t step = resync_.TrainStep(it);
  const bool zeroing = !r.resync && s_.zero_fraction > 0 &&
                       step >= s_.zero_first && step <= s_.zero_last;
  // The norm's squares as the mean is written (one pass over memory, not
  // two), unless chunks are zeroed after it.
  IncrementalBlockSquares squares(mean_, block_floats_, squares_);
  reducer_.Finalize(s_.push_fill, mean_, zeroing ? nullptr : &squares);
  for (uint32_t w = 0; w < tallies_.size(); ++w)
    tallies_[w] = reducer_.tally(w);
  r.workers = tallies_;
  if (zeroing) {
    ZeroRandomChunks(mean_, layout_, s_.zero_fraction, HashMix(seed_, step));
    BlockSquares(mean_, block_floats_, squares_);
  }
  if (s_.phase != nullptr) {
    // A server shard: the job's phase decides from every shard's blocks.
    PhaseDecision d = s_.phase->Decide(it, r.resync, squares_, push_ns);
    r.failure = std::move(d.failure);
    r.norm = d.norm;
    r.next = d.next;
  } else {
    r.norm = NormOfBlockSquares(squares_);
    if (!r.resync) policy_->OnIterationEnd(step, r.norm, push_ns);
    r.next = policy_->Current();
  }
  r.mean_finite = std::isfinite(r.norm);
  r.broadcast = BroadcastTolerance(r.resync, r.next);
  if (carry_ && !r.resync) {
    // The receiver STOPs with exactly the subset: no deadline may cut it.
    r.broadcast.deadline_ns = 0;
    r.subset = carry_->Plan(it, r.broadcast.p, mean_);
  }
  DBLP_LOG(Debug, "%s: iteration %llu: mean norm %.6g, next p %.4g%s%s",
           app_.c_str(), static_cast<unsigned long long>(it), r.norm, r.next.p,
           r.next.critical ? " (critical)" : "", r.resync ? " (resync)" : "");
  reducer_.BeginRound();
  reducer_.set_clip_norm(ClipNormFor(it + 1));
  return r;
}

// A resync pushes the workers' parameters, not gradients: a norm clip
// there would shrink the model every replica loads.
double ServerIteration::ClipNormFor(uint64_t it) const {
  return resync_.IsResync(it) ? 0 : s_.clip_norm;
}

}  // namespace dblp
