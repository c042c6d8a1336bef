// dblp-inmem-demo: a whole 3-worker DBLP job with microbursts, in one
// process, under `fixed` (MLT) and `dblp`, printed side by side.
//
// The protocol is real (frames, bitmaps, control messages, early stop, stale
// rejection, the CLR detector on the mean's norm); the network and the clock
// are modelled (sim/memory_cluster.h), so this runs anywhere and is
// deterministic for a seed. The DPDK apps measure real time.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "dblp/handoff/synthetic_gradient.h"
#include "dblp/obs/latency_stats.h"
#include "dblp/obs/records.h"
#include "dblp/policy/analytic.h"
#include "flag_checks.h"
#include "sim/memory_cluster.h"

DEFINE_uint32(workers, 3, "number of workers");
DEFINE_uint32(iterations, 60, "training iterations to run per policy");
DEFINE_uint64(floats, 262144, "gradient size in float32 values (1 MiB)");
DEFINE_uint32(mtu, 1500, "IP MTU; chunks fill MTU-sized frames");
DEFINE_string(burst_iters, "20,45",
              "iterations with a one-iteration microburst (comma list)");
DEFINE_double(burst_loss, 0.7, "loss rate during a microburst");
DEFINE_string(loss, "none",
              "base loss outside bursts: none | bernoulli:P | ge:...");
DEFINE_double(p_fixed, 0.008, "fixed (MLT) tolerance; also dblp's P_low");
DEFINE_double(p_high, 0.408, "dblp tolerance outside critical regimes");
DEFINE_uint32(clr_freq, 5, "CLR check every N iterations");
DEFINE_double(clr_eta, 0.5, "CLR relative norm-change threshold");
DEFINE_string(norm_jumps, "50",
              "iterations where the synthetic gradient norm jumps (a phase "
              "change the CLR detector should flag)");
DEFINE_string(send_order, "permuted", "sequential | rotating | permuted");
DEFINE_uint64(seed, 1, "seed for losses, send order and gradients");
DEFINE_double(ns_per_frame, 1230, "modelled wire time per frame (10 Gb/s)");
DEFINE_double(control_one_way_ns, 10000, "modelled control latency");
DEFINE_string(out_dir, "", "write per-iteration CSV/JSONL here if set");

