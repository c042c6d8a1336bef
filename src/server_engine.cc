#include "server_engine.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "datapath.h"
#include "dblp/control_sidecar.h"
#include "dblp/clr_detector.h"  // L2Norm
#include "dblp/loss_fill.h"
#include "dblp/receiver_round.h"
#include "dblp/sender_round.h"
#include "eal_app.h"
#include "frame_builder.h"
#include "run_report.h"

namespace dblp {
namespace {

// The server's state for one worker. Writer/reader per field.
struct WorkerLink {
  // sidecar: wo during join; datapath: ro after `joined`.
  ConnId conn = 0;
  std::string name;
  // datapath: wo (Begin/OnFrame); sidecar: any-thread calls (PROBE).
  std::unique_ptr<ReceiverRound> push_rx;
  // datapath: owner; sidecar: RequestStop(round) only.
  SenderRound bcast_tx;
  std::unique_ptr<SendOrder> order;
  std::vector<uint32_t> order_buf;      // datapath only
  BitmapMailbox bcast_bitmap;           // sidecar -> datapath
  BitmapMailbox push_bitmap;            // datapath -> sidecar (PROBE answer)
  bool probe_pending = false;           // datapath only
  uint32_t probe_round = 0;             // datapath only
  uint64_t probe_gen = 0;               // datapath only: poll when seen
  // Learned from the first accepted push frame (datapath only).
  bool learned = false;
  uint16_t port = 0;
  FrameTemplate tmpl;
  std::string error;                    // sidecar: wo before kPeerGone
  // datapath: wo; sidecar: ro (which links get ROUND_BEGIN).
  std::atomic<bool> alive{true};
  // datapath only.
  bool said_bye = false;
  bool probe_out = false;
  uint64_t t_probe = 0, t_push_stop = 0, t_bcast_stop = 0;
  double rtt_sum = 0;
  int rtt_n = 0;
};

struct ServerShared {
  std::mutex join_mu;  // sidecar-only during join; datapath waits on flag
  std::vector<std::unique_ptr<WorkerLink>> links;
  std::atomic<bool> joined{false};          // sidecar: wo; datapath: ro
  std::atomic<bool> rounds_ready{false};    // datapath: wo; sidecar: ro
  std::atomic<bool> failed{false};          // sidecar: wo
  std::string failure;                      // sidecar: wo before `failed`
  JoinMsg first_join;                       // sidecar: wo during join
  std::atomic<uint64_t> iteration{0};       // datapath: wo; stats: ro
  std::atomic<double> p{0};                 // datapath: wo; stats: ro
  std::atomic<bool> critical{false};        // datapath: wo; stats: ro
};

// Frames ahead of the one being processed whose headers are prefetched.
constexpr uint16_t kRxPrefetchAhead = 4;

// The server's per-frame push path: L2-L4 admission and loss injection,
// demux by sender rank, the worker's receiver (verdict, bitmap) and the
// sum. Datapath lcore only.
struct PushRxPath {
  uint16_t udp_port;
  uint32_t num_workers;
  uint32_t local_ip;
  bool prefetch;
  RxLossInjector* loss;
  DatapathCounters* ctr;
  MeanReducer* reducer;
  std::vector<std::unique_ptr<WorkerLink>>* links;
  const std::vector<PortCaps>* caps;

  // Named and kept out of line so that profiles (tools/dblp-bench
  // --callgrind) can attribute the RX path's instructions to it.
  [[gnu::noinline]] void ReceiveBurst(uint16_t port, rte_mbuf** pkts,
                                      uint16_t n) {
    const uint64_t rx_ns = NowNs();
    if (prefetch) {
      for (uint16_t j = 0; j < std::min<uint16_t>(n, kRxPrefetchAhead); ++j) {
        rte_prefetch0(rte_pktmbuf_mtod(pkts[j], const void*));
      }
    }
    for (uint16_t i = 0; i < n; ++i) {
      if (prefetch) {
        // Headers a few frames ahead; the next frame's sum slice, which
        // the permuted send order scatters over the whole gradient.
        if (i + kRxPrefetchAhead < n) {
          rte_prefetch0(rte_pktmbuf_mtod(pkts[i + kRxPrefetchAhead],
                                         const void*));
        }
        if (i + 1 < n) reducer->Prefetch(PeekSeq(pkts[i + 1]));
      }
      ParsedFrame pf;
      if (!AdmitFrame(pkts[i], udp_port, *loss, rx_ns, *ctr, &pf)) continue;
      // Unknown ranks go to worker 0's receiver, which counts them as
      // wrong-sender (or malformed) without accepting anything.
      const uint16_t rank = PeekSenderRank(pf.dblp, pf.dblp_len);
      WorkerLink& l = *(*links)[rank < num_workers ? rank : 0];
      if (!l.alive) {
        DatapathCounters::Add(ctr->from_lost_worker);
        continue;
      }
      DataHeader h;
      const uint8_t* payload = nullptr;
      if (l.push_rx->OnFrame(pf.dblp, pf.dblp_len, &h, &payload) !=
          Verdict::kAccepted) {
        continue;
      }
      reducer->Accumulate(h.seq, payload);
      if (!l.learned) Learn(l, port, rank, pf);
    }
  }

