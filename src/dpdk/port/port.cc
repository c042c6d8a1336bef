#include "port/port.h"

#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dblp/base/log.h"
#include "port/steering.h"
#include "runtime/eal_app.h"

namespace dblp {

namespace {

constexpr uint32_t kVlanBytes = 4;
// Ethernet header + CRC: what a device adds to the IP MTU when it does not
// say otherwise (the same default rte_ethdev uses).
constexpr uint32_t kDefaultL2Overhead = RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;

std::string PortList() {
  std::string list;
  for (uint16_t p = 0; p < RTE_MAX_ETHPORTS; ++p) {
    if (!rte_eth_dev_is_valid_port(p)) continue;
    char name[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(p, name);
    if (!list.empty()) list += ", ";
    list += std::to_string(p) + " (" + name + ")";
  }
  return list.empty() ? "none" : list;
}

// Data room (headroom included) for one `mtu`-sized frame in one segment.
uint32_t DataRoomFor(uint32_t mtu) {
  const uint32_t need = RTE_PKTMBUF_HEADROOM + mtu + RTE_ETHER_HDR_LEN +
                        kVlanBytes + RTE_ETHER_CRC_LEN;
  const uint32_t rounded = (need + 63u) & ~63u;
  return std::max<uint32_t>(RTE_MBUF_DEFAULT_BUF_SIZE, rounded);
}

uint32_t CacheSizeFor(uint32_t n_mbufs) {
  // The mempool requires cache_size <= n / 1.5 and <= the compile-time max.
  uint32_t cache =
      std::min<uint32_t>(kPoolCacheSize, RTE_MEMPOOL_CACHE_MAX_SIZE);
  cache = std::min<uint32_t>(cache, n_mbufs * 2 / 3);
  return cache;
}

}  // namespace

rte_mempool* CreatePoolOrDie(const std::string& name, uint32_t n_mbufs,
                             uint32_t mtu, int socket) {
  const uint32_t data_room = DataRoomFor(mtu);
  if (data_room > UINT16_MAX) {
    Die("mbuf pool " + name + ": MTU " + std::to_string(mtu) + " needs " +
            std::to_string(data_room) +
            "-byte mbufs, more than an mbuf can hold (65535)",
        "use --mtu <= 9000");
  }
  if (n_mbufs == 0) {
    Die("mbuf pool " + name + ": zero mbufs requested",
        "size the pool with MbufsNeeded()");
  }
  const uint32_t cache = CacheSizeFor(n_mbufs);
  rte_mempool* pool =
      rte_pktmbuf_pool_create(name.c_str(), n_mbufs, cache, 0,
                              static_cast<uint16_t>(data_room), socket);
  if (pool != nullptr) return pool;

  const int err = rte_errno;
  const uint64_t obj = rte_mempool_calc_obj_size(
      static_cast<uint32_t>(sizeof(rte_mbuf)) + data_room, 0, nullptr);
  // Objects plus the per-lcore cache array inside the mempool header.
  const uint64_t bytes = obj * n_mbufs + static_cast<uint64_t>(RTE_MAX_LCORE) *
                                             sizeof(rte_mempool_cache);
  const uint64_t mib = (bytes + (1u << 20) - 1) >> 20;
  char what[256];
  std::snprintf(what, sizeof(what),
                "cannot create mbuf pool %s (%u mbufs of %u bytes, ~%llu MiB "
                "on socket %d): %s",
                name.c_str(), n_mbufs, data_room,
                static_cast<unsigned long long>(mib), socket,
                rte_strerror(err));
  std::string fix;
  if (err == EEXIST) {
    fix = "a pool named " + name + " already exists; use another name";
  } else {
    // EAL itself needs some tens of MiB next to the pool.
    fix = "give the EAL more memory: -m " + std::to_string(mib + 64) +
          " (with --no-huge) or --socket-mem=" + std::to_string(mib + 64) +
          " with hugepages, or use fewer mbufs (smaller --rxd/--txd, "
          "fewer queues)";
  }
  Die(what, fix);
}

uint32_t MbufsNeeded(const PortOptions& opts, uint32_t burst, uint32_t extra) {
  const uint64_t q = opts.nb_queues;
  // Every RX descriptor holds an mbuf, every TX descriptor may, each lcore
  // (one per queue, plus the main/control lcore) may park a full cache and a
  // burst in flight.
  const uint64_t n = q * (opts.nb_rxd + opts.nb_txd) +
                     (q + 1) * (kPoolCacheSize + burst) + extra;
  return static_cast<uint32_t>(std::min<uint64_t>(n, UINT32_MAX));
}

PortCaps SetupPortOrDie(const PortOptions& opts, rte_mempool* pool) {
  const uint16_t port = opts.port_id;
  if (!rte_eth_dev_is_valid_port(port)) {
    Die("port " + std::to_string(port) +
            " not found; available ports: " + PortList(),
        "add a device: -a <PCI address> for a NIC bound to vfio-pci, or a "
        "virtual port such as --vdev=net_memif0,role=server,socket=/tmp/"
        "dblp.sock, --vdev=net_af_packet0,iface=<if> or --vdev=net_ring0 "
        "(before `--`), or pick an existing port id");
  }
  if (opts.checksum != "auto" && opts.checksum != "sw" &&
      opts.checksum != "none") {
    Die("unknown --checksum=" + opts.checksum, "use auto, sw or none");
  }

  rte_eth_dev_info info{};
  int ret = rte_eth_dev_info_get(port, &info);
  if (ret != 0) {
    Die("rte_eth_dev_info_get(port " + std::to_string(port) +
            "): " + rte_strerror(-ret),
        "check the device with dpdk-devbind.py --status");
  }
  PortCaps caps;
  caps.driver = info.driver_name != nullptr ? info.driver_name : "?";
  const std::string where =
      "port " + std::to_string(port) + " (" + caps.driver + ")";

  // Queues.
  if (opts.nb_queues == 0 || opts.nb_queues > info.max_rx_queues ||
      opts.nb_queues > info.max_tx_queues) {
    Die(where + ": " + std::to_string(opts.nb_queues) +
            " queue(s) requested, the device offers " +
            std::to_string(info.max_rx_queues) + " RX / " +
            std::to_string(info.max_tx_queues) + " TX",
        "use at most " +
            std::to_string(std::min(info.max_rx_queues, info.max_tx_queues)) +
            " datapath lcores/queues (for vdevs, e.g. net_af_packet, raise "
            "qpairs=)");
  }

  // MTU: the device's max_mtu, further capped by its max frame length.
  uint32_t overhead = kDefaultL2Overhead;
  if (info.max_mtu != UINT16_MAX && info.max_rx_pktlen > info.max_mtu) {
    overhead = info.max_rx_pktlen - info.max_mtu;
  }
  uint32_t dev_max = info.max_mtu;
  if (info.max_rx_pktlen > overhead) {
    dev_max = std::min<uint32_t>(dev_max, info.max_rx_pktlen - overhead);
  }
  if (opts.mtu > dev_max) {
    Die(where + ": MTU " + std::to_string(opts.mtu) +
            " is above the device's max of " + std::to_string(dev_max),
        "use --mtu=" + std::to_string(dev_max) +
            " or less (jumbo frames need a device and link that carry them)");
  }
  if (opts.mtu > kMaxMtu) {
    Die(where + ": MTU " + std::to_string(opts.mtu) + " is above DBLP's " +
            std::to_string(kMaxMtu),
        "use --mtu between " + std::to_string(kMinMtu) + " and " +
            std::to_string(kMaxMtu));
  }
  if (opts.mtu < info.min_mtu || opts.mtu < kMinMtu) {
    Die(where + ": MTU " + std::to_string(opts.mtu) + " is too small",
        "use --mtu of at least " +
            std::to_string(std::max<uint32_t>(info.min_mtu, kMinMtu)));
  }
  caps.mtu = opts.mtu;

  // One frame must fit one mbuf: the datapath never chains segments.
  if (pool != nullptr) {
    const uint32_t room =
        rte_pktmbuf_data_room_size(pool) - RTE_PKTMBUF_HEADROOM;
    const uint32_t frame = opts.mtu + RTE_ETHER_HDR_LEN + kVlanBytes;
    if (room < frame) {
      Die(where + ": mbufs of pool " + std::string(pool->name) + " hold " +
              std::to_string(room) + " bytes, an MTU-" +
              std::to_string(opts.mtu) + " frame needs " +
              std::to_string(frame),
          "create the pool with CreatePoolOrDie(..., mtu=" +
              std::to_string(opts.mtu) + ", ...)");
    }
  } else {
    Die(where + ": no mbuf pool", "create one with CreatePoolOrDie()");
  }

  // Offloads: ask only for what the device offers.
  rte_eth_conf conf{};
  conf.rxmode.mtu = opts.mtu;
  const uint64_t want_tx_ip = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
  const uint64_t want_tx_udp = RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  if (opts.checksum != "sw" && (info.tx_offload_capa & want_tx_ip) != 0) {
    conf.txmode.offloads |= want_tx_ip;
    caps.tx_ipv4_cksum_offload = true;
  }
  if (opts.checksum == "auto" && (info.tx_offload_capa & want_tx_udp) != 0) {
    conf.txmode.offloads |= want_tx_udp;
    caps.tx_udp_cksum_offload = true;
  }
  // Chained frames (the broadcast's shared payload, bcast_frames.h; the
  // worker's --tx_payload=extbuf), when asked for: a device not told may
  // pick a TX path that sends only the first segment.
  if (opts.multi_seg_tx &&
      (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0) {
    conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    caps.tx_multi_seg = true;
  } else if (opts.multi_seg_tx && opts.multi_seg_required) {
    Die(where + " (" + caps.driver +
            ") does not offer multi-segment TX (RTE_ETH_TX_OFFLOAD_MULTI_"
            "SEGS), which --tx_payload=extbuf needs",
        "use --tx_payload=copy on this port");
  }
  caps.udp_cksum_zero = SendsUdpChecksumZero(opts.checksum, caps.driver,
                                             caps.tx_udp_cksum_offload);
  caps.fused_checksum = opts.fused_checksum;
  const uint64_t want_rx =
      RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  if ((info.rx_offload_capa & want_rx) == want_rx) {
    conf.rxmode.offloads |= want_rx;
    caps.rx_cksum_offload = true;
  }
  if (opts.nb_queues > 1) {
    const uint64_t hf =
        (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
    if (hf != 0) {
      conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
      conf.rx_adv_conf.rss_conf.rss_hf = hf;
      caps.rss_hf = hf;
    }
  }
  if (opts.flow_isolate) IsolateOrDie(port, where);

  ret = rte_eth_dev_configure(port, opts.nb_queues, opts.nb_queues, &conf);
  if (ret != 0) {
    Die(where + ": rte_eth_dev_configure failed: " + rte_strerror(-ret),
        "run with --log-level=*:debug to see which setting the driver "
        "refused (MTU, queues, offloads)");
  }
  uint16_t nb_rxd = opts.nb_rxd, nb_txd = opts.nb_txd;
  ret = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rxd, &nb_txd);
  if (ret != 0) {
    Die(where + ": cannot adjust descriptor counts: " + rte_strerror(-ret),
        "use --rxd/--txd within the device's limits");
  }
  const int socket = rte_eth_dev_socket_id(port);
  rte_eth_rxconf rxconf = info.default_rxconf;
  rxconf.offloads = conf.rxmode.offloads;
  rte_eth_txconf txconf = info.default_txconf;
  txconf.offloads = conf.txmode.offloads;
  for (uint16_t q = 0; q < opts.nb_queues; ++q) {
    ret = rte_eth_rx_queue_setup(port, q, nb_rxd, socket, &rxconf, pool);
    if (ret != 0) {
      Die(where + ": RX queue " + std::to_string(q) +
              " setup failed: " + rte_strerror(-ret),
          "use fewer --rxd, or a larger pool (--mbufs=0 sizes it from the "
          "ports)");
    }
    ret = rte_eth_tx_queue_setup(port, q, nb_txd, socket, &txconf);
    if (ret != 0) {
      Die(where + ": TX queue " + std::to_string(q) +
              " setup failed: " + rte_strerror(-ret),
          "use fewer --txd");
    }
  }
  ret = rte_eth_dev_start(port);
  if (ret != 0) {
    Die(where + ": rte_eth_dev_start failed: " + rte_strerror(-ret),
        "check that the interface exists and is up (af_packet: `ip link set "
        "<if> up`), and that no other process owns the device");
  }
  if (opts.promiscuous) {
    ret = rte_eth_promiscuous_enable(port);
    if (ret != 0 && ret != -ENOTSUP) {
      DBLP_LOG(Warning, "dblp: %s: promiscuous mode not enabled: %s",
               where.c_str(), rte_strerror(-ret));
    }
  }
  ret = rte_eth_macaddr_get(port, &caps.mac);
  if (ret != 0) {
    Die(where + ": cannot read the MAC address: " + rte_strerror(-ret),
        "check the device");
  }
  return caps;
}

bool SendsUdpChecksumZero(const std::string& policy, const std::string& driver,
                          bool udp_offload) {
  if (policy == "none") return true;
  // memif frames are copied between two processes of one host and never
  // cross a wire: "auto" skips the software pass over every payload, like
  // testpmd's txonly. --checksum=sw still forces one.
  return policy == "auto" && !udp_offload && driver == "net_memif";
}

std::string DescribePortCaps(const PortCaps& caps) {
  std::string s = caps.driver + " mac " + FormatMac(caps.mac.addr_bytes) +
                  " mtu " + std::to_string(caps.mtu) + ", tx checksums: ip ";
  s += caps.tx_ipv4_cksum_offload ? "offload" : "sw";
  s += ", udp ";
  s += caps.udp_cksum_zero         ? "none (0)"
       : caps.tx_udp_cksum_offload ? "offload"
                                   : "sw";
  s += ", rx checksums: ";
  s += caps.rx_cksum_offload ? "offload" : "sw";
  return s;
}

PortDrops ReadPortDrops(uint16_t port_id) {
  PortDrops d;
  rte_eth_stats st{};
  if (rte_eth_stats_get(port_id, &st) == 0) {
    d.imissed = st.imissed;
    d.ierrors = st.ierrors;
    d.rx_nombuf = st.rx_nombuf;
    d.oerrors = st.oerrors;
  }
  return d;
}

bool WaitForLink(uint16_t port_id, uint32_t timeout_ms) {
  const uint64_t hz = rte_get_timer_hz();
  const uint64_t deadline = rte_get_timer_cycles() + hz / 1000 * timeout_ms;
  for (;;) {
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(port_id, &link) == 0 &&
        link.link_status == RTE_ETH_LINK_UP) {
      return true;
    }
    if (rte_get_timer_cycles() > deadline) return false;
    rte_delay_us_sleep(1000);  // setup only: the datapath has not started
  }
}

void AwaitPeerClose(uint16_t port_id, const PortCaps& caps) {
  if (caps.driver != "net_memif") return;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(port_id, &link) == 0 &&
        link.link_status == RTE_ETH_LINK_DOWN) {
      // The handler marks the link down as it finishes; let it return.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

namespace {

void StopAndClose(const std::vector<uint16_t>& ports) {
  for (const uint16_t p : ports) {
    rte_eth_dev_stop(p);
    rte_eth_dev_close(p);
  }
}

void StopAndCloseCall(void* ports) {
  StopAndClose(*static_cast<const std::vector<uint16_t>*>(ports));
}

bool IsMemif(uint16_t port_id) {
  rte_eth_dev_info info{};
  return rte_eth_dev_info_get(port_id, &info) == 0 &&
         info.driver_name != nullptr &&
         std::string(info.driver_name) == "net_memif";
}

}  // namespace

std::string StopAndClosePorts(const std::vector<uint16_t>& ports) {
  std::vector<uint16_t> memif, here;
  for (const uint16_t p : ports) (IsMemif(p) ? memif : here).push_back(p);
  StopAndClose(here);
  if (memif.empty()) return "";
  const std::string err = RunOnInterruptThread(StopAndCloseCall, &memif);
  if (err.empty()) return "";
  StopAndClose(memif);
  return "memif port(s) closed from this thread, where a peer's hang-up may "
         "race the close: " +
         err;
}

}  // namespace dblp
