#include "worker/worker_setup.h"

#include <rte_ethdev.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "dblp/control/shard_claim.h"
#include "dblp/job/counters.h"
#include "runtime/eal_app.h"
#include "runtime/numa_placement.h"

namespace dblp {

JoinMsg MakeJoin(const WorkerOptions& o, const GradientSource& source,
                 uint16_t port) {
  if (rte_eth_dev_count_avail() == 0) {
    Die("no Ethernet port",
        "give the worker a port: -a <PCI address> for a "
        "NIC, bound to vfio-pci (deploy/bind-nic.sh; check: dpdk-devbind.py "
        "--status-dev net), or "
        "--vdev=net_memif0,role=client,socket=/tmp/dblp-w0.sock");
  }
  JoinMsg join;
  join.worker_name = o.name;
  join.total_bytes = source.floats() * sizeof(float);
  join.mtu = o.dp.port.mtu;
  try {
    join.layers = source.Layers();
  } catch (const std::exception& e) {
    Die(std::string("the gradient source's layers: ") + e.what(),
        "restart the trainer (python/dblp) and its dblp-worker");
  }
  // Our data source, which the server pins: the port's MAC (known since
  // the EAL probed it; none behind a router, --eth_peer, where frames
  // reach the server from the router's) and --local_ip if given.
  rte_ether_addr mac{};
  if (rte_eth_macaddr_get(port, &mac) != 0) {
    Die("cannot read port " + std::to_string(port) + "'s MAC address",
        "check the port (-a / --vdev)");
  }
  if (o.eth_peer.empty()) std::memcpy(join.data_mac.data(), mac.addr_bytes, 6);
  if (!o.local_ip.empty() && !ParseIpv4(o.local_ip, &join.data_ipv4)) {
    Die("bad --local_ip " + o.local_ip,
        "use a dotted IPv4 address, e.g. 10.0.0.2");
  }
  return join;
}

namespace {

// Joins `l` (its control connection to l.address) with `join`; a refusal
// ends the process. In a sharded job the failure names the shard.
WelcomeMsg JoinLink(const WorkerOptions& o, ShardLink& l, const JoinMsg& join,
                    const std::atomic<bool>& quit) {
  AppFailure joined =
      l.control.Join(l.address, join, o.join_timeout_ms, quit, o.dp.realtime);
  if (joined.failed()) {
    if (l.count > 1) joined.what = l.Label() + ": " + joined.what;
    Die(joined);
  }
  return l.control.welcome();
}

// Before a failed join ends the worker: every link that joined closes
// its control connection (and stops its sidecar) first, so that no
// sidecar thread runs while the process exits.
void FinishJoined(WorkerShardLinks& links, const std::string& why) {
  for (size_t k = 0; k < links.size(); ++k) links[k].control.Finish(false, why);
}

}  // namespace

void JoinServerShards(const WorkerOptions& o, const GradientSource& source,
                      const DatapathCounters* ctr,
                      const std::atomic<bool>& quit, WorkerShardLinks* links) {
  const JoinMsg base = MakeJoin(o, source, 0);
  auto directory = std::make_unique<ShardLink>(0, 1, o.server, o.secret, ctr,
                                               o.dp.stats_period_s);
  WelcomeMsg dir = JoinLink(o, *directory, base, quit);
  if (!IsShardedWelcome(dir)) {
    directory->wel = dir;
    links->Add(std::move(directory));
    return;
  }
  if (std::string bad = CheckShardMap(dir); !bad.empty()) {
    const std::string why = "the directory's shard map is inconsistent: " + bad;
    directory->control.Finish(false, why);
    Die(why + " (dblp-server at " + o.server + ")",
        "run every server shard and worker from the same DBLP build");
  }
  const uint16_t S = dir.shard_count;
  // Link k uses port k when there is one per shard, else they share one.
  const uint16_t ports = rte_eth_dev_count_avail();
  if (ports != 1 && ports != S) {
    const std::string why = "this worker has " + std::to_string(ports) +
                            " DPDK ports for a job of " + std::to_string(S) +
                            " server shards";
    directory->control.Finish(false, why);
    Die(why,
        "give it one port that reaches every shard, or one per shard in "
        "shard order (port k to shard k): e.g. --vdev=net_memif0,role=client,"
        "socket=<shard 0's> ... --vdev=net_memif" +
            std::to_string(S - 1) + ",role=client,socket=<shard " +
            std::to_string(S - 1) + "'s>");
  }
  // A test seam (--shard_map_override): a wrong map, which shard k must
  // refuse. None in a production job.
  std::vector<ShardEntry> map = dir.shards;
  if (o.shard_map_hook) o.shard_map_hook(&map);
  directory->count = S;
  directory->wel = dir;
  links->Add(std::move(directory));
  for (uint16_t k = 1; k < S; ++k) {
    const uint16_t port = ports == S ? k : 0;
    auto link = std::make_unique<ShardLink>(k, S, ShardControlAddress(map[k]),
                                            o.secret, ctr, 0);
    const JoinMsg claim = ShardJoin(MakeJoin(o, source, port), dir, k, map[k]);
    AppFailure joined = link->control.Join(
        link->address, claim, o.join_timeout_ms, quit, o.dp.realtime);
    if (joined.failed()) {
      joined.what = link->Label() + ": " + joined.what;
      FinishJoined(*links, joined.what);
      Die(joined);
    }
    const WelcomeMsg got = link->control.welcome();
    if (std::string bad = CheckShardWelcome(dir, claim, map[k], got);
        !bad.empty()) {
      const std::string why = link->Label() +
                              "'s WELCOME does not confirm the shard map's "
                              "claim: " +
                              bad;
      link->control.Finish(false, why);
      FinishJoined(*links, why);
      Die(why,
          "give every worker the directory's shard map (--server= the "
          "directory, shard 0)");
    }
    link->wel = got;
    link->port = port;
    links->Add(std::move(link));
  }
}

// Binds the source to our rank; the job refuses what cannot serve it.
void StartWorkerSource(GradientSource& source, const WelcomeMsg& wel,
                       const WorkerJobSettings& js, WorkerControl& control) {
  try {
    source.Bind(wel.rank, wel.num_workers);
    source.OnJobStart(wel.resync_every);
  } catch (const std::exception& e) {
    control.Finish(false, e.what());
    Die(std::string("the gradient source cannot start as rank ") +
            std::to_string(wel.rank) + " of " +
            std::to_string(wel.num_workers) + ": " + e.what(),
        "check the source's flags (e.g. --max_train and --batch for the "
        "number of workers)");
  }
  if (std::string e = WorkerModel::CheckBroadcastFill(wel, js.bcast_fill);
      !e.empty()) {
    control.Finish(false, "--bcast_fill=prev with a consistent broadcast");
    Die(e, "--bcast_fill=zero");
  }
  if (std::string e = WorkerModel::CheckSource(source); !e.empty()) {
    control.Finish(false, e);
    Die(e, "check the trainer's dblp.Worker (same model on both sides)");
  }
}

void PrintJoined(const WelcomeMsg& wel, const GradientSource& source,
                 const ChunkLayout& layout, const PortCaps& caps,
                 size_t shards) {
  const std::string sharded =
      shards > 1
          ? " (directory of " + std::to_string(shards) + " server shards)"
          : "";
  std::printf(
      "dblp-worker: rank %u of %u, session %08x, %s, %u chunks of %u "
      "B, port %s (%s), server %s:%u%s\n",
      wel.rank, wel.num_workers, wel.session, source.Describe().c_str(),
      layout.num_chunks(), layout.chunk_payload(), caps.driver.c_str(),
      FormatMac(caps.mac.addr_bytes).c_str(),
      FormatIpv4(wel.server_ipv4).c_str(), wel.udp_base_port, sharded.c_str());
  std::fflush(stdout);
}

// The frame template toward the server, from the WELCOME and our flags.
FrameTemplate ServerTemplate(const WorkerOptions& o, const WelcomeMsg& wel,
                             const PortCaps& caps, Endpoint* local) {
  Endpoint server;
  local->mac = caps.mac;
  local->ipv4 = wel.worker_ipv4;  // ours, or the one the server assigned
  local->udp_port = static_cast<uint16_t>(wel.udp_base_port + 1 + wel.rank);
  server.ipv4 = wel.server_ipv4;
  server.udp_port = wel.udp_base_port;
  std::memcpy(server.mac.addr_bytes, wel.server_mac.data(), 6);
  if (!o.eth_peer.empty() && !ParseMac(o.eth_peer, server.mac.addr_bytes)) {
    Die("bad --eth_peer " + o.eth_peer, "use aa:bb:cc:dd:ee:ff");
  }
  return FrameTemplate(*local, server, caps);
}

void AddWorkerCounters(const std::vector<const LcoreConf*>& lcores,
                       const WorkerShardLinks& links, const PortDrops& drops,
                       RunReport* report) {
  uint64_t bitmaps_dropped = 0, stops = 0, msgs_in = 0, msgs_out = 0;
  std::vector<const ReceiverRound*> receivers;
  for (const auto& l : links) {
    bitmaps_dropped += l->bcast->answer().dropped();
    for (const auto& side : l->push) bitmaps_dropped += side->bitmaps_dropped();
    stops += l->control.stops_sent();
    msgs_in += l->control.messages_in();
    msgs_out += l->control.messages_out();
    receivers.push_back(&l->bcast->receiver());
  }
  // RX and frame checks are lcore 0's alone; TX is every lcore's.
  const DatapathCounters& ctr = lcores[0]->counters;
  auto sum = [&](auto field) {
    uint64_t t = 0;
    for (const LcoreConf* lc : lcores) t += (lc->counters.*field).load();
    return t;
  };
  using C = DatapathCounters;
  report->counters = {
      {"tx_frames", sum(&C::tx_frames)},
      {"rx_frames", ctr.rx_frames.load()},
      {"injected_drops", ctr.injected_drops.load()},
      {"tx_ring_full", sum(&C::tx_ring_full)},
      {"mbuf_alloc_failures", sum(&C::mbuf_alloc_failures)},
      {"bitmaps_dropped", bitmaps_dropped},
      {"stops_sent", stops},
      {"control_messages_in", msgs_in},
      {"control_messages_out", msgs_out},
      {"device_imissed", drops.imissed},
      {"device_rx_nombuf", drops.rx_nombuf},
      {"device_oerrors", drops.oerrors},
      {"frames_unpinned_source", ctr.unpinned_source.load()},
  };
  if (lcores.size() > 1) {
    for (size_t k = 0; k < lcores.size(); ++k) {
      report->counters.emplace_back("tx_frames_lcore" + std::to_string(k),
                                    lcores[k]->counters.tx_frames.load());
    }
  }
  AddReceiverCounters("bcast_", receivers, false, &report->counters);
  for (int s = 1; s < kNumFrameStatus; ++s) {
    report->counters.emplace_back(
        std::string("frame_") + FrameStatusName(static_cast<FrameStatus>(s)),
        ctr.frame_drops[s].load());
  }
}

rte_mempool* CreateWorkerPool(const WorkerOptions& o, uint16_t ports,
                              uint16_t queues) {
  PortOptions popts = o.dp.port;
  popts.nb_queues = queues;
  // External-buffer frames take up to three mbufs each (headers, payload
  // segment, tag).
  const uint32_t mbufs = o.dp.mbufs
                             ? o.dp.mbufs
                             : ports * MbufsNeeded(popts, o.dp.burst, 2048) *
                                   (o.dp.tx_extbuf ? 3 : 1);
  const int node = PortNumaNode(popts.port_id);
  WarnLcoresOffNode(node, "dblp-worker");
  return CreatePoolOrDie("dblp_worker_pool", mbufs, popts.mtu, node);
}

// The data port, set up once the WELCOME said how many queues the server's
// shards need; the push starts once the link is up (frames sent before are
// lost and would make the first round look like a burst).
PortCaps SetupWorkerPort(const WorkerOptions& o, uint16_t port_id,
                         uint16_t queues, rte_mempool* pool) {
  PortOptions popts = o.dp.port;
  popts.port_id = port_id;
  popts.nb_queues = queues;
  const PortCaps caps = SetupPortOrDie(popts, pool);
  if (!WaitForLink(popts.port_id, o.join_timeout_ms)) {
    Die("port " + std::to_string(popts.port_id) + " (" + caps.driver +
            ") link is down after " + std::to_string(o.join_timeout_ms) + " ms",
        "for net_memif start dblp-server (role=server, same socket=) "
        "first; for a NIC check the cable and the switch port");
  }
  return caps;
}

}  // namespace dblp
