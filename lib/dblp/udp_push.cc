#include "dblp/udp_push.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "dblp/chunking.h"
#include "dblp/control.h"
#include "dblp/control_sidecar.h"
#include "dblp/loss_fill.h"
#include "dblp/loss_model.h"
#include "dblp/receiver_round.h"
#include "dblp/rng.h"
#include "dblp/send_order.h"
#include "dblp/sender_round.h"
#include "dblp/udp_transport.h"
#include "dblp/wire.h"

namespace dblp {
namespace {

constexpr uint32_t kServerEndpoint = 0;
constexpr uint16_t kRxBurst = 64;
// UDP payload of an MTU-sized IPv4 datagram: the largest frame we expect.
constexpr uint32_t kIpUdpHeaders = kIpv4HeaderBytes + kUdpHeaderBytes;

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// A control event between the sidecar and the datapath, either way. Fat
// (a bitmap, a text) but rare: a few per round, never per packet.
struct Event {
  enum Kind : uint8_t {
    // sidecar -> datapath
    kRoundBegin,
    kStop,
    kBitmap,
    kProbe,
    kBye,
    kPeerGone,
    kPeerError,
    // datapath -> sidecar
    kSendRoundBegin,
    kSendStop,
    kSendBitmap,
    kSendProbe,
    kFinish,  // value 0: BYE, else ERROR with `text`; then close
  };
  // A constructor rather than aggregate init: most events fill a prefix.
  explicit Event(Kind k, uint32_t peer_ = 0, uint32_t round_ = 0,
                 uint64_t value_ = 0, uint64_t t_ns_ = 0)
      : kind(k), peer(peer_), round(round_), value(value_), t_ns(t_ns_) {}
  Kind kind;
  uint32_t peer = 0;
  uint32_t round = 0;
  uint64_t value = 0;
  uint64_t t_ns = 0;
  double p = 0;
  std::vector<uint64_t> words;
  std::string text;
};

// Multi-producer, single-consumer queue. The consumer polls it every loop
// turn, so Drain first checks an atomic flag and locks only when something
// was pushed: an idle check is one load, no lock.
class EventQueue {
 public:
  void Push(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(e));
    pending_.store(true, std::memory_order_release);
  }
  // Moves everything queued into *out (cleared first); false if empty.
  bool Drain(std::vector<Event>* out) {
    out->clear();
    if (!pending_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(items_, *out);
    pending_.store(false, std::memory_order_relaxed);
    return !out->empty();
  }

 private:
  std::mutex mu_;
  std::vector<Event> items_;
  std::atomic<bool> pending_{false};
};

// Busy polling while there is work; when idle, yield first (the sidecar
// threads may share our core), then sleep briefly so an idle round does
// not burn a core for nothing.
class Backoff {
 public:
  explicit Backoff(uint32_t sleep_us) : sleep_us_(sleep_us) {}
  void Work() { empty_ = 0; }
  void Idle() {
    if (++empty_ < 512 || sleep_us_ == 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    }
  }

 private:
  uint32_t sleep_us_;
  uint32_t empty_ = 0;
};

// Watchdog of a poll loop: fails a round that makes no progress.
class Watchdog {
 public:
  explicit Watchdog(uint32_t timeout_ms)
      : timeout_ns_(uint64_t{timeout_ms} * 1000000) {}
  void Progress() { last_ = NowNs(); }
  bool Expired() const { return NowNs() - last_ > timeout_ns_; }

 private:
  uint64_t timeout_ns_;
  uint64_t last_ = NowNs();
};

// Checked before any socket opens, so a bad CPU fails fast on both sides.
bool CheckCpu(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
      (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))) {
    *error = "CPU " + std::to_string(cpu) +
             " is not available to this "
             "process (" +
             std::to_string(CPU_COUNT(&allowed)) +
             " allowed): pick another CPU, or -1 for no pinning";
    return false;
  }
  return true;
}

bool PinThisThread(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) {
    *error = "cannot pin the datapath thread to CPU " + std::to_string(cpu) +
             ": " + std::strerror(rc);
    return false;
  }
  return true;
}

std::string CheckCommon(uint32_t mtu, uint32_t round_timeout_ms) {
  try {
    ChunkPayloadForMtu(mtu);
  } catch (const std::exception& e) {
    return std::string("mtu: ") + e.what() + " (use 576..9216, e.g. 1500)";
  }
  if (round_timeout_ms == 0) return "round timeout must be > 0 ms";
  return "";
}