  // The worker's return path, from its first accepted frame.
  void Learn(WorkerLink& l, uint16_t port, uint16_t rank,
             const ParsedFrame& pf) {
    l.learned = true;
    l.port = port;
    const auto worker_port = static_cast<uint16_t>(udp_port + 1 + rank);
    const Endpoint local{(*caps)[port].mac, local_ip, worker_port};
    Endpoint peer = pf.src;
    peer.udp_port = worker_port;
    l.tmpl = FrameTemplate(local, peer, (*caps)[port]);
  }
};

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

  ServerShared sh;
  EventRing events("dblp_s_ev", 4096);    // sidecar -> datapath
  EventRing requests("dblp_s_req", 4096); // datapath -> sidecar
  DatapathCounters ctr;
  ControlSidecar* sc_ptr = nullptr;
  std::vector<ConnId> pending;            // sidecar only: joined, not welcomed

  auto rank_of = [&](ConnId c) -> int {
    for (size_t w = 0; w < sh.links.size(); ++w) {
      if (sh.links[w]->conn == c) return static_cast<int>(w);
    }
    return -1;
  };
  auto fail_join = [&](ConnId c, const std::string& why) {
    sc_ptr->Send(c, ErrorMsg{1, why});
    sc_ptr->Close(c, why);
  };
  auto send_requests = [&] {
    CtlEvent e;
    while (requests.Pop(&e)) {
      switch (e.kind) {
        case CtlEvent::kSendStop:
          sc_ptr->Send(sh.links[e.peer]->conn,
                       StopMsg{e.round, Direction::kPush,
                               static_cast<uint32_t>(e.value),
                               e.value2 ? StopReason::kDeadline
                                        : StopReason::kThreshold});
          break;
        case CtlEvent::kSendBitmap: {
          WorkerLink& l = *sh.links[e.peer];
          const Bitmap& b = l.push_bitmap.slot();
          sc_ptr->Send(l.conn, BitmapMsg{e.round, Direction::kPush, b.size(),
                                         {b.words().begin(), b.words().end()}});
          l.push_bitmap.Release();
          break;
        }
        case CtlEvent::kSendProbe:
          sc_ptr->Send(sh.links[e.peer]->conn,
                       ProbeMsg{e.round, Direction::kBroadcast,
                                static_cast<uint32_t>(e.value)});
          break;
        case CtlEvent::kSendRoundBegin: {
          RoundBeginMsg rb{e.round, static_cast<uint32_t>(e.round / 2),
                           static_cast<Direction>(e.direction),
                           BitsDouble(e.value), e.value2,
                           BitsDouble(e.value3)};
          std::string why;
          if (ValidateControl(rb, &why) != ControlError::kNone) {
            // A policy value the wire cannot carry: a bug, not a hang.
            sh.failure = "cannot announce round " + std::to_string(e.round) +
                         ": " + why;
            sh.failed.store(true, std::memory_order_release);
            break;
          }
          for (auto& l : sh.links) {
            if (l->alive) sc_ptr->Send(l->conn, rb);
          }
          break;
        }
        default:
          break;
      }
    }
  };