namespace {

using namespace dblp;

struct PolicyRun {
  std::string name;
  std::vector<IterationOutcome> iters;
};

PolicyRun Run(const std::string& name, PolicyConfig policy) {
  ClusterConfig c;
  c.num_workers = FLAGS_workers;
  c.gradient_floats = FLAGS_floats;
  c.mtu = FLAGS_mtu;
  c.policy = policy;
  c.seed = FLAGS_seed;
  c.push_loss = ParseLossSpec(FLAGS_loss);
  c.bcast_loss = c.push_loss;
  c.bursts = ParseBurstIterations(FLAGS_burst_iters, FLAGS_burst_loss);
  c.send_order = ParseSendOrder(FLAGS_send_order);
  c.costs.worker_gbps = LinkGbpsForFrameNs(FLAGS_ns_per_frame, FLAGS_mtu);
  c.costs.server_gbps = c.costs.worker_gbps;
  c.costs.control_one_way_ns = FLAGS_control_one_way_ns;
  MemoryCluster cluster(c);

  NormTrace trace;
  trace.jumps = ParseIterationList(FLAGS_norm_jumps);
  std::vector<SyntheticGradientSource> sources;
  for (uint32_t w = 0; w < c.num_workers; ++w) {
    sources.emplace_back(c.gradient_floats, w, c.seed, trace);
  }
  PolicyRun run{name, {}};
  std::vector<std::vector<float>> grads(c.num_workers);
  for (uint32_t it = 0; it < FLAGS_iterations; ++it) {
    for (uint32_t w = 0; w < c.num_workers; ++w) {
      grads[w] = sources[w].Make(it);
    }
    run.iters.push_back(cluster.RunIteration(grads));
  }
  if (!FLAGS_out_dir.empty()) {
    std::filesystem::create_directories(FLAGS_out_dir);
    std::vector<IterationRecord> rows;
    for (const auto& o : run.iters) {
      rows.insert(rows.end(), o.workers.begin(), o.workers.end());
    }
    std::ofstream csv(FLAGS_out_dir + "/" + name + ".csv");
    WriteCsv(csv, rows);
    std::ofstream jsonl(FLAGS_out_dir + "/" + name + ".jsonl");
    WriteJsonl(jsonl, rows);
  }
  return run;
}

// The iteration's push latency: until the last worker saw STOP.
double PushUs(const IterationOutcome& o) { return o.push_round_ns / 1e3; }

uint32_t MaxPasses(const IterationOutcome& o) {
  uint32_t p = 0;
  for (const auto& r : o.workers) p = std::max(p, r.passes);
  return p;
}

double MeanPasses(const IterationOutcome& o) {
  double sum = 0;
  for (const auto& r : o.workers) sum += r.passes;
  return sum / o.workers.size();
}

// Mean passes of one sender over many simulated rounds: the formula's
// L^k <= p is an expectation; a finite N has a tail the simulation shows.
double SimulatedMeanPasses(uint32_t n, double loss, double p) {
  constexpr int kRounds = 200;
  double sum = 0;
  for (int s = 0; s < kRounds; ++s) {
    sum += SimulatePasses(n, loss, p, 1000 + s).passes;
  }
  return sum / kRounds;
}

double PacketsOverN(const IterationOutcome& o, uint32_t n) {
  double sum = 0;
  for (const auto& r : o.workers) sum += static_cast<double>(r.packets_sent);
  return sum / o.workers.size() / n;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "in-memory DBLP job: fixed vs dblp under microbursts (modelled time)");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  dblp::CheckFlagsOrDie();
  try {
    PolicyConfig fixed;
    fixed.kind = PolicyKind::kFixed;
    fixed.p_fixed = FLAGS_p_fixed;
    PolicyConfig dblp_cfg;
    dblp_cfg.kind = PolicyKind::kDblp;
    dblp_cfg.p_low = FLAGS_p_fixed;
    dblp_cfg.p_high = FLAGS_p_high;
    dblp_cfg.clr.freq = FLAGS_clr_freq;
    dblp_cfg.clr.eta = FLAGS_clr_eta;

    const std::vector<PolicyRun> runs = {Run("fixed", fixed),
                                         Run("dblp", dblp_cfg)};
    const BurstSchedule bursts =
        ParseBurstIterations(FLAGS_burst_iters, FLAGS_burst_loss);
    const ChunkLayout layout =
        ChunkLayout::ForMtu(FLAGS_floats * sizeof(float), FLAGS_mtu);
    const uint32_t n = layout.num_chunks();

    std::printf(
        "DBLP in-memory demo: %u workers, %.2f MiB gradient = %u chunks of "
        "%u B, %u iterations, %.0f%% microbursts at iterations %s\n"
        "Protocol logic is real; network and clock are MODELLED "
        "(%.0f ns/frame, %.0f us control one-way).\n\n",
        FLAGS_workers, FLAGS_floats * 4.0 / (1 << 20), n,
        layout.chunk_payload(), FLAGS_iterations, FLAGS_burst_loss * 100,
        FLAGS_burst_iters.c_str(), FLAGS_ns_per_frame,
        FLAGS_control_one_way_ns / 1e3);

    std::printf("%-6s %12s %10s %10s %10s %8s\n", "policy", "clean p50 us",
                "p99 us", "mean us", "max us", "crit %");
    std::vector<std::vector<double>> burst_us(runs.size());
    std::vector<double> means, p99s;
    for (size_t r = 0; r < runs.size(); ++r) {
      std::vector<double> all, clean;
      uint32_t critical = 0;
      for (const auto& o : runs[r].iters) {
        all.push_back(PushUs(o));
        if (!o.burst) clean.push_back(PushUs(o));
        critical += o.push_tolerance.critical ? 1 : 0;
      }
      const LatencySummary s = Summarize(all);
      const LatencySummary c = Summarize(clean);
      means.push_back(s.mean);
      p99s.push_back(s.p99);
      std::printf("%-6s %12.1f %10.1f %10.1f %10.1f %8.1f\n",
                  runs[r].name.c_str(), c.p50, s.p99, s.mean, s.max,
                  100.0 * critical / runs[r].iters.size());
    }
    std::printf("ratio fixed/dblp: p99 %.2fx, mean %.2fx\n\n", p99s[0] / p99s[1],
                means[0] / means[1]);

    std::printf("%-6s %-6s %6s %13s %7s %10s   %s\n", "burst", "policy", "p",
                "passes avg/max", "pkts/N", "push us",
                "expected at L=burst: passes, pkts/N, push us; simulated passes");
    for (uint64_t it : bursts.iterations) {
      if (it >= FLAGS_iterations) continue;
      for (size_t r = 0; r < runs.size(); ++r) {
        const IterationOutcome& o = runs[r].iters[it];
        const PassEstimate e =
            ExpectedPasses(n, FLAGS_burst_loss, o.push_tolerance.p);
        // The workers share the server's link, so a frame of each costs
        // W frame times; a pass boundary costs a PROBE/BITMAP round trip.
        const double expected_us =
            ExpectedRoundTimeNs(e, FLAGS_ns_per_frame * FLAGS_workers,
                                2 * FLAGS_control_one_way_ns) /
            1e3;
        std::printf("%-6llu %-6s %6.3f %9.1f/%-3u %7.2f %10.1f   %u, %.2f, %.1f; %.1f\n",
                    static_cast<unsigned long long>(it), runs[r].name.c_str(),
                    o.push_tolerance.p, MeanPasses(o), MaxPasses(o),
                    PacketsOverN(o, n), PushUs(o), e.passes, e.packets_over_n,
                    expected_us,
                    SimulatedMeanPasses(n, FLAGS_burst_loss,
                                        o.push_tolerance.p));
        burst_us[r].push_back(PushUs(o));
      }
      const size_t k = burst_us[0].size() - 1;
      std::printf("%-6s fixed/dblp burst latency: %.2fx\n", "",
                  burst_us[0][k] / burst_us[1][k]);
    }
  } catch (const std::exception& e) {
    DBLP_LOG(Error, "dblp-inmem-demo: %s", e.what());
    return 2;
  }
  return 0;
}
