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

#include "dblp/base/log.h"
#include "dblp/base/quit_signal.h"
#include "dblp/base/version.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/wire/chunking.h"
#include "job_flags.h"
#include "test_hooks/dumps.h"
#include "udp/udp_job.h"
#include "worker_flags.h"

DEFINE_uint32(join_timeout_ms, 30000, "give up joining after this long");
DEFINE_string(server, "127.0.0.1:9100",
              "dblp-udp-server's control address (ip:port)");
DEFINE_string(data, "0.0.0.0:0",
              "UDP address of this worker's data socket (ip:port; 0.0.0.0: "
              "the server pins the address our control connection comes "
              "from)");
DEFINE_string(name, "", "worker name shown by the server (default: pid)");
DEFINE_string(gradient, "synthetic",
              "synthetic | integer (exact test values) | shm (a PyTorch "
              "trainer posts each gradient over --shm: python/dblp, "
              "docs/PYTORCH.md)");
DEFINE_uint64(floats, 262144, "gradient size in float32 values");
DEFINE_string(bcast_fill, "zero",
              "fill of chunks missing from the broadcast: zero | prev");
DEFINE_int32(cpu, -1, "pin the datapath thread to this CPU (-1: none)");

namespace {

// --gradient and its flags; a bad combination exits 2 naming the fix.
std::unique_ptr<dblp::GradientSource> SourceFromFlags() {
  std::unique_ptr<dblp::GradientSource> source = dblp::WorkerSourceFromFlags();
  if (!source) {
    dblp::FlagError("--gradient=" + FLAGS_gradient +
                    ": use synthetic, integer or shm");
  }
  return source;
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
  o.bcast_fill = dblp::BcastFillFromFlags();
  dblp::LossFromFlags();  // exits naming the flag when the spec is bad
  o.loss = FLAGS_loss;
  o.bursts = dblp::BurstsFromFlags();
  o.round_timeout_ms = dblp::RoundTimeoutFromFlags();
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.cpu = FLAGS_cpu;
  o.idle_sleep_us = FLAGS_idle_sleep_us;
  o.deep_idle = dblp::DeepIdleFromFlags();
  o.out_dir = FLAGS_out_dir;
  o.rows_on_error = dblp::RowsOnErrorFromFlags();
  o.on_absorbed = dblp::WorkerDumps(FLAGS_dump_dir, FLAGS_dump_iterations);
  o.secret = dblp::JobSecretFromFlags("dblp-udp-worker");
  o.quit = &dblp::InstallQuitHandlers();  // summary and rows on SIGINT
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "dblp-udp-worker [options]\n"
      "  e.g. dblp-udp-worker --secret_file=job.secret "
      "--server=127.0.0.1:9100 --iterations=100");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    dblp::FlagError(std::string("unexpected argument ") + argv[1] +
                    " (options are --name=value)");
  }
  dblp::CheckFlagsOrDie();
  const dblp::UdpJobWorkerOptions o = OptionsFromFlags();
  std::unique_ptr<dblp::GradientSource> source;
  dblp::UdpJobWorkerResult r;
  try {
    source = SourceFromFlags();
    r = dblp::RunUdpJobWorker(o, *source);
  } catch (const std::exception& e) {
    DBLP_LOG(Error, "dblp-udp-worker: %s", e.what());
    return 1;
  }
  if (r.exit_code != 0) {
    DBLP_LOG(Error, "dblp-udp-worker %u: %s", r.rank, r.error.c_str());
    return r.exit_code;
  }
  std::printf("dblp-udp-worker %u: %zu iterations, %s\n", r.rank, r.rows.size(),
              source->Describe().c_str());
  return 0;
}
