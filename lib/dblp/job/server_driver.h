// The server's iteration, written once for every transport (the worker's
// twin is WorkerJob::Iterate): the order of the job's calls, where the
// datapath threads wait for each other, and who decides. dblp-server's
// DPDK lcores and dblp-udp-server's thread run ServeIterations; the
// simulator, which runs every shard and worker on one modelled clock,
// takes the coordinator's steps in the same order. The transport supplies
// its poll loop and its sides (ServerLane) and, once per job, what the
// coordinator needs of it (ServerTransport); it decides nothing.
//
// Per iteration `it`, on every lane (a datapath thread owning a slice of
// every round: a DPDK lcore, the UDP server's one thread); "|" is a
// barrier every lane waits at:
//
//   RunRound(push)          until the job's PushOver: closed, or every
//                           live worker said BYE
//   |                       the coordinator's view of PushOver decides
//                           for all (all BYE: the job ends)
//   ClosePushSides  |
//   coordinator: ClosePush  Gather, mean, policy, each ACCEPTED and the
//                           broadcast's ROUND_BEGIN posted; the app's hook
//                           (the prompt may change the next p); PlanPush
//                           (it + 1)
//   |  OpenPushSides(it + 1)  |
//   coordinator: AnnouncePush  ServerJob::OpenPush (the rows time the push
//                           from here) and its ROUND_BEGIN: a worker's
//                           first frame finds every lane's sides open
//   BeginBroadcastSides(it) each worker's order (BroadcastOrder)
//   RunRound(broadcast)     until BroadcastOver
//   |
//   coordinator: CloseBroadcast  the rows, on disk, while the other lanes
//                           already run push it + 1 (they touch no
//                           broadcast side and no row there)
//
// Iteration 0's push is planned, opened on every lane and announced the
// same way before the loop. A push-only job skips the broadcast.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dblp/job/server_job.h"

namespace dblp {

// What the job's coordinator needs of a transport, once per job. Virtual:
// it is called a few times per iteration, never per frame.
class ServerTransport {
 public:
  virtual ~ServerTransport() = default;
  // The clock of the transport's rounds (the simulator's is modelled).
  virtual uint64_t Now() = 0;
  // Worker w's push sides and broadcast sides, one per lane.
  virtual std::span<const ReceiveSide* const> PushLanes(uint32_t w) = 0;
  virtual std::span<const SendSide* const> BroadcastLanes(uint32_t w) = 0;
  // A control request to the workers, in the order posted; push feedback's
  // ACCEPTED are staged in Accepted() before the request that sends them.
  virtual void Post(const ControlRequest& r) = 0;
  virtual AcceptedSlots* Accepted() = 0;
  // Whether iteration `it` ran in a microburst (the rows say so).
  virtual bool InBurst(uint64_t it) = 0;
  // What the app adds at the boundaries (telemetry, the runtime prompt);
  // nothing by default.
  virtual void PushAnnounced(uint64_t /*it*/, const RoundTolerance& /*t*/) {}
  // Push `it` closed (the broadcast of `r` about to go out): the app may
  // change the next push's tolerance (ServerJob::OverrideNextPush).
  virtual void PushClosed(uint64_t /*it*/, const ReducedPush& /*r*/) {}
  // Every worker holds its share of iteration `it`'s mean (or, push only,
  // its push closed).
  virtual void IterationDone(uint64_t /*it*/) {}
};

// The job's decisions at an iteration's boundaries, taken by one lane (the
// coordinator) while the others wait at a barrier. What it decided for
// every lane (opening, all_bye) is written before a barrier and read after.
class ServerCoordinator {
 public:
  ServerCoordinator(ServerJob& job, ServerTransport& t, bool push_only)
      : job_(job), t_(t), push_only_(push_only) {}

  // Plans iteration `it`'s push: its tolerance and the sides' deadline
  // (opening()), which every lane opens its sides with.
  void PlanPush(uint64_t it);
  // The push planned last opens (ServerJob::OpenPush: the rows time it
  // from here) and is announced (ROUND_BEGIN), once every lane's sides
  // are open for it.
  void AnnouncePush();
  // Push `it` closed on every lane: the mean, the policy, the requests
  // (ACCEPTED, the broadcast's ROUND_BEGIN). "" or why the job ends (no
  // mean goes out).
  std::string ClosePush(uint64_t it);
  // Every lane's broadcast of iteration `it` is done: "" or why the job
  // ends (a row that could not be written under --rows_on_error=fail).
  std::string CloseBroadcast(uint64_t it);