// Waits (polling) for `done` or the timeout; true if done.
template <class F>
bool WaitFor(F done, uint32_t timeout_ms) {
  const uint64_t end = NowNs() + uint64_t{timeout_ms} * 1000000;
  while (!done()) {
    if (NowNs() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace

void FillBenchGradient(uint32_t rank, std::span<float> out) {
  // Exact in float32 (multiples of 1/1024 below 2^13), so a mean over one
  // worker reproduces it bit for bit; distinct per rank and per position.
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(
                 static_cast<int>((i * 7919 + rank * 104729) % 8191) - 4095) /
             1024.0f;
  }
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

UdpPushServerResult RunUdpPushServer(const UdpPushServerOptions& o) {
  UdpPushServerResult res;
  auto fail = [&](int code, const std::string& msg) {
    res.exit_code = code;
    res.error = msg;
    return res;
  };
  if (std::string e = CheckCommon(o.mtu, o.round_timeout_ms); !e.empty()) {
    return fail(2, e);
  }
  if (o.workers == 0 || o.workers >= 0xFFFF) {
    return fail(2, "workers=" + std::to_string(o.workers) +
                       " is out of range: use 1..65534");
  }
  if (!(o.p >= 0 && o.p < 1)) {
    return fail(2, "p=" + std::to_string(o.p) + " must be in [0, 1)");
  }
  std::string err;
  if (!CheckCpu(o.cpu, &err)) return fail(2, "server datapath: " + err);
  LossSpec loss_spec;
  try {
    loss_spec = ParseLossSpec(o.loss);
  } catch (const std::exception& e) {
    return fail(2, std::string("loss: ") + e.what());
  }

  UdpSocketPort port;
  UdpPortOptions popts;
  popts.max_datagram = o.mtu - kIpUdpHeaders;
  if (!port.Open(o.data, popts, &err)) return fail(1, err);
  const uint32_t session = static_cast<uint32_t>(HashMix(NowNs(), 0x5E55)) | 1u;

  // Join state: written by the sidecar until `joined`, read-only after.
  struct Link {
    ConnId conn = 0;
    std::string name;
  };
  std::mutex join_mu;
  std::vector<Link> links;
  std::atomic<bool> joined{false};
  JoinMsg first_join;
  EventQueue events;    // sidecar -> datapath
  EventQueue requests;  // datapath -> sidecar
  ControlSidecar* sc = nullptr;
  std::atomic<bool> finished{false};  // sidecar: wo after the last request
  const uint32_t chunk_payload = ChunkPayloadForMtu(o.mtu);

  auto rank_of = [&](ConnId c) -> int {
    for (size_t w = 0; w < links.size(); ++w) {
      if (links[w].conn == c) return static_cast<int>(w);
    }
    return -1;
  };
  auto refuse = [&](ConnId c, const std::string& why) {
    sc->Send(c, ErrorMsg{1, why});
    sc->Close(c, why);
  };

  ControlSidecar::Callbacks cb;
  cb.on_message = [&](ConnId c, const ControlMessage& m) {
    if (const auto* j = std::get_if<JoinMsg>(&m)) {
      std::lock_guard<std::mutex> lock(join_mu);
      if (joined.load()) return refuse(c, "job already has all workers");
      if (j->protocol_version != kControlVersion) {
        return refuse(c,
                      "control protocol version mismatch: run the same "
                      "DBLP build everywhere");
      }
      if (j->total_bytes == 0 || j->total_bytes % 4 != 0 ||
          j->total_bytes > o.max_gradient_bytes) {
        return refuse(c, "gradient of " + std::to_string(j->total_bytes) +
                             " bytes: must be a positive multiple of 4 up "
                             "to " +
                             std::to_string(o.max_gradient_bytes));
      }
      if (j->mtu != o.mtu) {
        return refuse(c, "worker MTU " + std::to_string(j->mtu) +
                             " != server MTU " + std::to_string(o.mtu) +
                             ": pass the same --mtu to both");
      }
      if (rank_of(c) >= 0) return refuse(c, "JOIN sent twice");
      if (links.empty()) {
        first_join = *j;
      } else if (j->total_bytes != first_join.total_bytes) {
        return refuse(c, "gradient size differs from the first worker's");
      }
      links.push_back(Link{c, j->worker_name});
      if (links.size() < o.workers) return;
      const ChunkLayout layout(first_join.total_bytes, chunk_payload);
      for (uint32_t w = 0; w < o.workers; ++w) {
        WelcomeMsg wm;
        wm.session = session;
        wm.rank = static_cast<uint16_t>(w);
        wm.num_workers = static_cast<uint16_t>(o.workers);
        wm.mtu = o.mtu;
        wm.chunk_payload = chunk_payload;
        wm.num_chunks = layout.num_chunks();
        wm.total_bytes = layout.total_bytes();
        wm.udp_base_port = port.bound_port();
        wm.server_ipv4 = ntohl(port.bound_addr().sin_addr.s_addr);
        wm.policy = "fixed p=" + std::to_string(o.p);
        sc->Send(links[w].conn, wm);
      }
      joined.store(true, std::memory_order_release);
      return;
    }
    if (!joined.load(std::memory_order_acquire)) return;
    const int w = rank_of(c);
    if (w < 0) return;
    const uint32_t peer = static_cast<uint32_t>(w);
    if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
      // The datapath answers after an RX poll that started later, so the
      // BITMAP counts every frame sent before the PROBE.
      if (pr->direction == Direction::kPush) {
        events.Push(Event{Event::kProbe, peer, pr->round});
      }
    } else if (std::holds_alternative<ByeMsg>(m)) {
      events.Push(Event{Event::kBye, peer});
    } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
      Event ev{Event::kPeerError, peer};
      ev.text = e->text;
      events.Push(std::move(ev));
    }
  };
  cb.on_close = [&](ConnId c, const std::string& reason) {
    std::lock_guard<std::mutex> lock(join_mu);
    const int w = rank_of(c);
    if (w < 0) return;
    if (!joined.load()) {
      links.erase(links.begin() + w);  // left during the join: free the slot
      return;
    }
    Event ev{Event::kPeerGone, static_cast<uint32_t>(w)};
    ev.text = reason;
    events.Push(std::move(ev));
  };
  std::vector<Event> out_events;  // sidecar thread only
  cb.on_wakeup = [&] {
    if (!requests.Drain(&out_events)) return;
    for (Event& e : out_events) {
      switch (e.kind) {
        case Event::kSendRoundBegin: {
          const RoundBeginMsg rb{e.round, e.round / 2, Direction::kPush,
                                 e.p,     0,           0};
          for (const Link& l : links) sc->Send(l.conn, rb);
          break;
        }
        case Event::kSendStop:
          sc->Send(links[e.peer].conn, StopMsg{e.round, Direction::kPush,
                                               static_cast<uint32_t>(e.value),
                                               StopReason::kThreshold});
          break;
        case Event::kSendBitmap:
          sc->Send(links[e.peer].conn, BitmapMsg{e.round, Direction::kPush,
                                                 static_cast<uint32_t>(e.value),
                                                 std::move(e.words)});
          break;
        case Event::kFinish:
          for (const Link& l : links) {
            if (e.value != 0) sc->Send(l.conn, ErrorMsg{2, e.text});
            sc->Close(l.conn, e.value ? e.text : "job finished");
          }
          finished.store(true, std::memory_order_release);
          break;
        default:
          break;
      }
    }
  };
  ControlSidecar sidecar(cb);
  sc = &sidecar;
  if (!sidecar.Listen(o.control, &err)) {
    return fail(1, "control: " + err);
  }
  if (!o.quiet) {
    std::printf("udp-server: control %s port %u, data %s\n", o.control.c_str(),
                sidecar.bound_port(),
                FormatIpv4Endpoint(port.bound_addr()).c_str());
    std::fflush(stdout);
  }
  if (o.on_listening) o.on_listening(sidecar.bound_port(), port.bound_port());
  // The sidecar thread starts before the pinning, so it does not inherit
  // the datapath's CPU.
  SidecarThread sidecar_thread(sidecar);
  if (!PinThisThread(o.cpu, &err)) return fail(2, err);

  if (!WaitFor([&] { return joined.load(std::memory_order_acquire); },
               o.join_timeout_ms)) {
    size_t have;
    {
      std::lock_guard<std::mutex> lock(join_mu);
      have = links.size();
    }
    return fail(1, "only " + std::to_string(have) + " of " +
                       std::to_string(o.workers) + " workers joined within " +
                       std::to_string(o.join_timeout_ms) +
                       " ms: start the workers with the server's control "
                       "address");
  }

  // ---- the job ------------------------------------------------------------
  const uint32_t W = o.workers;
  const ChunkLayout layout(first_join.total_bytes, chunk_payload);
  const uint32_t N = layout.num_chunks();
  res.chunks = N;
  struct RxLink {
    std::unique_ptr<ReceiverRound> rx;
    bool probe_pending = false;
    uint32_t probe_round = 0;
    uint64_t probe_gen = 0;
    bool bye = false;
  };
  std::vector<RxLink> rl(W);
  for (uint32_t w = 0; w < W; ++w) {
    rl[w].rx = std::make_unique<ReceiverRound>(ReceiverConfig{
        session, FrameType::kPush, static_cast<int32_t>(w), layout});
  }
  std::unique_ptr<MeanReducer> reducer_holder;
  std::vector<float> mean;
  try {
    reducer_holder = std::make_unique<MeanReducer>(layout, W);
    mean.assign(layout.total_bytes() / sizeof(float), 0.0f);
  } catch (const std::bad_alloc&) {
    return fail(1, "cannot allocate the sums of a " +
                       std::to_string(layout.total_bytes()) +
                       "-byte gradient: lower the workers' size or give the "
                       "server more memory");
  }
  MeanReducer& reducer = *reducer_holder;
  std::vector<Bitmap> arrived(W);
  LossInjector loss(loss_spec, BurstSchedule{}, HashMix(o.seed, 0xB0));
  std::vector<Packet> pkts(kRxBurst);
  for (Packet& p : pkts) p.bytes.reserve(popts.max_datagram);

  auto request = [&](Event e) {
    requests.Push(std::move(e));
    sidecar.Wakeup();
  };
  uint64_t it = 0;
  auto open_round = [&] {
    reducer.BeginRound();
    for (RxLink& l : rl) l.rx->Begin(PushRound(it), o.p);
    Event e{Event::kSendRoundBegin, 0, PushRound(it)};
    e.p = o.p;
    request(std::move(e));
  };

  std::string failure;
  uint64_t poll_gen = 0, drained_gen = 0;
  Backoff backoff(o.idle_sleep_us);
  Watchdog watchdog(o.round_timeout_ms);
  std::vector<Event> evs;
  Bitmap snap;
  open_round();
  for (;;) {
    // `work` ends the idle back-off; only `progress` (a new chunk, a new
    // round) feeds the watchdog, so a round whose every frame is lost
    // still times out.
    bool work = false, progress = false;
    ++poll_gen;
    const uint16_t n = port.RxBurst(pkts.data(), kRxBurst);
    if (n < kRxBurst) drained_gen = poll_gen;
    for (uint16_t i = 0; i < n; ++i) {
      const uint8_t* buf = pkts[i].bytes.data();
      const size_t len = pkts[i].bytes.size();
      // A frame too short to be one is never "lost": the receiver counts it
      // malformed.
      if (len >= kDataHeaderBytes && loss.ShouldDrop()) continue;
      const uint32_t rank = PeekSenderRank(buf, len);
      // Unknown ranks go to worker 0's receiver, which counts them as
      // wrong-sender (or malformed) without accepting anything.
      ReceiverRound& r = *rl[rank < W ? rank : 0].rx;
      DataHeader h;
      const uint8_t* payload = nullptr;
      if (r.OnFrame(buf, len, &h, &payload) == Verdict::kAccepted) {
        reducer.Accumulate(h.seq, payload);
        progress = true;
      }
    }
    if (n > 0) {
      work = true;
      for (uint32_t w = 0; w < W; ++w) {
        if (rl[w].rx->PollStop() != StopTrigger::kNone) {
          request(Event{Event::kSendStop, w, rl[w].rx->round(),
                        rl[w].rx->received()});
        }
      }
    }
    if (events.Drain(&evs)) {
      work = true;
      for (Event& e : evs) {
        RxLink& l = rl[e.peer];
        switch (e.kind) {
          case Event::kProbe:
            l.probe_pending = true;
            l.probe_round = e.round;
            l.probe_gen = poll_gen;
            break;
          case Event::kBye:
            l.bye = true;
            break;
          case Event::kPeerError:
            if (failure.empty()) {
              failure = "worker " + std::to_string(e.peer) + " (" +
                        links[e.peer].name + ") failed: " + e.text;
            }
            break;
          case Event::kPeerGone:
            if (!l.bye && failure.empty()) {
              failure = "worker " + std::to_string(e.peer) + " (" +
                        links[e.peer].name + ") disconnected in iteration " +
                        std::to_string(it) + ": " + e.text;
            }
            break;
          default:
            break;
        }
      }
    }
    if (!failure.empty()) break;
    // Answer PROBEs once a poll that started after the PROBE came back
    // short: every frame sent before it is in the bitmap.
    for (uint32_t w = 0; w < W; ++w) {
      RxLink& l = rl[w];
      if (!l.probe_pending || drained_gen <= l.probe_gen) continue;
      l.probe_pending = false;
      if (l.probe_round != l.rx->round()) continue;  // its STOP went out
      l.rx->SnapshotBitmap(snap);
      Event e{Event::kSendBitmap, w, l.probe_round, snap.size()};
      e.words.assign(snap.words().begin(), snap.words().end());
      request(std::move(e));
    }
    bool all_stop = true, all_bye = true;
    for (const RxLink& l : rl) {
      all_stop = all_stop && l.rx->stop_taken();
      all_bye = all_bye && l.bye;
    }
    if (all_bye) break;
    if (all_stop) {
      for (uint32_t w = 0; w < W; ++w) {
        rl[w].rx->Close();
        rl[w].rx->SnapshotBitmap(arrived[w]);
        res.rounds.push_back(
            UdpServerRound{it, w, rl[w].rx->delivered_fraction()});
      }
      reducer.Finalize(FillMode::kZero, mean);
      if (o.on_round) o.on_round(UdpServerRoundView{it, mean, arrived});
      ++it;
      open_round();
      work = progress = true;
    }
    if (progress) watchdog.Progress();
    if (work) {
      backoff.Work();
    } else {
      backoff.Idle();
    }
    if (!progress && watchdog.Expired()) {
      failure = "push round " + std::to_string(PushRound(it)) +
                " made no progress for " + std::to_string(o.round_timeout_ms) +
                " ms; chunks received:";
      for (uint32_t w = 0; w < W; ++w) {
        failure += " w" + std::to_string(w) + "=" +
                   std::to_string(rl[w].rx->received()) + "/" +
                   std::to_string(N);
      }
      break;
    }
  }
  if (!failure.empty()) {
    res.exit_code = 1;
    res.error = failure;
  }
  // ERROR (with the cause) or a plain close to every worker, flushed before
  // the sidecar stops.
  Event fin{Event::kFinish, 0, 0, failure.empty() ? 0u : 1u};
  fin.text = failure;
  request(std::move(fin));
  WaitFor([&] { return finished.load(std::memory_order_acquire); }, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  sidecar_thread.Stop();

  auto sum = [&](Verdict v) {
    uint64_t s = 0;
    for (const RxLink& l : rl) s += l.rx->verdict_count(v);
    return s;
  };
  res.counters = {
      {"rx_frames", port.rx_frames()},
      {"injected_drops", loss.dropped()},
      {"socket_drops", port.socket_drops()},
      {"rx_truncated", port.rx_truncated()},
      {"rcvbuf_bytes", static_cast<uint64_t>(port.rcvbuf_bytes())},
  };
  for (int v = 0; v < kNumVerdicts; ++v) {
    res.counters[VerdictName(static_cast<Verdict>(v))] =
        sum(static_cast<Verdict>(v));
  }
  return res;
}

// ---------------------------------------------------------------------------
// Worker
// ---------------------------------------------------------------------------

UdpPushWorkerResult RunUdpPushWorker(const UdpPushWorkerOptions& o) {
  UdpPushWorkerResult res;
  auto fail = [&](int code, const std::string& msg) {
    res.exit_code = code;
    res.error = msg;
    return res;
  };
  if (std::string e = CheckCommon(o.mtu, o.round_timeout_ms); !e.empty()) {
    return fail(2, e);
  }
  if (o.size_bytes == 0 || o.size_bytes % 4 != 0) {
    return fail(2, "gradient size " + std::to_string(o.size_bytes) +
                       " bytes must be a positive multiple of 4");
  }
  if (o.burst == 0 || o.burst > UdpSocketPort::kMaxBurst) {
    return fail(2, "burst=" + std::to_string(o.burst) + " must be in 1.." +
                       std::to_string(UdpSocketPort::kMaxBurst));
  }
  sockaddr_in server_ctrl{};
  std::string err;
  if (!CheckCpu(o.cpu, &err)) return fail(2, "worker datapath: " + err);
  if (!ParseIpv4Endpoint(o.server, false, false, "127.0.0.1:9100",
                         &server_ctrl, &err)) {
    return fail(2, "server: " + err);
  }
  UdpSocketPort port;
  UdpPortOptions popts;
  popts.max_datagram = o.mtu - kIpUdpHeaders;
  if (!port.Open(o.data, popts, &err)) return fail(1, err);

  // Shared with the sidecar; each field's writer noted.
  WelcomeMsg welcome;  // sidecar: wo before `welcomed`
  std::atomic<bool> welcomed{false};
  std::atomic<bool> server_gone{false};
  std::string gone_why;  // sidecar: wo before `server_gone`
  std::atomic<bool> closed{false};
  SenderRound push;  // sidecar: RequestStop(round) only
  EventQueue events, requests;
  ControlSidecar* sc = nullptr;
  ConnId conn = 0;

  ControlSidecar::Callbacks cb;
  cb.on_message = [&](ConnId, const ControlMessage& m) {
    if (const auto* w = std::get_if<WelcomeMsg>(&m)) {
      if (!welcomed.load()) {
        welcome = *w;
        welcomed.store(true, std::memory_order_release);
      }
    } else if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
      if (rb->direction == Direction::kPush) {
        Event e{Event::kRoundBegin, 0, rb->round};
        e.p = rb->p;
        events.Push(std::move(e));
      }
    } else if (const auto* st = std::get_if<StopMsg>(&m)) {
      if (st->direction == Direction::kPush) {
        // The event (with the arrival time) first, then the flag: when the
        // datapath sees the round stopped, the event is already queued.
        events.Push(Event{Event::kStop, 0, st->round, st->received, NowNs()});
        push.RequestStop(st->round);
      }
    } else if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
      if (bm->direction == Direction::kPush) {
        Event e{Event::kBitmap, 0, bm->round, bm->num_bits, NowNs()};
        e.words = bm->words;
        events.Push(std::move(e));
      }
    } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
      if (!server_gone.load()) {
        gone_why = "server: " + e->text;
        server_gone.store(true, std::memory_order_release);
      }
    } else if (std::holds_alternative<ByeMsg>(m)) {
      if (!server_gone.load()) {
        gone_why = "server said BYE";
        server_gone.store(true, std::memory_order_release);
      }
    }
  };
  cb.on_close = [&](ConnId, const std::string& reason) {
    if (!server_gone.load()) {
      gone_why = "control connection to the server closed: " + reason;
      server_gone.store(true, std::memory_order_release);
    }
    closed.store(true, std::memory_order_release);
  };
  std::vector<Event> out_events;  // sidecar thread only
  cb.on_wakeup = [&] {
    if (!requests.Drain(&out_events)) return;
    for (const Event& e : out_events) {
      if (e.kind == Event::kSendProbe) {
        sc->Send(conn, ProbeMsg{e.round, Direction::kPush,
                                static_cast<uint32_t>(e.value)});
      } else if (e.kind == Event::kFinish) {
        if (e.value == 0) {
          sc->Send(conn, ByeMsg{"done"});
        } else {
          sc->Send(conn, ErrorMsg{2, e.text});
        }
        sc->Close(conn, "job finished");
      }
    }
  };
  ControlSidecar sidecar(cb);
  sc = &sidecar;
  if (!sidecar.Connect(o.server, o.join_timeout_ms, &conn, &err)) {
    return fail(1, "cannot reach the server at " + o.server + ": " + err +
                       " (start the server first and check its control "
                       "address)");
  }
  JoinMsg join;
  join.worker_name = o.name;
  join.total_bytes = o.size_bytes;
  join.mtu = o.mtu;
  sidecar.Send(conn, join);
  SidecarThread sidecar_thread(sidecar);
  if (!PinThisThread(o.cpu, &err)) return fail(2, err);

  auto request = [&](Event e) {
    requests.Push(std::move(e));
    sidecar.Wakeup();
  };
  if (!WaitFor([&] { return welcomed.load() || server_gone.load(); },
               o.join_timeout_ms) ||
      !welcomed.load()) {
    return fail(
        1, "no WELCOME from the server at " + o.server +
               (server_gone.load()
                    ? " (" + gone_why + ")"
                    : " within " + std::to_string(o.join_timeout_ms) + " ms"));
  }
  // A WELCOME the codec accepted may still describe an impossible job.
  if (welcome.total_bytes != o.size_bytes || welcome.chunk_payload == 0 ||
      welcome.chunk_payload % 4 != 0 ||
      welcome.chunk_payload + kDataHeaderBytes + 28 > o.mtu ||
      welcome.num_workers == 0 || welcome.rank >= welcome.num_workers) {
    return fail(1, "WELCOME is invalid (" +
                       std::to_string(welcome.total_bytes) +
                       " bytes, chunk "
                       "payload " +
                       std::to_string(welcome.chunk_payload) + ", rank " +
                       std::to_string(welcome.rank) + " of " +
                       std::to_string(welcome.num_workers) +
                       "): run the same build on both sides");
  }
  const ChunkLayout layout(welcome.total_bytes, welcome.chunk_payload);
  if (layout.num_chunks() != welcome.num_chunks) {
    return fail(1,
                "WELCOME is inconsistent with our JOIN: run the same "
                "build on both sides");
  }
  const uint32_t N = layout.num_chunks();
  res.rank = welcome.rank;
  res.chunks = N;
  sockaddr_in server_data = server_ctrl;
  if (welcome.server_ipv4 != 0) {
    server_data.sin_addr.s_addr = htonl(welcome.server_ipv4);
  }
  server_data.sin_port = htons(welcome.udp_base_port);
  port.AddPeer(kServerEndpoint, server_data);

  std::vector<float> grad(o.size_bytes / sizeof(float));
  FillBenchGradient(welcome.rank, grad);
  const auto* grad_bytes = reinterpret_cast<const uint8_t*>(grad.data());
  const SendOrder order(kDefaultSendOrder, welcome.rank, welcome.num_workers,
                        o.seed);
  std::vector<uint32_t> order_buf;
  std::vector<uint32_t> seqs(o.burst);
  std::vector<Packet> pkts(o.burst);
  for (Packet& p : pkts) {
    p.src = welcome.rank + 1;
    p.dst = kServerEndpoint;
    p.bytes.reserve(kDataHeaderBytes + layout.chunk_payload());
  }
  DataHeader hdr{FrameType::kPush, welcome.session, welcome.rank, 0, 0, 0};

  std::string failure;
  Backoff backoff(o.idle_sleep_us);
  std::vector<Event> evs;
  Bitmap bitmap;
  bool have_go = false;
  uint32_t go_round = 0;
  uint64_t probes = 0, bitmaps = 0;
  for (uint64_t it = 0; it < o.iterations && failure.empty(); ++it) {
    const uint32_t round = PushRound(it);
    // State of this round, filled from control events.
    bool stop_seen = false, probe_out = false;
    uint64_t t_stop = 0, stop_received = 0;
    auto handle = [&](Event& e) {
      switch (e.kind) {
        case Event::kRoundBegin:
          have_go = true;
          go_round = e.round;
          res.p = e.p;
          break;
        case Event::kStop:
          if (e.round == round && push.round() == round && !stop_seen) {
            stop_seen = true;
            t_stop = e.t_ns;
            stop_received = e.value;
          }
          break;
        case Event::kBitmap:
          if (e.round == push.round() && e.round == round) {
            bitmap.Resize(static_cast<uint32_t>(e.value));
            if (bitmap.AssignWords(e.words) && push.OnBitmap(bitmap)) {
              probe_out = false;
              ++bitmaps;
            }
          }
          break;
        default:
          break;
      }
    };
    // Wait for the server to open our round.
    Watchdog watchdog(o.round_timeout_ms);
    while (!(have_go && go_round == round)) {
      bool any = false;
      if (events.Drain(&evs)) {
        any = true;
        for (Event& e : evs) handle(e);
      }
      if (server_gone.load(std::memory_order_acquire)) {
        failure = gone_why;
        break;
      }
      if (any) {
        backoff.Work();
        continue;
      }
      if (watchdog.Expired()) {
        failure = "the server never opened push round " +
                  std::to_string(round) + " (waited " +
                  std::to_string(o.round_timeout_ms) + " ms)";
        break;
      }
      backoff.Idle();
    }
    if (!failure.empty()) break;

    order.Fill(round, N, order_buf);
    push.Begin(round, order_buf);
    hdr.round = round;
    const uint64_t t0 = NowNs();
    watchdog.Progress();
    while (!stop_seen) {
      bool work = false;
      if (events.Drain(&evs)) {
        work = true;
        for (Event& e : evs) handle(e);
        if (stop_seen) break;
      }
      if (!push.finished()) {
        const uint32_t k = push.NextBurst(seqs.data(), o.burst);
        if (k > 0) {
          for (uint32_t i = 0; i < k; ++i) {
            hdr.seq = seqs[i];
            hdr.payload_len = static_cast<uint16_t>(layout.Length(seqs[i]));
            // No allocation: capacity was reserved for a full chunk.
            pkts[i].bytes.resize(kDataHeaderBytes + hdr.payload_len);
            BuildDataFrame(hdr, grad_bytes + layout.Offset(seqs[i]),
                           pkts[i].bytes.data());
          }
          const uint16_t sent =
              port.TxBurst(pkts.data(), static_cast<uint16_t>(k));
          push.Unsend(k - sent);  // a full socket buffer: again next turn
          work = work || sent > 0;
        }
        if (push.state() == SenderRound::State::kAwaitingBitmap && !probe_out) {
          probe_out = true;
          ++probes;
          request(Event{Event::kSendProbe, 0, round, push.passes()});
        }
      }
      if (server_gone.load(std::memory_order_acquire)) {
        failure = gone_why;
        break;
      }
      if (work) {
        backoff.Work();
        watchdog.Progress();
        continue;
      }
      if (watchdog.Expired()) {
        failure = "iteration " + std::to_string(it) + ": push round " +
                  std::to_string(round) + " made no progress for " +
                  std::to_string(o.round_timeout_ms) + " ms (" +
                  std::to_string(push.passes()) + " passes, " +
                  std::to_string(push.packets_sent()) + " packets sent, " +
                  (probe_out ? "BITMAP never came" : "no STOP") + ")";
        break;
      }
      backoff.Idle();
    }
    if (!failure.empty()) break;
    UdpRoundRecord r;
    r.iteration = it;
    r.latency_us = t_stop > t0 ? static_cast<double>(t_stop - t0) / 1e3 : 0;
    r.packets_sent = push.packets_sent();
    r.passes = push.passes();
    r.delivered_fraction = static_cast<double>(stop_received) / N;
    res.rounds.push_back(r);
    if (o.on_round) o.on_round(r);
  }

  // BYE when done, ERROR with the reason otherwise: the server must not
  // mistake a finished worker for a lost one.
  Event fin{Event::kFinish, 0, 0, failure.empty() ? 0u : 1u};
  fin.text = failure;
  request(std::move(fin));
  WaitFor([&] { return closed.load(std::memory_order_acquire); }, 1000);
  sidecar_thread.Stop();
  if (!failure.empty()) {
    res.exit_code = 1;
    res.error = failure;
  }
  res.counters = {
      {"tx_frames", port.tx_frames()},
      {"tx_eagain", port.tx_eagain()},
      {"tx_errors", port.tx_errors()},
      {"probes", probes},
      {"bitmaps", bitmaps},
  };
  return res;
}

