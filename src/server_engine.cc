#include "server_engine.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "app_telemetry.h"
#include "datapath.h"
#include "dblp/base/log.h"
#include "dblp/job/server_iteration.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/mean_reducer.h"
#include "eal_app.h"
#include "engine_runtime.h"
#include "lcore_loop.h"
#include "numa_placement.h"
#include "server_control.h"
#include "server_report.h"

namespace dblp {
namespace {

RoundBeginRequest Announcement(Direction d, uint32_t round,
                               const RoundTolerance& t) {
  return RoundBeginRequest{d, round, t.p, t.deadline_ns,
                           t.deadline_ns ? t.min_fraction : 0, t.critical};
}

// What a remote lcore runs: its ServerLcore until the job ends.
struct RemoteLcore {
  ServerLcore* lcore;
  bool realtime;
};
int RunRemoteLcore(void* arg) {
  auto* r = static_cast<RemoteLcore*>(arg);
  if (r->realtime) SetRealtime(pthread_self(), kDatapathRtPriority);
  r->lcore->Run(nullptr);
  return 0;
}

// Ports and the pool, with one RX/TX queue pair per datapath lcore.
uint16_t SetupServerPorts(const ServerOptions& o, uint16_t lcores,
                          rte_mempool** pool, std::vector<PortCaps>* caps) {
  const uint16_t nb_ports = rte_eth_dev_count_avail();
  if (nb_ports == 0) {
    Die("no Ethernet port",
        "give the server a port: -a <PCI address> for a "
        "NIC, bound to vfio-pci (deploy/bind-nic.sh; check: dpdk-devbind.py "
        "--status-dev net), or one "
        "--vdev=net_memifN,role=server,socket=/tmp/dblp-wN.sock per worker");
  }
  PortOptions popts = o.dp.port;
  popts.nb_queues = lcores;
  const uint32_t mbufs =
      o.dp.mbufs ? o.dp.mbufs
                 : nb_ports * MbufsNeeded(popts, o.dp.burst, 1024) + 2048;
  // The pool, the sums and the mean live on the ports' NUMA node.
  const int node = PortNumaNode(0);
  WarnLcoresOffNode(node, "dblp-server");
  *pool = CreatePoolOrDie("dblp_server_pool", mbufs, popts.mtu, node);
  caps->resize(nb_ports);
  for (uint16_t p = 0; p < nb_ports; ++p) {
    popts.port_id = p;
    (*caps)[p] = SetupPortOrDie(popts, *pool);
    if (lcores > 1 && (*caps)[p].driver != "net_memif") {
      Die("port " + std::to_string(p) + " (" + (*caps)[p].driver +
              ") cannot steer a round's chunk ranges to " +
              std::to_string(lcores) + " lcores",
          "run with one datapath lcore (-l with one core) on this port; "
          "several lcores need net_memif, whose queue k reaches queue k");
    }
  }
  return nb_ports;
}

}  // namespace

int RunServer(const ServerOptions& o) {
  const std::atomic<bool>& g_quit = InstallQuitHandlers();
  // Rows are streamed as the rounds end: a directory that cannot take them
  // fails the server now, before workers join a job it could not record.
  RowStream rows;
  if (std::string err;
      !o.dp.out_dir.empty() && !rows.Open(o.dp.out_dir, &err)) {
    DBLP_LOG(Error, "dblp-server: %s", err.c_str());
    return 1;
  }
  if (o.workers == 0 || o.workers >= kServerRank) {
    Die("--workers=" + std::to_string(o.workers) + " is out of range",
        "use 1.." + std::to_string(kServerRank - 1));
  }
  if (rte_lcore_count() > 64) {
    Die(std::to_string(rte_lcore_count()) + " datapath lcores",
        "give dblp-server at most 64 lcores (-l/--lcores)");
  }
  const auto S = static_cast<uint16_t>(rte_lcore_count());
  rte_mempool* pool = nullptr;
  std::vector<PortCaps> caps;
  const uint16_t nb_ports = SetupServerPorts(o, S, &pool, &caps);
  uint32_t local_ip = 0;
  if (!ParseIpv4(o.local_ip, &local_ip)) {
    Die("bad --local_ip " + o.local_ip, "use a dotted IPv4, e.g. 10.0.0.1");
  }
  // The job's random nonce: its session and frame key derive from it and
  // the secret (job_auth.h), so neither can be guessed from a clock.
  const AuthBytes job_nonce = RandomAuthBytes();
  const uint32_t session =
      o.session ? o.session : DeriveSession(o.secret, job_nonce);
  const FrameKey frame_key = DeriveFrameKey(o.secret, job_nonce, o.frame_auth);
  std::unique_ptr<TolerancePolicy> policy = TolerancePolicy::Create(o.policy);
  // Telemetry and the runtime prompt's commands (engine_runtime.h).
  EngineRuntime runtime("dblp-server", true);
  runtime.SetPolicy(o.policy, 0, false);

  std::vector<std::unique_ptr<LcoreConf>> lcs;
  std::vector<const DatapathCounters*> counters;
  unsigned lcore_id;
  RTE_LCORE_FOREACH(lcore_id) {
    lcs.push_back(std::make_unique<LcoreConf>());
    lcs.back()->lcore_id = lcore_id;
    lcs.back()->shard = static_cast<uint16_t>(lcs.size() - 1);
    counters.push_back(&lcs.back()->counters);
  }
  ServerControl control(
      ServerJoinConfig{o.workers, session, caps[0].mtu, local_ip, o.udp_port,
                       caps[0].mac, o.max_gradient_bytes, o.rank_by_name,
                       policy->Describe(),
                       nb_ports, S, o.resync_every, o.push_feedback,
                       o.consistent_broadcast, &o.secret, o.frame_auth,
                       job_nonce},
      counters, o.dp.stats_period_s, o.control_limits);
  const JoinMsg& first =
      control.AdmitWorkers(o.listen, o.join_timeout_ms, g_quit, o.dp.realtime);

  // ---- the job
  // ---------------------------------------------------------------
  const uint32_t W = o.workers;
  const ChunkLayout layout(
      first.total_bytes,
      ChunkPayloadForMtu(caps[0].mtu, FrameTagBytes(o.frame_auth)));
  const uint32_t N = layout.num_chunks();
  const ShardMap shards(N, S);
  std::vector<std::unique_ptr<WorkerState>> workers;
  std::vector<SendOrder> orders;
  for (uint32_t w = 0; w < W; ++w) {
    workers.push_back(std::make_unique<WorkerState>());
    workers.back()->source = control.pinned_source(w);
    orders.emplace_back(o.dp.send_order, w, W, HashMix(o.dp.seed, 0xBC));
  }
  LinkGrid links =
      BuildLinkGrid(session, layout, shards, o.dp.burst, workers, frame_key);
  std::vector<std::vector<ReceiveSide*>> push_sides(W);
  std::vector<std::vector<SendSide*>> bcast_sides(W);
  for (auto& shard : links) {
    for (uint32_t w = 0; w < W; ++w) {
      push_sides[w].push_back(&shard[w]->push);
      bcast_sides[w].push_back(&shard[w]->bcast);
    }
  }
  control.Attach(push_sides, bcast_sides);
  // What the server decides between a push and its broadcast (the same
  // object as dblp-udp-server's): mean, policy, broadcast, next push.
  ServerIteration iteration(o, std::move(policy), layout, W, o.dp.seed,
                            "dblp-server");
  MeanReducer& reducer = iteration.reducer();
  const std::span<const float> mean = iteration.mean();
  const int node = PortNumaNode(0);
  PlaceOnNodeOrWarn(reducer.sum_storage(), node, "sum buffer");
  PlaceOnNodeOrWarn(mean, node, "mean buffer");
  // Loss on the pushes we receive, applied as frames arrive.
  RxLossInjector loss(o.dp.loss, o.dp.bursts, HashMix(o.dp.seed, 0xB0));
  JobSync job(S, &g_quit);
  ServerDecisions decisions;
  decisions.next_push =
      iteration.PushTolerance(0, iteration.policy()->Current());
  // The consistent broadcast's subset of this iteration.
  std::vector<uint32_t> bcast_subset;
  std::vector<std::unique_ptr<ServerLcore>> lcores;
  std::vector<std::vector<TokenBucket>> link_rate(S);
  std::vector<std::unique_ptr<RoundPacer>> pacers;
  std::vector<std::unique_ptr<RxLossInjector>> losses;
  for (uint16_t k = 0; k < S; ++k) {
    // Emulated link rate, per port (a port is a link) and shared out
    // between the lcores that send on it.
    for (uint16_t p = 0; p < nb_ports; ++p) {
      link_rate[k].emplace_back(
          o.dp.link_gbps / S,
          uint64_t{o.dp.burst} * WireBytesPerFrame(caps[p].mtu));
    }
    pacers.push_back(std::make_unique<RoundPacer>(
        o.dp.idle_spin, o.dp.idle_sleep_us, o.dp.round_timeout_ms, &g_quit,
        job.progress(), o.dp.deep_idle));
    // Each lcore draws its own losses (same schedule, its own stream).
    losses.push_back(
        k == 0 ? nullptr
               : std::make_unique<RxLossInjector>(
                     o.dp.loss, o.dp.bursts, HashMix(o.dp.seed, 0xB0 + k)));
    std::vector<ServerLink*> mine;
    for (auto& l : links[k]) mine.push_back(l.get());
    lcores.push_back(std::make_unique<ServerLcore>(
        *lcs[k], control, job, workers, mine, *pacers[k],
        ServerLcore::Setup{nb_ports, o.udp_port, local_ip, &caps, &layout,
                           &shards, k == 0 ? &loss : losses[k].get(), &reducer,
                           reinterpret_cast<const uint8_t*>(mean.data()), pool,
                           &link_rate[k], o.dp.prefetch, o.push_only,
                           o.continue_on_worker_loss, &orders, &decisions,
                           &bcast_subset}));
  }
  // `inject burst` adds to every lcore's injector; the stats for telemetry
  // are the summary's counters, read by the coordinator.
  loss.set_injected(&GlobalAppState().burst);
  for (auto& l : losses) {
    if (l) l->set_injected(&GlobalAppState().burst);
  }
  {
    std::vector<const LcoreConf*> lc_ptrs;
    for (const auto& l : lcs) lc_ptrs.push_back(l.get());
    runtime.SetLcores(std::move(lc_ptrs), nb_ports);
  }
  runtime.SetCounters([&](CounterList* out) {
    RunReport live;
    AddServerCounters(lcs, control, links, nb_ports, &live);
    *out = std::move(live.counters);
  });
  RunReport report;
  report.role = "server";
  report.policy = iteration.policy()->Describe();
  report.burst_iterations = o.dp.bursts.iterations;

  RoundTolerance push_tol = decisions.next_push;
  uint64_t push_open_ns = 0;
  ServerCoordinator coord;
  coord.announce_push = [&](uint64_t it) {
    push_open_ns = NowNs();
    control.Publish(it, push_tol.p, push_tol.critical);
    runtime.PushOpened(it, push_tol);
    lcores[0]->outbox().Post(
        Announcement(Direction::kPush, PushRound(it), push_tol));
  };
  coord.reduce = [&](uint64_t it) {
    const ReducedPush r = iteration.Reduce(it, NowNs() - push_open_ns);
    bcast_subset.assign(r.subset.begin(), r.subset.end());
    AddPushRows(it, links, workers, push_open_ns, push_tol, r.norm,
                loss.InBurst(it), r.resync, o, N, &report);
    // Without a broadcast the rows are complete now.
    if (o.push_only) rows.Sync(report.rows);
    // Before the broadcast's announcement, so each worker holds its
    // ACCEPTED when the broadcast begins.
    if (o.push_feedback && !r.resync) {
      for (uint32_t w = 0; w < W; ++w) {
        const Bitmap b = MergedPushBitmap(links, w, N);
        control.StageAccepted(
            w,
            AcceptedMsg{
                PushRound(it), b.size(), {b.words().begin(), b.words().end()}});
        lcores[0]->outbox().Post(
            AcceptedRequest{static_cast<uint16_t>(w), PushRound(it)});
      }
    }
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      DumpBinary(o.dp.dump_dir + "/mean_it" + std::to_string(it) + ".f32",
                 mean.data(), mean.size() * sizeof(float));
    }
    lcores[0]->outbox().Post(
        Announcement(Direction::kBroadcast, BroadcastRound(it), r.broadcast));
    // The prompt's change, at this round boundary: iteration it + 1 on
    // (push and broadcast) runs under it; this broadcast keeps `next`.
    std::unique_ptr<TolerancePolicy>& live = iteration.policy();
    const RoundTolerance after =
        runtime.ApplyServerCommand(it + 1, &live) ? live->Current() : r.next;
    push_tol = iteration.PushTolerance(it + 1, after);
    runtime.BroadcastOpened(it, r.broadcast, push_tol);
    if (o.push_only) runtime.IterationDone(it);
    runtime.PublishStats();  // the other lcores wait at the barrier
    iteration.set_live_workers(lcores[0]->live_count());
    return push_tol;
  };
  ResourceTrack resources(pool);
  uint64_t iterations_done = 0;
  coord.broadcast_done = [&](uint64_t it) {
    iterations_done = it + 1;
    resources.Sample(it + 1);
    AddBroadcastToRows(links, W, &report);
    // On disk before the next round: a kill -9 keeps them.
    rows.Sync(report.rows);
    runtime.IterationDone(it);
  };

