// A whole DBLP job in one process: S server shards (each a ServerJob over its
// partition of the gradient, one phase for the whole model) and W workers
// exchanging real DBLP frames over the in-memory loopback fabric, with real
// control messages (encoded and decoded by the control codec, delivered in
// pieces), software loss and microbursts, stale-round replays, the tolerance
// policy and the servers' mean.
//
// Time is modelled, not measured (sim/sim_costs.h): the loop runs in turns,
// in each of which every sender sends at most one burst per link; a turn
// lasts as long as its busiest resource needs (a host's NIC in or out, an
// lcore's CPU, the shared cores of a small host), so W workers into one
// server link take W times as long as one (the incast). Every control
// message takes costs.control_one_way_ns to arrive. The protocol logic is the
// real one; only the clock is simulated, so results are deterministic for a
// seed. The DPDK apps (src/, apps/) measure real time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/emul/loss_model.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/job/server_job.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/records.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/send_order.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "sim/sim_costs.h"

namespace dblp {

// The job's settings are the servers' own (ServerJobSettings: policy, push
// fill, broadcast, resync, zeroing; the same ServerIteration decides), the
// rest models the network.
struct ClusterConfig : ServerJobSettings {
  uint32_t num_workers = 3;
  uint64_t gradient_floats = 1 << 16;
  uint32_t mtu = 1500;
  uint32_t session = 0xD0B1F00Du;
  uint32_t first_round = 0;  // round counter of iteration 0's push
  SendOrderKind send_order = kDefaultSendOrder;
  uint64_t seed = 1;
  LossSpec push_loss;         // base loss, worker -> server
  LossSpec bcast_loss;        // base loss, server -> worker
  BurstSchedule bursts;       // microbursts (both directions if below)
  bool bursts_on_broadcast = true;
  FillMode bcast_fill = FillMode::kZero;  // worker's copy of the mean
  uint32_t burst = 32;              // frames per TX burst
  uint32_t stale_replay = 16;       // frames of the last round replayed
  size_t ring_size = 1 << 16;       // receive ring per endpoint
  SimCosts costs;                   // the clock's model (10 Gb/s links)
  // Server shards (processes), each over its own partition of the chunks
  // (ChunkRanges(num_chunks, S)) with its own link; and the datapath lcores of
  // each shard and of each worker, which share its CPU work evenly.
  uint32_t server_shards = 1;
  uint32_t server_lcores = 1;
  uint32_t worker_lcores = 1;
  // Modelled time without progress (send_side.h, receive_side.h) after
  // which a round fails (std::runtime_error naming the workers), as
  // --round_timeout_ms in the apps: 100% loss ends, never spins.
  uint32_t round_timeout_ms = 30000;
  // A member that goes silent, as a SIGSTOPped process does: from
  // iteration `iteration`'s push (or its broadcast) on, worker `rank`
  // sends, reads and answers nothing. The servers wait round_timeout_ms of
  // modelled time; under continue_on_worker_loss they then go on without
  // it (ServerJob::LoseSilent, as dblp-server and dblp-udp-server), else
  // the round fails naming it.
  struct SilentMember {
    int64_t rank = -1;  // -1: every worker stays awake
    uint64_t iteration = 0;
    Direction from = Direction::kPush;
  } silent;
  // Test seam (src/test_hooks/dumps.h): each worker's absorbed iteration.
  AbsorbedObserver on_absorbed;
};

// Everything the cluster counted, summed over endpoints and rounds.
struct ClusterCounters {
  uint64_t accepted = 0;
  uint64_t duplicate = 0;
  uint64_t stale = 0;
  uint64_t future = 0;
  uint64_t late = 0;
  uint64_t malformed = 0;
  uint64_t rejected_other = 0;  // wrong session/sender/type, out of range
  uint64_t injected_drops = 0;
  uint64_t ring_drops = 0;
  uint64_t control_messages = 0;
  uint64_t stops_sent = 0;
};

struct IterationOutcome {
  uint64_t iteration = 0;
  uint32_t push_round = 0;
  uint32_t bcast_round = 0;
  RoundTolerance push_tolerance;   // p the server used for the pushes
  RoundTolerance bcast_tolerance;  // p after the CLR check (broadcast)
  bool burst = false;
  double grad_norm = 0;          // L2 norm of the server's mean
  double push_round_ns = 0;      // until the last worker saw STOP
  // When the servers saw this push's first chunk, after its workers
  // began: the push's time as the servers measure it (what the deadline
  // policies learn from) and its deadline run from there.
  double push_first_chunk_ns = 0;
  double bcast_round_ns = 0;     // until the last worker had enough
  // One per worker still in the job, in rank order (IterationRecord::rank
  // names it); a silent member has none from the iteration it stopped in.
  std::vector<IterationRecord> workers;
  std::vector<double> bcast_delivered;  // the same workers'
  // The workers the servers went on without in this iteration.
  std::vector<uint32_t> lost;
  // Why the job ends (--on_bad_gradient=abort refused a worker's chunks):
  // the push was reduced, nothing was broadcast, no worker row was made.
  std::string failure;
};

class MemoryCluster {
 public:
  // The caller hands each iteration's gradients to RunIteration(grads),
  // or each worker has its own source (`sources`, one per rank, bound to
  // it here: what the apps' --gradient makes) and RunIteration() asks it.
  explicit MemoryCluster(const ClusterConfig& config,
                         std::vector<GradientSource*> sources = {});
  ~MemoryCluster();
  MemoryCluster(const MemoryCluster&) = delete;
  MemoryCluster& operator=(const MemoryCluster&) = delete;

  // One training iteration: every worker pushes grads[rank]; the server
  // reduces, runs the tolerance policy on the mean's norm and broadcasts the
  // mean back. grads.size() == num_workers, each gradient_floats long.
  IterationOutcome RunIteration(std::span<const std::vector<float>> grads);
  IterationOutcome RunIteration() { return RunIteration({}); }
  // The job is over: every worker still in it says BYE to every shard
  // (ServerJob::OnBye), as the apps' workers do after their last
  // iteration. Optional: nothing after it but the reads below.
  void Finish();

  const ClusterConfig& config() const;
  // The whole gradient's layout (each shard runs over a slice of it).
  const ChunkLayout& layout() const;
  // Server shard k's first global chunk and its partition's layout.
  uint32_t shard_first_chunk(uint32_t k) const;
  const ChunkLayout& shard_layout(uint32_t k) const;
  // The servers' mean of the last iteration (after push fill), whole.
  const std::vector<float>& server_mean() const;
  // What worker `rank` received of the mean (after broadcast fill).
  const std::vector<float>& worker_average(uint32_t rank) const;
  // Which chunks of worker `rank`'s last push reached the server.
  const Bitmap& push_arrived(uint32_t rank) const;
  // Which chunks of the last broadcast reached worker `rank`.
  const Bitmap& bcast_arrived(uint32_t rank) const;
  ClusterCounters counters() const;
  // The servers' counters by the apps' names (push_<verdict>,
  // decode_<status>, injected_drops, frames_unpinned_source): the frames'
  // over every shard, the job's (bad gradients, clipping) shard 0's.
  NamedCounters server_counters() const;
  // The server job's settings for a summary (ServerJob::Info).
  std::vector<std::pair<std::string, std::string>> server_info() const;
  // Server shard k's rows (its ServerJob's, as dblp-server writes them).
  std::vector<IterationRecord>& server_rows(uint32_t k = 0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};


}  // namespace dblp
