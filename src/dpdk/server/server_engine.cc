#include "server/server_engine.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/job/server_job.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/loss_fill.h"
#include "port/datapath.h"
#include "port/port.h"
#include "runtime/app_telemetry.h"
#include "runtime/eal_app.h"
#include "runtime/engine_runtime.h"
#include "runtime/numa_placement.h"
#include "server/server_control.h"
#include "server/server_lcore.h"
#include "server/server_report.h"
#include "server/server_setup.h"

namespace dblp {
namespace {

// One dblp-server run: the DPDK transport under the ServerJob. Every lcore
// runs its lane of every round (ServeIterations); lcore 0 also coordinates
// (ServerCoordinator), and this is the transport it asks.
class ServerRun final : public ServerTransport {
 public:
  explicit ServerRun(const ServerOptions& o)
      : o_(o), quit_(InstallQuitHandlers()) {
    if (o.shard_role.count > 1) {
      runtime_.RefusePolicyChanges(
          "set p / set policy: not with --shards > 1 (every shard's p comes "
          "from the directory's one phase); restart the job with the new "
          "policy on every shard");
    }
  }
  int Run();

 private:
  void BuildJob();
  void FillCounters(RunReport* report);

  // ServerTransport, on lcore 0 (ServeIterations says which steps run
  // while the other lcores wait at a barrier).
  uint64_t Now() override { return NowNs(); }
  std::span<const ReceiveSide* const> PushLanes(uint32_t w) override {
    return push_lanes_[w];
  }
  std::span<const SendSide* const> BroadcastLanes(uint32_t w) override {
    return bcast_sides_[w];
  }
  void Post(const ControlRequest& r) override {
    lcores_.lcores[0]->outbox().Post(r);
  }
  AcceptedSlots* Accepted() override { return a_.control->accepted(); }
  bool InBurst(uint64_t it) override { return lcores_.losses[0]->InBurst(it); }
  void PushAnnounced(uint64_t it, const RoundTolerance& t) override;
  void PushClosed(uint64_t it, const ReducedPush& r) override;
  void IterationDone(uint64_t it) override;
  int Report(const std::string& failure);