  for (auto& lc : lcores) lc->OpenPush(0, push_tol);
  coord.announce_push(0);
  std::printf(
      "dblp-server: %u workers joined; %u chunks of %u B per round, "
      "%u datapath lcore(s)\n",
      W, N, layout.chunk_payload(), S);
  std::fflush(stdout);
  const uint64_t start_ns = NowNs();
  loss.StartClock(start_ns);
  for (auto& l : losses) {
    if (l) l->StartClock(start_ns);
  }
  std::vector<RemoteLcore> remote(S);
  for (uint16_t k = 1; k < S; ++k) {
    remote[k] = RemoteLcore{lcores[k].get(), o.dp.realtime};
    rte_eal_remote_launch(RunRemoteLcore, &remote[k], lcs[k]->lcore_id);
  }
  runtime.SetRunning(true);
  lcores[0]->Run(&coord);
  rte_eal_mp_wait_lcore();
  runtime.SetRunning(false);
  std::vector<std::pair<std::string, uint64_t>> resource_counters;
  resources.AddTo(iterations_done, &resource_counters);
  const std::string failure = job.failure();
  if (!failure.empty()) control.Fail(failure);
  control.Stop();

  AddServerCounters(lcs, control, links, nb_ports, &report);
  report.counters.insert(report.counters.end(), resource_counters.begin(),
                         resource_counters.end());