  const PushOpening& opening() const { return opening_; }
  // The last ClosePush's gathered push (per worker, what arrived).
  const ClosedPushSides& closed_push() const { return closed_push_; }
  // The last ClosePush's decision (norm, the broadcast's tolerance).
  const ReducedPush& reduced() const { return *reduced_; }
  bool all_bye() const { return all_bye_; }
  void set_all_bye(bool b) { all_bye_ = b; }
  bool push_only() const { return push_only_; }
  ServerJob& job() { return job_; }

 private:
  ServerJob& job_;
  ServerTransport& t_;
  const bool push_only_;
  uint64_t planned_it_ = 0;
  PushOpening opening_;
  bool all_bye_ = false;
  const ReducedPush* reduced_ = nullptr;
  ClosedPushSides closed_push_;
  std::vector<ControlRequest> posts_;
  std::vector<std::span<const SendSide* const>> bcast_lanes_;
};

// One datapath thread's part of the job, as a transport runs it.
template <class L>
concept ServerLane = requires(L l, uint64_t it, uint32_t w, bool broadcasting,
                              const PushOpening& open,
                              std::function<bool()> done) {
  // Its poll loop until done() (true), or until the job failed, was
  // interrupted or stalled past --on_worker_loss (false; the lane has
  // recorded why in the job's sync).
  { l.RunRound(it, broadcasting, done) } -> std::same_as<bool>;
  // Worker w's push of iteration `it` STOPped (on every lane); its
  // broadcast side on this lane is done.
  { l.PushStopped(w, it) } -> std::same_as<bool>;
  { l.BroadcastDone(w) } -> std::same_as<bool>;
  {l.ClosePushSides()};
  {l.OpenPushSides(it, open)};
  // False (the lane has recorded why) when the broadcast cannot start.
  { l.BeginBroadcastSides(it) } -> std::same_as<bool>;
};

// The lanes of one job: a barrier between the phases, the first failure.
template <class S>
concept ServerSync = requires(S s, const std::string& why) {
  // False, without waiting, once the job failed or was interrupted.
  { s.Barrier() } -> std::same_as<bool>;
  {s.Fail(why)};
};

// One lane's sync (the UDP server's one thread): nobody to wait for.
class SoloSync {
 public:
  bool Barrier() const { return failure_.empty(); }
  void Fail(const std::string& why) {
    if (failure_.empty()) failure_ = why.empty() ? "failed" : why;
  }
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }

 private:
  std::string failure_;
};

// The whole job on one lane: iterations until every live worker said BYE
// or the job fails (`sync` holds why). Exactly one lane of a job runs it
// with `coordinating`; every lane's `coord` is the same object.
template <ServerLane Lane, ServerSync Sync>
void ServeIterations(Lane& lane, Sync& sync, ServerCoordinator& coord,
                     bool coordinating) {
  // The coordinator's step, then a barrier every lane waits at.
  auto decide = [&](auto&& step) {
    if (coordinating) {
      if (std::string failure = step(); !failure.empty()) sync.Fail(failure);
    }
    return sync.Barrier();
  };
  auto open_push = [&](uint64_t it) {
    lane.OpenPushSides(it, coord.opening());
    if (!sync.Barrier()) return false;
    if (coordinating) coord.AnnouncePush();
    return true;
  };
  ServerJob& job = coord.job();
  if (!decide([&] {
        coord.PlanPush(0);
        return std::string();
      }) ||
      !open_push(0)) {
    return;
  }
  for (uint64_t it = 0;; ++it) {
    ServerJob::PushState state = ServerJob::PushState::kOpen;
    const bool pushed = lane.RunRound(it, false, [&] {
      state = job.PushOver([&](uint32_t w) { return lane.PushStopped(w, it); });
      return state != ServerJob::PushState::kOpen;
    });
    if (!pushed) return;
    // The coordinator's view decides for all: the lanes may see the last
    // BYE at different turns.
    if (coordinating) {
      coord.set_all_bye(state == ServerJob::PushState::kAllBye);
    }
    if (!sync.Barrier() || coord.all_bye()) return;
    lane.ClosePushSides();
    if (!sync.Barrier()) return;
    if (!decide([&] {
          std::string failure = coord.ClosePush(it);
          if (failure.empty()) coord.PlanPush(it + 1);
          return failure;
        }) ||
        !open_push(it + 1)) {
      return;
    }
    if (coord.push_only()) continue;
    if (!lane.BeginBroadcastSides(it)) return;
    const bool broadcast = lane.RunRound(it, true, [&] {
      return job.BroadcastOver(
          [&](uint32_t w) { return lane.BroadcastDone(w); });
    });
    // Every lane's broadcast done before the rows read their sides. A
    // failure to write them reaches the other lanes in their next turn.
    if (!broadcast || !sync.Barrier()) return;
    if (coordinating) {
      if (std::string failure = coord.CloseBroadcast(it); !failure.empty()) {
        sync.Fail(failure);
        return;
      }
    }
  }
}

}  // namespace dblp
