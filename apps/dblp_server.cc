// dblp-server [EAL options] -- [options]: the parameter server. Receives
// every worker's push under the current loss tolerance, reduces, runs the
// tolerance policy and broadcasts the mean back.
#include <gflags/gflags.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "common_flags.h"
#include "dblp/base/ipv4_endpoint.h"
#include "dblp/base/log.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "runtime/eal_app.h"
#include "runtime_flags.h"
#include "server/server_engine.h"
#include "server_flags.h"

DEFINE_string(listen, "127.0.0.1:9100", "TCP control address to listen on");
DEFINE_string(local_ip, "10.0.0.1", "the server's IPv4 on the data ports");
DEFINE_uint32(udp_port, 47000,
              "UDP port of pushes (with several lcores, lcore k's chunks "
              "on udp_port + k; worker r receives the broadcast on "
              "udp_port + 1 + r)");
DEFINE_uint32(session, 0,
              "session id (0 = derived from the job's random "
              "nonce)");
DEFINE_string(steering, "auto",
              "with several lcores (-l) on a port other than net_memif: how "
              "lcore k's chunks (UDP dst port udp_port + k) reach its RX "
              "queue k: flow (one rte_flow rule per lcore; refused: exit), "
              "rss (the port's RSS; frames on another lcore's queue are "
              "handed to it, counted frames_misrouted) or auto (flow, else "
              "rss)");
DEFINE_bool(flow_isolate, false,
            "put each port in rte_flow isolated mode, so that only the "
            "job's UDP ports reach DPDK and the kernel keeps the rest "
            "(bifurcated NICs such as mlx5; net_tap); needs flow rules");
DEFINE_string(bcast_frames, "auto",
              "how the broadcast's frames carry the mean: copy (the chunk "
              "copied into each worker's frame), shared (one chunk for "
              "every worker's frame, chained as an external buffer behind "
              "that worker's headers; for a NIC that DMAs) or auto (copy on "
              "net_memif and other software ports, which copy frames "
              "themselves; shared where the mean could be DMA-mapped)");
DEFINE_uint32(shards, 1,
              "server shards of the job: dblp-server processes that each "
              "own a partition of the gradient's chunks (1..64)");
DEFINE_uint32(shard_index, 0,
              "this server's shard, 0..shards-1; shard 0 is the job's "
              "directory, the address every worker joins");
DEFINE_string(directory, "",
              "shard 0's control address (its --listen), for a shard "
              "index > 0; it registers there");

namespace {

// The flags every server shard must share: a shard whose differ is
// refused, naming the first (ShardRegistry).
constexpr const char* kShardJobFlags[] = {
    "workers",
    // The tolerance policy's.
    "policy", "p_fixed", "p_low", "p_high", "clr_freq", "clr_eta",
    "ltp_deadline_factor", "ltp_window", "ltp_min_fraction",
    "deadline_percentile", "deadline_factor", "deadline_window",
    "deadline_min_fraction",
    // The rest of the job's.
    "frame_auth", "push_fill", "resync_every", "bcast_tolerance",
    "push_feedback", "on_bad_gradient", "clip_norm", "on_worker_loss",
    "zero_fraction", "zero_iters", "mtu", "insecure", "paper_mode",
    "max_gradient_mb"};

// Doubles in their shortest exact form ("0.008", not gflags'
// "0.0080000000000000002"): the same value gives the same text.
std::string ShardJobFlags() {
  std::string out;
  for (const char* name : kShardJobFlags) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name, &info)) continue;
    std::string value = info.current_value;
    if (info.type == "double") {
      char buf[64];
      const double d = std::strtod(value.c_str(), nullptr);
      const auto r = std::to_chars(buf, buf + sizeof buf, d);
      value.assign(buf, r.ptr);
    }
    out += std::string("--") + name + "=" + value + "\n";
  }
  return out;
}

bool IsLoopback(const std::string& endpoint) {
  return endpoint.rfind("127.", 0) == 0 || endpoint.rfind("localhost", 0) == 0;
}

// What a sharded job cannot take: a fixed --session (every shard derives
// its own, so frames of one shard never pass for another's), losing a
// worker mid-job (each shard would drop it at its own iteration), a
// loopback --listen advertised to workers on other hosts, and a control
// budget without room for the other shards' connections.
void ShardedJobFlagChecks() {
  if (FLAGS_session != 0) {
    dblp::FlagError("--session=" + std::to_string(FLAGS_session) +
                    " with --shards > 1: drop --session (each shard derives "
                    "its own from its job nonce)");
  }
  if (FLAGS_on_worker_loss != "abort") {
    dblp::FlagError("--on_worker_loss=" + FLAGS_on_worker_loss +
                    " is not supported with --shards > 1 (each shard would "
                    "drop a lost worker at its own iteration): use "
                    "--on_worker_loss=abort");
  }
  if (FLAGS_shard_index > 0 && IsLoopback(FLAGS_listen) &&
      !IsLoopback(FLAGS_directory)) {
    dblp::FlagError("--listen=" + FLAGS_listen +
                    " is a loopback address, but the directory (" +
                    FLAGS_directory +
                    ") is on another host and advertises it to the workers: "
                    "give --listen an address they can reach");
  }
  if (FLAGS_shard_index == 0 &&
      FLAGS_control_max_connections < FLAGS_workers + FLAGS_shards - 1) {
    dblp::FlagError(
        "--control_max_connections=" +
        std::to_string(FLAGS_control_max_connections) +
        " leaves no room for the job: the directory holds --workers + "
        "--shards - 1 = " +
        std::to_string(FLAGS_workers + FLAGS_shards - 1) + " connections");
  }
}

