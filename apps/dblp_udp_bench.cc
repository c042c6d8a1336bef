// dblp-udp-bench: the DBLP push direction over kernel UDP sockets, the
// comparison point for the DPDK apps. By default one server and one worker
// run in this process over 127.0.0.1, each datapath on its own CPU; with
// --role=server / --role=worker the two halves run as separate processes.
//
// Exit codes: 0 done, 1 a run failure (e.g. a round without progress for
// --round_timeout_ms), 2 bad flags.
#include <gflags/gflags.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "dblp/emul/loss_model.h"
#include "dblp/wire/chunking.h"
#include "flag_checks.h"
#include "udp/udp_push.h"

DEFINE_string(role, "both",
              "both (server + worker in this process) | "
              "server | worker");
DEFINE_double(size_mb, 1,
              "gradient size in MiB (rounded down to whole "
              "float32 values)");
DEFINE_uint32(iterations, 10, "push rounds to run");
DEFINE_string(loss, "none",
              "software loss at the server's receive side: "
              "none | bernoulli:P | ge:P_GB,P_BG,LOSS_GOOD,LOSS_BAD");
DEFINE_double(p, 0,
              "loss tolerance: a round stops once (1 - p) of the "
              "chunks arrived (0: every chunk is needed)");
DEFINE_uint32(mtu, 1500, "IP MTU of the data frames (576..9216)");
DEFINE_uint32(burst, 32, "frames per sendmmsg() (1..128)");
DEFINE_uint64(seed, 1, "seed of the loss injector and the send order");
DEFINE_int32(server_cpu, 0, "CPU of the server's datapath thread (-1: none)");
DEFINE_int32(worker_cpu, 1, "CPU of the worker's datapath thread (-1: none)");
DEFINE_string(control, "127.0.0.1:0",
              "TCP control: the server listens here "
              "(port 0 = ephemeral, both only); a worker connects here");
DEFINE_uint32(udp_port, 0, "the server's UDP port (0 = ephemeral)");
DEFINE_string(data, "",
              "UDP bind ip:port for --role=server|worker "
              "(default: 0.0.0.0:--udp_port for the server, 0.0.0.0:0 for "
              "the worker)");
DEFINE_uint32(round_timeout_ms, 30000,
              "fail (exit 1) when a round makes no "
              "progress for this long");
DEFINE_uint32(idle_sleep_us, 20,
              "idle back-off sleep of the datapath "
              "threads in us (0 = busy polling with yield)");
DEFINE_string(secret_file, "",
              "the job secret (a 0600 file of 16..4096 "
              "bytes), the same for the server and the worker; role=both "
              "makes a random one when none is given");
DEFINE_bool(insecure, false,
            "server/worker: no job secret (joins and "
            "frames unauthenticated)");
DEFINE_string(frame_auth, "full",
              "tag on every data frame: header | "
              "full | none (see dblp-server --help)");
DEFINE_string(out, "", "write the JSON report here (at exit)");
DEFINE_string(out_dir, "",
              "stream iterations.jsonl/.csv here, one row per round as it "
              "ends (a killed run keeps its rows), and summary.json with "
              "every counter at exit; --role=both writes server/ and "
              "worker/ under it");

