// dblp-sim: a whole job in one process, the server and every worker running
// the real job (ServerJob, WorkerModel, the rounds' sides, real frames and
// control messages) over the simulator's loopback with a modelled clock
// (sim/memory_cluster.h). It takes the job flags of dblp-server and
// dblp-worker, and writes what they write: the rows and summary of the
// server (--out_dir/server) and of each worker (--out_dir/worker<rank>),
// and the test hook's dumps (--dump_dir). The parity test
// (tests/memif_cluster_test.py --transport=sim) checks it as it checks the
// apps. Deterministic for a seed; no frame tags (a modelled link has no
// observer), no worker loss.
#include <gflags/gflags.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "dblp/obs/run_report.h"
#include "job_flags.h"
#include "server_flags.h"
#include "sim/memory_cluster.h"
#include "test_hooks/dumps.h"
#include "worker_flags.h"

DEFINE_string(gradient, "synthetic",
              "synthetic | integer (exact test values): every worker's");
DEFINE_uint64(floats, 262144, "gradient size in float32 values");
DEFINE_string(bcast_fill, "zero",
              "what a worker puts in the chunks of the mean its broadcast "
              "missed: zero | prev");
DEFINE_double(ns_per_frame, 1230, "modelled wire time per frame");
DEFINE_double(control_one_way_ns, 10000, "modelled control latency");

namespace {

dblp::ClusterConfig ConfigFromFlags() {
  dblp::ClusterConfig c;
  static_cast<dblp::ServerJobSettings&>(c) = dblp::JobSettingsFromFlags();
  if (c.continue_on_worker_loss) {
    dblp::FlagError("--on_worker_loss=continue: no worker is lost here");
  }
  if (FLAGS_workers == 0 || FLAGS_workers >= 0xFFFF) {
    dblp::FlagError("--workers must be in 1..65534");
  }
  c.num_workers = FLAGS_workers;
  c.gradient_floats = FLAGS_floats;
  c.mtu = dblp::MtuFromFlags();
  c.burst = dblp::BurstFromFlags(1024);
  c.seed = FLAGS_seed;
  c.send_order = dblp::SendOrderFromFlags();
  c.push_loss = dblp::LossFromFlags();
  c.bcast_loss = c.push_loss;
  c.bursts = dblp::BurstsFromFlags();
  c.bcast_fill = dblp::BcastFillFromFlags();
  c.ns_per_frame = FLAGS_ns_per_frame;
  c.control_one_way_ns = FLAGS_control_one_way_ns;
  c.round_timeout_ms = FLAGS_round_timeout_ms;
  c.on_absorbed = dblp::WorkerDumps(FLAGS_dump_dir, FLAGS_dump_iterations);
  return c;
}

// Rows (streamed as they come) and summary.json of one role.
class Output {
 public:
  Output(const std::string& dir, const char* role, int32_t rank) {
    report_.role = role;
    report_.rank = rank;
    rows_.set_on_error(dblp::RowsOnErrorFromFlags());
    std::string err;
    if (!dir.empty() && !rows_.Open(dir, &err)) dblp::FlagError(err);
  }
  dblp::RunReport& report() { return report_; }
  dblp::RowStream& rows() { return rows_; }
  // "" or why the files are incomplete.
  std::string Close() { return dblp::CloseRunReport(rows_, report_); }

 private:
  dblp::RowStream rows_;
  dblp::RunReport report_;
};

int Run() {
  const dblp::ClusterConfig c = ConfigFromFlags();
  std::vector<std::unique_ptr<dblp::GradientSource>> sources;
  std::vector<dblp::GradientSource*> ptrs;
  for (uint32_t w = 0; w < c.num_workers; ++w) {
    sources.push_back(dblp::WorkerSourceFromFlags());
    if (!sources.back()) {
      dblp::FlagError("--gradient=" + FLAGS_gradient +
                      ": the simulator takes synthetic or integer");
    }
    ptrs.push_back(sources.back().get());
  }
  dblp::MemoryCluster cluster(c, ptrs);
  const std::string out = FLAGS_out_dir;
  Output server(out.empty() ? "" : out + "/server", "server", -1);
  std::vector<std::unique_ptr<Output>> workers;
  for (uint32_t w = 0; w < c.num_workers; ++w) {
    workers.push_back(std::make_unique<Output>(
        out.empty() ? "" : out + "/worker" + std::to_string(w), "worker",
        static_cast<int32_t>(w)));
  }
  const dblp::ResyncSchedule resync(c.resync_every);
  const uint64_t iterations = resync.ProtocolIterations(FLAGS_iterations);
  std::string failure;
  bool rows_failed = false;
  for (uint64_t it = 0; it < iterations && !rows_failed; ++it) {
    const dblp::IterationOutcome o = cluster.RunIteration();
    server.rows().Sync(cluster.server_rows());
    rows_failed = server.rows().failed();
    if (!o.failure.empty()) {
      failure = o.failure;
      break;
    }
    for (uint32_t w = 0; w < c.num_workers; ++w) {
      workers[w]->report().rows.push_back(o.workers[w]);
      workers[w]->rows().Append(o.workers[w]);
      rows_failed = rows_failed || workers[w]->rows().failed();
    }
  }
  server.report().rows = cluster.server_rows();
  server.report().counters = cluster.server_counters();
  server.report().info = cluster.server_info();
  server.report().info.emplace_back("transport", "simulator");
  std::fputs(dblp::FormatRunSummary(server.report()).c_str(), stdout);
  int rc = 0;
  if (!failure.empty()) {
    DBLP_LOG(Error, "dblp-sim: %s", failure.c_str());
    rc = 1;
  }
  std::string err = server.Close();
  for (auto& w : workers) {
    if (err.empty()) err = w->Close();
  }
  if (!err.empty()) {
    DBLP_LOG(Error, "dblp-sim: %s", err.c_str());
    rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "a whole DBLP job in one process over the simulator (modelled time): "
      "dblp-sim --workers=N --iterations=K [job flags]");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  dblp::CheckFlagsOrDie();
  try {
    return Run();
  } catch (const std::exception& e) {
    DBLP_LOG(Error, "dblp-sim: %s", e.what());
    return 1;
  }
}
