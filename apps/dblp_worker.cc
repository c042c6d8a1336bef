// dblp-worker [EAL options] -- [options]: pushes its gradient to
// dblp-server each iteration and receives the mean, over DBLP.
#include <gflags/gflags.h>

#include "common_flags.h"
#include "dblp/gradient_source.h"
#include "eal_app.h"
#include "worker_engine.h"

DEFINE_string(server, "127.0.0.1:9100", "dblp-server's control address");
DEFINE_string(name, "", "worker name shown by the server (default: host:pid)");
DEFINE_string(local_ip, "", "this worker's IPv4 (default 10.0.0.<2+rank>)");
DEFINE_string(eth_peer, "", "MAC to send data frames to (default: the "
              "server's, from WELCOME)");
DEFINE_uint32(iterations, 100, "training iterations");
DEFINE_string(gradient, "synthetic", "synthetic | integer (exact test "
              "values)");
DEFINE_uint64(floats, 262144, "gradient size in float32 values (e.g. "
              "25557032 for ResNet-50)");
DEFINE_string(norm_jumps, "", "synthetic: iterations where the gradient "
              "norm jumps (phase changes for the CLR detector)");
DEFINE_uint32(jump_length, 10, "synthetic: iterations a norm jump lasts");
DEFINE_string(bcast_fill, "zero", "fill of chunks missing from the "
              "broadcast: zero | prev");
DEFINE_uint32(join_timeout_ms, 30000, "give up joining after this long");
DEFINE_uint32(hostile_per_round, 0, "test hook: stale and malformed frames "
              "sent at the server each round");

int main(int argc, char** argv) {
  dblp::ParseAppFlagsOrDie(argc, argv,
      "dblp-worker [EAL options] -- [options]\n"
      "  e.g. dblp-worker -l 1 --no-huge -m 256 --no-pci --file-prefix=w0 "
      "--vdev=net_memif0,role=client,socket=/tmp/dblp-w0.sock -- "
      "--server=127.0.0.1:9100 --iterations=100");

  dblp::WorkerOptions o;
  o.server = FLAGS_server;
  o.name = FLAGS_name.empty() ? "worker-" + std::to_string(getpid())
                              : FLAGS_name;
  o.local_ip = FLAGS_local_ip;
  o.eth_peer = FLAGS_eth_peer;
  o.iterations = FLAGS_iterations;
  o.dp = dblp::DatapathOptionsFromFlags();
  try {
    o.bcast_fill = dblp::ParseFillMode(FLAGS_bcast_fill);
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(std::string("--bcast_fill: ") + e.what());
  }
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.hostile_per_round = FLAGS_hostile_per_round;

  std::unique_ptr<dblp::GradientSource> source;
  try {
    if (FLAGS_gradient == "synthetic") {
      dblp::NormTrace trace;
      trace.jumps = dblp::ParseIterationList(FLAGS_norm_jumps);
      trace.jump_length = FLAGS_jump_length;
      source = dblp::MakeSyntheticSource(FLAGS_floats, FLAGS_seed, trace);
    } else if (FLAGS_gradient == "integer") {
      source = dblp::MakeIntegerSource(FLAGS_floats);
    } else {
      dblp::FlagError("--gradient=" + FLAGS_gradient +
                      ": use synthetic or integer");
    }
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(e.what());
  }
  dblp::InitEalOrDie(argc, argv);
  const int rc = dblp::RunWorker(o, std::move(source));
  rte_eal_cleanup();
  return rc;
}
