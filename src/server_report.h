// The server's run report: one row per worker and iteration, assembled
// from every lcore's shard of the worker's sides, and the job's counters.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dblp/obs/run_report.h"
#include "lcore_loop.h"
#include "server_control.h"
#include "server_engine.h"

namespace dblp {

// Worker w's push as the server summed it: the union of its shards'
// bitmaps (disjoint chunk ranges).
Bitmap MergedPushBitmap(const LinkGrid& links, uint32_t w, uint32_t num_chunks);

// One row per worker for the push just reduced.
void AddPushRows(uint64_t it, const LinkGrid& links,
                 const std::vector<std::unique_ptr<WorkerState>>& workers,
                 uint64_t push_open_ns, const RoundTolerance& tol, double norm,
                 bool burst, bool resync, const ServerOptions& o,
                 uint32_t num_chunks, RunReport* report);
// Completes the iteration's rows with the broadcast side (its shards).
void AddBroadcastToRows(const LinkGrid& links, uint32_t W, RunReport* report);
// The job's counters, summed over lcores, links and ports.
void AddServerCounters(const std::vector<std::unique_ptr<LcoreConf>>& lcs,
                       const ServerControl& control, const LinkGrid& links,
                       uint16_t nb_ports, RunReport* report);

}  // namespace dblp