  const ServerOptions& o_;
  const std::atomic<bool>& quit_;
  RowStream rows_;
  EngineRuntime runtime_{"dblp-server", true};
  ServerAdmission a_;  // its policy moves into job_ in BuildJob
  ChunkLayout layout_;
  ChunkRanges lanes_;
  std::unique_ptr<ServerJob> job_;
  std::vector<std::unique_ptr<WorkerState>> workers_;
  LinkGrid links_;
  std::unique_ptr<JobSync> sync_;
  std::unique_ptr<ServerCoordinator> coordinator_;
  ServerLcores lcores_;
  std::vector<std::vector<const ReceiveSide*>> push_lanes_;  // [w][lane]
  std::vector<std::vector<const SendSide*>> bcast_sides_;    // [w][lane]
  std::unique_ptr<ResourceTrack> resources_;
  uint64_t iterations_done_ = 0;
};

// The job the workers joined: its layout, the ServerJob, every lcore's
// links to every worker, the lcores.
void ServerRun::BuildJob() {
  const uint32_t W = o_.workers;
  const auto S = static_cast<uint32_t>(a_.confs.size());
  layout_ = ChunkLayout(
      a_.gradient_bytes,
      ChunkPayloadForMtu(a_.ports.caps[0].mtu, FrameTagBytes(o_.frame_auth)));
  lanes_ = ChunkRanges(layout_.num_chunks(), S);
  std::vector<std::string> names;
  for (uint32_t w = 0; w < W; ++w) {
    names.push_back(a_.control->worker_name(w));
    workers_.push_back(std::make_unique<WorkerState>());
    workers_.back()->source = a_.control->pinned_source(w);
    workers_.back()->frame_key = a_.control->member_frame_key(w);
  }
  // A server shard: the job's phase decides the norm and p; the clip
  // share counts the whole gradient.
  ServerJobSettings settings = o_;
  if (ShardLinks* links = a_.control->shard_links()) {
    settings.phase = links;
    settings.model_floats = links->partition().model_bytes / sizeof(float);
  }
  job_ = std::make_unique<ServerJob>(settings, std::move(a_.policy), layout_,
                                     std::move(names), o_.dp.send_order,
                                     o_.dp.seed, "dblp-server", S);
  job_->set_row_stream(&rows_);
  const int node = PortNumaNode(0);
  PlaceOnNodeOrWarn(job_->iteration().reducer().sum_storage(), node,
                    "sum buffer");
  PlaceOnNodeOrWarn(job_->iteration().mean(), node, "mean buffer");
  links_ = BuildLinkGrid(a_.session, layout_, lanes_, o_.dp.burst, workers_);
  std::vector<std::vector<ReceiveSide*>> push_sides(W);
  std::vector<std::vector<SendSide*>> bcast_sides(W);
  push_lanes_.resize(W);
  bcast_sides_.resize(W);
  for (auto& lane : links_) {
    for (uint32_t w = 0; w < W; ++w) {
      push_sides[w].push_back(&lane[w]->push);
      push_lanes_[w].push_back(&lane[w]->push);
      bcast_sides[w].push_back(&lane[w]->bcast);
      bcast_sides_[w].push_back(&lane[w]->bcast);
    }
  }
  a_.control->Attach(push_sides, bcast_sides);
  sync_ = std::make_unique<JobSync>(S, &quit_);
  coordinator_ =
      std::make_unique<ServerCoordinator>(*job_, *this, o_.push_only);
  lcores_ = BuildServerLcores(ServerShared{.o = &o_,
                                           .ports = &a_.ports,
                                           .local_ip = a_.local_ip,
                                           .layout = &layout_,
                                           .lanes = &lanes_,
                                           .job = job_.get(),
                                           .control = a_.control.get(),
                                           .sync = sync_.get(),
                                           .coordinator = coordinator_.get(),
                                           .quit = &quit_},
                              a_.confs, workers_, links_);
  resources_ = std::make_unique<ResourceTrack>(a_.ports.pool);
}

void ServerRun::PushAnnounced(uint64_t it, const RoundTolerance& t) {
  a_.control->Publish(it, t.p, t.critical);
  runtime_.PushOpened(it, t);
}

// The prompt's change applies at this boundary (iteration it + 1 on).
void ServerRun::PushClosed(uint64_t it, const ReducedPush& r) {
  std::unique_ptr<TolerancePolicy>& live = job_->iteration().policy();
  if (runtime_.ApplyServerCommand(it + 1, &live)) {
    job_->OverrideNextPush(live->Current());
  }
  runtime_.BroadcastOpened(it, r.broadcast, job_->PushTolerance(it + 1));
  runtime_.PublishStats();  // the other lcores wait at the barrier
}

void ServerRun::IterationDone(uint64_t it) {
  iterations_done_ = it + 1;
  resources_->Sample(it + 1);
  runtime_.IterationDone(it);
}

int ServerRun::Run() {
  // Rows are streamed as the rounds end: a directory that cannot take them
  // fails the server now, before workers join a job it could not record.
  rows_.set_on_error(o_.dp.rows_on_error);
  if (std::string err;
      !o_.dp.out_dir.empty() && !rows_.Open(o_.dp.out_dir, &err)) {
    DBLP_LOG(Error, "dblp-server: %s", err.c_str());
    return 1;
  }
  a_ = AdmitServerWorkers(o_, quit_);
  runtime_.SetPolicy(o_.policy, 0, false);
  BuildJob();
  {
    std::vector<const LcoreConf*> lc;
    for (const auto& c : a_.confs) lc.push_back(c.get());
    runtime_.SetLcores(std::move(lc), a_.ports.nb_ports);
  }
  runtime_.SetCounters([&](CounterList* out) {
    RunReport live;
    FillCounters(&live);
    *out = std::move(live.counters);
  });
  std::printf(
      "dblp-server: %u workers joined; %u chunks of %u B per round, "
      "%zu datapath lcore(s)\n",
      o_.workers, layout_.num_chunks(), layout_.chunk_payload(),
      a_.confs.size());
  std::fflush(stdout);
  const uint64_t start_ns = NowNs();
  for (auto& l : lcores_.losses) l->StartClock(start_ns);
  LaunchRemoteLcores(lcores_, a_.confs, o_.dp.realtime);
  runtime_.SetRunning(true);
  lcores_.lcores[0]->Run();
  rte_eal_mp_wait_lcore();
  runtime_.SetRunning(false);
  return Report(sync_->failure());
}

void ServerRun::FillCounters(RunReport* report) {
  AddServerCounters(a_.confs, *a_.control, links_, a_.ports.nb_ports, report);
  if (job_) job_->AddCounters(&report->counters);
}

// The summary and the exit code, once every lcore stopped.
int ServerRun::Report(const std::string& failure) {
  if (!failure.empty()) {
    a_.control->Fail(failure);
  } else {
    a_.control->Finish();  // peer server shards: a BYE, no loss
  }
  a_.control->Stop();
  RunReport report;
  report.role = "server";
  report.burst_iterations = o_.dp.bursts.iterations;
  FillCounters(&report);
  resources_->AddTo(iterations_done_, &report.counters);
  for (uint16_t p = 0; p < a_.ports.nb_ports; ++p) {
    report.xstats.emplace_back("port" + std::to_string(p), ReadXstats(p));
  }
  runtime_.PublishFinal(report.counters, !failure.empty());
  // Workers on memif wait for this close before they close their side
  // (port.h, AwaitPeerClose): closed right after the job.
  std::vector<uint16_t> ports(a_.ports.nb_ports);
  std::iota(ports.begin(), ports.end(), uint16_t{0});
  if (const std::string err = StopAndClosePorts(ports); !err.empty()) {
    DBLP_LOG(Warning, "dblp-server: %s", err.c_str());
  }
  report.info = job_->Info();
  report.info.emplace_back("loss", FormatLossSpec(o_.dp.loss));
  report.info.emplace_back("link_gbps", o_.dp.link_gbps > 0
                                            ? std::to_string(o_.dp.link_gbps)
                                            : "unpaced");
  // The prompt may have changed it.
  report.policy = job_->iteration().policy()->Describe();
  // The rows of a round the job ended in (push summed, broadcast cut
  // short) were not streamed yet.
  rows_.Sync(job_->rows());
  report.rows = std::move(job_->rows());
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (const std::string err = CloseRunReport(rows_, report); !err.empty()) {
    DBLP_LOG(Error, "dblp-server: %s", err.c_str());
    exit_code = 1;
  }
  if (!failure.empty()) DBLP_LOG(Error, "dblp-server: %s", failure.c_str());
  return exit_code;
}

}  // namespace

int RunServer(const ServerOptions& o) { return ServerRun(o).Run(); }

}  // namespace dblp
