// The server's job, written once for every transport (dblp-server's DPDK
// lcores, dblp-udp-server's thread, the simulator's modelled clock). The
// transport runs the rounds (its sides, its poll loop, its clock) and calls
// this at each boundary of an iteration:
//
//   OpenPush(it)            the push's tolerance and ROUND_BEGIN
//   ... the transport runs the push until every live worker's STOP ...
//   ClosedPushSides::Gather the closed push's bitmaps and STOPs, merged
//                           over each worker's lanes
//   ClosePush(it, ...)      mean, policy, rows, ACCEPTED, the broadcast's
//                           ROUND_BEGIN and plan (BroadcastOrder)
//   OpenPush(it + 1)        the next push opens beside the broadcast
//   ... the transport runs the broadcast until every live worker's STOP ...
//   CloseBroadcast(it, ...) the rows are complete and on disk
//
// and, between turns, the workers' lifecycle: BYE, a lost connection, a
// worker that finished early, each decided here (--on_worker_loss). When a
// round is over is decided here too (PushOver, BroadcastOver), from what
// the transport's sides say of each worker. The job returns the control
// requests to post, in order; it never touches a frame.
//
// At debug level every call above is logged as "<app>: job: ..." with what
// it decided, in the order made: the same lines, in the same order, from
// every transport running the same job (tests/server_call_order_test.py).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/accepted_mail.h"
#include "dblp/job/diagnosis.h"
#include "dblp/job/server_iteration.h"
#include "dblp/obs/records.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_events.h"
#include "dblp/round/send_order.h"
#include "dblp/round/send_side.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/wire.h"

namespace dblp {

// One closed push, per worker: what arrived (every shard's chunks) and its
// STOP (the last shard's).
struct ClosedPush {
  uint64_t now_ns = 0;  // when the last side closed
  std::span<const Bitmap> arrived;
  std::span<const uint64_t> stop_ns;
  bool burst = false;  // the iteration ran in a microburst
  // When the push's first chunk arrived, on any side (ReceiveSide::
  // first_ns; 0: none). The push's time, which the deadline policies
  // learn from, runs from here, not from the opening beside the broadcast
  // before it.
  uint64_t first_ns = 0;
};

// A closed push gathered from the transport's sides, the same way on every
// transport: per worker, the union of its lanes' arrived chunks (each lane
// owns a chunk range, chunk_ranges.h; one lane where the transport has
// none) and the last lane's STOP; and the push's first chunk on any side.
// The transport closes its sides (ReceiveSide::Close), calls Gather, and
// hands View() to ServerJob::ClosePush. Reused every iteration: no
// allocation after the first.
class ClosedPushSides {
 public:
  // `lanes(w)`: worker w's push sides, one per lane, as a
  // std::span<const ReceiveSide* const>.
  template <class Lanes>
  void Gather(uint32_t workers, uint32_t num_chunks, Lanes lanes);
  ClosedPush View(uint64_t now_ns, bool burst) const {
    return ClosedPush{now_ns, arrived_, stop_ns_, burst, first_ns_};
  }
  std::span<const Bitmap> arrived() const { return arrived_; }
  uint64_t first_ns() const { return first_ns_; }

 private:
  std::vector<Bitmap> arrived_;
  std::vector<uint64_t> stop_ns_;
  uint64_t first_ns_ = 0;
  Bitmap part_;  // one lane's
};

template <class Lanes>
void ClosedPushSides::Gather(uint32_t workers, uint32_t num_chunks,
                             Lanes lanes) {
  arrived_.resize(workers);
  stop_ns_.assign(workers, 0);
  first_ns_ = 0;
  for (uint32_t w = 0; w < workers; ++w) {
    const std::span<const ReceiveSide* const> sides = lanes(w);
    Bitmap& arrived = arrived_[w];
    if (sides.size() == 1) {
      sides[0]->receiver().SnapshotBitmap(arrived);
    } else {
      arrived.Resize(num_chunks);
      for (const ReceiveSide* side : sides) {
        side->receiver().SnapshotBitmap(part_);
        arrived.OrWith(part_);
      }
    }
    for (const ReceiveSide* side : sides) {
      stop_ns_[w] = std::max(stop_ns_[w], side->stop_ns());
      const uint64_t f = side->first_ns();
      if (f != 0 && (first_ns_ == 0 || f < first_ns_)) first_ns_ = f;
    }
  }
}

// An opened push round: its ROUND_BEGIN, and the push sides' deadline,
// counted from each side's first chunk (ReceiveSide::
// DeadlineAfterFirstChunk; 0: none).
struct PushOpening {
  RoundBeginRequest announce;
  uint64_t deadline_after_first_ns = 0;
};

class ServerJob {
 public:
  // `policy` is the job's (made before the join so the WELCOME can
  // describe it); `app` names the server in logs and failure texts; `names`
  // the workers (JOIN's). Throws std::bad_alloc when the sums do not fit.
  // `shards`: the datapath threads that sum chunks (MeanReducer's).
  ServerJob(const ServerJobSettings& s, std::unique_ptr<TolerancePolicy> policy,
            const ChunkLayout& layout, std::vector<std::string> names,
            SendOrderKind order, uint64_t seed, std::string app,
            uint32_t shards = 1);

