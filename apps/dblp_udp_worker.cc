// dblp-udp-worker [options]: a worker of a DBLP job over kernel UDP sockets
// (dblp-udp-server), where DPDK cannot run. Each iteration it pushes its
// gradient, receives the mean, fills what the broadcast missed and applies
// it (src/udp/udp_job.h). Flags mean what dblp-worker's of the same name
// mean.
//
// Exit codes: 0 done, 1 the job failed (the server or a peer lost, a round
// without progress, the trainer gone), 2 bad flags.
#include <gflags/gflags.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

#include "dblp/chunking.h"
#include "dblp/gradient_source.h"
#include "dblp/loss_fill.h"
#include "dblp/shm_source.h"
#include "job_flags.h"
#include "udp/udp_job.h"

DEFINE_string(server, "127.0.0.1:9100",
              "dblp-udp-server's control address (ip:port)");
DEFINE_string(data, "0.0.0.0:0",
              "UDP address of this worker's data socket (ip:port; 0.0.0.0: "
              "the server pins the address our control connection comes "
              "from)");
DEFINE_string(name, "", "worker name shown by the server (default: pid)");
DEFINE_uint32(iterations, 100, "training iterations");
DEFINE_string(gradient, "synthetic",
              "synthetic | integer (exact test values) | shm (a PyTorch "
              "trainer posts each gradient over --shm: python/dblp, "
              "docs/PYTORCH.md)");
DEFINE_string(shm, "",
              "shm: the trainer's shared-memory object (e.g. /dblp-w0); "
              "dblp.Worker creates it and starts this process");
DEFINE_uint32(shm_idle_timeout_ms, 0,
              "shm: fail when the trainer, still alive, posts nothing for "
              "this long (0: wait while it lives)");
DEFINE_uint64(floats, 262144, "gradient size in float32 values");
DEFINE_string(norm_jumps, "",
              "synthetic: iterations where the gradient norm jumps (phase "
              "changes for the CLR detector)");
DEFINE_uint32(jump_length, 10, "synthetic: iterations a norm jump lasts");
DEFINE_string(bcast_fill, "zero",
              "fill of chunks missing from the broadcast: zero | prev");
DEFINE_uint32(join_timeout_ms, 30000, "give up joining after this long");
DEFINE_int32(cpu, -1, "pin the datapath thread to this CPU (-1: none)");

namespace {

// --gradient and its flags; a bad combination exits 2 naming the fix.
std::unique_ptr<dblp::GradientSource> SourceFromFlags() {
  const bool shm = FLAGS_gradient == "shm";
  if (shm != !FLAGS_shm.empty()) {
    dblp::FlagError(shm ? "--gradient=shm needs --shm=NAME (the trainer's "
                          "object, e.g. /dblp-w0)"
                        : "--shm only applies to --gradient=shm");
  }
  if (shm && (!gflags::GetCommandLineFlagInfoOrDie("floats").is_default ||
              !gflags::GetCommandLineFlagInfoOrDie("iterations").is_default)) {
    dblp::FlagError(
        "--gradient=shm: the trainer sets the gradient size and the number "
        "of steps; drop --floats and --iterations");
  }
  if (!shm && FLAGS_floats == 0) dblp::FlagError("--floats must be >= 1");
  if (FLAGS_gradient == "synthetic") {
    dblp::NormTrace trace;
    try {
      trace.jumps = dblp::ParseIterationList(FLAGS_norm_jumps);
    } catch (const std::invalid_argument& e) {
      dblp::FlagError(std::string("--norm_jumps: ") + e.what());
    }
    trace.jump_length = FLAGS_jump_length;
    return dblp::MakeSyntheticSource(FLAGS_floats, FLAGS_seed, trace);
  }
  if (FLAGS_gradient == "integer") return dblp::MakeIntegerSource(FLAGS_floats);
  if (shm) {
    // Throws naming the fix (no such object, a trainer of another build).
    return dblp::OpenShmSource(FLAGS_shm, FLAGS_shm_idle_timeout_ms);
  }
  dblp::FlagError("--gradient=" + FLAGS_gradient +
                  ": use synthetic, integer or shm");
}

dblp::UdpJobWorkerOptions OptionsFromFlags() {
  dblp::UdpJobWorkerOptions o;
  o.server = FLAGS_server;
  o.data = FLAGS_data;
  o.name = FLAGS_name.empty() ? "udp-worker-" + std::to_string(getpid())
                              : FLAGS_name;
  o.mtu = dblp::MtuFromFlags();
  o.burst = dblp::BurstFromFlags(128);  // frames per sendmmsg()
  o.iterations = FLAGS_iterations;
  o.seed = FLAGS_seed;
  o.send_order = dblp::SendOrderFromFlags();
  try {
    o.bcast_fill = dblp::ParseFillMode(FLAGS_bcast_fill);
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(std::string("--bcast_fill: ") + e.what());
  }
  dblp::LossFromFlags();  // exits naming the flag when the spec is bad
  o.loss = FLAGS_loss;
  o.bursts = dblp::BurstsFromFlags();
  o.round_timeout_ms = dblp::RoundTimeoutFromFlags();
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.cpu = FLAGS_cpu;
  o.idle_sleep_us = FLAGS_idle_sleep_us;
  o.out_dir = FLAGS_out_dir;
  o.dump_dir = FLAGS_dump_dir;
  o.dump_iterations = FLAGS_dump_iterations;
  o.secret = dblp::JobSecretFromFlags("dblp-udp-worker");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "dblp-udp-worker [options]\n"
      "  e.g. dblp-udp-worker --secret_file=job.secret "
      "--server=127.0.0.1:9100 --iterations=100");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    dblp::FlagError(std::string("unexpected argument ") + argv[1] +
                    " (options are --name=value)");
  }
  const dblp::UdpJobWorkerOptions o = OptionsFromFlags();
  std::unique_ptr<dblp::GradientSource> source;
  dblp::UdpJobWorkerResult r;
  try {
    source = SourceFromFlags();
    r = dblp::RunUdpJobWorker(o, *source);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dblp-udp-worker: %s\n", e.what());
    return 1;
  }
  if (r.exit_code != 0) {
    std::fprintf(stderr, "dblp-udp-worker %u: %s\n", r.rank, r.error.c_str());
    return r.exit_code;
  }
  std::printf("dblp-udp-worker %u: %zu iterations, %s\n", r.rank, r.rows.size(),
              source->Describe().c_str());
  return 0;
}
