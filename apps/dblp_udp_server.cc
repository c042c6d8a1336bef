// dblp-udp-server [options]: the parameter server of a DBLP job over kernel
// UDP sockets, where DPDK cannot run. Receives every worker's push under
// the current loss tolerance, reduces, runs the tolerance policy and
// broadcasts the mean back (src/udp/udp_job.h), with the same job logic as
// dblp-server (lib/dblp/job/server_iteration.h). Flags mean what
// dblp-server's of the same name mean.
//
// With --shards=S, S dblp-udp-server processes serve one job, each a
// partition of the gradient (dblp/job/shard_links.h); the workers join
// shard 0, the directory, and it names the others.
//
// Exit codes: 0 done, 1 the job failed (a worker lost, a round without
// progress), 2 bad flags.
#include <gflags/gflags.h>

#include <cstdio>
#include <exception>
#include <string>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/base/log.h"
#include "dblp/base/quit_signal.h"
#include "dblp/base/version.h"
#include "dblp/wire/chunking.h"
#include "job_flags.h"
#include "server_flags.h"
#include "shard_flags.h"
#include "udp/udp_job.h"

DEFINE_string(control, "127.0.0.1:9100",
              "TCP control address to listen on (ip:port)");
DEFINE_string(data, "",
              "UDP address of the data socket (ip:port; default: "
              "--control's IP, an ephemeral port); the workers learn it "
              "from WELCOME");
DEFINE_int32(cpu, -1, "pin the datapath thread to this CPU (-1: none)");

namespace {

std::string DataAddressFromFlags() {
  if (!FLAGS_data.empty()) return FLAGS_data;
  sockaddr_in ctrl{};
  std::string err;
  if (!dblp::ParseIpv4Endpoint(FLAGS_control, true, true, "127.0.0.1:9100",
                               &ctrl, &err)) {
    dblp::FlagError("--control: " + err);
  }
  ctrl.sin_port = 0;
  return dblp::FormatIpv4Endpoint(ctrl);
}

// Everything dblp-udp-server takes, checked: a bad value exits 2 naming
// the flag and a value that works.
dblp::UdpJobServerOptions OptionsFromFlags() {
  dblp::UdpJobServerOptions o;
  o.control = FLAGS_control;
  o.data = DataAddressFromFlags();
  o.workers = FLAGS_workers;
  if (FLAGS_workers == 0 || FLAGS_workers >= 0xFFFF) {
    dblp::FlagError("--workers must be in 1..65534");
  }
  o.mtu = dblp::MtuFromFlags();
  o.burst = dblp::BurstFromFlags(128);  // frames per sendmmsg()
  static_cast<dblp::ServerJobSettings&>(o) = dblp::JobSettingsFromFlags();
  dblp::LossFromFlags();  // exits naming the flag when the spec is bad
  o.loss = FLAGS_loss;
  o.bursts = dblp::BurstsFromFlags();
  o.seed = FLAGS_seed;
  o.send_order = dblp::SendOrderFromFlags();
  o.round_timeout_ms = dblp::RoundTimeoutFromFlags();
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.max_gradient_bytes = dblp::MaxGradientBytesFromFlags();
  o.rank_by_name = dblp::RankByNameFromFlags();
  o.shard_role = dblp::ShardRoleFromFlags(FLAGS_control, "control");
  o.shard_job_flags = dblp::ShardJobFlags();
  o.control_limits = dblp::ControlLimitsFromFlags();
  o.cpu = FLAGS_cpu;
  o.idle_sleep_us = FLAGS_idle_sleep_us;
  o.deep_idle = dblp::DeepIdleFromFlags();
  o.quit = &dblp::InstallQuitHandlers();  // summary and rows on SIGINT
  o.out_dir = FLAGS_out_dir;
  o.rows_on_error = dblp::RowsOnErrorFromFlags();
  o.secret = dblp::JobSecretFromFlags("dblp-udp-server");
  o.frame_auth = dblp::FrameAuthFromFlags(o.secret);
  o.quiet = false;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "dblp-udp-server [options]\n"
      "  e.g. dblp-udp-server --secret_file=job.secret --workers=3 "
      "--control=127.0.0.1:9100 --policy=dblp");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    dblp::FlagError(std::string("unexpected argument ") + argv[1] +
                    " (options are --name=value)");
  }
  dblp::CheckFlagsOrDie();
  const dblp::UdpJobServerOptions o = OptionsFromFlags();
  dblp::UdpJobServerResult r;
  try {
    r = dblp::RunUdpJobServer(o);
  } catch (const std::exception& e) {
    // Setup steps that throw (libcrypto, the random number generator): a
    // message and exit 1, never std::terminate.
    DBLP_LOG(Error, "dblp-udp-server: %s", e.what());
    return 1;
  }
  if (r.exit_code != 0) {
    DBLP_LOG(Error, "dblp-udp-server: %s", r.error.c_str());
    return r.exit_code;
  }
  std::printf("dblp-udp-server: %u workers, %llu iterations of %u chunks\n",
              o.workers, static_cast<unsigned long long>(r.iterations),
              r.chunks);
  return 0;
}
