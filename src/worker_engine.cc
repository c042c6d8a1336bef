#include "worker_engine.h"

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "app_telemetry.h"
#include "datapath.h"
#include "dblp/base/log.h"
#include "dblp/job/counters.h"
#include "dblp/job/rows.h"
#include "dblp/job/worker_model.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "eal_app.h"
#include "engine_runtime.h"
#include "frame_builder.h"
#include "lcore_loop.h"
#include "numa_placement.h"
#include "worker_control.h"

namespace dblp {
namespace {

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

void AddWorkerCounters(const LcoreConf& lc, const WorkerControl& control,
                       const std::vector<std::unique_ptr<SendSide>>& push,
                       const ReceiveSide& bcast, const PortDrops& drops,
                       RunReport* report) {
  uint64_t bitmaps_dropped = bcast.answer().dropped();
  for (const auto& side : push) bitmaps_dropped += side->bitmaps_dropped();
  const DatapathCounters& ctr = lc.counters;
  const ReceiverRound& rx = bcast.receiver();
  report->counters = {
      {"tx_frames", ctr.tx_frames.load()},
      {"rx_frames", ctr.rx_frames.load()},
      {"injected_drops", ctr.injected_drops.load()},
      {"tx_ring_full", ctr.tx_ring_full.load()},
      {"mbuf_alloc_failures", ctr.mbuf_alloc_failures.load()},
      {"bitmaps_dropped", bitmaps_dropped},
      {"stops_sent", control.stops_sent()},
      {"control_messages_in", control.messages_in()},
      {"control_messages_out", control.messages_out()},
      {"device_imissed", drops.imissed},
      {"device_rx_nombuf", drops.rx_nombuf},
      {"device_oerrors", drops.oerrors},
      {"frames_unpinned_source", ctr.unpinned_source.load()},
  };
  const ReceiverRound* receivers[] = {&rx};
  AddReceiverCounters("bcast_", receivers, false, &report->counters);
  for (int s = 1; s < kNumFrameStatus; ++s) {
    report->counters.emplace_back(
        std::string("frame_") + FrameStatusName(static_cast<FrameStatus>(s)),
        ctr.frame_drops[s].load());
  }
}

// The data port, set up once the WELCOME said how many queues the server's
// shards need; the push starts once the link is up (frames sent before are
// lost and would make the first round look like a burst).
PortCaps SetupWorkerPort(const WorkerOptions& o, uint16_t queues,
                         rte_mempool** pool) {
  PortOptions popts = o.dp.port;
  popts.nb_queues = queues;
  const uint32_t mbufs =
      o.dp.mbufs ? o.dp.mbufs : MbufsNeeded(popts, o.dp.burst, 2048);
  const int node = PortNumaNode(popts.port_id);
  WarnLcoresOffNode(node, "dblp-worker");
  *pool = CreatePoolOrDie("dblp_worker_pool", mbufs, popts.mtu, node);
  const PortCaps caps = SetupPortOrDie(popts, *pool);
  if (queues > 1 && caps.driver != "net_memif") {
    Die("the server shards rounds over " + std::to_string(queues) +
            " lcores, which port " + std::to_string(popts.port_id) + " (" +
            caps.driver + ") cannot steer",
        "run dblp-server with one datapath lcore, or connect over net_memif");
  }
  if (!WaitForLink(popts.port_id, o.join_timeout_ms)) {
    Die("port " + std::to_string(popts.port_id) + " (" + caps.driver +
            ") link is down after " + std::to_string(o.join_timeout_ms) + " ms",
        "for net_memif start dblp-server (role=server, same socket=) "
        "first; for a NIC check the cable and the switch port");
  }
  return caps;
}

}  // namespace

int RunWorker(const WorkerOptions& o, std::unique_ptr<GradientSource> source) {
  const std::atomic<bool>& g_quit = InstallQuitHandlers();
  // Rows are streamed from the first iteration on: a directory that cannot
  // take them fails the worker now, before it joins (and stalls) a job.
  RowStream rows;
  if (std::string err;
      !o.dp.out_dir.empty() && !rows.Open(o.dp.out_dir, &err)) {
    DBLP_LOG(Error, "dblp-worker: %s", err.c_str());
    return 1;
  }
  if (rte_eth_dev_count_avail() == 0) {
    Die("no Ethernet port",
        "give the worker a port: -a <PCI address> for a "
        "NIC, bound to vfio-pci (deploy/bind-nic.sh; check: dpdk-devbind.py "
        "--status-dev net), or "
        "--vdev=net_memif0,role=client,socket=/tmp/dblp-w0.sock");
  }
  LcoreConf lc;
  lc.lcore_id = rte_lcore_id();
  WorkerControl control(o.secret, &lc.counters, o.dp.stats_period_s);
  // Telemetry and the runtime prompt's commands (engine_runtime.h).
  EngineRuntime runtime("dblp-worker", false);
  JoinMsg join;
  join.worker_name = o.name;
  join.total_bytes = source->floats() * sizeof(float);
  join.mtu = o.dp.port.mtu;
  join.layers = source->Layers();
  // Our data source, which the server pins: the port's MAC (known since
  // the EAL probed it; none behind a router, --eth_peer, where frames
  // reach the server from the router's) and --local_ip if given.
  rte_ether_addr mac{};
  if (rte_eth_macaddr_get(0, &mac) != 0) {
    Die("cannot read port 0's MAC address", "check the port (-a / --vdev)");
  }
  if (o.eth_peer.empty()) std::memcpy(join.data_mac.data(), mac.addr_bytes, 6);
  if (!o.local_ip.empty() && !ParseIpv4(o.local_ip, &join.data_ipv4)) {
    Die("bad --local_ip " + o.local_ip,
        "use a dotted IPv4 address, e.g. 10.0.0.2");
  }
  // Join checks the WELCOME (authenticity, layout, rank, ports) and exits
  // naming the fix if it is wrong.
  const WelcomeMsg wel =
      control.Join(o.server, join, o.join_timeout_ms, g_quit, o.dp.realtime);
  const ChunkLayout layout(wel.total_bytes, wel.chunk_payload);
  const uint16_t queues = wel.num_shards;
  const FrameKey frame_key = DeriveFrameKey(
      o.secret, wel.job_nonce, static_cast<FrameAuthMode>(wel.frame_auth));
  if (std::string e = WorkerModel::CheckBroadcastFill(wel, o.bcast_fill);
      !e.empty()) {
    control.Finish(false, "--bcast_fill=prev with a consistent broadcast");
    Die(e, "--bcast_fill=zero");
  }
  try {
    source->Bind(wel.rank, wel.num_workers);
    source->OnJobStart(wel.resync_every);
  } catch (const std::exception& e) {
    control.Finish(false, e.what());
    Die(std::string("the gradient source cannot start as rank ") +
            std::to_string(wel.rank) + " of " +
            std::to_string(wel.num_workers) + ": " + e.what(),
        "check the source's flags (e.g. --max_train and --batch for the "
        "number of workers)");
  }
  rte_mempool* pool = nullptr;
  const PortCaps caps = SetupWorkerPort(o, queues, &pool);
  Endpoint local;
  FrameTemplate to_server = ServerTemplate(o, wel, caps, &local);
  to_server.set_auth(frame_key);

  // One push side per server shard, each on its own TX queue.
  std::vector<std::unique_ptr<SendSide>> push;
  std::vector<SendSide*> push_ptrs;
  for (uint16_t q = 0; q < queues; ++q) {
    SendSideConfig sc{
        FrameType::kPush, wel.session, static_cast<uint16_t>(wel.rank), 0,
        Direction::kPush, o.dp.burst};
    sc.shard = q;
    push.push_back(std::make_unique<SendSide>(sc));
    push_ptrs.push_back(push.back().get());
  }
  ReceiveSide bcast(ReceiveSideConfig{
      ReceiverConfig{wel.session, FrameType::kBroadcast, kServerRank, layout, 0,
                     UINT32_MAX, frame_key},
      Direction::kBroadcast, 0});
  control.Attach(push_ptrs, &bcast);

  // Loss on the broadcast we receive, applied as frames arrive.
  RxLossInjector loss(o.dp.loss, o.dp.bursts, HashMix(o.dp.seed, wel.rank + 1));
  loss.set_injected(&GlobalAppState().burst);  // the prompt's inject burst
  GlobalAppState().worker_policy.Add("describe", wel.policy);
  TokenBucket link(o.dp.link_gbps,
                   uint64_t{o.dp.burst} * WireBytesPerFrame(caps.mtu));
  std::vector<ChunkTransmitter> tx;
  for (uint16_t q = 0; q < queues; ++q) {
    tx.push_back(ChunkTransmitter{0, q, pool, &lc.counters, &link, 8,
                                  WireBytesPerFrame(caps.mtu), o.dp.prefetch});
  }
  RoundPacer pacer(o.dp.idle_spin, o.dp.idle_sleep_us, o.dp.round_timeout_ms,
                   &g_quit, nullptr, o.dp.deep_idle);
  if (std::string e = WorkerModel::CheckSource(*source); !e.empty()) {
    control.Finish(false, e);
    Die(e, "check the trainer's dblp.Worker (same model on both sides)");
  }
  WorkerModel model(*source, wel, layout, o.bcast_fill);
  const std::span<float> grad = model.grad(), avg = model.avg();
  const auto* grad_bytes = reinterpret_cast<const uint8_t*>(grad.data());
  // The buffers the lcore streams through, next to the port.
  const int node = PortNumaNode(0);
  PlaceOnNodeOrWarn(std::span<const float>(grad), node, "gradient buffer");
  PlaceOnNodeOrWarn(std::span<const float>(avg), node, "mean buffer");
  WorkerLcore lcore(
      lc, control, push, bcast,
      WorkerLcore::Setup{0, queues, local.udp_port, wel.server_ipv4, &layout,
                         &loss, &tx, &to_server, grad_bytes,
                         reinterpret_cast<uint8_t*>(avg.data()), &pacer});
  SendOrder order(o.dp.send_order, wel.rank, wel.num_workers, o.dp.seed);
  std::vector<uint32_t> order_buf;
  // A test seam (--hostile_per_round installs one): called before each
  // push with the round and its send order; none in a production job.
  std::unique_ptr<PushHook> push_hook;
  if (o.push_hook) {
    push_hook = o.push_hook(PushHookContext{
        &wel, pool, &lc.counters, &to_server, &caps, local, grad_bytes,
        &layout, queues, frame_key});
  }

  std::printf(
      "dblp-worker: rank %u of %u, session %08x, %s, %u chunks of %u "
      "B, port %s (%s), server %s:%u\n",
      wel.rank, wel.num_workers, wel.session, source->Describe().c_str(),
      layout.num_chunks(), layout.chunk_payload(), caps.driver.c_str(),
      FormatMac(caps.mac.addr_bytes).c_str(),
      FormatIpv4(wel.server_ipv4).c_str(), wel.udp_base_port);
  std::fflush(stdout);

  RunReport report;
  report.role = "worker";
  report.rank = wel.rank;
  report.policy = wel.policy;
  report.burst_iterations = o.dp.bursts.iterations;
  std::string failure;
  loss.StartClock(NowNs());
  // A trainer-fed source ends the job itself (Prepare says when).
  const uint64_t iterations =
      source->Unbounded() ? UINT64_MAX : model.iterations(o.iterations);
  ResourceTrack resources(pool);
  runtime.SetLcores({&lc}, queues);
  runtime.SetCounters([&](CounterList* out) {
    RunReport live;
    AddWorkerCounters(lc, control, push, bcast, ReadPortDrops(0), &live);
    *out = std::move(live.counters);
  });
  runtime.round().total_iterations = iterations == UINT64_MAX ? 0 : iterations;
  runtime.SetRunning(true);
  for (uint64_t it = 0; it < iterations && failure.empty(); ++it) {
    resources.Sample(it);
    control.set_iteration(it);
    runtime.ApplyWorkerCommand(it);  // the prompt's, before the round opens
    runtime.WorkerStarted(it);
    bool more = true;
    failure = model.Prepare(it, &more);
    if (!failure.empty() || !more) break;
    if (!lcore.AwaitPushRound(it, &failure)) break;
    order.Fill(PushRound(it), layout.num_chunks(), order_buf);
    if (push_hook) push_hook->BeforePush(it, PushRound(it), order_buf);
    if (!lcore.Exchange(it, order_buf, &failure)) break;

    const WorkerIterationTimes& t = lcore.times();
    const IterationRecord r = WorkerRow(
        WorkerExchange{it, wel.rank, push_ptrs, t.bcast_done_ns,
                       bcast.receiver().delivered_fraction(), t.announced_p,
                       t.critical, loss.InBurst(it), model.IsResync(it)});
    // The trainer reads the row with the mean, so it goes first.
    source->Observe(r);
    Bitmap arrived;
    bcast.receiver().SnapshotBitmap(arrived);
    failure = model.Absorb(it, control, arrived, o.dp.round_timeout_ms);
    if (!failure.empty()) break;
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      model.Dump(o.dp.dump_dir + "/w" + std::to_string(wel.rank) + "_it" +
                     std::to_string(it),
                 it, arrived);
    }
    report.rows.push_back(r);
    rows.Append(r);  // on disk before the next iteration: kill -9 keeps it
    runtime.WorkerDone(it, r.p, r.critical, r.delivered_fraction);
    runtime.PublishStats();
  }
  std::vector<std::pair<std::string, uint64_t>> resource_counters;
  resources.AddTo(report.rows.size(), &resource_counters);
  runtime.SetRunning(false);
  // Before the server closes its side: memif's counters end with the link.
  report.xstats.emplace_back("port0", ReadXstats(0));
  control.Finish(failure.empty(), failure);
  AwaitPeerClose(0, caps);
  const PortDrops drops = ReadPortDrops(0);

  AddWorkerCounters(lc, control, push, bcast, drops, &report);
  report.counters.insert(report.counters.end(), resource_counters.begin(),
                         resource_counters.end());

  runtime.PublishFinal(report.counters, !failure.empty());
  report.info = {
      {"source", source->Describe()},
      {"link_gbps",
       o.dp.link_gbps > 0 ? std::to_string(o.dp.link_gbps) : "unpaced"},
      {"chunks", std::to_string(layout.num_chunks())},
      {"chunk_bytes", std::to_string(layout.chunk_payload())},
      {"loss", FormatLossSpec(o.dp.loss)},
      {"driver", caps.driver}};
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (const std::string err = CloseRunReport(rows, report); !err.empty()) {
    DBLP_LOG(Error, "dblp-worker: %s", err.c_str());
    exit_code = 1;
  }
  if (!failure.empty()) {
    DBLP_LOG(Error, "dblp-worker %u: %s", wel.rank, failure.c_str());
    source->Fail(failure);
  }
  rte_eth_dev_stop(0);
  rte_eth_dev_close(0);
  return exit_code;
}

}  // namespace dblp
