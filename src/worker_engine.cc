#include "worker_engine.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>
#include <vector>

#include "datapath.h"
#include "dblp/control_sidecar.h"
#include "dblp/receiver_round.h"
#include "dblp/sender_round.h"
#include "eal_app.h"
#include "frame_builder.h"
#include "run_report.h"

namespace dblp {
namespace {

// State the sidecar thread and the datapath lcore share. Each field names
// its writer and reader.
struct WorkerShared {
  // sidecar: wo (once); datapath: ro after `welcomed`.
  WelcomeMsg welcome;
  std::atomic<bool> welcomed{false};
  // datapath: wo (once, after WELCOME); sidecar: ro.
  std::atomic<bool> rounds_ready{false};
  SenderRound push_tx;                       // sidecar: RequestStop only
  std::unique_ptr<ReceiverRound> bcast_rx;   // sidecar: any-thread calls only
  BitmapMailbox push_bitmap;                 // sidecar -> datapath
  BitmapMailbox bcast_bitmap;                // datapath -> sidecar
  std::atomic<bool> server_gone{false};      // sidecar: wo
  std::string failure;                       // sidecar: wo before server_gone
  std::string final_error;   // datapath: wo before kIterationDone; sidecar: ro
  std::atomic<bool> closed{false};           // sidecar: wo
  std::atomic<uint64_t> stops_sent{0};       // sidecar: wo
  std::atomic<uint64_t> iteration{0};        // datapath: wo; stats: ro
};

}  // namespace

int RunWorker(const WorkerOptions& o, std::unique_ptr<GradientSource> source) {
  const std::atomic<bool>& g_quit = InstallQuitHandlers();
  if (rte_eth_dev_count_avail() == 0) {
    Die("no Ethernet port", "give the worker a port: -a <PCI address> for a "
        "NIC, or --vdev=net_memif0,role=client,socket=/tmp/dblp-w0.sock");
  }
  PortOptions popts = o.dp.port;
  const uint32_t mbufs =
      o.dp.mbufs ? o.dp.mbufs : MbufsNeeded(popts, o.dp.burst, 2048);
  rte_mempool* pool = CreatePoolOrDie("dblp_worker_pool", mbufs, popts.mtu,
                                      static_cast<int>(rte_socket_id()));
  const PortCaps caps = SetupPortOrDie(popts, pool);
  // Join only with a working data link: frames sent before it is up are
  // lost, and would make the first round look like a burst.
  if (!WaitForLink(popts.port_id, o.join_timeout_ms)) {
    Die("port " + std::to_string(popts.port_id) + " (" + caps.driver +
            ") link is down after " + std::to_string(o.join_timeout_ms) +
            " ms",
        "for net_memif start dblp-server (role=server, same socket=) "
        "first; for a NIC check the cable and the switch port");
  }

  WorkerShared sh;
  EventRing events("dblp_w_ev", 1024);    // sidecar -> datapath
  EventRing requests("dblp_w_req", 1024); // datapath -> sidecar
  DatapathCounters ctr;
  ConnId server_conn = 0;
  ControlSidecar* sidecar_ptr = nullptr;

  ControlSidecar::Callbacks cb;
  cb.on_message = [&](ConnId, const ControlMessage& m) {
    if (const auto* w = std::get_if<WelcomeMsg>(&m)) {
      if (!sh.welcomed.load()) {
        sh.welcome = *w;
        sh.welcomed.store(true, std::memory_order_release);
      }
      return;
    }
    if (const auto* e = std::get_if<ErrorMsg>(&m)) {
      sh.failure = "server refused: " + e->text;
      sh.server_gone.store(true, std::memory_order_release);
      return;
    }
    if (std::holds_alternative<ByeMsg>(m)) {
      sh.failure = "server said BYE";
      sh.server_gone.store(true, std::memory_order_release);
      return;
    }
    if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
      // The datapath applies it: it owns the receiver's round, so a late
      // ROUND_BEGIN can never plant its p in a newer round.
      events.Push(CtlEvent{CtlEvent::kRoundBegin,
                           static_cast<uint8_t>(rb->direction), 0, rb->round,
                           DoubleBits(rb->p), rb->deadline_ns,
                           DoubleBits(rb->min_fraction)});
      return;
    }
    if (!sh.rounds_ready.load(std::memory_order_acquire)) return;
    if (const auto* st = std::get_if<StopMsg>(&m)) {
      if (st->direction == Direction::kPush) {
        // The time first, then the flag: the datapath sees the flag at its
        // next burst (early stop) and finds the time already queued.
        events.Push(CtlEvent{CtlEvent::kStopSeen, 0, 0, st->round, NowNs(), 0, 0});
        sh.push_tx.RequestStop(st->round);
      }
    } else if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
      if (bm->direction != Direction::kPush ||
          !sh.push_bitmap.Post(bm->num_bits, bm->words)) {
        return;
      }
      events.Push(CtlEvent{CtlEvent::kBitmap, 0, 0, bm->round, NowNs(), 0, 0});
    } else if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
      // The datapath answers, after draining its RX ring, so the BITMAP
      // counts every frame that arrived before the PROBE.
      if (pr->direction == Direction::kBroadcast) {
        events.Push(CtlEvent{CtlEvent::kProbe, 1, 0, pr->round, 0, 0, 0});
      }
    }
  };
  cb.on_close = [&](ConnId, const std::string& reason) {
    if (sh.failure.empty()) sh.failure = "control connection closed: " + reason;
    sh.server_gone.store(true, std::memory_order_release);
    sh.closed.store(true, std::memory_order_release);
  };
  cb.on_wakeup = [&] {
    CtlEvent e;
    while (requests.Pop(&e)) {
      switch (e.kind) {
        case CtlEvent::kSendProbe:
          sidecar_ptr->Send(server_conn,
                            ProbeMsg{e.round, Direction::kPush,
                                     static_cast<uint32_t>(e.value)});
          break;
        case CtlEvent::kSendStop:
          sidecar_ptr->Send(server_conn,
                            StopMsg{e.round, Direction::kBroadcast,
                                    static_cast<uint32_t>(e.value),
                                    StopReason::kThreshold});
          sh.stops_sent.fetch_add(1);
          break;
        case CtlEvent::kSendBitmap: {
          const Bitmap& b = sh.bcast_bitmap.slot();
          sidecar_ptr->Send(server_conn,
                            BitmapMsg{e.round, Direction::kBroadcast, b.size(),
                                      {b.words().begin(), b.words().end()}});
          sh.bcast_bitmap.Release();
          break;
        }
        case CtlEvent::kIterationDone:
          if (e.value == 0) {
            sidecar_ptr->Send(server_conn, ByeMsg{"done"});
          } else {
            sidecar_ptr->Send(server_conn, ErrorMsg{2, sh.final_error});
          }
          sidecar_ptr->Close(server_conn, "job finished");
          break;
        default:
          break;
      }
    }
  };
  uint64_t last_tx = 0, last_rx = 0;
  if (o.dp.stats_period_s > 0) {
    cb.tick_ms = static_cast<uint32_t>(o.dp.stats_period_s * 1000);
    cb.on_tick = [&] {
      const uint64_t tx = ctr.tx_frames.load(std::memory_order_relaxed);
      const uint64_t rx = ctr.rx_frames.load(std::memory_order_relaxed);
      std::printf("[worker %u] iter %llu  tx %.0f pps  rx %.0f pps  "
                  "injected drops %llu\n",
                  sh.welcome.rank,
                  static_cast<unsigned long long>(sh.iteration.load()),
                  (tx - last_tx) / o.dp.stats_period_s,
                  (rx - last_rx) / o.dp.stats_period_s,
                  static_cast<unsigned long long>(
                      ctr.injected_drops.load(std::memory_order_relaxed)));
      std::fflush(stdout);
      last_tx = tx;
      last_rx = rx;
    };
  }
  ControlSidecar sidecar(cb);
  sidecar_ptr = &sidecar;
  std::string err;
  if (!sidecar.Connect(o.server, o.join_timeout_ms, &server_conn, &err)) {
    Die("cannot reach dblp-server at " + o.server + ": " + err,
        "start dblp-server first and check --server=IP:PORT");
  }
  JoinMsg join;
  join.worker_name = o.name;
  join.total_bytes = source->floats() * sizeof(float);
  join.mtu = caps.mtu;
  join.layers = source->Layers();
  sidecar.Send(server_conn, join);
  SidecarThread sidecar_thread(sidecar);
  SetControlPriorities(sidecar_thread, "dblp-worker", o.dp.realtime);
  auto shutdown = [&] { sidecar_thread.Stop(); };

  // ---- wait for WELCOME ----------------------------------------------------
  const auto join_deadline = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(o.join_timeout_ms);
  while (!sh.welcomed.load(std::memory_order_acquire)) {
    if (sh.server_gone.load() || g_quit.load() ||
        std::chrono::steady_clock::now() > join_deadline) {
      shutdown();
      Die("no WELCOME from dblp-server at " + o.server +
              (sh.failure.empty() ? "" : " (" + sh.failure + ")"),
          "check that the server expects this many workers (--workers) and "
          "that every worker sends the same gradient size (--floats)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const WelcomeMsg& wel = sh.welcome;
  const ChunkLayout layout(wel.total_bytes, wel.chunk_payload);
  if (layout.num_chunks() != wel.num_chunks) {
    shutdown();
    Die("WELCOME is inconsistent (chunk count)", "update both apps");
  }
  try {
    source->Bind(wel.rank, wel.num_workers);
  } catch (const std::exception& e) {
    shutdown();
    Die(std::string("the gradient source cannot start as rank ") +
            std::to_string(wel.rank) + " of " +
            std::to_string(wel.num_workers) + ": " + e.what(),
        "check the source's flags (e.g. --max_train and --batch for the "
        "number of workers)");
  }

  Endpoint local, server;
  local.mac = caps.mac;
  const std::string ip = o.local_ip.empty()
                             ? "10.0.0." + std::to_string(2 + wel.rank)
                             : o.local_ip;
  if (!ParseIpv4(ip, &local.ipv4)) {
    shutdown();
    Die("bad --local_ip " + ip, "use a dotted IPv4 address, e.g. 10.0.0.2");
  }
  local.udp_port = static_cast<uint16_t>(wel.udp_base_port + 1 + wel.rank);
  server.ipv4 = wel.server_ipv4;
  server.udp_port = wel.udp_base_port;
  std::memcpy(server.mac.addr_bytes, wel.server_mac.data(), 6);
  if (!o.eth_peer.empty() && !ParseMac(o.eth_peer, server.mac.addr_bytes)) {
    shutdown();
    Die("bad --eth_peer " + o.eth_peer, "use aa:bb:cc:dd:ee:ff");
  }
  FrameTemplate to_server(local, server, caps);

  ReceiverConfig rc{wel.session, FrameType::kBroadcast, 0xFFFF, layout};
  sh.bcast_rx = std::make_unique<ReceiverRound>(rc);
  ReceiverRound& bcast = *sh.bcast_rx;
  SenderRound& push = sh.push_tx;
  SendOrder order(o.dp.send_order, wel.rank, wel.num_workers, o.dp.seed);
  std::vector<uint32_t> order_buf;
  sh.rounds_ready.store(true, std::memory_order_release);

  // Loss on the broadcast direction, applied as frames arrive.
  RxLossInjector loss(o.dp.loss, o.dp.bursts,
                      HashMix(o.dp.seed, wel.rank + 1));
  TokenBucket link(o.dp.link_gbps,
                   uint64_t{o.dp.burst} * WireBytesPerFrame(caps.mtu));
  ChunkTransmitter tx{0, 0, pool, &ctr, &link, 8,
                      WireBytesPerFrame(caps.mtu), o.dp.prefetch};
  ChunkTransmitter hostile_tx{0, 0, pool, &ctr, nullptr, 64};
  RoundPacer pacer(o.dp.idle_spin, o.dp.idle_sleep_us, o.dp.round_timeout_ms,
                   &g_quit);
  std::vector<float> grad(source->floats()), avg(source->floats()),
      prev_avg(source->floats(), 0.0f);
  auto* avg_bytes = reinterpret_cast<uint8_t*>(avg.data());
  const auto* grad_bytes = reinterpret_cast<const uint8_t*>(grad.data());

  std::printf("dblp-worker: rank %u of %u, session %08x, %s, %u chunks of %u "
              "B, port %s (%s), server %s:%u\n",
              wel.rank, wel.num_workers, wel.session, source->Describe().c_str(),
              layout.num_chunks(), layout.chunk_payload(), caps.driver.c_str(),
              FormatMac(caps.mac.addr_bytes).c_str(),
              FormatIpv4(server.ipv4).c_str(), server.udp_port);
  std::fflush(stdout);

  RunReport report;
  report.role = "worker";
  report.rank = wel.rank;
  report.policy = wel.policy;
  report.burst_iterations = o.dp.bursts.iterations;
  uint32_t go_round = UINT32_MAX;  // latest push ROUND_BEGIN seen
  double announced_p = 0;
  bool have_go = false;
  rte_mbuf* rx_pkts[64];
  std::vector<uint32_t> seqs(o.dp.burst);
  int exit_code = 0;
  std::string failure;  // datapath's own; the sidecar's is sh.failure

  bool probe_pending = false;  // a broadcast PROBE waits for RX to drain
  uint32_t probe_round = 0;
  uint64_t loop_gen = 0;   // datapath loop iterations (RX polls)
  uint64_t probe_gen = 0;  // the loop that saw the PROBE
  Bitmap snap;
  // Frames of the previous push kept for the hostile replay test hook.
  std::vector<uint32_t> replay_seqs;

  // The p that decides our broadcast STOP is the one announced now.
  auto apply_bcast_begin = [&](const CtlEvent& e) {
    bcast.SetTolerance(BitsDouble(e.value));
    bcast.SetDeadline(e.value2 ? NowNs() + e.value2 : 0, BitsDouble(e.value3));
    if (bcast.PollStop(NowNs()) != StopTrigger::kNone) {
      requests.Push(CtlEvent{CtlEvent::kSendStop, 1, 0, bcast.round(),
                             bcast.received(), 0, 0});
      sidecar.Wakeup();
    }
  };
  CtlEvent early_bcast_begin{};  // a broadcast ROUND_BEGIN ahead of Begin

  auto handle_event = [&](const CtlEvent& e, uint64_t* t_stop,
                          uint64_t* t_probe, double* rtt_sum, int* rtt_n,
                          bool* probe_out) {
    switch (e.kind) {
      case CtlEvent::kRoundBegin:
        if (e.direction == static_cast<uint8_t>(Direction::kPush)) {
          go_round = e.round;
          have_go = true;
          announced_p = BitsDouble(e.value);
        } else if (e.round == bcast.round()) {
          apply_bcast_begin(e);
        } else if (static_cast<int32_t>(e.round - bcast.round()) > 0) {
          // The server closed our push and announced the broadcast before
          // this iteration opened its receiver: kept for Begin.
          early_bcast_begin = e;
        }
        break;
      case CtlEvent::kStopSeen:
        if (e.round == push.round() && *t_stop == 0) *t_stop = e.value;
        break;
      case CtlEvent::kProbe:
        if (e.round == bcast.round()) {
          probe_pending = true;
          probe_round = e.round;
          probe_gen = loop_gen;
        }
        break;
      case CtlEvent::kBitmap:
        if (e.round == push.round() && push.OnBitmap(sh.push_bitmap.slot())) {
          *probe_out = false;
          if (*t_probe != 0) {
            *rtt_sum += static_cast<double>(e.value - *t_probe) / 1e3;
            ++*rtt_n;
          }
        }
        sh.push_bitmap.Release();
        break;
      default:
        break;
    }
  };

  loss.StartClock(NowNs());
  for (uint64_t it = 0; it < o.iterations && exit_code == 0; ++it) {
    sh.iteration.store(it, std::memory_order_relaxed);
    try {
      source->Compute(it, grad);
    } catch (const std::exception& e) {
      failure = std::string("computing the gradient of iteration ") +
                std::to_string(it) + ": " + e.what();
      exit_code = 1;
      break;
    }
    const uint32_t push_round = PushRound(it);
    // Open the broadcast receiver with p = 0 until ROUND_BEGIN announces the
    // broadcast's p: a complete buffer satisfies any p, so an early frame
    // can never trigger a STOP under a stale tolerance.
    bcast.Begin(push_round + 1, 0.0);
    if (early_bcast_begin.kind == CtlEvent::kRoundBegin &&
        early_bcast_begin.round == push_round + 1) {
      apply_bcast_begin(early_bcast_begin);
    }
    uint64_t t_stop = 0, t_probe = 0;
    double rtt_sum = 0;
    int rtt_n = 0;
    bool probe_out = false;

    // Wait for the server to open our push round.
    pacer.Start();
    while (!(have_go && go_round == push_round) && !sh.server_gone.load()) {
      CtlEvent e;
      bool any = false;
      while (events.Pop(&e)) {
        handle_event(e, &t_stop, &t_probe, &rtt_sum, &rtt_n, &probe_out);
        any = true;
      }
      const RoundPacer::Step step = pacer.After(any);
      if (step == RoundPacer::Step::kTimedOut) {
        failure = "server never opened push round " +
                  std::to_string(push_round);
      }
      if (step != RoundPacer::Step::kContinue) break;
    }
    if (!(have_go && go_round == push_round)) {
      exit_code = 1;
      break;
    }
    order.Fill(push_round, layout.num_chunks(), order_buf);
    push.Begin(push_round, order_buf);

    if (o.hostile_per_round > 0 && it > 0) {
      // Stale replays of the previous round, then malformed frames.
      DataHeader stale{FrameType::kPush, wel.session,
                       static_cast<uint16_t>(wel.rank), 0, push_round - 2, 0};
      hostile_tx.Send(to_server, stale, replay_seqs.data(),
                    static_cast<uint32_t>(std::min<size_t>(
                        replay_seqs.size(), o.hostile_per_round)),
                    grad_bytes, layout);
      DataHeader wrong_session = stale;
      wrong_session.round = push_round;
      wrong_session.session = wel.session ^ 0x5A5A5A5Au;
      uint32_t zero = 0;
      hostile_tx.Send(to_server, wrong_session, &zero, 1, grad_bytes, layout);
      DataHeader future = stale;
      future.round = push_round + 4;
      hostile_tx.Send(to_server, future, &zero, 1, grad_bytes, layout);
      // Valid L2-L4 around bad DBLP bytes: a wrong chunk length, a
      // truncated header and a bad magic.
      uint8_t raw[kDataHeaderBytes + 8] = {};
      DataHeader h = wrong_session;
      h.session = wel.session;
      h.payload_len = 8;  // shorter than chunk 0: out of range
      EncodeDataHeader(h, raw);
      const uint16_t lens[3] = {sizeof(raw), 10, sizeof(raw)};
      for (int k = 0; k < 3; ++k) {
        if (k == 2) raw[0] ^= 0xFF;  // bad magic
        rte_mbuf* m = rte_pktmbuf_alloc(pool);
        if (m == nullptr) break;
        to_server.BuildRaw(m, raw, lens[k]);
        if (rte_eth_tx_burst(0, 0, &m, 1) != 1) rte_pktmbuf_free(m);
      }
    }
    replay_seqs.assign(order_buf.begin(),
                       order_buf.begin() +
                           std::min<size_t>(order_buf.size(),
                                            o.hostile_per_round));

    const uint64_t t0 = NowNs();
    uint64_t t_push_done = 0, t_bcast_done = 0;
    pacer.Start();
    bool push_done = false, bcast_done = false;
    DataHeader proto{FrameType::kPush, wel.session,
                     static_cast<uint16_t>(wel.rank), 0, push_round, 0};
    while (!(push_done && bcast_done)) {
      bool work = false;
      // RX first: the broadcast of the mean.
      ++loop_gen;
      const uint16_t n = PollRx(0, 0, rx_pkts, 64);
      if (n > 0) {
        work = true;
        const uint64_t rx_ns = NowNs();
        DatapathCounters::Add(ctr.rx_frames, n);
        for (uint16_t i = 0; i < n; ++i) {
          ParsedFrame pf;
          if (!AdmitFrame(rx_pkts[i], local.udp_port, loss, rx_ns, ctr, &pf)) {
            continue;
          }
          DataHeader h;
          const uint8_t* payload = nullptr;
          if (bcast.OnFrame(pf.dblp, pf.dblp_len, &h, &payload) ==
              Verdict::kAccepted) {
            std::memcpy(avg_bytes + layout.Offset(h.seq), payload,
                        h.payload_len);
          }
        }
        rte_pktmbuf_free_bulk(rx_pkts, n);
      }
      // A deadline (LTP, or a push-only server) may close the round with
      // nothing arriving.
      if (n > 0 || bcast.deadline_ns() != 0) {
        const StopTrigger t = bcast.PollStop(NowNs());
        if (t != StopTrigger::kNone) {
          requests.Push(CtlEvent{CtlEvent::kSendStop,
                                 static_cast<uint8_t>(Direction::kBroadcast),
                                 0, bcast.round(), bcast.received(), 0});
          sidecar.Wakeup();
        }
      }
      if (!bcast_done && bcast.stop_taken()) {
        bcast_done = true;
        t_bcast_done = NowNs();
        bcast.Close();
      }
      // Control events.
      CtlEvent e;
      while (events.Pop(&e)) {
        handle_event(e, &t_stop, &t_probe, &rtt_sum, &rtt_n, &probe_out);
        work = true;
      }
      // Answer a PROBE once a poll that started after it was seen came
      // back short: every frame sent before the PROBE is then counted.
      if (probe_pending && n < 64 && loop_gen > probe_gen) {
        probe_pending = false;
        // A PROBE of a round that is over needs no answer.
        if (probe_round == bcast.round()) {
          bcast.SnapshotBitmap(snap);
          if (sh.bcast_bitmap.Post(snap.size(), snap.words())) {
            requests.Push(CtlEvent{CtlEvent::kSendBitmap, 1, 0, probe_round,
                                   0, 0, 0});
            sidecar.Wakeup();
          }
        }
      }
      // TX: our push, until STOP.
      if (!push_done) {
        if (push.finished()) {
          // STOP's arrival time is queued before the flag is raised.
          while (t_stop == 0 && events.Pop(&e)) {
            handle_event(e, &t_stop, &t_probe, &rtt_sum, &rtt_n, &probe_out);
          }
          push_done = true;
          t_push_done = t_stop ? t_stop : NowNs();
        } else {
          const uint32_t k = push.NextBurst(seqs.data(), o.dp.burst);
          if (k > 0) {
            const uint32_t sent =
                tx.Send(to_server, proto, seqs.data(), k, grad_bytes, layout);
            push.Unsend(k - sent);  // a full TX ring: try again next loop
            // A full ring is no progress: back off and let the peer drain.
            work = work || sent > 0;
          }
          if (push.state() == SenderRound::State::kAwaitingBitmap &&
              !probe_out) {
            probe_out = true;
            t_probe = NowNs();
            requests.Push(CtlEvent{CtlEvent::kSendProbe, 0, 0, push_round,
                                   push.passes(), 0});
            sidecar.Wakeup();
          }

        }
      }
      if (sh.server_gone.load()) break;
      const RoundPacer::Step step = pacer.After(work);
      if (step == RoundPacer::Step::kTimedOut) {
        failure = "iteration " + std::to_string(it) + ": no progress for " +
                     std::to_string(pacer.timeout_ms()) + " ms (push " +
                     (push_done ? "done" : "pending") + ", broadcast " +
                     std::to_string(bcast.received()) + "/" +
                     std::to_string(layout.num_chunks()) + ")";
      }
      if (step != RoundPacer::Step::kContinue) break;
    }
    if (!(push_done && bcast_done)) {
      exit_code = 1;
      break;
    }
    Bitmap arrived;
    bcast.SnapshotBitmap(arrived);
    FillMissing(avg, arrived, layout, o.bcast_fill, prev_avg);
    try {
      source->Apply(it, avg);
    } catch (const std::exception& e) {
      failure = std::string("applying the mean of iteration ") +
                std::to_string(it) + ": " + e.what();
      exit_code = 1;
      break;
    }
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      const std::string base =
          o.dp.dump_dir + "/w" + std::to_string(wel.rank) + "_it" +
          std::to_string(it);
      DumpBinary(base + "_avg.f32", avg.data(), avg.size() * sizeof(float));
      DumpBinary(base + "_bcast.bits", arrived.words().data(),
                 arrived.words().size() * sizeof(uint64_t));
    }
    prev_avg = avg;

    IterationRecord r;
    r.iteration = it;
    r.rank = wel.rank;
    r.send_latency_us = static_cast<double>(t_push_done - t0) / 1e3;
    // From our push's end to holding enough of the mean (waiting for the
    // other workers and the reduction included).
    r.bcast_latency_us =
        t_bcast_done > t_push_done
            ? static_cast<double>(t_bcast_done - t_push_done) / 1e3
            : 0;
    r.passes = push.passes();
    r.packets_sent = push.packets_sent();
    r.packets_resent = push.packets_resent();
    r.delivered_fraction = bcast.delivered_fraction();
    r.p = announced_p;
    r.burst = loss.InBurst(it);
    r.control_rtt_us = rtt_n > 0 ? rtt_sum / rtt_n : 0;
    report.rows.push_back(r);
  }

  if (failure.empty() && exit_code != 0) {
    failure = sh.server_gone.load(std::memory_order_acquire) ? sh.failure
                                                             : "interrupted";
  }
  // BYE when done, ERROR with the reason otherwise, then a graceful close:
  // the server must not mistake a finished worker for a lost one, nor a
  // failed one for a finished one.
  sh.final_error = failure;
  requests.Push(CtlEvent{CtlEvent::kIterationDone, 0, 0, 0,
                         exit_code == 0 ? 0u : 1u, 0, 0});
  sidecar.Wakeup();
  for (int i = 0; i < 200 && !sh.closed.load(std::memory_order_acquire); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  shutdown();

  const PortDrops drops = ReadPortDrops(0);
  report.counters = {
      {"tx_frames", ctr.tx_frames.load()},
      {"rx_frames", ctr.rx_frames.load()},
      {"injected_drops", ctr.injected_drops.load()},
      {"tx_ring_full", ctr.tx_ring_full.load()},
      {"mbuf_alloc_failures", ctr.mbuf_alloc_failures.load()},
      {"bcast_accepted", bcast.verdict_count(Verdict::kAccepted)},
      {"bcast_duplicate", bcast.verdict_count(Verdict::kDuplicate)},
      {"bcast_stale", bcast.verdict_count(Verdict::kStaleRound)},
      {"bcast_late", bcast.verdict_count(Verdict::kLate)},
      {"bcast_malformed", bcast.verdict_count(Verdict::kMalformed)},
      {"bitmaps_dropped",
       sh.push_bitmap.dropped() + sh.bcast_bitmap.dropped()},
      {"stops_sent", sh.stops_sent.load()},
      {"control_messages_in", sidecar.messages_in()},
      {"control_messages_out", sidecar.messages_out()},
      {"device_imissed", drops.imissed},
      {"device_rx_nombuf", drops.rx_nombuf},
      {"device_oerrors", drops.oerrors},
  };
  for (int s = 1; s < kNumFrameStatus; ++s) {
    report.counters.emplace_back(
        std::string("frame_") + FrameStatusName(static_cast<FrameStatus>(s)),
        ctr.frame_drops[s].load());
  }
  report.info = {{"source", source->Describe()},
                 {"link_gbps", o.dp.link_gbps > 0
                                   ? std::to_string(o.dp.link_gbps)
                                   : "unpaced"},
                 {"chunks", std::to_string(layout.num_chunks())},
                 {"chunk_bytes", std::to_string(layout.chunk_payload())},
                 {"loss", FormatLossSpec(o.dp.loss)},
                 {"driver", caps.driver}};
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  if (!o.dp.out_dir.empty()) {
    std::string werr;
    if (!WriteRunReport(o.dp.out_dir, report, &werr)) {
      std::fprintf(stderr, "dblp-worker: %s\n", werr.c_str());
      exit_code = exit_code ? exit_code : 1;
    }
  }
  if (exit_code != 0) {
    std::fprintf(stderr, "dblp-worker %u: %s\n", wel.rank, failure.c_str());
  }
  rte_eth_dev_stop(0);
  rte_eth_dev_close(0);
  return exit_code;
}

}  // namespace dblp
