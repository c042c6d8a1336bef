#include "server/server_setup.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <cstdio>
#include <string>

#include "dblp/base/log.h"
#include "dblp/base/rng.h"
#include "dblp/control/job_auth.h"
#include "runtime/eal_app.h"
#include "runtime/numa_placement.h"

namespace dblp {

ServerPorts SetupServerPorts(const ServerOptions& o, uint16_t lcores) {
  ServerPorts sp;
  sp.nb_ports = rte_eth_dev_count_avail();
  if (sp.nb_ports == 0) {
    Die("no Ethernet port",
        "give the server a port: -a <PCI address> for a "
        "NIC, bound to vfio-pci (deploy/bind-nic.sh; check: dpdk-devbind.py "
        "--status-dev net), or one "
        "--vdev=net_memifN,role=server,socket=/tmp/dblp-wN.sock per worker");
  }
  PortOptions popts = o.dp.port;
  popts.nb_queues = lcores;
  popts.multi_seg_tx =
      o.bcast_frames_auto || o.bcast_frames == BcastFrameMode::kShared;
  if (uint32_t{o.udp_port} + lcores - 1 > UINT16_MAX) {
    Die("--udp_port=" + std::to_string(o.udp_port) + " leaves no room for " +
            std::to_string(lcores) + " lcores' ports (udp_port + k)",
        "use --udp_port=" + std::to_string(UINT16_MAX - lcores + 1) +
            " or less");
  }
  // With several lcores their handoff rings may hold frames too.
  const uint32_t handoff = lcores > 1 ? lcores * kHandoffRingSize : 0;
  const uint32_t mbufs =
      o.dp.mbufs
          ? o.dp.mbufs
          : sp.nb_ports * MbufsNeeded(popts, o.dp.burst, 1024) + 2048 + handoff;
  // The pool, the sums and the mean live on the ports' NUMA node.
  const int node = PortNumaNode(0);
  WarnLcoresOffNode(node, "dblp-server");
  sp.pool = CreatePoolOrDie("dblp_server_pool", mbufs, popts.mtu, node);
  sp.caps.resize(sp.nb_ports);
  popts.flow_isolate = o.steering.isolate;
  uint32_t local_ip = 0;
  if (!ParseIpv4(o.local_ip, &local_ip)) {
    Die("bad --local_ip " + o.local_ip, "use a dotted IPv4, e.g. 10.0.0.1");
  }
  for (uint16_t p = 0; p < sp.nb_ports; ++p) {
    popts.port_id = p;
    sp.caps[p] = SetupPortOrDie(popts, sp.pool);
    // Lcore k's chunks arrive on UDP port udp_port + k (steering.h).
    const SteeringResult st =
        SteerOrDie(p, sp.caps[p], lcores, local_ip, o.udp_port, o.steering);
    if (lcores > 1 || o.steering.isolate) {
      std::printf("dblp-server: port %u (%s): steering %s: %s\n", p,
                  sp.caps[p].driver.c_str(), SteeringModeName(o.steering.mode),
                  st.describe.c_str());
      std::fflush(stdout);
    }
  }
  return sp;
}

// Ports, keys, the control plane and the join.
ServerAdmission AdmitServerWorkers(const ServerOptions& o,
                                   const std::atomic<bool>& quit) {
  ServerAdmission a;
  if (o.workers == 0 || o.workers >= kServerRank) {
    Die("--workers=" + std::to_string(o.workers) + " is out of range",
        "use 1.." + std::to_string(kServerRank - 1));
  }
  if (rte_lcore_count() > 64) {
    Die(std::to_string(rte_lcore_count()) + " datapath lcores",
        "give dblp-server at most 64 lcores (-l/--lcores)");
  }
  a.confs = MakeLcoreConfs();
  const auto S = static_cast<uint16_t>(a.confs.size());
  a.ports = SetupServerPorts(o, S);
  if (!ParseIpv4(o.local_ip, &a.local_ip)) {
    Die("bad --local_ip " + o.local_ip, "use a dotted IPv4, e.g. 10.0.0.1");
  }
  // The job's random nonce: its session and the members' frame keys derive
  // from it and the secret (job_auth.h), so none can be guessed from a
  // clock.
  const AuthBytes job_nonce = RandomAuthBytes();
  a.session = o.session ? o.session : DeriveSession(o.secret, job_nonce);
  a.policy = TolerancePolicy::Create(o.policy);
  std::vector<const DatapathCounters*> counters;
  for (const auto& c : a.confs) counters.push_back(&c->counters);
  const PortCaps& caps = a.ports.caps[0];
  ServerJoinConfig join{.workers = o.workers,
                        .session = a.session,
                        .mtu = caps.mtu,
                        .local_ip = a.local_ip,
                        .udp_port = o.udp_port,
                        .mac = caps.mac,
                        .max_gradient_bytes = o.max_gradient_bytes,
                        .rank_by_name = o.rank_by_name,
                        .policy = a.policy->Describe(),
                        .ports = a.ports.nb_ports,
                        .lanes = S,
                        .resync_every = o.resync_every,
                        .push_feedback = o.push_feedback,
                        .consistent_broadcast = o.consistent_broadcast,
                        .secret = &o.secret,
                        .frame_auth = o.frame_auth,
                        .job_nonce = job_nonce,
                        .sharding = std::nullopt};
  if (o.shard_role.sharded()) {
    join.sharding = ShardLinksConfig{.app = "dblp-server",
                                     .role = o.shard_role,
                                     .listen = o.listen,
                                     .job_flags = o.shard_job_flags,
                                     .local_ip = a.local_ip,
                                     .mac = std::to_array(caps.mac.addr_bytes),
                                     .udp_port = o.udp_port,
                                     .queues = S,
                                     .mtu = caps.mtu,
                                     .secret = &o.secret,
                                     .policy = o.policy,
                                     .resync_every = o.resync_every,
                                     .round_timeout_ms = o.dp.round_timeout_ms};
  }
  a.control = std::make_unique<ServerControl>(
      join, counters, o.dp.stats_period_s, o.control_limits);
  const AppFailure f =
      a.control->AdmitWorkers(o.listen, o.join_timeout_ms, quit, o.dp.realtime);
  if (f.failed()) Die(f);
  // A server shard's job is over its partition (local chunk i is the
  // gradient's first_chunk + i).
  const ShardLinks* links = a.control->shard_links();
  a.gradient_bytes =
      links ? links->PartitionBytes() : a.control->first_join().total_bytes;
  return a;
}

std::vector<std::unique_ptr<LcoreConf>> MakeLcoreConfs() {
  std::vector<std::unique_ptr<LcoreConf>> confs;
  unsigned lcore_id;
  RTE_LCORE_FOREACH(lcore_id) {
    confs.push_back(std::make_unique<LcoreConf>());
    confs.back()->lcore_id = lcore_id;
    confs.back()->lane = static_cast<uint16_t>(confs.size() - 1);
  }
  return confs;
}

namespace {

// --bcast_frames for this job's ports: auto shares the mean only where no
// port's PMD copies and every device could DMA-map it.
BcastFrameMode ChooseBcastFrames(const ServerOptions& o,
                                 const ServerPorts& ports, const uint8_t* mean,
                                 size_t mean_bytes) {
  BcastFrameMode mode = o.bcast_frames;
  for (uint16_t p = 0; p < ports.nb_ports; ++p) {
    if (mode == BcastFrameMode::kShared && !ports.caps[p].tx_multi_seg) {
      DBLP_LOG(Warning,
               "dblp-server: port %u (%s) offers no multi-segment TX: the "
               "broadcast copies the mean (--bcast_frames=copy)",
               p, ports.caps[p].driver.c_str());
      mode = BcastFrameMode::kCopy;
    }
  }
  if (!o.bcast_frames_auto && mode == BcastFrameMode::kShared) {
    // Asked for: the ports that DMA (not the software ones, which copy by
    // address) must be able to reach the mean, or the broadcast copies.
    std::vector<uint16_t> dma;
    for (uint16_t p = 0; p < ports.nb_ports; ++p) {
      if (AutoBcastFrameMode(ports.caps[p].driver, true) ==
          BcastFrameMode::kShared) {
        dma.push_back(p);
      }
    }
    if (!dma.empty() && !MapMeanForDma(mean, mean_bytes, dma.data(),
                                       static_cast<uint16_t>(dma.size()))) {
      DBLP_LOG(Warning,
               "dblp-server: the mean could not be DMA-mapped for the ports "
               "(needs IOVA as VA: EAL --iova-mode=va): the broadcast "
               "copies the mean (--bcast_frames=copy)");
      mode = BcastFrameMode::kCopy;
    }
  }
  if (o.bcast_frames_auto) {
    mode = BcastFrameMode::kShared;
    for (uint16_t p = 0; p < ports.nb_ports; ++p) {
      if (!ports.caps[p].tx_multi_seg ||
          AutoBcastFrameMode(ports.caps[p].driver, true) ==
              BcastFrameMode::kCopy) {
        mode = BcastFrameMode::kCopy;
      }
    }
    if (mode == BcastFrameMode::kShared) {
      std::vector<uint16_t> ids(ports.nb_ports);
      for (uint16_t p = 0; p < ports.nb_ports; ++p) ids[p] = p;
      if (!MapMeanForDma(mean, mean_bytes, ids.data(), ports.nb_ports)) {
        mode = BcastFrameMode::kCopy;
      }
    }
  }
  std::printf(
      "dblp-server: broadcast frames %s the mean (--bcast_frames=%s)\n",
      mode == BcastFrameMode::kShared ? "share" : "copy",
      o.bcast_frames_auto ? "auto" : BcastFrameModeName(o.bcast_frames));
  std::fflush(stdout);
  return mode;
}

}  // namespace

ServerLcores BuildServerLcores(
    const ServerShared& s, std::vector<std::unique_ptr<LcoreConf>>& confs,
    std::vector<std::unique_ptr<WorkerState>>& workers, LinkGrid& links) {
  const ServerOptions& o = *s.o;
  const DatapathOptions& dp = o.dp;
  const ServerPorts& ports = *s.ports;
  const auto S = static_cast<uint16_t>(confs.size());
  const auto* mean =
      reinterpret_cast<const uint8_t*>(s.job->iteration().mean().data());
  const BcastFrameMode bcast_mode = ChooseBcastFrames(
      o, ports, mean, s.job->iteration().mean().size() * sizeof(float));
  ServerLcores l;
  l.link_rate.resize(S);
  if (S > 1) {
    l.handoff = std::make_unique<HandoffRings>(S, PortNumaNode(0));
  }
  for (uint16_t k = 0; k < S; ++k) {
    // Emulated link rate, per port (a port is a link) and shared out
    // between the lcores that send on it.
    for (uint16_t p = 0; p < ports.nb_ports; ++p) {
      l.link_rate[k].emplace_back(
          dp.link_gbps / S,
          uint64_t{dp.burst} * WireBytesPerFrame(ports.caps[p].mtu));
    }
    l.pacers.push_back(std::make_unique<RoundPacer>(
        dp.idle_spin, dp.idle_sleep_us, dp.round_timeout_ms, s.quit,
        s.sync->progress(), dp.deep_idle));
    l.losses.push_back(std::make_unique<RxLossInjector>(
        dp.loss, dp.bursts, HashMix(dp.seed, 0xB0 + k)));
    // `inject burst` at the prompt adds to every lcore's injector.
    l.losses.back()->set_injected(&GlobalAppState().burst);
    std::vector<ServerLink*> mine;
    for (auto& link : links[k]) mine.push_back(link.get());
    l.lcores.push_back(std::make_unique<ServerLcore>(
        *confs[k], *s.control, *s.sync, workers, mine, *l.pacers[k],
        ServerLcore::Setup{
            .nb_ports = ports.nb_ports,
            .udp_port = o.udp_port,
            .local_ip = s.local_ip,
            .caps = &ports.caps,
            .layout = s.layout,
            .lanes = s.lanes,
            .loss = l.losses[k].get(),
            .job = s.job,
            .mean = mean,
            .pool = ports.pool,
            .link_rate = &l.link_rate[k],
            .prefetch = dp.prefetch,
            .coordinator = s.coordinator,
            .handoff = S > 1 ? l.handoff->rings() : std::vector<rte_ring*>{},
            .bcast_frames = bcast_mode,
            .mean_iova = MeanIova(mean)}));
  }
  return l;
}

namespace {
int RunRemoteLcore(void* arg) {
  auto* r = static_cast<RemoteLcore*>(arg);
  if (r->realtime) SetRealtime(pthread_self(), kDatapathRtPriority);
  r->lcore->Run();
  return 0;
}
}  // namespace

void LaunchRemoteLcores(ServerLcores& l,
                        const std::vector<std::unique_ptr<LcoreConf>>& confs,
                        bool realtime) {
  l.remote.assign(l.lcores.size(), RemoteLcore{});
  for (size_t k = 1; k < l.lcores.size(); ++k) {
    l.remote[k] = RemoteLcore{l.lcores[k].get(), realtime};
    rte_eal_remote_launch(RunRemoteLcore, &l.remote[k], confs[k]->lcore_id);
  }
}

}  // namespace dblp
