// dblp-sim: a whole job in one process, the server and every worker running
// the real job (ServerJob, WorkerModel, the rounds' sides, real frames and
// control messages) over the simulator's loopback with a modelled clock
// (sim/memory_cluster.h). It takes the job flags of dblp-server and
// dblp-worker, and writes what they write: the rows and summary of the
// server (--out_dir/server) and of each worker (--out_dir/worker<rank>),
// and the test hook's dumps (--dump_dir). The parity test
// (tests/memif_cluster_test.py --transport=sim) checks it as it checks the
// apps. Deterministic for a seed; no frame tags (a modelled link has no
// observer). A member may go silent (--silent_worker), as a SIGSTOPped
// process does, to see what --on_worker_loss makes of it.
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
#include "sim/sim_costs.h"
#include "test_hooks/dumps.h"
#include "worker_flags.h"

DEFINE_string(gradient, "synthetic",
              "synthetic | integer (exact test values): every worker's");
DEFINE_uint64(floats, 262144, "gradient size in float32 values");
DEFINE_string(bcast_fill, "zero",
              "what a worker puts in the chunks of the mean its broadcast "
              "missed: zero | prev");
DEFINE_double(ns_per_frame, 1230,
              "modelled wire time of a full frame on every link whose "
              "--worker_gbps/--server_gbps is 0 (1230: 10 Gb/s at MTU 1500; "
              "0: no wire limit, as memif)");
DEFINE_double(control_one_way_ns, 10000, "modelled control latency");
DEFINE_string(costs, "",
              "calibration file of per-frame CPU costs and control latency "
              "(tools/dblp-bench --calibrate FILE; docs/SCALING.md); flags "
              "given on the command line override its values");
DEFINE_double(worker_gbps, 0,
              "each worker host's link rate in Gb/s (0: from --ns_per_frame)");
DEFINE_double(server_gbps, 0,
              "each server shard's link rate in Gb/s (0: from "
              "--ns_per_frame); many workers into one server link is the "
              "incast");
DEFINE_uint32(host_cores, 0,
              "0: every process has cores of its own; N: all the job's "
              "processes share N cores (a check against runs on one host)");
DEFINE_uint32(server_shards, 1,
              "server shards (processes), each over its own partition of "
              "the gradient with its own link, one phase for the whole model");
DEFINE_uint32(server_lcores, 1,
              "datapath lcores of each server shard (they share its CPU work)");
DEFINE_uint32(worker_lcores, 1,
              "datapath lcores of each worker (they share its CPU work)");
DEFINE_int64(silent_worker, -1,
             "this worker goes silent (sends, reads and answers nothing, as "
             "a SIGSTOPped process) from --silent_iteration on; -1: none. "
             "--on_worker_loss decides what the servers make of it");
DEFINE_uint64(silent_iteration, 0, "the iteration --silent_worker stops in");
DEFINE_string(silent_during, "push",
              "push | broadcast: the phase of --silent_iteration it stops at");

namespace {

bool OnCommandLine(const char* flag) {
  return !gflags::GetCommandLineFlagInfoOrDie(flag).is_default;
}

// The clock's model: the calibration file, then the flags given.
dblp::SimCosts CostsFromFlags(uint32_t mtu) {
  dblp::SimCosts costs;
  costs.control_one_way_ns = FLAGS_control_one_way_ns;
  if (!FLAGS_costs.empty()) {
    const std::string err = dblp::LoadSimCosts(FLAGS_costs, &costs);
    if (!err.empty()) dblp::FlagError("--costs=" + err);
    if (OnCommandLine("control_one_way_ns")) {
      costs.control_one_way_ns = FLAGS_control_one_way_ns;
    }
  }
  const double link = dblp::LinkGbpsForFrameNs(FLAGS_ns_per_frame, mtu);
  costs.worker_gbps = FLAGS_worker_gbps > 0 ? FLAGS_worker_gbps : link;
  costs.server_gbps = FLAGS_server_gbps > 0 ? FLAGS_server_gbps : link;
  if (OnCommandLine("host_cores") || FLAGS_costs.empty()) {
    costs.host_cores = FLAGS_host_cores;
  }
  return costs;
}

dblp::ClusterConfig ConfigFromFlags() {
  dblp::ClusterConfig c;
  static_cast<dblp::ServerJobSettings&>(c) = dblp::JobSettingsFromFlags();
  if (FLAGS_workers == 0 || FLAGS_workers >= 0xFFFF) {
    dblp::FlagError("--workers must be in 1..65534");
  }
  if (FLAGS_silent_worker < -1 ||
      FLAGS_silent_worker >= static_cast<int64_t>(FLAGS_workers)) {
    dblp::FlagError("--silent_worker=" + std::to_string(FLAGS_silent_worker) +
                    " is not a worker: -1 (none) or 0.." +
                    std::to_string(FLAGS_workers - 1));
  }
  if (FLAGS_silent_during != "push" && FLAGS_silent_during != "broadcast") {
    dblp::FlagError("--silent_during=" + FLAGS_silent_during +
                    ": push or broadcast");
  }
  c.silent.rank = FLAGS_silent_worker;
  c.silent.iteration = FLAGS_silent_iteration;
  c.silent.from = FLAGS_silent_during == "push" ? dblp::Direction::kPush
                                                : dblp::Direction::kBroadcast;
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
  c.costs = CostsFromFlags(c.mtu);
  if (FLAGS_server_shards == 0 || FLAGS_server_lcores == 0 ||
      FLAGS_worker_lcores == 0) {
    dblp::FlagError(
        "--server_shards, --server_lcores and --worker_lcores must be >= 1");
  }
  c.server_shards = FLAGS_server_shards;
  c.server_lcores = FLAGS_server_lcores;
  c.worker_lcores = FLAGS_worker_lcores;
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
    for (const uint32_t w : o.lost) {
      DBLP_LOG(Warning, "dblp-sim: the servers went on without worker %u", w);
    }
    for (const dblp::IterationRecord& r : o.workers) {  // those in the job
      Output& w = *workers.at(r.rank);
      w.report().rows.push_back(r);
      w.rows().Append(r);
      rows_failed = rows_failed || w.rows().failed();
    }
  }
  if (failure.empty() && !rows_failed) cluster.Finish();
  // As the apps report it (the server's policy, the workers' WELCOME), so
  // a simulated run's summary names its policy too.
  const std::string policy =
      dblp::TolerancePolicy::Create(c.policy)->Describe();
  server.report().policy = policy;
  for (auto& w : workers) w->report().policy = policy;
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
