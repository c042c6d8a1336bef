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
#include "shard_flags.h"

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

namespace {

// dblp-server's own check of a sharded job: a fixed --session (every
// shard derives its own, so frames of one shard never pass for another's).
void CheckSessionForShards() {
  if (FLAGS_shards > 1 && FLAGS_session != 0) {
    dblp::FlagError("--session=" + std::to_string(FLAGS_session) +
                    " with --shards > 1: drop --session (each shard derives "
                    "its own from its job nonce)");
  }
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
  CheckSessionForShards();
  o.shard_role = dblp::ShardRoleFromFlags(FLAGS_listen, "listen");
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
  o.shard_job_flags = dblp::ShardJobFlags();
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
