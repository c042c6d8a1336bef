// NIC queue steering for a dblp-server with several datapath lcores on a
// real port: lcore k owns chunk range k (lib/dblp/round/chunk_ranges.h) and RX
// queue k, and a worker sends range k's chunks to UDP destination port
// base + k. The server asks the port to put each port on its queue:
//  - flow: one rte_flow rule per lcore, ETH / IPV4 dst=us / UDP dst=base+k
//    -> QUEUE k (validated, then created; all or none);
//  - rss: the port's RSS on IPv4/UDP ports, which spreads flows over the
//    queues by hash: a frame may land on another lcore's queue, which hands
//    it over (ServerLcore, counted frames_misrouted);
//  - auto: flow, else rss, saying so in the startup log.
// `--flow_isolate` puts the port in rte_flow isolated mode before it is
// configured (only what the rules match reaches DPDK; the kernel keeps the
// rest on bifurcated NICs, e.g. mlx5), which needs the flow rules.
// net_memif needs none of this: a client's TX queue k is our RX queue k.
// Setup only: nothing here runs per packet.
#pragma once

#include <cstdint>
#include <string>

#include "port/port.h"

namespace dblp {

enum class SteeringMode : uint8_t { kAuto, kFlow, kRss };
// "auto", "flow" or "rss"; false for anything else.
bool ParseSteeringMode(const std::string& s, SteeringMode* mode);
const char* SteeringModeName(SteeringMode m);

struct SteeringOptions {
  SteeringMode mode = SteeringMode::kAuto;
  bool isolate = false;  // --flow_isolate
};

// How a port's frames reach their lcore's queue.
enum class SteeringKind : uint8_t {
  kOneQueue,   // one lcore: nothing to steer
  kQueueMap,   // net_memif: queue k reaches queue k
  kFlowRules,  // one rte_flow rule per lcore
  kRss,        // RSS (or no RSS): misrouted frames are handed over
};

struct SteeringResult {
  SteeringKind kind = SteeringKind::kOneQueue;
  std::string describe;  // one line for the startup log
};

// Before rte_eth_dev_configure (SetupPortOrDie calls it when
// PortOptions::flow_isolate): isolated mode, or Die naming the fix.
void IsolateOrDie(uint16_t port, const std::string& where);

// After the port started with `queues` RX queues: steers UDP destination
// port base + k to queue k for every k < queues, as `opts` asks. Dies
// naming the fix when --steering=flow or --flow_isolate cannot be had.
SteeringResult SteerOrDie(uint16_t port, const PortCaps& caps, uint16_t queues,
                          uint32_t local_ipv4, uint16_t udp_base,
                          const SteeringOptions& opts);

}  // namespace dblp
