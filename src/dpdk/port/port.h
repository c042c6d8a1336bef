// Port and mempool setup that asks the device what it can do.
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dblp/wire/chunking.h"  // kMinMtu, kMaxMtu

namespace dblp {

struct PortOptions {
  uint16_t port_id = 0;
  uint16_t nb_queues = 1;  // one RX and one TX queue per datapath lcore
  uint16_t nb_rxd = 1024;
  uint16_t nb_txd = 1024;
  uint32_t mtu = 1500;      // IP MTU; validated against the device
  bool promiscuous = true;  // vdevs and shared L2 segments need it
  // Checksum offload policy: "auto" uses the device's IPv4/UDP TX checksum
  // offloads when offered and software otherwise, except on net_memif
  // (shared memory, no wire), where it sends UDP checksum 0; "sw" always
  // computes in software; "none" sends UDP checksum 0 (legal for IPv4) and
  // treats the IPv4 header checksum like "auto".
  std::string checksum = "auto";
  // A software UDP checksum is summed while the payload is copied into the
  // frame (one pass over the gradient) instead of in a second pass.
  bool fused_checksum = true;
  // rte_flow isolated mode before the port is configured (steering.h,
  // --flow_isolate): only frames the flow rules match reach DPDK.
  bool flow_isolate = false;
  // Chained frames may go out: asks for multi-segment TX where offered
  // (caps.tx_multi_seg says whether it was), for the server's shared
  // broadcast payload (bcast_frames.h) and external-buffer TX
  // (--tx_payload=extbuf). Off for the rest, since on some NICs it rules
  // out the fastest TX path.
  bool multi_seg_tx = false;
  // With multi_seg_tx: a device without it is refused, naming the flag
  // (--tx_payload=extbuf cannot fall back to copying).
  bool multi_seg_required = false;
};

// What the port ended up with after negotiation.
struct PortCaps {
  bool tx_ipv4_cksum_offload = false;
  bool tx_udp_cksum_offload = false;
  bool udp_cksum_zero = false;    // checksum=none
  bool tx_multi_seg = false;      // chained mbufs go out whole
  bool fused_checksum = true;     // PortOptions::fused_checksum
  bool rx_cksum_offload = false;  // device validates and flags RX checksums
  uint32_t mtu = 1500;
  uint64_t rss_hf = 0;  // RSS hash functions in use (several queues)
  rte_ether_addr mac{};
  std::string driver;
};

// Per-lcore mempool cache of the pools CreatePoolOrDie makes (smaller for
// tiny pools); MbufsNeeded accounts for it.
inline constexpr uint32_t kPoolCacheSize = 256;

// Whether frames go out with UDP checksum 0 under checksum policy `policy`
// on driver `driver`: always for "none"; for "auto" on net_memif without a
// UDP offload (shared memory between two processes: no wire to protect
// against; a memif peer that forwards to a network, such as VPP, should be
// given --checksum=sw).
bool SendsUdpChecksumZero(const std::string& policy, const std::string& driver,
                          bool udp_offload);

// One line for logs: driver, MAC, MTU and which checksums are offloaded.
std::string DescribePortCaps(const PortCaps& caps);

// Creates a pktmbuf pool of `n_mbufs` mbufs big enough for `mtu`-sized
// frames (one segment each) on `socket` (SOCKET_ID_ANY is fine). Dies with
// the memory it needed and the fix (-m, --socket-mem, fewer mbufs) if it
// cannot.
rte_mempool* CreatePoolOrDie(const std::string& name, uint32_t n_mbufs,
                             uint32_t mtu, int socket);

// Configures and starts a port. Dies naming the fix if the port does not
// exist (list of available ports, -a/--vdev hint), the MTU or queue count
// exceeds what the device offers, the pool's mbufs cannot hold an MTU-sized
// frame, or setup fails. TX checksum offloads are enabled in txmode (and
// reported in PortCaps) only when the device offers them; RX IPv4+UDP
// checksum offloads likewise. PortCaps.mac comes from rte_eth_macaddr_get.
PortCaps SetupPortOrDie(const PortOptions& opts, rte_mempool* pool);

// Mbufs a port needs: RX rings + TX rings + per-lcore caches + in flight.
// Pure arithmetic (no EAL needed): one lcore per queue plus one more.
uint32_t MbufsNeeded(const PortOptions& opts, uint32_t burst, uint32_t extra);

// Polls the link state until it is up or `timeout_ms` passed. A memif
// client's link comes up only once its server side accepted it.
bool WaitForLink(uint16_t port_id, uint32_t timeout_ms);

// Device drops (imissed + rx_nombuf + oerrors) for the summary.
struct PortDrops {
  uint64_t imissed = 0, ierrors = 0, rx_nombuf = 0, oerrors = 0;
};
PortDrops ReadPortDrops(uint16_t port_id);

// On memif the side that closes second is safe: a memif disconnect handled
// on the EAL interrupt thread while this process transmits, closes its port
// or cleans up the EAL crashed it (DPDK 22.11: 2 of 33 training workers at
// exit; a server mid-TX when the workers closed first). So a worker, after
// its BYE, waits for the server (which closes its ports right after the
// job) to close the link first, at most 2 s. Other drivers: returns at once.
// (The close itself now runs on the interrupt thread, StopAndClosePorts
// below, and the apps skip rte_eal_cleanup; the wait still keeps a worker's
// TX off a port memif is tearing down.)
void AwaitPeerClose(uint16_t port_id, const PortCaps& caps);

// Stops and closes `ports`, after the datapath lcores stopped. A memif
// port's control channel lives on EAL's interrupt thread, which tears the
// port down by itself when the peer hangs up (memif_disconnect frees the
// regions and the channel); a close from this thread at that moment frees
// them twice (DPDK 22.11 under ASan: "EAL: Error: Invalid memory", then a
// SEGV in the handler, when a worker was killed and the server aborted). An
// EAL alarm runs on that same thread, so memif ports close there, after any
// teardown in flight (eal_app.h, RunOnInterruptThread); other drivers close
// here. Returns a warning when the close could not run there (the ports are
// then closed here).
std::string StopAndClosePorts(const std::vector<uint16_t>& ports);

}  // namespace dblp
