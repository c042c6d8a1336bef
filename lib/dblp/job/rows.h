// The rows of an iteration (obs/records.h), computed the same way on every
// transport: a worker's from its push sides (one per server shard) and its
// broadcast (dblp-worker, dblp-udp-worker); the server's, per worker, from
// that worker's push receive sides and broadcast send sides (dblp-server,
// dblp-udp-server).
#pragma once

#include <cstdint>
#include <span>

#include "dblp/obs/records.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/send_side.h"

namespace dblp {

struct WorkerExchange {
  uint64_t iteration = 0;
  uint32_t rank = 0;
  std::span<const SendSide* const> push;  // this iteration's, done
  // When the worker's receiver STOPped the broadcast (0: none).
  uint64_t bcast_done_ns = 0;
  // Of the broadcast (the push bench: of the push, from its STOP).
  double delivered_fraction = 0;
  double p = 0;  // the push round's, from its ROUND_BEGIN
  bool critical = false;
  bool burst = false;
  bool resync = false;
};

// Send latency: first frame to the last shard's STOP (or complete BITMAP).
// Broadcast latency: from there to holding enough of the mean (waiting for
// the other workers and the reduction included). Passes: the most of any
// shard; packets: their sum; control RTT: the mean over shards that probed.
IterationRecord WorkerRow(const WorkerExchange& x);

// The server's push half of worker `rank`'s row: from the push's opening
// to the worker's STOP (the last shard's), what arrived, the tolerance the
// round ran under and the mean's norm.
struct ServerPush {
  uint64_t iteration = 0;
  uint32_t rank = 0;
  uint64_t open_ns = 0;
  uint64_t stop_ns = 0;
  double delivered_fraction = 0;
  RoundTolerance tolerance;
  double grad_norm = 0;
  bool burst = false;
  bool resync = false;
  // What the server's check saw of this worker's push (mean_reducer.h).
  double worker_norm = 0;
  uint32_t bad_chunks = 0;
  uint32_t clipped_chunks = 0;
  uint64_t clr_nonfinite = 0;
};
IterationRecord ServerPushRow(const ServerPush& x);

// The broadcast half, once the worker's broadcast sides (one per shard)
// are done: latency, passes, packets and control RTT, as WorkerRow counts
// the push's.
void AddBroadcastToRow(std::span<const SendSide* const> bcast,
                       IterationRecord* row);

}  // namespace dblp
