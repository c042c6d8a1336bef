#include "worker_engine.h"

#include <rte_ethdev.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "app_telemetry.h"
#include "datapath.h"
#include "dblp/base/log.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/run_report.h"
#include "eal_app.h"
#include "engine_runtime.h"
#include "lcore_loop.h"
#include "numa_placement.h"
#include "worker_control.h"
#include "worker_setup.h"

namespace dblp {
namespace {

// One dblp-worker run: the DPDK transport (its lcore, one push side per
// server shard, the broadcast's receive side) under the WorkerJob.
class WorkerRun {
 public:
  WorkerRun(const WorkerOptions& o, std::unique_ptr<GradientSource> source)
      : o_(o), source_(std::move(source)), quit_(InstallQuitHandlers()) {}
  int Run();

  // The WorkerJob's transport (WorkerExchanger).
  std::string Exchange(uint64_t it, std::span<const uint32_t> order);
  WorkerExchange Exchanged(uint64_t it) const;
  const Bitmap& arrived() const { return arrived_; }

 private:
  void BuildDatapath();
  std::string RunIterations();
  int Report(const std::string& failure);

  const WorkerOptions& o_;
  std::unique_ptr<GradientSource> source_;
  const std::atomic<bool>& quit_;
  RowStream rows_;
  LcoreConf lc_;
  std::optional<WorkerControl> control_;
  EngineRuntime runtime_{"dblp-worker", false};
  WelcomeMsg wel_;
  ChunkLayout layout_;
  FrameKey frame_key_;
  std::optional<WorkerJob> job_;
  rte_mempool* pool_ = nullptr;
  PortCaps caps_;
  Endpoint local_;
  FrameTemplate to_server_;
  std::vector<std::unique_ptr<SendSide>> push_;  // one per server shard
  std::vector<SendSide*> push_ptrs_;
  std::optional<ReceiveSide> bcast_;
  std::optional<RxLossInjector> loss_;  // on the broadcast we receive
  std::optional<TokenBucket> link_;
  std::vector<ChunkTransmitter> tx_;  // one per queue
  std::optional<RoundPacer> pacer_;
  std::optional<WorkerLcore> lcore_;
  // A test seam (--hostile_per_round installs one): called before each
  // push with the round and its send order; none in a production job.
  std::unique_ptr<PushHook> push_hook_;
  Bitmap arrived_;
  std::optional<ResourceTrack> resources_;  // mbufs and RSS over the run
};

// The port, the sides, the lcore that runs them, the push hook.
void WorkerRun::BuildDatapath() {
  const uint16_t queues = wel_.num_shards;
  caps_ = SetupWorkerPort(o_, queues, &pool_);
  to_server_ = ServerTemplate(o_, wel_, caps_, &local_);
  to_server_.set_auth(frame_key_);
  for (uint16_t q = 0; q < queues; ++q) {
    SendSideConfig sc{
        FrameType::kPush, wel_.session, static_cast<uint16_t>(wel_.rank), 0,
        Direction::kPush, o_.dp.burst};
    sc.shard = q;
    push_.push_back(std::make_unique<SendSide>(sc));
    push_ptrs_.push_back(push_.back().get());
  }
  bcast_.emplace(ReceiveSideConfig{
      ReceiverConfig{wel_.session, FrameType::kBroadcast, kServerRank, layout_,
                     0, UINT32_MAX, frame_key_},
      Direction::kBroadcast, 0});
  control_->Attach(push_ptrs_, &*bcast_);
  loss_.emplace(o_.dp.loss, o_.dp.bursts, HashMix(o_.dp.seed, wel_.rank + 1));
  loss_->set_injected(&GlobalAppState().burst);  // the prompt's inject burst
  GlobalAppState().worker_policy.Add("describe", wel_.policy);
  link_.emplace(o_.dp.link_gbps,
                uint64_t{o_.dp.burst} * WireBytesPerFrame(caps_.mtu));
  for (uint16_t q = 0; q < queues; ++q) {
    // Lcore-shard q's chunks go to the server's UDP port base + q, which
    // its NIC steers to its queue q (steering.h); harmless on memif.
    const auto dst_port =
        static_cast<uint16_t>(queues > 1 ? wel_.udp_base_port + q : 0);
    tx_.push_back(ChunkTransmitter{0, q, pool_, &lc_.counters, &*link_, 8,
                                   WireBytesPerFrame(caps_.mtu), o_.dp.prefetch,
                                   dst_port});
  }
  resources_.emplace(pool_);
  pacer_.emplace(o_.dp.idle_spin, o_.dp.idle_sleep_us, o_.dp.round_timeout_ms,
                 &quit_, nullptr, o_.dp.deep_idle);
  const std::span<float> grad = job_->model().grad(), avg = job_->model().avg();
  const auto* grad_bytes = reinterpret_cast<const uint8_t*>(grad.data());
  // The buffers the lcore streams through, next to the port.
  PlaceOnNodeOrWarn(std::span<const float>(grad), PortNumaNode(0),
                    "gradient buffer");
  PlaceOnNodeOrWarn(std::span<const float>(avg), PortNumaNode(0),
                    "mean buffer");
  lcore_.emplace(
      lc_, *control_, push_, *bcast_,
      WorkerLcore::Setup{0, queues, local_.udp_port, wel_.server_ipv4, &layout_,
                         &*loss_, &tx_, &to_server_, grad_bytes,
                         reinterpret_cast<uint8_t*>(avg.data()), &*pacer_,
                         o_.server});
  if (o_.push_hook) {
    push_hook_ = o_.push_hook(
        PushHookContext{&wel_, pool_, &lc_.counters, &to_server_, &caps_,
                        local_, grad_bytes, &layout_, queues, frame_key_});
  }
}

std::string WorkerRun::Exchange(uint64_t it, std::span<const uint32_t> order) {
  std::string failure;
  if (!lcore_->AwaitPushRound(it, &failure)) return failure;
  if (push_hook_) push_hook_->BeforePush(it, PushRound(it), order);
  lcore_->Exchange(it, order, &failure);
  bcast_->receiver().SnapshotBitmap(arrived_);
  return failure;
}

WorkerExchange WorkerRun::Exchanged(uint64_t it) const {
  const WorkerIterationTimes& t = lcore_->times();
  WorkerExchange x{it, wel_.rank, push_ptrs_, t.bcast_done_ns};
  x.delivered_fraction = bcast_->receiver().delivered_fraction();
  x.p = t.announced_p;
  x.critical = t.critical;
  x.burst = loss_->InBurst(it);
  return x;
}

std::string WorkerRun::RunIterations() {
  const uint64_t iterations = job_->iterations(o_.iterations);
  runtime_.round().total_iterations = iterations == UINT64_MAX ? 0 : iterations;
  std::string failure;
  bool more = true;
  for (uint64_t it = 0; it < iterations && more && failure.empty(); ++it) {
    resources_->Sample(it);
    control_->set_iteration(it);
    runtime_.ApplyWorkerCommand(it);  // the prompt's, before the round opens
    runtime_.WorkerStarted(it);
    failure = job_->Iterate(it, *this, *control_, &more);
    if (!failure.empty() || !more) break;
    const IterationRecord& r = job_->last_row();
    runtime_.WorkerDone(it, r.p, r.critical, r.delivered_fraction);
    runtime_.PublishStats();
  }
  return failure;
}

int WorkerRun::Run() {
  // Rows are streamed from the first iteration on: a directory that cannot
  // take them fails the worker now, before it joins (and stalls) a job.
  rows_.set_on_error(o_.dp.rows_on_error);
  if (std::string err;
      !o_.dp.out_dir.empty() && !rows_.Open(o_.dp.out_dir, &err)) {
    DBLP_LOG(Error, "dblp-worker: %s", err.c_str());
    return 1;
  }
  lc_.lcore_id = rte_lcore_id();
  control_.emplace(o_.secret, &lc_.counters, o_.dp.stats_period_s);
  // Join checks the WELCOME (authenticity, layout, rank, ports); a wrong
  // one ends the worker naming the fix.
  const AppFailure joined =
      control_->Join(o_.server, MakeJoin(o_, *source_), o_.join_timeout_ms,
                     quit_, o_.dp.realtime);
  if (joined.failed()) Die(joined);
  wel_ = control_->welcome();
  layout_ = ChunkLayout(wel_.total_bytes, wel_.chunk_payload);
  frame_key_ = control_->MemberFrameKey();
  const WorkerJobSettings js{
      o_.bcast_fill, o_.dp.send_order,       o_.dp.seed,
      false,         o_.dp.round_timeout_ms, o_.on_absorbed};
  StartWorkerSource(*source_, wel_, js, *control_);
  job_.emplace(*source_, wel_, layout_, js);
  job_->set_row_stream(&rows_);
  BuildDatapath();
  PrintJoined(wel_, *source_, layout_, caps_);
  loss_->StartClock(NowNs());
  runtime_.SetLcores({&lc_}, wel_.num_shards);
  runtime_.SetCounters([&](CounterList* out) {
    RunReport live;
    AddWorkerCounters(lc_, *control_, push_, *bcast_, ReadPortDrops(0), &live);
    *out = std::move(live.counters);
  });
  runtime_.SetRunning(true);
  const std::string failure = RunIterations();
  runtime_.SetRunning(false);
  return Report(failure);
}

// The summary and the exit code; the port closes after the server's. A
// failure is said at once.
int WorkerRun::Report(const std::string& failure) {
  if (!failure.empty()) {
    DBLP_LOG(Error, "dblp-worker %u: %s", wel_.rank, failure.c_str());
  }
  RunReport report;
  report.role = "worker";
  report.rank = wel_.rank;
  report.policy = wel_.policy;
  report.burst_iterations = o_.dp.bursts.iterations;
  report.rows = job_->rows();
  std::vector<std::pair<std::string, uint64_t>> resources;
  resources_->AddTo(report.rows.size(), &resources);
  // Before the server closes its side: memif's counters end with the link.
  report.xstats.emplace_back("port0", ReadXstats(0));
  // The server closes its side first (memif's server-side handler must not
  // meet our close while its app winds down), unless it is the peer that
  // fell silent (it neither finished nor sent an ERROR): then nobody would
  // close it, and we must not wait. Asked before Finish, which closes the
  // control connection itself.
  const bool server_ends = failure.empty() || control_->server_gone();
  control_->Finish(failure.empty(), failure);
  if (server_ends) AwaitPeerClose(0, caps_);
  AddWorkerCounters(lc_, *control_, push_, *bcast_, ReadPortDrops(0), &report);
  report.counters.insert(report.counters.end(), resources.begin(),
                         resources.end());
  runtime_.PublishFinal(report.counters, !failure.empty());
  report.info = {
      {"source", source_->Describe()},
      {"link_gbps",
       o_.dp.link_gbps > 0 ? std::to_string(o_.dp.link_gbps) : "unpaced"},
      {"chunks", std::to_string(layout_.num_chunks())},
      {"chunk_bytes", std::to_string(layout_.chunk_payload())},
      {"loss", FormatLossSpec(o_.dp.loss)},
      {"driver", caps_.driver}};
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (const std::string err = CloseRunReport(rows_, report); !err.empty()) {
    DBLP_LOG(Error, "dblp-worker: %s", err.c_str());
    exit_code = 1;
  }
  if (!failure.empty()) source_->Fail(failure);
  rte_eth_dev_stop(0);
  rte_eth_dev_close(0);
  return exit_code;
}

}  // namespace

int RunWorker(const WorkerOptions& o, std::unique_ptr<GradientSource> source) {
  return WorkerRun(o, std::move(source)).Run();
}

}  // namespace dblp