  // ---- the iteration ----
  // Iteration `it`'s push tolerance (a resync's is reliable).
  RoundTolerance PushTolerance(uint64_t it) const {
    return iteration_.PushTolerance(it, next_);
  }
  // What iteration `it`'s push sides begin with (announce.round, .p,
  // .min_fraction, and deadline_after_first_ns: each side's deadline from
  // its first chunk) and its ROUND_BEGIN, before it opens: the lanes open
  // their sides with it, then OpenPush announces.
  PushOpening PlanPush(uint64_t it) const;
  // Opens it at `now_ns` (PlanPush's opening). The rows time each worker's
  // push from here; the policy learns the push's time from its first
  // chunk (ClosedPush::first_ns).
  PushOpening OpenPush(uint64_t it, uint64_t now_ns);
  // Every live worker's push side closed: reduces, runs the policy, adds
  // the push half of each worker's row, stages push feedback in `accepted`
  // and appends to `post` the requests to send, in order (each worker's
  // ACCEPTED, then the broadcast's ROUND_BEGIN).
  const ReducedPush& ClosePush(uint64_t it, const ClosedPush& c,
                               AcceptedSlots* accepted,
                               std::vector<ControlRequest>* post);
  // The next push runs under `t` instead of the policy's (the prompt's
  // change, at this boundary).
  void OverrideNextPush(const RoundTolerance& t) { next_ = t; }
  // Worker w's first pass of iteration `it`'s broadcast: the consistent
  // subset, or its own order. Const: lcores call it side by side.
  void BroadcastOrder(uint32_t w, uint64_t it, uint32_t num_chunks,
                      std::vector<uint32_t>* out) const;
  // Every live worker's broadcast is done: completes the rows (each
  // worker's broadcast sides, one per shard) and writes them.
  void CloseBroadcast(std::span<const std::span<const SendSide* const>> sides);

  // ---- when a round is over: one rule for every transport ----
  enum class PushState : uint8_t {
    kOpen,    // a live worker still pushes
    kClosed,  // every live worker's push STOPped: ClosePush
    kAllBye,  // every live worker said BYE instead: the job is over
  };
  // `stopped(w)`: worker w's push side (on this datapath thread) STOPped.
  template <class Stopped>
  PushState PushOver(Stopped stopped) const;
  // `done(w)`: worker w's broadcast side (on this thread) is done.
  template <class Done>
  bool BroadcastOver(Done done) const {
    for (uint32_t w = 0; w < workers(); ++w) {
      if (alive(w) && !done(w)) return false;
    }
    return true;
  }
  // How a worker's connection ended, as its control thread saw it.
  struct GoneReason {
    bool failed = false;  // an error, not a plain close
    std::string why;
  };
  // A BYE or a lost connection from the control thread (`reason(w)`: how
  // worker w's connection ended), during iteration `it`: "" while the job
  // goes on, else why it ends.
  template <class Reason>
  std::string OnEvent(const DatapathEvent& e, uint64_t it, Reason reason);