namespace {

using dblp::FlagError;

void CheckFlags() {
  if (FLAGS_role != "both" && FLAGS_role != "server" &&
      FLAGS_role != "worker") {
    FlagError("--role=" + FLAGS_role + ": use both, server or worker");
  }
  if (!(FLAGS_size_mb > 0) || !std::isfinite(FLAGS_size_mb) ||
      FLAGS_size_mb > 4096) {
    FlagError("--size_mb must be in (0, 4096], e.g. --size_mb=25");
  }
  if (FLAGS_iterations == 0) FlagError("--iterations must be >= 1");
  try {
    dblp::ParseLossSpec(FLAGS_loss);
  } catch (const std::exception& e) {
    FlagError(std::string("--loss=") + FLAGS_loss + ": " + e.what());
  }
  if (!(FLAGS_p >= 0 && FLAGS_p < 1)) {
    FlagError("--p must be in [0, 1), e.g. --p=0.02");
  }
  if (FLAGS_mtu < dblp::kMinMtu || FLAGS_mtu > dblp::kMaxMtu) {
    FlagError("--mtu=" + std::to_string(FLAGS_mtu) + " is outside " +
              std::to_string(dblp::kMinMtu) + ".." +
              std::to_string(dblp::kMaxMtu) + ", e.g. --mtu=1500");
  }
  if (FLAGS_burst == 0 || FLAGS_burst > 128) {
    FlagError("--burst must be in 1..128, e.g. --burst=32");
  }
  if (FLAGS_udp_port > 65535) FlagError("--udp_port must be <= 65535");
  if (FLAGS_round_timeout_ms == 0) {
    FlagError("--round_timeout_ms must be > 0, e.g. 30000");
  }
  if (FLAGS_server_cpu < -1 || FLAGS_worker_cpu < -1) {
    FlagError("--server_cpu/--worker_cpu: a CPU number, or -1 for none");
  }
}

void PrintRound(const dblp::UdpRoundRecord& r) {
  std::printf(
      "iteration %4llu  latency %10.1f us  packets %8llu  passes %2u"
      "  delivered %.4f\n",
      static_cast<unsigned long long>(r.iteration), r.latency_us,
      static_cast<unsigned long long>(r.packets_sent), r.passes,
      r.delivered_fraction);
  std::fflush(stdout);
}

// Opened before the run, so a path that cannot be written fails at once,
// not after the whole run.
std::ofstream g_out;

int Finish(const dblp::UdpPushBenchOptions& o,
           const dblp::UdpPushBenchResult& r) {
  auto c = [&](const char* k) {
    const auto f = r.counters.find(k);
    return static_cast<unsigned long long>(f == r.counters.end() ? 0
                                                                 : f->second);
  };
  if (!r.rounds.empty()) {
    double sum = 0;
    for (const auto& x : r.rounds) sum += x.latency_us;
    const double mean_us = sum / static_cast<double>(r.rounds.size());
    std::printf(
        "kernel-udp: %llu bytes, %u chunks, mean latency %.1f us "
        "(%.2f Gb/s goodput); rx %llu tx %llu injected drops %llu "
        "socket drops %llu tx eagain %llu\n",
        static_cast<unsigned long long>(r.size_bytes), r.chunks, mean_us,
        mean_us > 0 ? static_cast<double>(r.size_bytes) * 8 / (mean_us * 1e3)
                    : 0,
        c("rx_frames"), c("tx_frames"), c("injected_drops"), c("socket_drops"),
        c("tx_eagain"));
  }
  // Every reason a frame was turned away, not only the totals above.
  std::string nonzero;
  for (const auto& [k, v] : r.counters) {
    if (v != 0) nonzero += " " + k + "=" + std::to_string(v);
  }
  if (!nonzero.empty()) std::printf("  counters:%s\n", nonzero.c_str());
  if (!FLAGS_out.empty()) {
    std::ofstream& f = g_out;
    f << dblp::FormatUdpBenchJson(o, r);
    f.flush();
    if (!f.good()) {
      DBLP_LOG(Error,
                   "error: cannot write --out=%s: check the "
                   "directory exists and is writable",
                   FLAGS_out.c_str());
      return r.exit_code ? r.exit_code : 1;
    }
  }
  if (r.exit_code != 0) {
    DBLP_LOG(Error, "dblp-udp-bench: %s", r.error.c_str());
  }
  return r.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "DBLP push rounds over kernel UDP sockets (no DPDK).\n"
      "  dblp-udp-bench --size_mb=25 --iterations=5 [--loss=bernoulli:0.01 "
      "--p=0.02] [--out=run.json]");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    FlagError(std::string("unexpected argument ") + argv[1] +
              " (flags are --name=value)");
  }
  dblp::CheckFlagsOrDie();
  CheckFlags();
  if (!FLAGS_out.empty()) {
    g_out.open(FLAGS_out);
    if (!g_out) {
      FlagError("cannot write --out=" + FLAGS_out +
                ": check the directory exists and is writable");
    }
  }

  dblp::UdpPushBenchOptions o;
  if (!dblp::ParseFrameAuthMode(FLAGS_frame_auth, &o.frame_auth)) {
    FlagError("--frame_auth=" + FLAGS_frame_auth +
              ": use header, full or none");
  }
  if (!FLAGS_secret_file.empty() && FLAGS_insecure) {
    FlagError("--secret_file and --insecure: choose one");
  }
  if (!FLAGS_secret_file.empty()) {
    std::string err;
    std::optional<dblp::JobSecret> s =
        dblp::JobSecret::Load(FLAGS_secret_file, &err);
    if (!s) FlagError("--secret_file: " + err);
    o.secret = *std::move(s);
  } else if (FLAGS_role != "both" && !FLAGS_insecure) {
    FlagError("role=" + FLAGS_role +
              " needs --secret_file=FILE (head -c 32 /dev/urandom > FILE "
              "&& chmod 600 FILE; the same on both sides) or --insecure");
  }
  if (FLAGS_insecure && FLAGS_role != "both") {
    if (!gflags::GetCommandLineFlagInfoOrDie("frame_auth").is_default &&
        o.frame_auth != dblp::FrameAuthMode::kNone) {
      FlagError("--frame_auth needs --secret_file, not --insecure");
    }
    o.frame_auth = dblp::FrameAuthMode::kNone;
  }
  o.size_mb = FLAGS_size_mb;
  o.iterations = FLAGS_iterations;
  o.loss = FLAGS_loss;
  o.p = FLAGS_p;
  o.mtu = FLAGS_mtu;
  o.burst = FLAGS_burst;
  o.seed = FLAGS_seed;
  o.server_cpu = FLAGS_server_cpu;
  o.worker_cpu = FLAGS_worker_cpu;
  o.control = FLAGS_control;
  o.udp_port = static_cast<uint16_t>(FLAGS_udp_port);
  o.round_timeout_ms = FLAGS_round_timeout_ms;
  o.idle_sleep_us = FLAGS_idle_sleep_us;
  o.on_round = PrintRound;
  o.out_dir = FLAGS_out_dir;

  if (FLAGS_role == "both") return Finish(o, dblp::RunUdpPushBench(o));

  dblp::UdpPushBenchResult r;
  if (FLAGS_role == "server") {
    dblp::UdpPushServerOptions so;
    so.secret = o.secret;
    so.frame_auth = o.frame_auth;
    so.control = FLAGS_control;
    so.data = FLAGS_data.empty() ? "0.0.0.0:" + std::to_string(FLAGS_udp_port)
                                 : FLAGS_data;
    so.mtu = o.mtu;
    so.p = o.p;
    so.loss = o.loss;
    so.seed = o.seed;
    so.round_timeout_ms = o.round_timeout_ms;
    so.join_timeout_ms = o.round_timeout_ms;
    so.cpu = o.server_cpu;
    so.idle_sleep_us = o.idle_sleep_us;
    so.quiet = false;
    so.out_dir = FLAGS_out_dir;
    so.on_round = [](const dblp::UdpServerRoundView& v) {
      std::printf("iteration %4llu  closed\n",
                  static_cast<unsigned long long>(v.iteration));
      std::fflush(stdout);
    };
    const dblp::UdpPushServerResult s = dblp::RunUdpPushServer(so);
    r.exit_code = s.exit_code;
    r.error = s.error;
    r.chunks = s.chunks;
    r.server_rounds = s.rounds;
    r.counters = s.counters;
  } else {
    dblp::UdpPushWorkerOptions wo;
    wo.secret = o.secret;
    wo.server = FLAGS_control;
    wo.data = FLAGS_data.empty() ? "0.0.0.0:0" : FLAGS_data;
    wo.size_bytes = std::max<uint64_t>(
        4, static_cast<uint64_t>(FLAGS_size_mb * 1048576.0) / 4 * 4);
    wo.mtu = o.mtu;
    wo.burst = o.burst;
    wo.iterations = o.iterations;
    wo.seed = o.seed;
    wo.round_timeout_ms = o.round_timeout_ms;
    wo.join_timeout_ms = o.round_timeout_ms;
    wo.cpu = o.worker_cpu;
    wo.idle_sleep_us = o.idle_sleep_us;
    wo.on_round = PrintRound;
    wo.out_dir = FLAGS_out_dir;
    const dblp::UdpPushWorkerResult w = dblp::RunUdpPushWorker(wo);
    r.exit_code = w.exit_code;
    r.error = w.error;
    r.size_bytes = wo.size_bytes;
    r.chunks = w.chunks;
    r.rounds = w.rounds;
    r.counters = w.counters;
    // The server decides p and injects loss: report the p it announced
    // (the loss spec is the server's and unknown here).
    o.p = w.p;
    o.loss = "server-side";
  }
  return Finish(o, r);
}
