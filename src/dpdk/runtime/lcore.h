// What every DPDK datapath lcore has, in both apps: its own state in one
// cache-aligned struct (l3fwd's lcore_conf), the RX burst, and the text of
// what this process measured of a failed round's cause.
#pragma once

#include <rte_common.h>
#include <rte_mbuf.h>

#include <cstdint>
#include <string>

#include "dblp/emul/rx_loss.h"
#include "port/datapath.h"

namespace dblp {

inline constexpr uint16_t kRxBurst = 64;

// One datapath lcore's own state (l3fwd's lcore_conf). Writer: that lcore;
// readers: the sidecar's stats line and the summary read `counters` only.
struct alignas(RTE_CACHE_LINE_SIZE) LcoreConf {
  unsigned lcore_id = 0;
  uint16_t lane = 0;      // = its RX and TX queue on every port
  uint64_t poll_gen = 0;  // RX polls so far
  DatapathCounters counters;
  rte_mbuf* rx_pkts[kRxBurst];
};

// A pool that ran dry stalls a round as surely as a silent peer: when it
// did, the stall says so and names the flag that sizes it. What this
// process measured of a failed round's cause: its mbuf pool and its loss
// injector (diagnosis.h).
std::string MeasuredHint(const DatapathCounters& c, const RxLossInjector* loss);

}  // namespace dblp
