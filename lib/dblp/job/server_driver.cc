#include "dblp/job/server_driver.h"

namespace dblp {

void ServerCoordinator::PlanPush(uint64_t it) {
  planned_it_ = it;
  opening_ = job_.PlanPush(it);
}

// Opened (and timed) as it is announced, as before the lanes waited for
// each other.
void ServerCoordinator::AnnouncePush() {
  const PushOpening open = job_.OpenPush(planned_it_, t_.Now());
  t_.PushAnnounced(planned_it_, job_.PushTolerance(planned_it_));
  t_.Post(open.announce);
}

std::string ServerCoordinator::ClosePush(uint64_t it) {
  closed_push_.Gather(job_.workers(), job_.num_chunks(),
                      [&](uint32_t w) { return t_.PushLanes(w); });
  posts_.clear();
  const ReducedPush& r = job_.ClosePush(
      it, closed_push_.View(t_.Now(), t_.InBurst(it)), t_.Accepted(), &posts_);
  reduced_ = &r;
  // --on_bad_gradient=abort: no mean goes out.
  if (!r.failure.empty()) return r.failure;
  // Each worker's ACCEPTED, then the broadcast's ROUND_BEGIN, before the
  // next push's.
  for (const ControlRequest& req : posts_) t_.Post(req);
  t_.PushClosed(it, r);
  if (push_only_) t_.IterationDone(it);
  // A push-only job's rows are complete now (on disk, or the job ends).
  return job_.RowsFailure();
}

std::string ServerCoordinator::CloseBroadcast(uint64_t it) {
  bcast_lanes_.clear();
  for (uint32_t w = 0; w < job_.workers(); ++w) {
    bcast_lanes_.push_back(t_.BroadcastLanes(w));
  }
  job_.CloseBroadcast(bcast_lanes_);
  t_.IterationDone(it);
  return job_.RowsFailure();
}

}  // namespace dblp
