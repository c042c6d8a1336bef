#include "server_engine.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "datapath.h"
#include "dblp/clr_detector.h"  // L2Norm
#include "dblp/loss_fill.h"
#include "eal_app.h"
#include "lcore_loop.h"
#include "run_report.h"
#include "server_control.h"

namespace dblp {
namespace {

// One row per worker for the push just reduced.
void AddPushRows(uint64_t it, const std::vector<std::unique_ptr<ServerLink>>& links,
                 uint64_t push_open_ns, const RoundTolerance& tol, double norm,
                 bool burst, const ServerOptions& o, RunReport* report) {
  for (uint32_t w = 0; w < links.size(); ++w) {
    const ReceiveSide& push = links[w]->push;
    IterationRecord r;
    r.iteration = it;
    r.rank = w;
    r.send_latency_us =
        push.stop_ns() ? static_cast<double>(push.stop_ns() - push_open_ns) / 1e3
                       : 0;
    r.delivered_fraction = push.receiver().delivered_fraction();
    r.p = tol.p;
    r.critical = tol.critical;
    r.grad_norm = norm;
    r.burst = burst;
    report->rows.push_back(r);
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      Bitmap b;
      push.receiver().SnapshotBitmap(b);
      DumpBinary(o.dp.dump_dir + "/w" + std::to_string(w) + "_it" +
                     std::to_string(it) + "_push.bits",
                 b.words().data(), b.words().size() * sizeof(uint64_t));
    }
  }
}

// Completes the iteration's rows with the broadcast side.
void AddBroadcastToRows(const std::vector<std::unique_ptr<ServerLink>>& links,
                        RunReport* report) {
  const size_t W = links.size();
  for (uint32_t w = 0; w < W; ++w) {
    const SendSide& b = links[w]->bcast;
    IterationRecord& r = report->rows[report->rows.size() - W + w];
    r.bcast_latency_us =
        b.done_ns() > b.begin_ns()
            ? static_cast<double>(b.done_ns() - b.begin_ns()) / 1e3
            : 0;
    r.bcast_passes = b.sender().passes();
    r.packets_sent = b.sender().packets_sent();
    r.packets_resent = b.sender().packets_resent();
    r.control_rtt_us = b.mean_rtt_us();
  }
}

void AddServerCounters(const LcoreConf& lc, const ServerControl& control,
                       const std::vector<std::unique_ptr<ServerLink>>& links,
                       uint16_t nb_ports, RunReport* report) {
  const DatapathCounters& ctr = lc.counters;
  report->counters = {
      {"rx_frames", ctr.rx_frames.load()},
      {"tx_frames", ctr.tx_frames.load()},
      {"injected_drops", ctr.injected_drops.load()},
      {"tx_ring_full", ctr.tx_ring_full.load()},
      {"mbuf_alloc_failures", ctr.mbuf_alloc_failures.load()},
      {"frames_from_lost_workers", ctr.from_lost_worker.load()},
      {"control_messages_in", control.messages_in()},
      {"control_messages_out", control.messages_out()},
      {"control_protocol_errors", control.protocol_errors()},
  };
  for (int v = 0; v < kNumVerdicts; ++v) {
    uint64_t sum = 0;
    for (auto& l : links) {
      sum += l->push.receiver().verdict_count(static_cast<Verdict>(v));
    }
    report->counters.emplace_back(
        std::string("push_") + VerdictName(static_cast<Verdict>(v)), sum);
  }
  for (int s = 1; s < kNumDecodeStatus; ++s) {
    uint64_t sum = 0;
    for (auto& l : links) {
      sum += l->push.receiver().decode_error_count(static_cast<DecodeStatus>(s));
    }
    report->counters.emplace_back(
        std::string("decode_") + DecodeStatusName(static_cast<DecodeStatus>(s)),
        sum);
  }
  for (int s = 1; s < kNumFrameStatus; ++s) {
    report->counters.emplace_back(
        std::string("frame_") + FrameStatusName(static_cast<FrameStatus>(s)),
        ctr.frame_drops[s].load());
  }
  PortDrops total{};
  for (uint16_t p = 0; p < nb_ports; ++p) {
    const PortDrops d = ReadPortDrops(p);
    total.imissed += d.imissed;
    total.rx_nombuf += d.rx_nombuf;
    total.oerrors += d.oerrors;
  }
  uint64_t bitmaps_dropped = 0;
  for (auto& l : links) {
    bitmaps_dropped += l->bcast.bitmaps_dropped() + l->push.answer().dropped();
  }
  report->counters.emplace_back("bitmaps_dropped", bitmaps_dropped);
  report->counters.emplace_back("device_imissed", total.imissed);
  report->counters.emplace_back("device_rx_nombuf", total.rx_nombuf);
  report->counters.emplace_back("device_oerrors", total.oerrors);
}

// The broadcast's tolerance after the policy saw this iteration.
RoundTolerance BroadcastTolerance(const ServerOptions& o,
                                  const RoundTolerance& next) {
  RoundTolerance t = o.reliable_broadcast ? RoundTolerance{} : next;
  if (o.push_only) {
    // Closed on arrival: a 1 ns deadline with a floor of zero chunks.
    t = RoundTolerance{};
    t.deadline_ns = 1;
    t.min_fraction = 0;
  }
  return t;
}

RoundBeginRequest Announcement(Direction d, uint32_t round,
                               const RoundTolerance& t) {
  return RoundBeginRequest{d, round, t.p, t.deadline_ns,
                           t.deadline_ns ? t.min_fraction : 0};
}

}  // namespace

