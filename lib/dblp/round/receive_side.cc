#include "dblp/round/receive_side.h"

namespace dblp {

void ReceiveSide::Begin(uint32_t round, double p, uint64_t deadline_abs_ns,
                        double min_fraction, uint64_t now_ns) {
  progress_base_ += rx_.received() + 1;  // the new round resets received()
  rx_.Begin(round, p, deadline_abs_ns, min_fraction);
  begun_ = true;
  probe_pending_ = false;
  stop_ns_ = 0;
  first_ns_ = 0;
  deadline_after_ns_ = 0;
  poll_stop_ = false;
  if (have_early_ && early_.round == round) Apply(early_, now_ns);
  have_early_ = false;
}

void ReceiveSide::Announce(const RoundBeginEvent& e, uint64_t now_ns) {
  if (rx_.open() && e.round == rx_.round()) {
    Apply(e, now_ns);
  } else if (!begun_ || RoundIsOlder(rx_.round(), e.round)) {
    // The sender's side closed the previous round and announced this one
    // before our loop opened it: kept for Begin.
    early_ = e;
    have_early_ = true;
  }
}

void ReceiveSide::Apply(const RoundBeginEvent& e, uint64_t now_ns) {
  rx_.SetTolerance(e.p);
  rx_.SetDeadline(e.deadline_ns ? now_ns + e.deadline_ns : 0,
                  e.min_fraction);
  poll_stop_ = true;  // the new p may already be met
}

StopTrigger ReceiveSide::PollStop(uint64_t now_ns, uint32_t* received) {
  if (config_.group == nullptr) {
    const StopTrigger t = rx_.PollStop(now_ns);
    *received = rx_.received();
    return t;
  }
  if (!rx_.open()) return StopTrigger::kNone;
  return config_.group->Poll(rx_.round(), rx_.Rule(), now_ns, received);
}

bool ReceiveSide::AnswerProbe() {
  // A PROBE of a round that is over needs no answer: its STOP went out.
  if (probe_round_ != rx_.round()) return false;
  rx_.SnapshotBitmap(snapshot_);
  return answer_.Post(probe_round_, 0, snapshot_.size(), snapshot_.words());
}

}  // namespace dblp