// ---------------------------------------------------------------------------
// Bench: both in one process
// ---------------------------------------------------------------------------

UdpPushBenchResult RunUdpPushBench(const UdpPushBenchOptions& o) {
  UdpPushBenchResult res;
  if (!(o.size_mb > 0) || !std::isfinite(o.size_mb) || o.size_mb > 4096) {
    res.exit_code = 2;
    res.error = "size_mb must be in (0, 4096]";
    return res;
  }
  res.size_bytes = std::max<uint64_t>(
      4, static_cast<uint64_t>(o.size_mb * 1048576.0) / 4 * 4);
  sockaddr_in ctrl{};
  std::string err;
  // Both sides' option errors up front: a side that fails alone would
  // leave the other waiting for its join timeout.
  if (!CheckCpu(o.server_cpu, &err) || !CheckCpu(o.worker_cpu, &err)) {
    res.exit_code = 2;
    res.error = err;
    return res;
  }
  if (std::string e = CheckCommon(o.mtu, o.round_timeout_ms); !e.empty()) {
    res.exit_code = 2;
    res.error = e;
    return res;
  }
  if (o.burst == 0 || o.burst > UdpSocketPort::kMaxBurst) {
    res.exit_code = 2;
    res.error =
        "burst must be in 1.." + std::to_string(UdpSocketPort::kMaxBurst);
    return res;
  }
  if (!ParseIpv4Endpoint(o.control, true, true, "127.0.0.1:9100", &ctrl,
                         &err)) {
    res.exit_code = 2;
    res.error = "control: " + err;
    return res;
  }
  if (ctrl.sin_addr.s_addr == htonl(INADDR_ANY)) {
    ctrl.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }

  UdpPushServerOptions so;
  so.control = o.control;
  so.data = "127.0.0.1:" + std::to_string(o.udp_port);
  so.mtu = o.mtu;
  so.p = o.p;
  so.loss = o.loss;
  so.seed = o.seed;
  so.round_timeout_ms = o.round_timeout_ms;
  so.join_timeout_ms = std::min<uint32_t>(o.round_timeout_ms, 30000);
  so.cpu = o.server_cpu;
  so.idle_sleep_us = o.idle_sleep_us;
  so.on_round = o.on_server_round;
  std::promise<uint16_t> control_port;
  bool told = false;  // server thread only
  so.on_listening = [&](uint16_t c, uint16_t u) {
    told = true;
    if (o.on_server_listening) o.on_server_listening(u);
    control_port.set_value(c);
  };
  UdpPushServerResult sres;
  std::thread server([&] {
    sres = RunUdpPushServer(so);
    if (!told) control_port.set_value(0);
  });
  const uint16_t cport = control_port.get_future().get();
  UdpPushWorkerResult wres;
  if (cport != 0) {
    UdpPushWorkerOptions wo;
    ctrl.sin_port = htons(cport);
    wo.server = FormatIpv4Endpoint(ctrl);
    wo.data = "127.0.0.1:0";
    wo.size_bytes = res.size_bytes;
    wo.mtu = o.mtu;
    wo.burst = o.burst;
    wo.iterations = o.iterations;
    wo.seed = o.seed;
    wo.round_timeout_ms = o.round_timeout_ms;
    wo.join_timeout_ms = so.join_timeout_ms;
    wo.cpu = o.worker_cpu;
    wo.idle_sleep_us = o.idle_sleep_us;
    wo.name = "bench-worker";
    wo.on_round = o.on_round;
    std::thread worker([&] { wres = RunUdpPushWorker(wo); });
    worker.join();
  }
  server.join();

  res.chunks = wres.chunks ? wres.chunks : sres.chunks;
  res.rounds = wres.rounds;
  res.server_rounds = sres.rounds;
  res.exit_code = std::max(sres.exit_code, wres.exit_code);
  // Option errors (2) win over the run failures they cause on the peer.
  if (sres.exit_code == 2 || wres.exit_code == 2) res.exit_code = 2;
  if (!sres.error.empty()) res.error = "server: " + sres.error;
  // A worker that failed because the server did repeats the server's cause.
  if (!wres.error.empty() && wres.error != "server: " + sres.error) {
    res.error +=
        (res.error.empty() ? "" : "; ") + std::string("worker: ") + wres.error;
  }
  res.counters = sres.counters;
  for (const auto& [k, v] : wres.counters) res.counters[k] = v;
  return res;
}