// Checked before the EAL starts: exits 2 naming the flag.
dblp::ShardRole ShardRoleFromFlags() {
  if (FLAGS_shards < 1 || FLAGS_shards > dblp::kMaxServerShards) {
    dblp::FlagError("--shards=" + std::to_string(FLAGS_shards) +
                    " is out of range: use 1.." +
                    std::to_string(dblp::kMaxServerShards));
  }
  if (FLAGS_shard_index >= FLAGS_shards) {
    dblp::FlagError("--shard_index=" + std::to_string(FLAGS_shard_index) +
                    " needs --shards above it: use 0.." +
                    std::to_string(FLAGS_shards - 1));
  }
  if (FLAGS_shard_index > 0 && FLAGS_directory.empty()) {
    dblp::FlagError("--shard_index=" + std::to_string(FLAGS_shard_index) +
                    " needs --directory=IP:PORT, the --listen of shard 0");
  }
  if (FLAGS_shard_index == 0 && !FLAGS_directory.empty()) {
    dblp::FlagError(
        "--directory is for shards 1..shards-1; shard 0 is the "
        "directory (drop --directory or set --shard_index)");
  }
  // Before the checks that compare it with --listen: a malformed
  // directory is named as such, not as "another host".
  if (FLAGS_shard_index > 0) {
    sockaddr_in sa{};
    std::string err;
    if (!dblp::ParseIpv4Endpoint(FLAGS_directory, false, false, "10.0.0.1:9100",
                                 &sa, &err)) {
      dblp::FlagError("--directory=" + FLAGS_directory + ": " + err);
    }
  }
  if (FLAGS_shards > 1) ShardedJobFlagChecks();
  dblp::ShardRole role;
  role.index = static_cast<uint16_t>(FLAGS_shard_index);
  role.count = static_cast<uint16_t>(FLAGS_shards);
  role.directory = FLAGS_shard_index > 0 ? FLAGS_directory : FLAGS_listen;
  return role;
}

}  // namespace

int main(int argc, char** argv) {
  dblp::ParseAppFlagsOrDie(
      argc, argv,
      "dblp-server [EAL options] -- [options]\n"
      "  e.g. dblp-server -l 0 --no-huge -m 512 --no-pci --file-prefix=srv "
      "--vdev=net_memif0,role=server,socket=/tmp/dblp-w0.sock -- "
      "--workers=1 --policy=dblp");

  dblp::ServerOptions o;
  o.shard_role = ShardRoleFromFlags();
  o.listen = FLAGS_listen;
  o.workers = FLAGS_workers;
  o.local_ip = FLAGS_local_ip;
  // In 64 bits: a port near 2^32 must not wrap past the check.
  if (FLAGS_udp_port == 0 ||
      uint64_t{FLAGS_udp_port} + 1 + FLAGS_workers > 65535) {
    dblp::FlagError("--udp_port=" + std::to_string(FLAGS_udp_port) +
                    " must leave room for one port per worker (--workers=" +
                    std::to_string(FLAGS_workers) + "): use 1.." +
                    std::to_string(65534 - FLAGS_workers));
  }
  o.udp_port = static_cast<uint16_t>(FLAGS_udp_port);
  if (!dblp::ParseSteeringMode(FLAGS_steering, &o.steering.mode)) {
    dblp::FlagError("--steering=" + FLAGS_steering +
                    " is not a steering mode: use auto, flow or rss");
  }
  if (FLAGS_flow_isolate && o.steering.mode == dblp::SteeringMode::kRss) {
    dblp::FlagError(
        "--flow_isolate needs flow rules, --steering=rss installs none: use "
        "--steering=flow or auto with it");
  }
  o.steering.isolate = FLAGS_flow_isolate;
  if (!dblp::ParseBcastFrameMode(FLAGS_bcast_frames, &o.bcast_frames_auto,
                                 &o.bcast_frames)) {
    dblp::FlagError("--bcast_frames=" + FLAGS_bcast_frames +
                    ": use auto, copy or shared");
  }
  // First: --paper_mode rewrites --send_order, which the datapath reads.
  static_cast<dblp::ServerJobSettings&>(o) = dblp::JobSettingsFromFlags();
  o.dp = dblp::DatapathOptionsFromFlags();
  // After --paper_mode rewrote the flags it implies: the values the job
  // runs with are the ones every shard must share.
  o.shard_job_flags = ShardJobFlags();
  o.session = FLAGS_session;
  o.max_gradient_bytes = dblp::MaxGradientBytesFromFlags();
  o.rank_by_name = dblp::RankByNameFromFlags();
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.control_limits = dblp::ControlLimitsFromFlags();
  o.secret = dblp::JobSecretFromFlags("dblp-server");
  o.frame_auth = dblp::FrameAuthFromFlags(o.secret);
  // The prompt's command file is checked before the EAL starts.
  const dblp::PromptOptions prompt = dblp::PromptOptionsFromFlags(
      "dblp-server", &o.policy, &o.dp.stats_period_s);
  dblp::InitEalOrDie(argc, argv);
  auto runtime_session = std::make_unique<dblp::RuntimeSession>(prompt);
  int rc = 1;
  try {
    rc = dblp::RunServer(o);
  } catch (const std::exception& e) {
    // Setup steps outside the datapath that throw (libcrypto, the random
    // number generator): a message and exit 1, never std::terminate.
    DBLP_LOG(Error, "error: %s", e.what());
  }
  runtime_session.reset();  // the prompt ends, capture stops
  // No rte_eal_cleanup(): it unmaps the EAL's memory under a still-running
  // interrupt thread (eal_cleanup.h, "Why not rte_eal_cleanup"); exit
  // reclaims it, and the atexit handler removes the files.
  return rc;
}