  // ---- the workers ----
  // Any thread: whether worker w's frames still count.
  bool alive(uint32_t w) const {
    return alive_[w].load(std::memory_order_relaxed);
  }
  // The flags themselves, for a per-frame check without the indirection.
  const std::atomic<bool>* alive_flags() const { return alive_.get(); }
  uint32_t live_count() const;
  uint32_t workers() const { return static_cast<uint32_t>(names_.size()); }
  uint32_t num_chunks() const { return layout_.num_chunks(); }
  // Coordinator: worker w finished its iterations (BYE).
  void OnBye(uint32_t w);
  // Any thread.
  bool said_bye(uint32_t w) const {
    return bye_[w].load(std::memory_order_relaxed);
  }
  bool AllLiveSaidBye() const;
  // Worker w is gone: "" when the job goes on without it (its frames are
  // dropped and a round's mean counts it only if some of its chunks of
  // that round arrived: ClosePush),
  // else why the job ends.
  // `lost_now` (may be null): whether this call took it out (two threads
  // may name the same worker; one does).
  std::string Lose(uint32_t w, const std::string& how, uint64_t it,
                   bool* lost_now = nullptr);
  // Worker w's connection closed (`failed`: with an error, `why`): after
  // its BYE a plain close is a finish, anything else a loss.
  std::string OnGone(uint32_t w, bool failed, const std::string& why,
                     uint64_t it);
  // A worker that said BYE while another pushes iteration `it` ran fewer
  // iterations: the round could never close. `received(w)`: chunks of
  // w's push so far; `stopped(w)`: its push STOPped.
  template <class Received, class Stopped>
  std::string FinishedEarly(uint64_t it, Received received, Stopped stopped);
  // A round made no progress for the timeout (`stalled`: its text). Under
  // --on_worker_loss=continue the live workers it still waits for
  // (`waiting(w)`, the negation of the round's own "done" for w) are lost
  // and "" says the round goes on without them, unless it waits for every
  // live worker: that is the link's or this server's stall, not a member's
  // silence. Else `stalled`, why the job ends. Any datapath thread whose
  // round stalled may call it: each loss happens once.
  // `dropped`: the workers this call took out, to be told (DropRequest).
  template <class Waiting>
  std::string LoseSilent(uint64_t it, bool broadcast, uint32_t timeout_ms,
                         Waiting waiting, std::string stalled,
                         std::vector<uint32_t>* dropped);
  // The text of a stalled push: what each worker delivered.
  // `injected`: frames this server's loss injector dropped while the
  // round waited (PushStalledHint).
  template <class Received>
  std::string PushStalled(uint64_t it, uint32_t timeout_ms, Received received,
                          uint64_t injected = 0) const;
  // The text of a stalled broadcast: the workers not done(w).
  template <class Done>
  std::string BroadcastStalled(uint64_t it, uint32_t timeout_ms,
                               Done done) const;

  // ---- what it holds ----
  ServerIteration& iteration() { return iteration_; }
  std::vector<IterationRecord>& rows() { return rows_; }
  void set_row_stream(RowStream* s) { stream_ = s; }
  // What the job refused and clipped, by the summary's names
  // (bad_gradient_*, clipped_chunks, clr_nonfinite_norms).
  void AddCounters(NamedCounters* out) const;
  // Why the job must end now ("" while it may go on): a row could not be
  // written under --rows_on_error=fail. Transports ask after ClosePush and
  // CloseBroadcast.
  std::string RowsFailure() const {
    return stream_ != nullptr && stream_->failed() ? stream_->error() : "";
  }
  // The job's settings for a summary's info (chunks, fill, broadcast,
  // resync), the same keys on every transport.
  std::vector<std::pair<std::string, std::string>> Info() const;

 private:
  const ServerJobSettings s_;
  const SendOrderKind order_kind_;
  const ChunkLayout layout_;
  const std::vector<std::string> names_;
  const std::string app_;
  ServerIteration iteration_;
  std::vector<SendOrder> orders_;  // per worker, the broadcast's
  // --send_order=magnitude: the mean's chunks, largest first, the same
  // for every worker (a clean broadcast cut at 1 - p then leaves every
  // replica the same chunks). Written by ClosePush, read by the lcores.
  std::vector<uint32_t> magnitude_order_;
  std::vector<double> chunk_norms_;
  RoundTolerance next_;            // the next push's, before resync
  RoundTolerance push_tol_;        // the open push's
  uint64_t push_open_ns_ = 0;
  ReducedPush reduced_;
  // Per worker. alive_: writers the coordinator (Lose) and, under
  // --on_worker_loss=continue, a datapath thread whose round stalled
  // (LoseSilent; an exchange, so each loss happens once); readers every
  // datapath thread (per frame) and the control thread (no ROUND_BEGIN to
  // a lost worker); bye_: writer the coordinator (OnBye), readers every
  // datapath thread (a push round ends when every live worker said BYE).
  std::unique_ptr<std::atomic<bool>[]> alive_;
  std::unique_ptr<std::atomic<bool>[]> bye_;
  std::vector<IterationRecord> rows_;
  RowStream* stream_ = nullptr;
  // Members who lie: "" or why the job ends; counts and logs under drop.
  std::string CheckContributions(uint64_t it, const ReducedPush& r);
  std::vector<uint64_t> bad_by_worker_;  // chunks refused, whole job
  uint64_t nonfinite_chunks_ = 0;
  uint64_t overflow_chunks_ = 0;
  uint64_t clipped_chunks_ = 0;
  uint64_t nonfinite_means_ = 0;
  uint64_t nonfinite_mean_floats_ = 0;  // set to 0 before the broadcast
  uint64_t broadcast_it_ = 0;           // the iteration ClosePush closed
  // One "job:" line at debug level (the header's comment).
  void Journal(const std::string& what) const;
};

template <class Stopped>
ServerJob::PushState ServerJob::PushOver(Stopped stopped) const {
  bool all_stopped = true;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (alive(w)) all_stopped = all_stopped && stopped(w);
  }
  // A push that every live worker STOPped closes even if they said BYE
  // too: its mean is owed.
  if (all_stopped) return PushState::kClosed;
  return AllLiveSaidBye() ? PushState::kAllBye : PushState::kOpen;
}

