#include "worker/worker_engine.h"

#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/run_report.h"
#include "port/datapath.h"
#include "port/port.h"
#include "runtime/app_telemetry.h"
#include "runtime/eal_app.h"
#include "runtime/engine_runtime.h"
#include "runtime/numa_placement.h"
#include "worker/shard_link.h"
#include "worker/worker_control.h"
#include "worker/worker_lcore.h"
#include "worker/worker_setup.h"

namespace dblp {
namespace {

// One dblp-worker run: the DPDK transport (its lcore, one link per server
// shard: shard_link.h) under the WorkerJob.
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
  void BuildPorts();
  void BuildLink(ShardLink& l);
  void BuildHelpers();
  void BuildDatapath();
  void LaunchHelpers();
  void EndHelpers();
  std::vector<const LcoreConf*> Lcores() const;
  // The lcore that steps TX queue `q` of every link (q % lcores).
  unsigned OwnerOf(uint16_t q) const { return q % (helper_confs_.size() + 1); }
  LcoreConf& Conf(unsigned lcore) {
    return lcore == 0 ? lc_ : *helper_confs_[lcore - 1];
  }
  std::string RunIterations();
  PortDrops Drops() const;
  int Report(const std::string& failure);

  const WorkerOptions& o_;
  std::unique_ptr<GradientSource> source_;
  const std::atomic<bool>& quit_;
  RowStream rows_;
  LcoreConf lc_;  // lcore 0 (the main lcore): RX, control, broadcast
  // Lcores 1.. (EAL -l): helpers stepping the other TX queues' push sides
  // (PushCrew, lcore_loop.h); none with one lcore.
  std::vector<std::unique_ptr<LcoreConf>> helper_confs_;
  std::optional<PushCrew> crew_;
  std::vector<std::unique_ptr<WorkerPushLcore>> helpers_;
  WorkerShardLinks links_;  // links_[0]: the directory (or the only server)
  EngineRuntime runtime_{"dblp-worker", false};
  WelcomeMsg wel_;      // the directory's
  ChunkLayout layout_;  // the whole gradient's
  std::optional<WorkerJob> job_;
  rte_mempool* pool_ = nullptr;
  std::vector<uint16_t> ports_;  // the links' ports, each once
  std::vector<PortCaps> caps_;   // by port
  // By lcore, then port: each lcore paces its own share of --link_gbps.
  std::vector<std::vector<TokenBucket>> link_rate_;
  std::optional<RxLossInjector> loss_;  // on the broadcast we receive
  std::optional<RoundPacer> pacer_;
  std::optional<WorkerLcore> lcore_;
  // A test seam (--hostile_per_round installs one): called before each
  // push with the round and its send order (link 0's); none in a
  // production job.
  std::unique_ptr<PushHook> push_hook_;
  Bitmap arrived_;
  std::optional<ResourceTrack> resources_;  // mbufs and RSS over the run
};

// Every link's port, set up once with as many queues as the most any
// server shard on it asked for.
void WorkerRun::BuildPorts() {
  // Broadcasts on a shared port are told apart by their server's data
  // IPv4 (WorkerLcore::LinkRunOf): two shards with one address on one port
  // would hand each other's frames to the wrong link.
  for (size_t a = 0; a < links_.size(); ++a) {
    for (size_t b = a + 1; b < links_.size(); ++b) {
      if (links_[a].port == links_[b].port &&
          links_[a].wel.server_ipv4 == links_[b].wel.server_ipv4) {
        Die("server shards " + std::to_string(a) + " and " + std::to_string(b) +
                " both send from data IPv4 " +
                FormatIpv4(links_[a].wel.server_ipv4) + " to port " +
                std::to_string(links_[a].port) +
                ", where this worker tells their broadcasts apart by it",
            "give every server shard its own --local_ip, or this worker one "
            "port per shard (a --vdev per shard, port k for shard k)");
      }
    }
  }
  uint16_t nb_ports = 0, queues = 1;
  for (const auto& l : links_) {
    nb_ports = std::max<uint16_t>(nb_ports, l->port + 1);
    queues = std::max(queues, l->wel.lanes);
  }
  pool_ = CreateWorkerPool(o_, nb_ports, queues);
  caps_.resize(nb_ports);
  const size_t lcores = helper_confs_.size() + 1;
  link_rate_.resize(lcores);
  for (uint16_t p = 0; p < nb_ports; ++p) {
    uint16_t q = 1;
    for (const auto& l : links_) {
      if (l->port == p) q = std::max(q, l->wel.lanes);
    }
    caps_[p] = SetupWorkerPort(o_, p, q, pool_);
    ports_.push_back(p);
    // A port is a link: the lcores that send on it (one per TX queue,
    // OwnerOf) share its rate out.
    const double senders = static_cast<double>(std::min<size_t>(lcores, q));
    for (auto& rates : link_rate_) {
      rates.emplace_back(
          o_.dp.link_gbps / senders,
          uint64_t{o_.dp.burst} * WireBytesPerFrame(caps_[p].mtu));
    }
  }
}

// Link `l`'s frame template, push sides (one per lane of its
// server), broadcast receiver over its partition, and transmitters.
void WorkerRun::BuildLink(ShardLink& l) {
  const uint16_t queues = l.wel.lanes;
  l.caps = caps_[l.port];
  l.to_server = ServerTemplate(o_, l.wel, l.caps, &l.local);
  l.to_server.set_auth(l.key);
  for (uint16_t q = 0; q < queues; ++q) {
    SendSideConfig sc = PushSendConfig(
        l.wel.session, static_cast<uint16_t>(l.wel.rank), o_.dp.burst);
    sc.lane = q;
    l.push.push_back(std::make_unique<SendSide>(sc));
    l.push_ptrs.push_back(l.push.back().get());
  }
  l.bcast.emplace(BroadcastReceiveConfig(l.wel.session, l.layout, l.key));
  l.control.Attach(l.push_ptrs, &*l.bcast);
  for (uint16_t q = 0; q < queues; ++q) {
    // Lane q's chunks go to that server's UDP port base + q, which
    // its NIC steers to its queue q (steering.h); harmless on memif.
    const auto dst_port =
        static_cast<uint16_t>(queues > 1 ? l.wel.udp_base_port + q : 0);
    // Counted and paced by the lcore that steps queue q.
    const unsigned owner = OwnerOf(q);
    l.tx.push_back(ChunkTransmitter{
        l.port, q, pool_, &Conf(owner).counters, &link_rate_[owner][l.port], 8,
        WireBytesPerFrame(l.caps.mtu), o_.dp.prefetch, dst_port});
  }
  // Each helper lcore builds frames from its own copy (IP id, steering
  // port and authenticator are per template).
  l.helper_tmpl.assign(helper_confs_.size(), l.to_server);
  // The partition's bytes of the whole gradient and mean.
  const uint64_t at = layout_.Offset(l.first_chunk);
  l.gradient =
      reinterpret_cast<const uint8_t*>(job_->model().grad().data()) + at;
  l.mean = reinterpret_cast<uint8_t*>(job_->model().avg().data()) + at;
  if (o_.dp.tx_extbuf) {
    // The gradient stays put for the job (the model's buffer); a round's
    // frames are all freed before Exchange returns (DrainExtbuf), so the
    // trainer never writes under a frame still on a ring.
    l.extbuf = std::make_unique<ExtbufRegion>();
    const std::string err =
        l.extbuf->Init(l.gradient, l.layout.total_bytes(),
                       l.layout.num_chunks(), l.port, l.caps.driver);
    if (!err.empty()) Die(err, "use --tx_payload=copy");
    for (ChunkTransmitter& tx : l.tx) tx.extbuf = l.extbuf.get();
  }
}

// Helper lcore j's push sides: TX queue q of every link with q % lcores
// == j.
void WorkerRun::BuildHelpers() {
  if (helper_confs_.empty()) return;
  crew_.emplace(static_cast<unsigned>(helper_confs_.size()));
  for (unsigned j = 1; j <= helper_confs_.size(); ++j) {
    std::vector<WorkerPushLcore::Queue> queues;
    for (const auto& link : links_) {
      ShardLink& l = *link;
      for (uint16_t q = 0; q < l.push.size(); ++q) {
        if (OwnerOf(q) != j) continue;
        queues.push_back(WorkerPushLcore::Queue{
            l.push[q].get(),
            MbufFrames{&l.tx[q], &l.helper_tmpl[j - 1], l.gradient, &l.layout},
            l.control.outbox()});
      }
    }
    if (queues.empty()) {
      DBLP_LOG(Warning,
               "dblp-worker: lcore %u has no push side to step (the server "
               "shards have fewer lcores than this worker): give the worker "
               "at most as many lcores (-l) as the server has",
               Conf(j).lcore_id);
    }
    helpers_.push_back(std::make_unique<WorkerPushLcore>(
        Conf(j), *crew_, j - 1, std::move(queues), o_.dp.idle_spin,
        o_.dp.idle_sleep_us));
  }
}

int RunHelper(void* arg) {
  static_cast<WorkerPushLcore*>(arg)->Run();
  return 0;
}

void WorkerRun::LaunchHelpers() {
  for (auto& h : helpers_) {
    rte_eal_remote_launch(RunHelper, h.get(), h->conf().lcore_id);
  }
}

// After the last push (or a failure, which stopped the helpers' push).
void WorkerRun::EndHelpers() {
  if (!crew_) return;
  crew_->End();
  rte_eal_mp_wait_lcore();
}

std::vector<const LcoreConf*> WorkerRun::Lcores() const {
  std::vector<const LcoreConf*> all{&lc_};
  for (const auto& c : helper_confs_) all.push_back(c.get());
  return all;
}

// The ports, the links, the lcores that run them, the push hook.
void WorkerRun::BuildDatapath() {
  BuildPorts();
  for (const auto& l : links_) BuildLink(*l);
  if (std::string bad = links_.Seal(layout_.num_chunks()); !bad.empty()) {
    Die("the server shards' partitions do not fit this gradient: " + bad,
        "run every server shard and worker from the same DBLP build");
  }
  loss_.emplace(o_.dp.loss, o_.dp.bursts, HashMix(o_.dp.seed, wel_.rank + 1));
  loss_->set_injected(&GlobalAppState().burst);  // the prompt's inject burst
  GlobalAppState().worker_policy.Add("describe", wel_.policy);
  resources_.emplace(pool_);
  pacer_.emplace(o_.dp.idle_spin, o_.dp.idle_sleep_us, o_.dp.round_timeout_ms,
                 &quit_, nullptr, o_.dp.deep_idle);
  const std::span<float> grad = job_->model().grad(), avg = job_->model().avg();
  // The buffers the lcore streams through, next to the port.
  PlaceOnNodeOrWarn(std::span<const float>(grad), PortNumaNode(0),
                    "gradient buffer");
  PlaceOnNodeOrWarn(std::span<const float>(avg), PortNumaNode(0),
                    "mean buffer");
  BuildHelpers();
  lcore_.emplace(lc_, links_,
                 WorkerLcore::Setup{.loss = &*loss_,
                                    .pacer = &*pacer_,
                                    .crew = crew_ ? &*crew_ : nullptr,
                                    .prefetch = o_.dp.prefetch});
  if (o_.push_hook) {
    ShardLink& l = links_[0];
    push_hook_ = o_.push_hook(PushHookContext{
        &l.wel, pool_, &lc_.counters, &l.to_server, &l.caps, l.local,
        l.gradient, &l.layout, static_cast<uint16_t>(l.push.size()), l.key});
  }
}

std::string WorkerRun::Exchange(uint64_t it, std::span<const uint32_t> order) {
  std::string failure;
  if (!lcore_->AwaitPushRound(it, &failure)) return failure;
  links_.Split(order);
  if (push_hook_) push_hook_->BeforePush(it, PushRound(it), links_[0].order);
  lcore_->Exchange(it, &failure);
  links_.SnapshotArrived(&arrived_);
  return failure;
}

WorkerExchange WorkerRun::Exchanged(uint64_t it) const {
  const WorkerIterationTimes& t = lcore_->times();
  WorkerExchange x{it, wel_.rank, links_.push_sides(), t.bcast_done_ns};
  x.delivered_fraction = links_.delivered_fraction();
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
    for (const auto& l : links_) l->control.set_iteration(it);
    runtime_.ApplyWorkerCommand(it);  // the prompt's, before the round opens
    runtime_.WorkerStarted(it);
    failure = job_->Iterate(it, *this, links_, &more);
    if (!failure.empty() || !more) break;
    const IterationRecord& r = job_->last_row();
    runtime_.WorkerDone(it, r.p, r.critical, r.delivered_fraction);
    runtime_.PublishStats();
  }
  return failure;
}