int RunServer(const ServerOptions& o) {
  const std::atomic<bool>& g_quit = InstallQuitHandlers();
  if (o.workers == 0 || o.workers >= kServerRank) {
    Die("--workers=" + std::to_string(o.workers) + " is out of range",
        "use 1.." + std::to_string(kServerRank - 1));
  }
  const uint16_t nb_ports = rte_eth_dev_count_avail();
  if (nb_ports == 0) {
    Die("no Ethernet port", "give the server a port: -a <PCI address> for a "
        "NIC, or one --vdev=net_memifN,role=server,socket=/tmp/dblp-wN.sock "
        "per worker");
  }
  PortOptions popts = o.dp.port;
  const uint32_t mbufs =
      o.dp.mbufs ? o.dp.mbufs
                 : nb_ports * MbufsNeeded(popts, o.dp.burst, 1024) + 2048;
  rte_mempool* pool = CreatePoolOrDie("dblp_server_pool", mbufs, popts.mtu,
                                      static_cast<int>(rte_socket_id()));
  std::vector<PortCaps> caps(nb_ports);
  for (uint16_t p = 0; p < nb_ports; ++p) {
    popts.port_id = p;
    caps[p] = SetupPortOrDie(popts, pool);
  }
  uint32_t local_ip = 0;
  if (!ParseIpv4(o.local_ip, &local_ip)) {
    Die("bad --local_ip " + o.local_ip, "use a dotted IPv4, e.g. 10.0.0.1");
  }
  const uint32_t session =
      o.session ? o.session
                : static_cast<uint32_t>(HashMix(NowNs(), 0x5E55)) | 1u;
  std::unique_ptr<TolerancePolicy> policy = TolerancePolicy::Create(o.policy);

  LcoreConf lc;
  lc.lcore_id = rte_lcore_id();
  ServerControl control(
      ServerJoinConfig{o.workers, session, caps[0].mtu, local_ip, o.udp_port,
                       caps[0].mac, o.max_gradient_bytes, policy->Describe(),
                       nb_ports},
      &lc.counters, o.dp.stats_period_s);
  const JoinMsg& first =
      control.AdmitWorkers(o.listen, o.join_timeout_ms, g_quit, o.dp.realtime);

  // ---- the job ---------------------------------------------------------------
  const uint32_t W = o.workers;
  const ChunkLayout layout(first.total_bytes, ChunkPayloadForMtu(caps[0].mtu));
  const uint32_t N = layout.num_chunks();
  std::vector<std::unique_ptr<ServerLink>> links;
  std::vector<ReceiveSide*> push_sides;
  std::vector<SendSide*> bcast_sides;
  for (uint32_t w = 0; w < W; ++w) {
    links.push_back(std::make_unique<ServerLink>(
        ReceiveSideConfig{ReceiverConfig{session, FrameType::kPush,
                                         static_cast<int32_t>(w), layout},
                          Direction::kPush, static_cast<uint16_t>(w)},
        SendSideConfig{FrameType::kBroadcast, session, kServerRank,
                       static_cast<uint16_t>(w), Direction::kBroadcast,
                       o.dp.burst},
        SendOrder(o.dp.send_order, w, W, HashMix(o.dp.seed, 0xBC))));
    push_sides.push_back(&links.back()->push);
    bcast_sides.push_back(&links.back()->bcast);
  }
  control.Attach(push_sides, bcast_sides);
  MeanReducer reducer(layout, W);
  std::vector<float> mean(layout.total_bytes() / sizeof(float), 0.0f);
  // Loss on the pushes we receive, applied as frames arrive.
  RxLossInjector loss(o.dp.loss, o.dp.bursts, HashMix(o.dp.seed, 0xB0));
  // Emulated link rate, one bucket per port (a port is a link).
  std::vector<TokenBucket> link_rate;
  for (uint16_t p = 0; p < nb_ports; ++p) {
    link_rate.emplace_back(o.dp.link_gbps, uint64_t{o.dp.burst} *
                                               WireBytesPerFrame(caps[p].mtu));
  }
  RoundPacer pacer(o.dp.idle_spin, o.dp.idle_sleep_us, o.dp.round_timeout_ms,
                   &g_quit);
  ServerLcore lcore(
      lc, control, links,
      ServerLcore::Setup{nb_ports, o.udp_port, local_ip, &caps, &layout, &loss,
                         &reducer, reinterpret_cast<const uint8_t*>(mean.data()),
                         pool, &link_rate, o.dp.prefetch, &pacer,
                         o.continue_on_worker_loss});
  RunReport report;
  report.role = "server";
  report.policy = policy->Describe();
  report.burst_iterations = o.dp.bursts.iterations;

  RoundTolerance push_tol = policy->Current();
  uint64_t push_open_ns = 0;
  auto open_push = [&](uint64_t it) {
    reducer.BeginRound();
    reducer.set_num_workers(lcore.live_count());
    push_open_ns = NowNs();
    const uint64_t deadline =
        push_tol.deadline_ns ? push_open_ns + push_tol.deadline_ns : 0;
    for (auto& l : links) {
      l->push.Begin(PushRound(it), push_tol.p, deadline,
                    push_tol.deadline_ns ? push_tol.min_fraction : 0,
                    push_open_ns);
    }
    lcore.outbox().Post(
        Announcement(Direction::kPush, PushRound(it), push_tol));
  };
  open_push(0);
  std::printf("dblp-server: %u workers joined; %u chunks of %u B per round\n",
              W, N, layout.chunk_payload());
  std::fflush(stdout);

  std::string failure;
  loss.StartClock(NowNs());
  for (uint64_t it = 0; failure.empty(); ++it) {
    control.Publish(it, push_tol.p, push_tol.critical);
    const ServerLcore::PushEnd end = lcore.RunPush(it, &failure);
    if (end != ServerLcore::PushEnd::kStopped) break;

    // Reduce, detect the phase, open the next push.
    for (auto& l : links) l->push.Close();
    reducer.Finalize(o.push_fill, mean);
    if (it >= o.zero_first && it <= o.zero_last && o.zero_fraction > 0) {
      ZeroRandomChunks(mean, layout, o.zero_fraction, HashMix(o.dp.seed, it));
    }
    const double norm = L2Norm(mean);
    AddPushRows(it, links, push_open_ns, push_tol, norm, loss.InBurst(it), o,
                &report);
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      DumpBinary(o.dp.dump_dir + "/mean_it" + std::to_string(it) + ".f32",
                 mean.data(), mean.size() * sizeof(float));
    }
    policy->OnIterationEnd(it, norm, NowNs() - push_open_ns);
    const RoundTolerance next_tol = policy->Current();
    lcore.outbox().Post(Announcement(Direction::kBroadcast,
                                     BroadcastRound(it),
                                     BroadcastTolerance(o, next_tol)));
    push_tol = next_tol;
    open_push(it + 1);
    if (o.push_only) continue;
    lcore.RunBroadcast(it, &failure);
    AddBroadcastToRows(links, &report);
  }
  control.Stop();

  AddServerCounters(lc, control, links, nb_ports, &report);
  report.info = {{"loss", FormatLossSpec(o.dp.loss)},
                 {"link_gbps", o.dp.link_gbps > 0
                                   ? std::to_string(o.dp.link_gbps)
                                   : "unpaced"},
                 {"chunks", std::to_string(N)},
                 {"chunk_bytes", std::to_string(layout.chunk_payload())},
                 {"push_fill", FillModeName(o.push_fill)},
                 {"broadcast", o.reliable_broadcast ? "reliable" : "same_p"}};
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (!o.dp.out_dir.empty()) {
    std::string werr;
    if (!WriteRunReport(o.dp.out_dir, report, &werr)) {
      std::fprintf(stderr, "dblp-server: %s\n", werr.c_str());
      exit_code = 1;
    }
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "dblp-server: %s\n", failure.c_str());
  }
  for (uint16_t p = 0; p < nb_ports; ++p) {
    rte_eth_dev_stop(p);
    rte_eth_dev_close(p);
  }
  return exit_code;
}

}  // namespace dblp