template <class Reason>
std::string ServerJob::OnEvent(const DatapathEvent& e, uint64_t it,
                               Reason reason) {
  if (const auto* bye = std::get_if<PeerByeEvent>(&e)) {
    if (bye->peer < workers()) OnBye(bye->peer);
  } else if (const auto* gone = std::get_if<PeerGoneEvent>(&e)) {
    const uint32_t w = gone->peer;
    if (w >= workers()) return "";
    const GoneReason r = reason(w);
    return OnGone(w, r.failed, r.why, it);
  }
  return "";
}

template <class Received, class Stopped>
std::string ServerJob::FinishedEarly(uint64_t it, Received received,
                                     Stopped stopped) {
  bool others_push = false;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (alive(w) && !said_bye(w) && received(w) > 0) others_push = true;
  }
  if (!others_push) return "";
  for (uint32_t w = 0; w < workers(); ++w) {
    if (alive(w) && said_bye(w) && !stopped(w)) {
      std::string failure = Lose(w, FinishedEarlyHow(it), it);
      if (!failure.empty()) return failure;
    }
  }
  return "";
}

template <class Waiting>
std::string ServerJob::LoseSilent(uint64_t it, bool broadcast,
                                  uint32_t timeout_ms, Waiting waiting,
                                  std::string stalled,
                                  std::vector<uint32_t>* dropped) {
  if (!s_.continue_on_worker_loss) return stalled;
  std::vector<uint32_t> silent;
  uint32_t live = 0;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (!alive(w)) continue;
    ++live;
    if (waiting(w)) silent.push_back(w);
  }
  // Waiting for nobody is the round's own `done` (the transports wait for
  // the same predicate): another lcore lost the last one a moment ago, and
  // the round closes at the next turn.
  if (silent.empty()) return "";
  if (silent.size() == live) return stalled;
  const std::string how = SilentHow(
      broadcast ? "broadcast round " + std::to_string(BroadcastRound(it))
                : "push round " + std::to_string(PushRound(it)),
      timeout_ms);
  for (const uint32_t w : silent) {
    bool lost_now = false;
    std::string failure = Lose(w, how, it, &lost_now);
    if (lost_now) dropped->push_back(w);
    if (!failure.empty()) return failure;
  }
  return "";
}

template <class Received>
std::string ServerJob::PushStalled(uint64_t it, uint32_t timeout_ms,
                                   Received received, uint64_t injected) const {
  std::string s = NoProgressText("push round " + std::to_string(PushRound(it)),
                                 timeout_ms) +
                  "; chunks received:";
  bool silent = false;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (!alive(w)) continue;
    const uint32_t got = received(w);
    silent = silent || got == 0;
    s += (w ? ", " : " ") + WorkerLabel(w, names_[w]) + " " +
         std::to_string(got) + "/" + std::to_string(layout_.num_chunks());
  }
  return s + (silent || injected > 0 ? PushStalledHint(injected)
                                     : StalledLinkHint());
}

template <class Done>
std::string ServerJob::BroadcastStalled(uint64_t it, uint32_t timeout_ms,
                                        Done done) const {
  std::string s =
      NoProgressText("broadcast round " + std::to_string(BroadcastRound(it)),
                     timeout_ms) +
      "; not delivered to:";
  for (uint32_t w = 0; w < workers(); ++w) {
    if (alive(w) && !done(w)) s += " " + WorkerLabel(w, names_[w]);
  }
  return s + StalledLinkHint();
}

}  // namespace dblp