  ControlSidecar::Callbacks cb;
  cb.on_message = [&](ConnId c, const ControlMessage& m) {
    if (const auto* j = std::get_if<JoinMsg>(&m)) {
      std::lock_guard<std::mutex> lock(sh.join_mu);
      if (sh.joined.load()) return fail_join(c, "job already has all workers");
      if (j->protocol_version != kControlVersion) {
        return fail_join(c, "control protocol version " +
                                std::to_string(j->protocol_version) +
                                " != server's " +
                                std::to_string(kControlVersion) +
                                ": run the same DBLP build everywhere");
      }
      if (j->total_bytes == 0 || j->total_bytes % 4 != 0) {
        return fail_join(c, "gradient size must be a positive multiple of 4");
      }
      if (j->total_bytes > o.max_gradient_bytes) {
        return fail_join(c, "gradient of " + std::to_string(j->total_bytes) +
                                " bytes is above the server's limit of " +
                                std::to_string(o.max_gradient_bytes) +
                                ": lower --floats or raise the server's "
                                "--max_gradient_mb");
      }
      if (rank_of(c) >= 0) return fail_join(c, "JOIN sent twice");
      if (j->mtu != caps[0].mtu) {
        return fail_join(c, "worker MTU " + std::to_string(j->mtu) +
                                " != server MTU " +
                                std::to_string(caps[0].mtu) +
                                ": pass the same --mtu to every app");
      }
      if (sh.links.empty()) {
        sh.first_join = *j;
      } else if (j->total_bytes != sh.first_join.total_bytes ||
                 j->layers != sh.first_join.layers) {
        return fail_join(c, "gradient layout differs from the first "
                            "worker's: every worker must run the same model "
                            "(--floats / --model)");
      }
      auto link = std::make_unique<WorkerLink>();
      link->conn = c;
      link->name = j->worker_name;
      sh.links.push_back(std::move(link));
      if (sh.links.size() == o.workers) {
        const uint32_t payload = ChunkPayloadForMtu(caps[0].mtu);
        const ChunkLayout layout(sh.first_join.total_bytes, payload);
        for (uint32_t w = 0; w < o.workers; ++w) {
          WelcomeMsg wm;
          wm.session = session;
          wm.rank = static_cast<uint16_t>(w);
          wm.num_workers = static_cast<uint16_t>(o.workers);
          wm.mtu = caps[0].mtu;
          wm.chunk_payload = payload;
          wm.num_chunks = layout.num_chunks();
          wm.total_bytes = layout.total_bytes();
          wm.udp_base_port = o.udp_port;
          wm.num_shards = 1;
          wm.server_ipv4 = local_ip;
          std::memcpy(wm.server_mac.data(), caps[0].mac.addr_bytes, 6);
          wm.policy = policy->Describe();
          wm.layers = sh.first_join.layers;
          sc_ptr->Send(sh.links[w]->conn, wm);
        }
        sh.joined.store(true, std::memory_order_release);
      }
      return;
    }
    if (!sh.rounds_ready.load(std::memory_order_acquire)) return;
    const int w = rank_of(c);
    if (w < 0) return;
    WorkerLink& l = *sh.links[w];
    if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
      // The datapath answers, after draining its RX rings, so the BITMAP
      // counts every frame that arrived before the PROBE.
      if (pr->direction == Direction::kPush) {
        events.Push(CtlEvent{CtlEvent::kProbe, 0, static_cast<uint16_t>(w),
                             pr->round, 0, 0, 0});
      }
    } else if (const auto* st = std::get_if<StopMsg>(&m)) {
      if (st->direction == Direction::kBroadcast) {
        // The time first, then the flag: when the datapath sees the sender
        // finished, the time is already queued.
        events.Push(CtlEvent{CtlEvent::kStopSeen, 1, static_cast<uint16_t>(w),
                             st->round, NowNs(), 0, 0});
        l.bcast_tx.RequestStop(st->round);
      }
    } else if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
      if (bm->direction != Direction::kBroadcast ||
          !l.bcast_bitmap.Post(bm->num_bits, bm->words)) {
        return;
      }
      events.Push(CtlEvent{CtlEvent::kBitmap, 1, static_cast<uint16_t>(w),
                           bm->round, NowNs(), 0, 0});
    } else if (const auto* err = std::get_if<ErrorMsg>(&m)) {
      // The worker failed; its connection closes next (on_close -> gone).
      l.error = err->text;
    } else if (std::holds_alternative<ByeMsg>(m)) {
      events.Push(CtlEvent{CtlEvent::kIterationDone, 0,
                           static_cast<uint16_t>(w), 0, 0, 0, 0});
    }
  };
  cb.on_close = [&](ConnId c, const std::string& reason) {
    std::lock_guard<std::mutex> lock(sh.join_mu);
    const int w = rank_of(c);
    if (w < 0) return;
    if (!sh.joined.load()) {
      // A worker that left during the join: free its slot.
      sh.links.erase(sh.links.begin() + w);
      std::fprintf(stderr, "dblp-server: a worker left before the job "
                           "started (%s)\n", reason.c_str());
      return;
    }
    CtlEvent e{CtlEvent::kPeerGone, 0, static_cast<uint16_t>(w), 0, 0, 0, 0};
    events.Push(e);
    std::fprintf(stderr, "dblp-server: control connection of worker %d "
                         "closed: %s\n", w, reason.c_str());
  };
  cb.on_wakeup = send_requests;
  uint64_t last_rx = 0, last_tx = 0;
  if (o.dp.stats_period_s > 0) {
    cb.tick_ms = static_cast<uint32_t>(o.dp.stats_period_s * 1000);
    cb.on_tick = [&] {
      if (!sh.rounds_ready.load()) return;
      const uint64_t rx = ctr.rx_frames.load(std::memory_order_relaxed);
      const uint64_t tx = ctr.tx_frames.load(std::memory_order_relaxed);
      std::printf("[server] iter %llu  rx %.0f pps  tx %.0f pps  p=%.3f%s\n",
                  static_cast<unsigned long long>(sh.iteration.load()),
                  (rx - last_rx) / o.dp.stats_period_s,
                  (tx - last_tx) / o.dp.stats_period_s, sh.p.load(),
                  sh.critical.load() ? " (critical)" : "");
      std::fflush(stdout);
      last_rx = rx;
      last_tx = tx;
    };
  }
  ControlSidecar sidecar(cb);
  sc_ptr = &sidecar;
  std::string err;
  if (!sidecar.Listen(o.listen, &err)) {
    Die("cannot listen on " + o.listen + ": " + err,
        "pick a free --listen=IP:PORT");
  }
  std::printf("dblp-server: %u port(s), waiting for %u workers on %s "
              "(session %08x, policy %s)\n",
              nb_ports, o.workers, o.listen.c_str(), session,
              policy->Describe().c_str());
  std::fflush(stdout);
  SidecarThread sidecar_thread(sidecar);
  SetControlPriorities(sidecar_thread, "dblp-server", o.dp.realtime);
  auto shutdown = [&] { sidecar_thread.Stop(); };

  const auto join_deadline = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(o.join_timeout_ms);
  while (!sh.joined.load(std::memory_order_acquire)) {
    if (g_quit.load() || std::chrono::steady_clock::now() > join_deadline) {
      size_t have;
      {
        std::lock_guard<std::mutex> lock(sh.join_mu);
        have = sh.links.size();
      }
      shutdown();
      Die("only " + std::to_string(have) + " of " +
              std::to_string(o.workers) + " workers joined",
          "start all workers with --server=" + o.listen +
              " or lower --workers");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // ---- the job -------------------------------------------------------------
  const uint32_t W = o.workers;
  const ChunkLayout layout(sh.first_join.total_bytes,
                           ChunkPayloadForMtu(caps[0].mtu));
  const uint32_t N = layout.num_chunks();
  for (uint32_t w = 0; w < W; ++w) {
    WorkerLink& l = *sh.links[w];
    ReceiverConfig rc{session, FrameType::kPush, static_cast<int32_t>(w),
                      layout};
    l.push_rx = std::make_unique<ReceiverRound>(rc);
    l.order = std::make_unique<SendOrder>(o.dp.send_order, w, W,
                                          HashMix(o.dp.seed, 0xBC));
  }
  MeanReducer reducer(layout, W);
  std::vector<float> mean(layout.total_bytes() / sizeof(float), 0.0f);
  const auto* mean_bytes = reinterpret_cast<const uint8_t*>(mean.data());
  // Loss on the push direction, applied as frames arrive.
  RxLossInjector loss(o.dp.loss, o.dp.bursts, HashMix(o.dp.seed, 0xB0));
  // Emulated link rate, one bucket per port (a port is a link).
  std::vector<TokenBucket> links_rate;
  for (uint16_t p = 0; p < nb_ports; ++p) {
    links_rate.emplace_back(o.dp.link_gbps, uint64_t{o.dp.burst} *
                                                WireBytesPerFrame(caps[p].mtu));
  }
  RoundPacer pacer(o.dp.idle_spin, o.dp.idle_sleep_us, o.dp.round_timeout_ms,
                   &g_quit);
  rte_mbuf* rx_pkts[64];
  std::vector<uint32_t> seqs(o.dp.burst);
  RunReport report;
  report.role = "server";
  report.policy = policy->Describe();
  report.burst_iterations = o.dp.bursts.iterations;
  int exit_code = 0;
  std::string failure;

  auto request = [&](const CtlEvent& e) {
    requests.Push(e);
    sidecar.Wakeup();
  };
  RoundTolerance push_tol = policy->Current();
  uint64_t push_open_ns = 0;
  auto live_count = [&] {
    uint32_t n = 0;
    for (auto& l : sh.links) n += l->alive ? 1 : 0;
    return n;
  };
  auto open_push = [&](uint64_t it, const RoundTolerance& tol) {
    reducer.BeginRound();
    reducer.set_num_workers(live_count());
    push_open_ns = NowNs();
    const uint64_t deadline = tol.deadline_ns ? push_open_ns + tol.deadline_ns : 0;
    for (auto& l : sh.links) {
      l->push_rx->Begin(PushRound(it), tol.p, deadline,
                        tol.deadline_ns ? tol.min_fraction : 0);
      l->t_push_stop = 0;
    }
    request(CtlEvent{CtlEvent::kSendRoundBegin,
                     static_cast<uint8_t>(Direction::kPush), 0, PushRound(it),
                     DoubleBits(tol.p), tol.deadline_ns,
                     DoubleBits(tol.deadline_ns ? tol.min_fraction : 0)});
  };
  
  // RX: every port; frames demuxed by the DBLP sender rank, each worker's
  // receiver checks the rest. Returns frames received.
  // Per port: the last poll generation that left its RX ring empty. A PROBE
  // is answered only after a poll that started after the PROBE was seen
  // found the ring empty, so every frame sent before it is counted.
  uint64_t poll_gen = 0;
  std::vector<uint64_t> drained_gen(nb_ports, 0);
  PushRxPath rx_path{.udp_port = o.udp_port,
                     .num_workers = W,
                     .local_ip = local_ip,
                     .prefetch = o.dp.prefetch,
                     .loss = &loss,
                     .ctr = &ctr,
                     .reducer = &reducer,
                     .links = &sh.links,
                     .caps = &caps};
  auto poll_rx = [&]() -> uint32_t {
    uint32_t total = 0;
    ++poll_gen;
    for (uint16_t p = 0; p < nb_ports; ++p) {
      const uint16_t n = PollRx(p, 0, rx_pkts, 64);
      if (n < 64) drained_gen[p] = poll_gen;
      if (n == 0) continue;
      total += n;
      DatapathCounters::Add(ctr.rx_frames, n);
      rx_path.ReceiveBurst(p, rx_pkts, n);
      rte_pktmbuf_free_bulk(rx_pkts, n);
    }
    if (total > 0 || push_tol.deadline_ns) {
      const uint64_t now = NowNs();
      for (uint32_t w = 0; w < W; ++w) {
        WorkerLink& l = *sh.links[w];
        const StopTrigger t = l.push_rx->PollStop(now);
        if (t != StopTrigger::kNone) {
          l.t_push_stop = now;
          request(CtlEvent{CtlEvent::kSendStop, 0, static_cast<uint16_t>(w),
                           l.push_rx->round(), l.push_rx->received(),
                           t == StopTrigger::kDeadline ? 1u : 0u, 0});
        }
      }
    }
    return total;
  };

  // A worker is gone (disconnected, or finished early): end the job with a
  // message naming it, or (--on_worker_loss=continue) carry on without it.
  auto lose_worker = [&](uint32_t w, const std::string& how) -> bool {
    WorkerLink& l = *sh.links[w];
    if (!o.continue_on_worker_loss) {
      failure = "worker " + std::to_string(w) + " (" + l.name + ") " + how +
                " in iteration " + std::to_string(sh.iteration.load()) +
                "; restart the job, or run the server with "
                "--on_worker_loss=continue to carry on without it";
      return false;
    }
    std::fprintf(stderr, "dblp-server: continuing without worker %u (%s)\n",
                 w, how.c_str());
    l.alive = false;  // its frames are dropped from now on
    if (live_count() == 0) {
      failure = "every worker is gone";
      return false;
    }
    // The mean's divisor changes at the next round (open_push): this round
    // may already hold the lost worker's chunks.
    return true;
  };

  // Control events; returns false if the job must end.
  auto drain_events = [&](bool* work) -> bool {
    if (sh.failed.load(std::memory_order_acquire)) {
      failure = sh.failure;
      return false;
    }
    CtlEvent e;
    while (events.Pop(&e)) {
      *work = true;
      WorkerLink& l = *sh.links[e.peer];
      switch (e.kind) {
        case CtlEvent::kBitmap:
          if (e.round == l.bcast_tx.round() &&
              l.bcast_tx.OnBitmap(l.bcast_bitmap.slot())) {
            l.probe_out = false;
            l.rtt_sum += static_cast<double>(e.value - l.t_probe) / 1e3;
            ++l.rtt_n;
          }
          l.bcast_bitmap.Release();
          break;
        case CtlEvent::kStopSeen:
          if (e.round == l.bcast_tx.round() && l.t_bcast_stop == 0) {
            l.t_bcast_stop = e.value;
          }
          break;
        case CtlEvent::kProbe:
          l.probe_pending = true;
          l.probe_round = e.round;
          l.probe_gen = poll_gen;
          break;
        case CtlEvent::kIterationDone:
          l.said_bye = true;
          break;
        case CtlEvent::kPeerGone:
          if (l.said_bye || !l.alive) break;
          if (!lose_worker(e.peer, l.error.empty()
                                       ? "disconnected"
                                       : "failed (" + l.error + ")")) {
            return false;
          }
          break;
        default:
          break;
      }
    }
    return true;
  };

  // Answers pending PROBEs once the worker's RX ring was drained by a poll
  // that started after the PROBE was seen. A PROBE of a round that is no
  // longer open is dropped: its STOP went out before.
  Bitmap snap;
  auto answer_probes = [&] {
    for (uint32_t w = 0; w < sh.links.size(); ++w) {
      WorkerLink& l = *sh.links[w];
      // Until its port is known, any port may hold its frames.
      const auto later = [&](uint64_t g) { return g > l.probe_gen; };
      const bool drained =
          l.learned ? later(drained_gen[l.port])
                    : std::all_of(drained_gen.begin(), drained_gen.end(),
                                  later);
      if (!l.probe_pending || !drained) continue;
      l.probe_pending = false;
      if (l.probe_round != l.push_rx->round()) continue;
      l.push_rx->SnapshotBitmap(snap);
      if (l.push_bitmap.Post(snap.size(), snap.words())) {
        request(CtlEvent{CtlEvent::kSendBitmap, 0, static_cast<uint16_t>(w),
                         l.probe_round, 0, 0, 0});
      }
    }
  };

  sh.rounds_ready.store(true, std::memory_order_release);
  open_push(0, push_tol);
  std::printf("dblp-server: %u workers joined; %u chunks of %u B per round\n",
              W, N, layout.chunk_payload());
  std::fflush(stdout);

  loss.StartClock(NowNs());
  for (uint64_t it = 0; exit_code == 0; ++it) {
    sh.iteration.store(it, std::memory_order_relaxed);
    const uint32_t push_round = PushRound(it);
    // ---- push: wait until every live worker's receiver reached STOP ----
    pacer.Start();
    bool all_bye = false;
    for (;;) {
      bool work = poll_rx() > 0;
      if (!drain_events(&work)) {
        exit_code = 1;
        break;
      }
      answer_probes();
      bool done = true;
      all_bye = true;
      for (auto& l : sh.links) {
        if (!l->alive) continue;
        if (!l->said_bye) all_bye = false;
        if (!l->push_rx->stop_taken()) done = false;
      }
      if (done || all_bye) break;
      // A worker that finished while another already pushes this round ran
      // fewer --iterations. (Workers that all finish say BYE within a few
      // messages of each other and push nothing more.)
      bool others_push = false;
      for (auto& l : sh.links) {
        if (l->alive && !l->said_bye && l->push_rx->received() > 0) {
          others_push = true;
        }
      }
      bool lost = false;
      for (uint32_t w = 0; w < W && !lost && others_push; ++w) {
        WorkerLink& l = *sh.links[w];
        if (l.alive && l.said_bye && !l.push_rx->stop_taken() &&
            !lose_worker(w, "finished after " + std::to_string(it) +
                                " iterations while the others go on (run "
                                "every worker with the same --iterations);")) {
          lost = true;
        }
      }
      if (lost) {
        exit_code = 1;
        break;
      }
      const RoundPacer::Step step = pacer.After(work);
      if (step == RoundPacer::Step::kContinue) continue;
      failure = "interrupted";
      if (step == RoundPacer::Step::kTimedOut) {
        failure = "push round " + std::to_string(push_round) +
                  " made no progress for " + std::to_string(pacer.timeout_ms()) +
                  " ms; chunks received:";
        for (uint32_t w = 0; w < W; ++w) {
          failure += " w" + std::to_string(w) + "=" +
                     std::to_string(sh.links[w]->push_rx->received()) + "/" +
                     std::to_string(N);
        }
      }
      exit_code = 1;
      break;
    }
    if (exit_code != 0 || all_bye) break;

    // ---- reduce, detect the phase, open the next push ----
    for (auto& l : sh.links) l->push_rx->Close();
    reducer.Finalize(o.push_fill, mean);
    if (it >= o.zero_first && it <= o.zero_last && o.zero_fraction > 0) {
      ZeroRandomChunks(mean, layout, o.zero_fraction, HashMix(o.dp.seed, it));
    }
    const double norm = L2Norm(mean);
    const uint64_t push_ns = NowNs() - push_open_ns;
    const bool in_burst = loss.InBurst(it);
    for (uint32_t w = 0; w < W; ++w) {
      WorkerLink& l = *sh.links[w];
      IterationRecord r;
      r.iteration = it;
      r.rank = w;
      r.send_latency_us =
          l.t_push_stop ? static_cast<double>(l.t_push_stop - push_open_ns) / 1e3 : 0;
      r.delivered_fraction = l.push_rx->delivered_fraction();
      r.p = push_tol.p;
      r.critical = push_tol.critical;
      r.grad_norm = norm;
      r.burst = in_burst;
      report.rows.push_back(r);
      if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
        Bitmap b;
        l.push_rx->SnapshotBitmap(b);
        DumpBinary(o.dp.dump_dir + "/w" + std::to_string(w) + "_it" +
                       std::to_string(it) + "_push.bits",
                   b.words().data(), b.words().size() * sizeof(uint64_t));
      }
    }
    if (!o.dp.dump_dir.empty() && it < o.dp.dump_iterations) {
      DumpBinary(o.dp.dump_dir + "/mean_it" + std::to_string(it) + ".f32",
                 mean.data(), mean.size() * sizeof(float));
    }
    policy->OnIterationEnd(it, norm, push_ns);
    const RoundTolerance next_tol = policy->Current();
    RoundTolerance bcast_tol =
        o.reliable_broadcast ? RoundTolerance{} : next_tol;
    if (o.push_only) {
      // Closed on arrival: a 1 ns deadline with a floor of zero chunks.
      bcast_tol = RoundTolerance{};
      bcast_tol.deadline_ns = 1;
      bcast_tol.min_fraction = 0;
    }
    request(CtlEvent{CtlEvent::kSendRoundBegin,
                     static_cast<uint8_t>(Direction::kBroadcast), 0,
                     push_round + 1, DoubleBits(bcast_tol.p),
                     bcast_tol.deadline_ns,
                     DoubleBits(bcast_tol.deadline_ns ? bcast_tol.min_fraction : 0)});
    push_tol = next_tol;
    sh.p.store(push_tol.p, std::memory_order_relaxed);
    sh.critical.store(push_tol.critical, std::memory_order_relaxed);
    open_push(it + 1, push_tol);

    if (o.push_only) continue;
    // ---- broadcast the mean to every live worker ----
    const uint64_t bcast_start = NowNs();
    for (uint32_t w = 0; w < W; ++w) {
      WorkerLink& l = *sh.links[w];
      l.order->Fill(push_round + 1, N, l.order_buf);
      l.bcast_tx.Begin(push_round + 1, l.order_buf);
      l.probe_out = false;
      l.t_bcast_stop = 0;
      l.rtt_sum = 0;
      l.rtt_n = 0;
    }
    pacer.Start();
    uint32_t rr = 0;
    for (;;) {
      bool work = poll_rx() > 0;  // early pushes of the next iteration
      if (!drain_events(&work)) {
        exit_code = 1;
        break;
      }
      answer_probes();
      bool done = true;
      for (uint32_t i = 0; i < W; ++i) {
        const uint32_t w = (rr + i) % W;
        WorkerLink& l = *sh.links[w];
        if (!l.alive || l.bcast_tx.finished()) continue;
        done = false;
        const uint32_t k = l.bcast_tx.NextBurst(seqs.data(), o.dp.burst);
        if (k > 0) {
          ChunkTransmitter tx{l.port, 0, pool, &ctr, &links_rate[l.port], 8,
                              WireBytesPerFrame(caps[l.port].mtu),
                              o.dp.prefetch};
          const uint32_t sent = tx.Send(
              l.tmpl,
              DataHeader{FrameType::kBroadcast, session, kServerRank, 0,
                         push_round + 1, 0},
              seqs.data(), k, mean_bytes, layout);
          l.bcast_tx.Unsend(k - sent);  // a full TX ring: try again later
          // A full ring is no progress: back off and let the peer drain.
          work = work || sent > 0;
        }
        if (l.bcast_tx.state() == SenderRound::State::kAwaitingBitmap &&
            !l.probe_out) {
          l.probe_out = true;
          l.t_probe = NowNs();
          request(CtlEvent{CtlEvent::kSendProbe, 1, static_cast<uint16_t>(w),
                           push_round + 1, l.bcast_tx.passes(), 0, 0});
        }
      }
      rr = (rr + 1) % W;
      if (done) break;
      const RoundPacer::Step step = pacer.After(work);
      if (step == RoundPacer::Step::kContinue) continue;
      failure = step == RoundPacer::Step::kTimedOut
                    ? "broadcast round " + std::to_string(push_round + 1) +
                          " made no progress for " +
                          std::to_string(pacer.timeout_ms()) + " ms"
                    : "interrupted";
      exit_code = 1;
      break;
    }
    if (exit_code == 0) {
      bool ignored = false;  // pick up STOP times queued with the last flags
      if (!drain_events(&ignored)) exit_code = 1;
    }
    // Complete the rows of this iteration with the broadcast side.
    for (uint32_t w = 0; w < W; ++w) {
      WorkerLink& l = *sh.links[w];
      IterationRecord& r = report.rows[report.rows.size() - W + w];
      r.bcast_latency_us =
          l.t_bcast_stop ? static_cast<double>(l.t_bcast_stop - bcast_start) / 1e3 : 0;
      r.bcast_passes = l.bcast_tx.passes();
      r.packets_sent = l.bcast_tx.packets_sent();
      r.packets_resent = l.bcast_tx.packets_resent();
      r.control_rtt_us = l.rtt_n ? l.rtt_sum / l.rtt_n : 0;
    }
  }
  shutdown();

  report.counters = {
      {"rx_frames", ctr.rx_frames.load()},
      {"tx_frames", ctr.tx_frames.load()},
      {"injected_drops", ctr.injected_drops.load()},
      {"tx_ring_full", ctr.tx_ring_full.load()},
      {"mbuf_alloc_failures", ctr.mbuf_alloc_failures.load()},
      {"frames_from_lost_workers", ctr.from_lost_worker.load()},
      {"control_messages_in", sidecar.messages_in()},
      {"control_messages_out", sidecar.messages_out()},
      {"control_protocol_errors", sidecar.protocol_errors()},
  };
  for (int v = 0; v < kNumVerdicts; ++v) {
    uint64_t sum = 0;
    for (auto& l : sh.links) sum += l->push_rx->verdict_count(static_cast<Verdict>(v));
    report.counters.emplace_back(
        std::string("push_") + VerdictName(static_cast<Verdict>(v)), sum);
  }
  for (int s = 1; s < kNumDecodeStatus; ++s) {
    uint64_t sum = 0;
    for (auto& l : sh.links) {
      sum += l->push_rx->decode_error_count(static_cast<DecodeStatus>(s));
    }
    report.counters.emplace_back(
        std::string("decode_") + DecodeStatusName(static_cast<DecodeStatus>(s)),
        sum);
  }
  for (int s = 1; s < kNumFrameStatus; ++s) {
    report.counters.emplace_back(
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
  for (auto& l : sh.links) {
    bitmaps_dropped += l->bcast_bitmap.dropped() + l->push_bitmap.dropped();
  }
  report.counters.emplace_back("bitmaps_dropped", bitmaps_dropped);
  report.counters.emplace_back("device_imissed", total.imissed);
  report.counters.emplace_back("device_rx_nombuf", total.rx_nombuf);
  report.counters.emplace_back("device_oerrors", total.oerrors);
  report.info = {{"loss", FormatLossSpec(o.dp.loss)},
                 {"link_gbps", o.dp.link_gbps > 0
                                   ? std::to_string(o.dp.link_gbps)
                                   : "unpaced"},
                 {"chunks", std::to_string(N)},
                 {"chunk_bytes", std::to_string(layout.chunk_payload())},
                 {"push_fill", FillModeName(o.push_fill)},
                 {"broadcast", o.reliable_broadcast ? "reliable" : "same_p"}};
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  if (!o.dp.out_dir.empty()) {
    std::string werr;
    if (!WriteRunReport(o.dp.out_dir, report, &werr)) {
      std::fprintf(stderr, "dblp-server: %s\n", werr.c_str());
      exit_code = exit_code ? exit_code : 1;
    }
  }
  if (exit_code != 0) {
    std::fprintf(stderr, "dblp-server: %s\n", failure.c_str());
  }
  for (uint16_t p = 0; p < nb_ports; ++p) {
    rte_eth_dev_stop(p);
    rte_eth_dev_close(p);
  }
  return exit_code;
}

}  // namespace dblp
