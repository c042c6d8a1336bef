// The engines' side of runtime visibility and control: what they publish
// into GlobalAppState() (lib/dblp/obs/app_state.h) for telemetry and the
// prompt, and the prompt's commands applied at a round boundary. One per
// engine; every method runs on the engine's coordinating thread (the
// server's lcore 0 coordinator, the worker's iteration loop), never per
// packet.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dblp/obs/app_state.h"
#include "dblp/policy/tolerance.h"
#include "runtime/lcore.h"

namespace dblp {

class EngineRuntime {
 public:
  // `app`: "dblp-server" / "dblp-worker". Publishes phase "joining".
  EngineRuntime(const char* app, bool server);
  ~EngineRuntime();  // the job ended: phase done, prompt waits released
  EngineRuntime(const EngineRuntime&) = delete;
  EngineRuntime& operator=(const EngineRuntime&) = delete;

  // What the stats publish: the summary's counters, filled on the
  // coordinating thread (where reading every lcore's sides is safe).
  void SetCounters(std::function<void(CounterList*)> fill) {
    fill_ = std::move(fill);
  }
  // The datapath lcores (their counters are atomics); `tx_queues` per lcore.
  void SetLcores(std::vector<const LcoreConf*> lcores, uint16_t tx_queues);
  // The server's policy in force (at start and after each change).
  void SetPolicy(const PolicyConfig& c, uint64_t from_iteration, bool change);
  // The job runs (the mailbox is served) / ended.
  void SetRunning(bool running);

  // The round state; change it, then PublishRound().
  RoundSnapshot& round() { return round_; }
  void PublishRound() { GlobalAppState().round.Store(round_); }
  // Server: iteration `it`'s push announced at `t`.
  void PushOpened(uint64_t it, const RoundTolerance& t);
  // Server: its broadcast announced at `bcast`; the next push will run at
  // `next_push`.
  void BroadcastOpened(uint64_t it, const RoundTolerance& bcast,
                       const RoundTolerance& next_push);
  // Iteration `it` is complete.
  void IterationDone(uint64_t it);
  // Worker: iteration `it` starts / ended with its push at `p`.
  void WorkerStarted(uint64_t it);
  void WorkerDone(uint64_t it, double p, bool critical, double delivered);
  // The counters and lcores, at most every 10 ms unless `force`.
  void PublishStats(bool force = false);
  // At the end: the summary's final counters (resource gauges included).
  void PublishFinal(const CounterList& counters, bool failed);

  // Server, at the boundary before iteration `next_it`: applies a waiting
  // command (set p / set policy: `*policy` replaced; inject burst: from
  // `next_it`; clear stats) and logs it. True if the policy changed.
  bool ApplyServerCommand(uint64_t next_it,
                          std::unique_ptr<TolerancePolicy>* policy);
  // Set p / set policy are refused with `why` (a sharded job: p is the
  // directory's one phase for every shard).
  void RefusePolicyChanges(std::string why) {
    policy_refusal_ = std::move(why);
  }
  // Worker, before iteration `it` starts.
  void ApplyWorkerCommand(uint64_t it);

 private:
  void ApplyCommon(const RuntimeCommand& c, uint64_t from_it, RuntimeResult* r);
  const char* app_;
  RoundSnapshot round_;
  std::function<void(CounterList*)> fill_;
  std::vector<const LcoreConf*> lcores_;
  uint16_t tx_queues_ = 1;
  uint64_t last_stats_ns_ = 0;
  CounterList scratch_;
  PolicySnapshot policy_;
  std::string policy_refusal_;
};

}  // namespace dblp
