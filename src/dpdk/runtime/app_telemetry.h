// What the DPDK apps show to DPDK's own tools: the /dblp/* telemetry
// commands (dpdk-telemetry.py -f <file-prefix>), packet capture for
// dpdk-dumpcap (rte_pdump) and the ports' extended statistics.
//
// The telemetry callbacks run on DPDK's telemetry thread. They read only
// GlobalAppState() (lib/dblp/obs/app_state.h): snapshots and atomics the
// engines publish at round boundaries, so any request rate is safe and
// nothing the datapath owns is touched.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dblp/obs/app_state.h"

namespace dblp {

// Registers /dblp/stats, /dblp/round, /dblp/policy, /dblp/lcores and
// /dblp/config. After rte_eal_init; once per process.
void RegisterTelemetry();

// rte_pdump_init, so that `dpdk-dumpcap --file-prefix=<prefix>` (a
// secondary process) can capture the ports. A process that cannot serve
// secondaries (--in-memory, --no-shconf) says so once and goes on.
void InitCapture(const char* app);
void UninitCapture();

// The EAL's part of /dblp/config (lcores, main lcore, runtime directory,
// process type); the apps add their flags (apps/runtime_flags.h).
void PublishEalConfig();

// Every extended statistic of `port` (rte_eth_xstats_get_names / get).
CounterList ReadXstats(uint16_t port);

}  // namespace dblp