PortDrops WorkerRun::Drops() const {
  PortDrops sum;
  for (const uint16_t p : ports_) {
    const PortDrops d = ReadPortDrops(p);
    sum.imissed += d.imissed;
    sum.ierrors += d.ierrors;
    sum.rx_nombuf += d.rx_nombuf;
    sum.oerrors += d.oerrors;
  }
  return sum;
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
  unsigned lcore_id;
  RTE_LCORE_FOREACH_WORKER(lcore_id) {
    helper_confs_.push_back(std::make_unique<LcoreConf>());
    helper_confs_.back()->lcore_id = lcore_id;
    helper_confs_.back()->lane = static_cast<uint16_t>(helper_confs_.size());
  }
  // The directory (or the only server), then every other server shard;
  // each WELCOME is checked (authenticity, layout, rank, ports, the
  // shard's claim), and a wrong one ends the worker naming the fix.
  JoinServerShards(o_, *source_, &lc_.counters, quit_, &links_);
  wel_ = links_[0].wel;
  layout_ = ChunkLayout(links_.size() > 1 ? wel_.model_bytes : wel_.total_bytes,
                        wel_.chunk_payload);
  for (const auto& l : links_) {
    l->layout = ChunkLayout(l->wel.total_bytes, l->wel.chunk_payload);
    l->first_chunk = l->wel.first_chunk;
    l->key = l->control.MemberFrameKey();
  }
  const WorkerJobSettings js{.bcast_fill = o_.bcast_fill,
                             .send_order = o_.dp.send_order,
                             .seed = o_.dp.seed,
                             .push_only = false,
                             .timeout_ms = o_.dp.round_timeout_ms,
                             .on_absorbed = o_.on_absorbed};
  StartWorkerSource(*source_, wel_, js, links_[0].control);
  job_.emplace(*source_, wel_, layout_, js);
  job_->set_row_stream(&rows_);
  BuildDatapath();
  PrintJoined(wel_, *source_, layout_, caps_[0], links_.size());
  loss_->StartClock(NowNs());
  runtime_.SetLcores(Lcores(), wel_.lanes);
  runtime_.SetCounters([&](CounterList* out) {
    RunReport live;
    AddWorkerCounters(Lcores(), links_, Drops(), &live);
    *out = std::move(live.counters);
  });
  runtime_.SetRunning(true);
  LaunchHelpers();
  const std::string failure = RunIterations();
  EndHelpers();
  runtime_.SetRunning(false);
  return Report(failure);
}

