// dblp-worker's setup around its job (worker_engine.cc): the JOIN it
// sends, the data port, the frame template toward the server, and the
// counters of its summary. Setup only (Die() names the fix).
#pragma once

#include <rte_mempool.h>

#include <memory>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "frame_builder.h"
#include "lcore_loop.h"
#include "port.h"
#include "worker_control.h"
#include "worker_engine.h"

namespace dblp {

// The JOIN: our name, the source's size and layers, and the data source
// the server pins (port 0's MAC unless behind a router, --local_ip).
JoinMsg MakeJoin(const WorkerOptions& o, const GradientSource& source);

// Binds `source` to the WELCOME's rank; refuses (telling the server, then
// Die() with the fix) a source or a fill that cannot serve the job.
void StartWorkerSource(GradientSource& source, const WelcomeMsg& wel,
                       const WorkerJobSettings& js, WorkerControl& control);

// The line that says the worker joined: rank, session, source, chunks,
// port, server.
void PrintJoined(const WelcomeMsg& wel, const GradientSource& source,
                 const ChunkLayout& layout, const PortCaps& caps);

// The data port, set up once the WELCOME said how many queues the server's
// shards need; returns once the link is up.
PortCaps SetupWorkerPort(const WorkerOptions& o, uint16_t queues,
                         rte_mempool** pool);

// The frame template toward the server, from the WELCOME and our flags;
// *local is our data address as the server pinned it.
FrameTemplate ServerTemplate(const WorkerOptions& o, const WelcomeMsg& wel,
                             const PortCaps& caps, Endpoint* local);

void AddWorkerCounters(const LcoreConf& lc, const WorkerControl& control,
                       const std::vector<std::unique_ptr<SendSide>>& push,
                       const ReceiveSide& bcast, const PortDrops& drops,
                       RunReport* report);

}  // namespace dblp