  for (uint16_t p = 0; p < nb_ports; ++p) {
    report.xstats.emplace_back("port" + std::to_string(p), ReadXstats(p));
  }
  runtime.PublishFinal(report.counters, !failure.empty());

  // Workers on memif wait for this close before they close their side
  // (worker_engine.cc, AwaitServerClose): closed right after the job.
  for (uint16_t p = 0; p < nb_ports; ++p) {
    rte_eth_dev_stop(p);
    rte_eth_dev_close(p);
  }
  report.info = {
      {"loss", FormatLossSpec(o.dp.loss)},
      {"link_gbps",
       o.dp.link_gbps > 0 ? std::to_string(o.dp.link_gbps) : "unpaced"},
      {"chunks", std::to_string(N)},
      {"chunk_bytes", std::to_string(layout.chunk_payload())},
      {"push_fill", FillModeName(o.push_fill)},
      {"broadcast", o.reliable_broadcast     ? "reliable"
                    : o.consistent_broadcast ? "consistent"
                                             : "same_p"},
      {"resync_every", std::to_string(o.resync_every)}};
  // The prompt may have changed it.
  report.policy = iteration.policy()->Describe();
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (rows.is_open()) {
    // The rows of a round the job ended in (push summed, broadcast cut
    // short) were not streamed yet.
    rows.Sync(report.rows);
    std::string werr = rows.error();
    rows.Close();
    if (werr.empty()) WriteRunSummary(o.dp.out_dir, report, &werr);
    if (!werr.empty()) {
      DBLP_LOG(Error, "dblp-server: %s", werr.c_str());
      exit_code = 1;
    }
  }
  if (!failure.empty()) {
    DBLP_LOG(Error, "dblp-server: %s", failure.c_str());
  }
  return exit_code;
}

}  // namespace dblp