// The summary and the exit code; the ports close after the servers'. A
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
  // Before the servers close their sides: memif's counters end with the
  // link.
  for (const uint16_t p : ports_) {
    report.xstats.emplace_back("port" + std::to_string(p), ReadXstats(p));
  }
  // A server closes its side first (memif's server-side handler must not
  // meet our close while its app winds down), unless it is the peer that
  // fell silent (it neither finished nor sent an ERROR): then nobody would
  // close it, and we must not wait. Asked before Finish, which closes the
  // control connection itself.
  std::vector<bool> server_ends;
  for (const auto& l : links_) {
    server_ends.push_back(failure.empty() || l->control.server_gone());
  }
  for (const auto& l : links_) l->control.Finish(failure.empty(), failure);
  for (const uint16_t p : ports_) {
    // A port shared by several links: when every one of its servers ends.
    bool ends = true;
    for (size_t k = 0; k < links_.size(); ++k) {
      if (links_[k].port == p) ends = ends && server_ends[k];
    }
    if (ends) AwaitPeerClose(p, caps_[p]);
  }
  AddWorkerCounters(Lcores(), links_, Drops(), &report);
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
      {"driver", caps_[0].driver}};
  if (links_.size() > 1) {
    report.info.emplace_back("server_shards", std::to_string(links_.size()));
  }
  if (!helpers_.empty()) {
    report.info.emplace_back("lcores", std::to_string(helpers_.size() + 1));
  }
  std::fputs(FormatRunSummary(report).c_str(), stdout);
  int exit_code = failure.empty() ? 0 : 1;
  if (const std::string err = CloseRunReport(rows_, report); !err.empty()) {
    DBLP_LOG(Error, "dblp-worker: %s", err.c_str());
    exit_code = 1;
  }
  if (!failure.empty()) source_->Fail(failure);
  if (const std::string err = StopAndClosePorts(ports_); !err.empty()) {
    DBLP_LOG(Warning, "dblp-worker: %s", err.c_str());
  }
  return exit_code;
}

}  // namespace

int RunWorker(const WorkerOptions& o, std::unique_ptr<GradientSource> source) {
  return WorkerRun(o, std::move(source)).Run();
}

}  // namespace dblp
