#include "server_control.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <variant>

#include "dblp/round_control.h"
#include "eal_app.h"

namespace dblp {

ServerControl::ServerControl(const ServerJoinConfig& join,
                             std::vector<const DatapathCounters*> ctr,
                             double stats_period_s)
    : cfg_(join),
      sidecar_(MakeCallbacks(std::move(ctr), stats_period_s)),
      alive_(new std::atomic<bool>[join.workers]) {
  for (uint32_t w = 0; w < join.workers; ++w) alive_[w].store(true);
}

ServerControl::~ServerControl() { Stop(); }

ControlSidecar::Callbacks ServerControl::MakeCallbacks(
    std::vector<const DatapathCounters*> ctr, double stats_period_s) {
  ControlSidecar::Callbacks cb;
  cb.on_message = [this](ConnId c, const ControlMessage& m) {
    OnMessage(c, m);
  };
  cb.on_close = [this](ConnId c, const std::string& r) { OnClose(c, r); };
  cb.on_wakeup = [this] { SendRequests(); };
  if (stats_period_s > 0) {
    cb.tick_ms = static_cast<uint32_t>(stats_period_s * 1000);
    cb.on_tick = [this, ctr, stats_period_s, last_rx = uint64_t{0},
                  last_tx = uint64_t{0}]() mutable {
      if (!attached_.load()) return;
      uint64_t rx = 0, tx = 0;
      for (const DatapathCounters* c : ctr) {
        rx += c->rx_frames.load(std::memory_order_relaxed);
        tx += c->tx_frames.load(std::memory_order_relaxed);
      }
      std::printf("[server] iter %llu  rx %.0f pps  tx %.0f pps  p=%.3f%s\n",
                  static_cast<unsigned long long>(iteration_.load()),
                  static_cast<double>(rx - last_rx) / stats_period_s,
                  static_cast<double>(tx - last_tx) / stats_period_s,
                  p_.load(), critical_.load() ? " (critical)" : "");
      std::fflush(stdout);
      last_rx = rx;
      last_tx = tx;
    };
  }
  return cb;
}

int ServerControl::RankOf(ConnId c) const {
  for (size_t w = 0; w < links_.size(); ++w) {
    if (links_[w].conn == c) return static_cast<int>(w);
  }
  return -1;
}

void ServerControl::Refuse(ConnId c, const std::string& why) {
  sidecar_.Send(c, ErrorMsg{1, why});
  sidecar_.Close(c, why);
}

void ServerControl::OnJoin(ConnId c, const JoinMsg& j) {
  std::lock_guard<std::mutex> lock(mu_);
  if (joined_.load()) return Refuse(c, "job already has all workers");
  if (j.protocol_version != kControlVersion) {
    return Refuse(c, "control protocol version " +
                         std::to_string(j.protocol_version) + " != server's " +
                         std::to_string(kControlVersion) +
                         ": run the same DBLP build everywhere");
  }
  if (j.total_bytes == 0 || j.total_bytes % 4 != 0) {
    return Refuse(c, "gradient size must be a positive multiple of 4");
  }
  if (j.total_bytes > cfg_.max_gradient_bytes) {
    return Refuse(c, "gradient of " + std::to_string(j.total_bytes) +
                         " bytes is above the server's limit of " +
                         std::to_string(cfg_.max_gradient_bytes) +
                         ": lower --floats or raise the server's "
                         "--max_gradient_mb");
  }
  if (RankOf(c) >= 0) return Refuse(c, "JOIN sent twice");
  if (j.mtu != cfg_.mtu) {
    return Refuse(c, "worker MTU " + std::to_string(j.mtu) +
                         " != server MTU " + std::to_string(cfg_.mtu) +
                         ": pass the same --mtu to every app");
  }
  if (links_.empty()) {
    first_join_ = j;
  } else if (j.total_bytes != first_join_.total_bytes ||
             j.layers != first_join_.layers) {
    return Refuse(c, "gradient layout differs from the first worker's: "
                     "every worker must run the same model (--floats / "
                     "--model)");
  }
  links_.push_back(Link{c, j.worker_name, ""});
  if (links_.size() == cfg_.workers) Welcome();
}

// Every worker joined: each gets its rank and the job's layout.
void ServerControl::Welcome() {
  const uint32_t payload = ChunkPayloadForMtu(cfg_.mtu);
  const ChunkLayout layout(first_join_.total_bytes, payload);
  for (uint32_t w = 0; w < cfg_.workers; ++w) {
    WelcomeMsg wm;
    wm.session = cfg_.session;
    wm.rank = static_cast<uint16_t>(w);
    wm.num_workers = static_cast<uint16_t>(cfg_.workers);
    wm.mtu = cfg_.mtu;
    wm.chunk_payload = payload;
    wm.num_chunks = layout.num_chunks();
    wm.total_bytes = layout.total_bytes();
    wm.udp_base_port = cfg_.udp_port;
    wm.num_shards = cfg_.shards;
    wm.server_ipv4 = cfg_.local_ip;
    std::memcpy(wm.server_mac.data(), cfg_.mac.addr_bytes, 6);
    wm.policy = cfg_.policy;
    wm.layers = first_join_.layers;
    sidecar_.Send(links_[w].conn, wm);
  }
  joined_.store(true, std::memory_order_release);
}

void ServerControl::OnMessage(ConnId c, const ControlMessage& m) {
  if (const auto* j = std::get_if<JoinMsg>(&m)) return OnJoin(c, *j);
  if (!attached_.load(std::memory_order_acquire)) return;
  const int w = RankOf(c);
  if (w < 0) return;
  // A PROBE or BITMAP goes to the side of the shard it names, STOP to every
  // shard's broadcast side.
  if (DeliverToSides(m, bcast_[w], push_[w], NowNs())) return;
  if (const auto* err = std::get_if<ErrorMsg>(&m)) {
    // The worker failed; its connection closes next (PeerGoneEvent).
    std::lock_guard<std::mutex> lock(mu_);
    links_[w].error = err->text;
  } else if (std::holds_alternative<ByeMsg>(m)) {
    events_.Push(PeerByeEvent{static_cast<uint16_t>(w)});
  }
}

void ServerControl::OnClose(ConnId c, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  const int w = RankOf(c);
  if (w < 0) return;
  if (!joined_.load()) {
    // A worker that left during the join: free its slot.
    links_.erase(links_.begin() + w);
    std::fprintf(stderr, "dblp-server: a worker left before the job "
                         "started (%s)\n", reason.c_str());
    return;
  }
  events_.Push(PeerGoneEvent{static_cast<uint16_t>(w)});
  std::fprintf(stderr, "dblp-server: control connection of worker %d "
                       "closed: %s\n", w, reason.c_str());
}

std::string ServerControl::worker_error(uint32_t w) {
  std::lock_guard<std::mutex> lock(mu_);
  return links_[w].error;
}

void ServerControl::Announce(const RoundBeginRequest& r) {
  const RoundBeginMsg rb{r.round, r.round / 2, r.direction, r.p,
                         r.deadline_ns, r.min_fraction};
  std::string why;
  if (ValidateControl(rb, &why) != ControlError::kNone) {
    // A policy value the wire cannot carry: a bug, not a hang.
    failure_ = "cannot announce round " + std::to_string(r.round) + ": " + why;
    failed_.store(true, std::memory_order_release);
    return;
  }
  for (uint32_t w = 0; w < links_.size(); ++w) {
    if (alive_[w].load()) sidecar_.Send(links_[w].conn, rb);
  }
}

void ServerControl::SendRequests() {
  ControlRequest r;
  while (requests_.Pop(&r)) {
    if (const auto* rb = std::get_if<RoundBeginRequest>(&r)) {
      Announce(*rb);
      continue;
    }
    const uint16_t peer = std::visit(
        Overloaded{[](const RoundBeginRequest&) -> uint16_t { return 0; },
                   [](const FinishRequest&) -> uint16_t { return 0; },
                   [](const auto& q) -> uint16_t { return q.peer; }},
        r);
    if (peer >= links_.size()) continue;
    ReceiveSide* answering = nullptr;
    if (const auto* b = std::get_if<BitmapRequest>(&r)) {
      if (b->side >= push_[peer].size()) continue;
      answering = push_[peer][b->side];
    }
    for (const ControlMessage& m : SideRequestMessages(r, answering)) {
      sidecar_.Send(links_[peer].conn, m);
    }
  }
}

const JoinMsg& ServerControl::AdmitWorkers(const std::string& listen,
                                           uint32_t timeout_ms,
                                           const std::atomic<bool>& quit,
                                           bool realtime) {
  std::string err;
  if (!sidecar_.Listen(listen, &err)) {
    Die("cannot listen on " + listen + ": " + err,
        "pick a free --listen=IP:PORT");
  }
  std::printf("dblp-server: %u port(s), waiting for %u workers on %s "
              "(session %08x, policy %s)\n",
              cfg_.ports, cfg_.workers, listen.c_str(), cfg_.session,
              cfg_.policy.c_str());
  std::fflush(stdout);
  thread_ = std::make_unique<SidecarThread>(sidecar_);
  SetControlPriorities(*thread_, "dblp-server", realtime);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(timeout_ms);
  while (!joined_.load(std::memory_order_acquire)) {
    if (quit.load() || std::chrono::steady_clock::now() > deadline) {
      size_t have;
      {
        std::lock_guard<std::mutex> lock(mu_);
        have = links_.size();
      }
      Stop();
      Die("only " + std::to_string(have) + " of " +
              std::to_string(cfg_.workers) + " workers joined",
          "start all workers with --server=" + listen + " or lower --workers");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return first_join_;
}

void ServerControl::Attach(std::vector<std::vector<ReceiveSide*>> push,
                           std::vector<std::vector<SendSide*>> bcast) {
  push_ = std::move(push);
  bcast_ = std::move(bcast);
  attached_.store(true, std::memory_order_release);
}

}  // namespace dblp