std::string FormatUdpBenchJson(const UdpPushBenchOptions& o,
                               const UdpPushBenchResult& r) {
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      if (static_cast<unsigned char>(c) < 0x20) continue;
      q += c;
    }
    return q + "\"";
  };
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  auto counter = [&](const char* k) {
    const auto f = r.counters.find(k);
    return std::to_string(f == r.counters.end() ? 0 : f->second);
  };
  std::ostringstream s;
  s << "{\"transport\":\"kernel-udp\",\"size_bytes\":" << r.size_bytes
    << ",\"chunks\":" << r.chunks << ",\"mtu\":" << o.mtu
    << ",\"loss\":" << quote(o.loss) << ",\"p\":" << num(o.p)
    << ",\"rounds\":[";
  for (size_t i = 0; i < r.rounds.size(); ++i) {
    const UdpRoundRecord& x = r.rounds[i];
    s << (i ? "," : "") << "{\"iteration\":" << x.iteration
      << ",\"latency_us\":" << num(x.latency_us)
      << ",\"packets_sent\":" << x.packets_sent << ",\"passes\":" << x.passes
      << ",\"delivered_fraction\":" << num(x.delivered_fraction) << "}";
  }
  s << "],\"counters\":{\"rx_frames\":" << counter("rx_frames")
    << ",\"tx_frames\":" << counter("tx_frames")
    << ",\"injected_drops\":" << counter("injected_drops")
    << ",\"socket_drops\":" << counter("socket_drops")
    << ",\"tx_eagain\":" << counter("tx_eagain")
    << ",\"malformed\":" << counter("malformed") << "}";
  if (r.exit_code != 0) s << ",\"error\":" << quote(r.error);
  s << "}\n";
  return s.str();
}

}  // namespace dblp
