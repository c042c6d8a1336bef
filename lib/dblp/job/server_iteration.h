// What the server decides between a push and its broadcast, written once
// for every transport (dblp-server over DPDK, dblp-udp-server over kernel
// UDP): the mean of the push (with its fill), the zeroing experiment, the
// norm and the tolerance policy, the broadcast's tolerance and, for a
// consistent broadcast, its one subset; and the tolerance of the next push
// (a resync's is reliable). The transports move frames; this decides what
// the rounds are.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dblp/job/phase_link.h"
#include "dblp/policy/broadcast_carry.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/mean_reducer.h"
#include "dblp/policy/resync.h"
#include "dblp/policy/tolerance.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"

namespace dblp {

// A test seam (src/test_hooks/server_dumps.h, the udp tests): sees each
// closed push's mean and, per worker, the chunks that arrived.
using ReducedObserver = std::function<void(
    uint64_t it, std::span<const float> mean, std::span<const Bitmap> arrived)>;

// The job's settings of a server, whatever its transport: one struct that
// both servers' options extend (ServerOptions, UdpJobServerOptions).
struct ServerJobSettings {
  PolicyConfig policy;                   // p of every push and broadcast
  FillMode push_fill = FillMode::kZero;  // the mean of a missing chunk
  // The broadcast: each worker its own 1-p of the mean (the default), every
  // chunk (reliable), one subset for every worker sent reliably with the
  // rest carried (consistent, dblp/policy/broadcast_carry.h), or none at
  // all (push_only: a push benchmark).
  bool reliable_broadcast = false;
  bool consistent_broadcast = false;
  bool push_only = false;
  // Every K training steps one reliable iteration of parameters whose
  // average every worker loads (dblp/policy/resync.h; 0 = never).
  uint32_t resync_every = 0;
  // After every push the server tells each worker the chunks it summed
  // (ACCEPTED) and the worker carries the rest into its next push.
  bool push_feedback = false;
  bool continue_on_worker_loss = false;
  // Members who lie (mean_reducer.h): a worker's chunk holding a NaN or an
  // infinity, or whose addition would overflow the sum, is refused and
  // left out of its chunk's mean. Abort (the default) then ends the job
  // naming the worker and the iteration; drop goes on, counted and logged.
  bool drop_bad_gradient = false;
  // Each worker's contribution scaled to an L2 norm <= clip_norm, chunk by
  // chunk (mean_reducer.h says what that bounds); 0 = off.
  double clip_norm = 0;
  // Experiment hook (DBLP paper, Fig. 1): zero this fraction of the mean's
  // chunks in training steps [zero_first, zero_last].
  double zero_fraction = 0;
  uint64_t zero_first = 0;
  uint64_t zero_last = 0;
  ReducedObserver on_reduced;  // test seam; empty in production
  // A server shard of a sharded job (dblp-server --shards): the job's
  // phase, which decides the norm and the next tolerance from every
  // shard's block squares (phase_link.h; null: unsharded, the policy runs
  // here), and the whole gradient's floats (the clip norm's per-chunk
  // share, mean_reducer.h; 0: this layout's). Not owned.
  PhaseLink* phase = nullptr;
  uint64_t model_floats = 0;
};

// What one closed push decided.
struct ReducedPush {
  bool resync = false;       // the "mean" is the average model
  // The mean's L2 norm (what the policy saw): per-64-chunk block squares
  // summed in order (float_ops.h); a server shard's is the whole job's.
  double norm = 0;
  RoundTolerance broadcast;  // the broadcast of this mean
  // The consistent broadcast's chunks, or (ServerJob, --send_order=
  // magnitude) the mean's chunks by size: one send order for every worker
  // (empty: each worker's own order). Valid until the next Reduce.
  std::span<const uint32_t> subset;
  RoundTolerance next;  // the policy's tolerance after this iteration
  // Per worker, what the reducer refused or clipped of this push and the
  // L2 norm of what it sent. Valid until the next Reduce.
  std::span<const MeanReducer::Tally> workers;
  bool mean_finite = true;  // the mean's norm is finite
  // The job ends (--on_bad_gradient=abort, a lost server shard).
  std::string failure;
};

class ServerIteration {
 public:
  // `policy` is the job's (made from s.policy before the join, so that the
  // WELCOME can describe it); `app` names the server in the debug log.
  // Throws std::bad_alloc when the sums do not fit.
  ServerIteration(const ServerJobSettings& s,
                  std::unique_ptr<TolerancePolicy> policy,
                  const ChunkLayout& layout, uint32_t workers, uint64_t seed,
                  std::string app, uint32_t shards = 1);

  // Iteration `it`'s push is closed (every worker's STOP, its chunks in
  // the reducer), after push_ns: the mean, the policy's next p, and the
  // broadcast. Then the reducer starts the next round's sums.
  ReducedPush Reduce(uint64_t it, uint64_t push_ns);
  // The tolerance of iteration `it`'s push, the policy's (or a prompt's
  // change) being `t`: a resync's push is reliable, whatever the policy.
  RoundTolerance PushTolerance(uint64_t it, const RoundTolerance& t) const {
    return resync_.IsResync(it) ? RoundTolerance{} : t;
  }
  // Between rounds: the workers the next mean divides by (a job that
  // continues after losing one).
  void set_live_workers(uint32_t w) { reducer_.set_num_workers(w); }

  MeanReducer& reducer() { return reducer_; }
  std::span<float> mean() { return mean_; }
  const std::vector<float>& mean() const { return mean_; }
  const ResyncSchedule& resync() const { return resync_; }
  // The runtime prompt may replace it between iterations.
  std::unique_ptr<TolerancePolicy>& policy() { return policy_; }
  const TolerancePolicy& policy() const { return *policy_; }

 private:
  double ClipNormFor(uint64_t it) const;
  RoundTolerance BroadcastTolerance(bool resync,
                                    const RoundTolerance& next) const;

  const ServerJobSettings s_;
  std::unique_ptr<TolerancePolicy> policy_;
  const ChunkLayout layout_;
  const ResyncSchedule resync_;
  const uint64_t seed_;
  const std::string app_;
  MeanReducer reducer_;
  std::vector<MeanReducer::Tally> tallies_;  // the last Reduce's, per worker
  std::vector<float> mean_;
  const size_t block_floats_;    // a norm block's floats (kNormBlockChunks)
  std::vector<double> squares_;  // the last Reduce's block squares
  // Built only for a consistent broadcast: it holds a copy of the gradient.
  std::optional<BroadcastCarry> carry_;
};

}  // namespace dblp
