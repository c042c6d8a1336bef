#include "udp/udp_push.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/obs/run_report.h"
#include "dblp/transport/udp_transport.h"
#include "dblp/wire/chunking.h"
#include "udp/udp_common.h"

namespace dblp {
namespace {

using udp::CheckCommon;
using udp::CheckCpu;

// The bench worker's gradient: FillBenchGradient of its rank, filled once
// (the push measures the transport, not a computation) and sent straight
// from here.
class BenchSource final : public GradientSource {
 public:
  explicit BenchSource(uint64_t floats) : grad_(floats) {}
  std::vector<LayerInfo> Layers() const override { return {}; }
  uint64_t floats() const override { return grad_.size(); }
  void Bind(uint32_t rank, uint32_t) override {
    FillBenchGradient(rank, grad_);
  }
  void Compute(uint64_t, std::span<float>) override {}
  void Apply(uint64_t, std::span<const float>) override {}
  std::string Describe() const override { return "bench"; }
  std::span<float> SharedGradient() override { return grad_; }

 private:
  std::vector<float> grad_;
};

UdpJobServerOptions JobOptions(const UdpPushServerOptions& o) {
  UdpJobServerOptions j;
  j.secret = o.secret;
  j.frame_auth = o.frame_auth;
  j.control = o.control;
  j.data = o.data;
  j.workers = o.workers;
  j.mtu = o.mtu;
  j.policy.kind = PolicyKind::kFixed;
  j.policy.p_fixed = o.p;
  j.push_only = true;
  j.loss = o.loss;
  j.seed = o.seed;
  j.round_timeout_ms = o.round_timeout_ms;
  j.join_timeout_ms = o.join_timeout_ms;
  j.max_gradient_bytes = o.max_gradient_bytes;
  j.cpu = o.cpu;
  j.idle_sleep_us = o.idle_sleep_us;
  j.on_listening = o.on_listening;
  if (o.on_round) {
    j.on_reduced = [f = o.on_round](uint64_t it, std::span<const float> mean,
                                    std::span<const Bitmap> arrived) {
      f(UdpServerRoundView{it, mean, arrived});
    };
  }
  j.quiet = o.quiet;
  j.out_dir = o.out_dir;
  return j;
}

UdpJobWorkerOptions JobOptions(const UdpPushWorkerOptions& o) {
  UdpJobWorkerOptions j;
  j.secret = o.secret;
  j.server = o.server;
  j.data = o.data;
  j.mtu = o.mtu;
  j.burst = o.burst;
  j.iterations = o.iterations;
  j.seed = o.seed;
  // The bench's push is a fixed synthetic gradient: ranking it each round
  // would measure the sort, not the push (the apps' own default ranks).
  j.send_order = SendOrderKind::kPermuted;
  j.push_only = true;
  j.round_timeout_ms = o.round_timeout_ms;
  j.join_timeout_ms = o.join_timeout_ms;
  j.cpu = o.cpu;
  j.idle_sleep_us = o.idle_sleep_us;
  j.name = o.name;
  j.out_dir = o.out_dir;
  return j;
}

UdpRoundRecord PushRecord(const IterationRecord& row) {
  return UdpRoundRecord{row.iteration, row.send_latency_us, row.packets_sent,
                        row.passes, row.delivered_fraction};
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

UdpPushServerResult RunUdpPushServer(const UdpPushServerOptions& o) {
  if (!(o.p >= 0 && o.p < 1)) {
    UdpPushServerResult r;
    return udp::Failed(&r, 2,
                       "p=" + std::to_string(o.p) + " must be in [0, 1)");
  }
  return RunUdpJobServer(JobOptions(o));
}

UdpPushWorkerResult RunUdpPushWorker(const UdpPushWorkerOptions& o) {
  UdpPushWorkerResult res;
  if (o.size_bytes == 0 || o.size_bytes % 4 != 0) {
    return udp::Failed(&res, 2,
                       "gradient size " + std::to_string(o.size_bytes) +
                           " bytes must be a positive multiple of 4");
  }
  BenchSource source(o.size_bytes / sizeof(float));
  UdpJobWorkerOptions j = JobOptions(o);
  j.on_iteration = [&](const IterationRecord& row) {
    if (o.on_round) o.on_round(PushRecord(row));
  };
  const UdpJobWorkerResult r = RunUdpJobWorker(j, source);
  res.exit_code = r.exit_code;
  res.error = r.error;
  res.rank = r.rank;
  res.chunks = r.chunks;
  res.p = r.p;
  for (const IterationRecord& row : r.rows) {
    res.rounds.push_back(PushRecord(row));
  }
  res.counters = r.counters;
  return res;
}

// ---------------------------------------------------------------------------
// Bench: both in one process
// ---------------------------------------------------------------------------

namespace {

// Both sides' option errors up front (a side that fails alone would leave
// the other waiting for its join timeout): "" or why not; *ctrl is the
// server's control address to connect to.
std::string CheckBenchOptions(const UdpPushBenchOptions& o, sockaddr_in* ctrl) {
  if (!(o.size_mb > 0) || !std::isfinite(o.size_mb) || o.size_mb > 4096) {
    return "size_mb must be in (0, 4096]";
  }
  std::string err;
  if (!CheckCpu(o.server_cpu, &err) || !CheckCpu(o.worker_cpu, &err)) {
    return err;
  }
  if (std::string e = CheckCommon(o.mtu, o.round_timeout_ms); !e.empty()) {
    return e;
  }
  if (o.burst == 0 || o.burst > UdpSocketPort::kMaxBurst) {
    return "burst must be in 1.." + std::to_string(UdpSocketPort::kMaxBurst);
  }
  if (!ParseIpv4Endpoint(o.control, true, true, "127.0.0.1:9100", ctrl, &err)) {
    return "--control: " + err;
  }
  if (ctrl->sin_addr.s_addr == htonl(INADDR_ANY)) {
    ctrl->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  // Both sides' directories, like the other option errors (each side
  // opens its own again when it starts).
  for (const char* side : {"/server", "/worker"}) {
    RowStream probe;
    if (!o.out_dir.empty() && !probe.Open(o.out_dir + side, &err)) return err;
  }
  return "";
}

}  // namespace

UdpPushBenchResult RunUdpPushBench(const UdpPushBenchOptions& o) {
  UdpPushBenchResult res;
  sockaddr_in ctrl{};
  if (std::string e = CheckBenchOptions(o, &ctrl); !e.empty()) {
    res.exit_code = 2;
    res.error = e;
    return res;
  }
  res.size_bytes = std::max<uint64_t>(
      4, static_cast<uint64_t>(o.size_mb * 1048576.0) / 4 * 4);

  UdpPushServerOptions so;
  so.secret = o.secret;
  if (so.secret.insecure() && o.frame_auth != FrameAuthMode::kNone) {
    const AuthBytes key = RandomAuthBytes();
    so.secret = JobSecret::FromBytes(key);
  }
  so.frame_auth = o.frame_auth;
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
  if (!o.out_dir.empty()) so.out_dir = o.out_dir + "/server";
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
    wo.secret = so.secret;
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
    if (!o.out_dir.empty()) wo.out_dir = o.out_dir + "/worker";
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
  const bool repeats = !sres.error.empty() &&
                       wres.error.size() > sres.error.size() &&
                       wres.error.ends_with(": " + sres.error);
  if (!wres.error.empty() && !repeats) {
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
  // These first, always (readers index them), then every other counter
  // the run kept, by name: each drop reason of the receive side included.
  const std::vector<std::string> first = {"rx_frames",      "tx_frames",
                                          "injected_drops", "socket_drops",
                                          "tx_eagain",      "push_malformed"};
  s << "],\"counters\":{";
  for (size_t i = 0; i < first.size(); ++i) {
    s << (i ? "," : "") << quote(first[i]) << ":" << counter(first[i].c_str());
  }
  for (const auto& [k, v] : r.counters) {
    if (std::find(first.begin(), first.end(), k) == first.end()) {
      s << "," << quote(k) << ":" << v;
    }
  }
  s << "}";
  if (r.exit_code != 0) s << ",\"error\":" << quote(r.error);
  s << "}\n";
  return s.str();
}

}  // namespace dblp
