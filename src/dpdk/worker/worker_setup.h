// dblp-worker's setup around its job (worker_engine.cc): the JOIN it
// sends, the data port, the frame template toward the server, and the
// counters of its summary. Setup only (Die() names the fix).
#pragma once

#include <rte_mempool.h>

#include <atomic>
#include <memory>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "worker/shard_link.h"
#include "worker/worker_control.h"
#include "worker/worker_lcore.h"
#include "worker/worker_options.h"

namespace dblp {

// The JOIN: our name, the source's size and layers, and the data source
// the server pins (`port`'s MAC unless behind a router, --local_ip).
JoinMsg MakeJoin(const WorkerOptions& o, const GradientSource& source,
                 uint16_t port = 0);

// Joins the job: the directory (--server, shard 0) first; then, when its
// WELCOME lists server shards, every shard k > 0 with the claim the map
// gives (shard_claim.h), checking that its WELCOME confirms it. Adds one
// link per server shard to `links`, each with its DPDK port: with one port
// every link shares it, with one per server shard link k uses port k (any
// other count ends the process naming the --vdev list). A refusal ends the
// process naming the shard and the fix.
void JoinServerShards(const WorkerOptions& o, const GradientSource& source,
                      const DatapathCounters* ctr,
                      const std::atomic<bool>& quit, WorkerShardLinks* links);

// Binds `source` to the WELCOME's rank; refuses (telling the server, then
// Die() with the fix) a source or a fill that cannot serve the job.
void StartWorkerSource(GradientSource& source, const WelcomeMsg& wel,
                       const WorkerJobSettings& js, WorkerControl& control);

// The line that says the worker joined: rank, session, source, chunks,
// port, server (and the server shards' count).
void PrintJoined(const WelcomeMsg& wel, const GradientSource& source,
                 const ChunkLayout& layout, const PortCaps& caps,
                 size_t shards);

// The pool every port's mbufs come from, sized for `ports` ports of up to
// `queues` queues.
rte_mempool* CreateWorkerPool(const WorkerOptions& o, uint16_t ports,
                              uint16_t queues);

// Data port `port_id`, set up once the WELCOME said how many queues the
// server's shards need; returns once the link is up.
PortCaps SetupWorkerPort(const WorkerOptions& o, uint16_t port_id,
                         uint16_t queues, rte_mempool* pool);

// The frame template toward the server, from the WELCOME and our flags;
// *local is our data address as the server pinned it.
FrameTemplate ServerTemplate(const WorkerOptions& o, const WelcomeMsg& wel,
                             const PortCaps& caps, Endpoint* local);

// Summed over every link (and port) and lcore (lcores[0]: lcore 0); with
// several lcores also each lcore's frames sent (tx_frames_lcoreK).
void AddWorkerCounters(const std::vector<const LcoreConf*>& lcores,
                       const WorkerShardLinks& links, const PortDrops& drops,
                       RunReport* report);

}  // namespace dblp
