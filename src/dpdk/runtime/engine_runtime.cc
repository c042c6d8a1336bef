#include "runtime/engine_runtime.h"

#include <cstdio>
#include <string>

#include "dblp/base/log.h"
#include "port/datapath.h"  // NowNs

namespace dblp {
namespace {
constexpr uint64_t kStatsPeriodNs = 10 * 1000 * 1000;  // 10 ms
}  // namespace

EngineRuntime::EngineRuntime(const char* app, bool server) : app_(app) {
  AppState& s = GlobalAppState();
  s.app.store(app);
  s.is_server.store(server);
  round_.phase = JobPhase::kJoining;
  PublishRound();
}

EngineRuntime::~EngineRuntime() {
  SetRunning(false);
  round_.phase = JobPhase::kDone;
  PublishRound();
}

void EngineRuntime::SetLcores(std::vector<const LcoreConf*> lcores,
                              uint16_t tx_queues) {
  lcores_ = std::move(lcores);
  tx_queues_ = tx_queues;
}

void EngineRuntime::SetPolicy(const PolicyConfig& c, uint64_t from_iteration,
                              bool change) {
  policy_.config = c;
  policy_.known = 1;
  if (change) {
    ++policy_.changes;
    policy_.from_iteration = from_iteration;
  }
  GlobalAppState().policy.Store(policy_);
}

void EngineRuntime::SetRunning(bool running) {
  GlobalAppState().running.store(running, std::memory_order_release);
}

void EngineRuntime::PushOpened(uint64_t it, const RoundTolerance& t) {
  round_.phase = JobPhase::kPush;
  round_.iteration = it;
  round_.push_round = PushRound(it);
  round_.p = t.p;
  round_.critical = t.critical ? 1 : 0;
  PublishRound();
}

void EngineRuntime::BroadcastOpened(uint64_t it, const RoundTolerance& bcast,
                                    const RoundTolerance& next_push) {
  round_.phase = JobPhase::kBroadcast;
  round_.iteration = it;
  round_.broadcast_round = BroadcastRound(it);
  round_.broadcast_p = bcast.p;
  round_.next_p = next_push.p;
  PublishRound();
}

void EngineRuntime::IterationDone(uint64_t it) {
  round_.iterations_done = it + 1;
  PublishRound();
}

void EngineRuntime::WorkerStarted(uint64_t it) {
  round_.phase = JobPhase::kPush;
  round_.iteration = it;
  round_.push_round = PushRound(it);
  round_.broadcast_round = BroadcastRound(it);
  PublishRound();
}

void EngineRuntime::WorkerDone(uint64_t it, double p, bool critical,
                               double delivered) {
  round_.p = p;
  round_.broadcast_p = p;  // the server announces both at the same p
  round_.critical = critical ? 1 : 0;
  round_.delivered = delivered;
  round_.iterations_done = it + 1;
  PublishRound();
}

void EngineRuntime::PublishStats(bool force) {
  const uint64_t now = NowNs();
  if (!force && now - last_stats_ns_ < kStatsPeriodNs) return;
  last_stats_ns_ = now;
  AppState& s = GlobalAppState();
  if (fill_) {
    scratch_.clear();
    fill_(&scratch_);
    s.stats.Publish(scratch_);
  }
  LcoreTable t;
  for (const LcoreConf* lc : lcores_) {
    if (t.count >= LcoreTable::kMax) break;
    LcoreSnapshot& l = t.lcores[t.count++];
    l.lcore_id = lc->lcore_id;
    l.lane = lc->lane;
    l.queues = tx_queues_;
    const DatapathCounters& c = lc->counters;
    l.rx_frames = c.rx_frames.load(std::memory_order_relaxed);
    l.tx_frames = c.tx_frames.load(std::memory_order_relaxed);
    l.injected_drops = c.injected_drops.load(std::memory_order_relaxed);
    l.tx_ring_full = c.tx_ring_full.load(std::memory_order_relaxed);
    l.mbuf_alloc_failures =
        c.mbuf_alloc_failures.load(std::memory_order_relaxed);
  }
  s.lcores.Store(t);
}

void EngineRuntime::PublishFinal(const CounterList& counters, bool failed) {
  PublishStats(true);
  GlobalAppState().stats.Publish(counters);
  round_.failed = failed ? 1 : 0;
  round_.phase = JobPhase::kDone;
  SetRunning(false);
  PublishRound();
}

void EngineRuntime::ApplyCommon(const RuntimeCommand& c, uint64_t from_it,
                                RuntimeResult* r) {
  switch (c.kind) {
    case RuntimeCommand::Kind::kInjectBurst:
      GlobalAppState().burst.Set(from_it, c.iterations, c.loss);
      round_.burst_first = from_it;
      round_.burst_count = c.iterations;
      round_.burst_loss = c.loss;
      r->ok = true;
      std::snprintf(
          r->text, sizeof(r->text), "loss %g on iterations %llu..%llu", c.loss,
          static_cast<unsigned long long>(from_it),
          static_cast<unsigned long long>(from_it + c.iterations - 1));
      break;
    case RuntimeCommand::Kind::kClearStats:
      PublishStats(true);
      GlobalAppState().stats.ClearToLast();
      r->ok = true;
      std::snprintf(r->text, sizeof(r->text), "counters cleared");
      break;
    default:
      r->ok = false;
      std::snprintf(r->text, sizeof(r->text), "not a command of %s", app_);
      return;
  }
}

bool EngineRuntime::ApplyServerCommand(
    uint64_t next_it, std::unique_ptr<TolerancePolicy>* policy) {
  RuntimeCommand c;
  if (!GlobalAppState().mailbox.Take(&c)) return false;
  RuntimeResult r;
  r.from_iteration = next_it;
  bool changed = false;
  if (c.kind == RuntimeCommand::Kind::kSetPolicy && !policy_refusal_.empty()) {
    r.ok = false;
    std::snprintf(r.text, sizeof(r.text), "%s", policy_refusal_.c_str());
  } else if (c.kind == RuntimeCommand::Kind::kSetPolicy) {
    try {
      *policy = TolerancePolicy::Create(c.policy);
      SetPolicy(c.policy, next_it, true);
      changed = true;
      r.ok = true;
      std::snprintf(r.text, sizeof(r.text),
                    "p=%g (policy %s) from iteration %llu",
                    (*policy)->Current().p, (*policy)->Describe().c_str(),
                    static_cast<unsigned long long>(next_it));
    } catch (const std::exception& e) {
      r.ok = false;
      std::snprintf(r.text, sizeof(r.text), "%s", e.what());
    }
  } else {
    ApplyCommon(c, next_it, &r);
    if (r.ok) {
      const std::string t = r.text;
      std::snprintf(r.text, sizeof(r.text), "%s from iteration %llu", t.c_str(),
                    static_cast<unsigned long long>(next_it));
    }
  }
  if (r.ok) {
    ++round_.changes;
    round_.last_change_iteration = next_it;
    DBLP_LOG(Notice, "%s: runtime: %s (push round %u on)", app_, r.text,
             PushRound(next_it));
  }
  GlobalAppState().mailbox.Done(r);
  PublishRound();
  return changed;
}

void EngineRuntime::ApplyWorkerCommand(uint64_t it) {
  RuntimeCommand c;
  if (!GlobalAppState().mailbox.Take(&c)) return;
  RuntimeResult r;
  r.from_iteration = it;
  ApplyCommon(c, it, &r);
  if (r.ok) {
    ++round_.changes;
    round_.last_change_iteration = it;
    const std::string t = r.text;
    std::snprintf(r.text, sizeof(r.text), "%s from iteration %llu", t.c_str(),
                  static_cast<unsigned long long>(it));
    DBLP_LOG(Notice, "%s: runtime: %s", app_, r.text);
  }
  GlobalAppState().mailbox.Done(r);
  PublishRound();
}

}  // namespace dblp
