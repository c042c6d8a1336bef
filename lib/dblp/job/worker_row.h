// A worker's row of an iteration, from its push sides (one per server
// shard) and its broadcast: the same columns, computed the same way, on
// every transport (dblp-worker, dblp-udp-worker).
#pragma once

#include <cstdint>
#include <span>

#include "dblp/obs/records.h"
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

}  // namespace dblp
