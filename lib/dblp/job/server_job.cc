#include "dblp/job/server_job.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "dblp/base/log.h"
#include "dblp/base/rng.h"
#include "dblp/job/rows.h"
#include "dblp/wire/float_ops.h"

namespace dblp {
namespace {

// A p in the journal: the same text from every transport.
std::string NumberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

ServerJob::ServerJob(const ServerJobSettings& s,
                     std::unique_ptr<TolerancePolicy> policy,
                     const ChunkLayout& layout, std::vector<std::string> names,
                     SendOrderKind order, uint64_t seed, std::string app,
                     uint32_t shards)
    : s_(s),
      order_kind_(order),
      layout_(layout),
      names_(std::move(names)),
      app_(std::move(app)),
      iteration_(s, std::move(policy), layout,
                 static_cast<uint32_t>(names_.size()), seed, app_, shards),
      alive_(std::make_unique<std::atomic<bool>[]>(names_.size())),
      bye_(std::make_unique<std::atomic<bool>[]>(names_.size())),
      bad_by_worker_(names_.size(), 0) {
  const auto W = static_cast<uint32_t>(names_.size());
  for (uint32_t w = 0; w < W; ++w) {
    orders_.emplace_back(order, w, W, HashMix(seed, 0xBC));
    alive_[w].store(true);
    bye_[w].store(false);
  }
  next_ = iteration_.policy()->Current();
}

PushOpening ServerJob::PlanPush(uint64_t it) const {
  const RoundTolerance t = PushTolerance(it);
  // The minimum fraction counts only with a deadline.
  return PushOpening{
      RoundBeginRequest{Direction::kPush, PushRound(it), t.p, t.deadline_ns,
                        t.deadline_ns ? t.min_fraction : 0, t.critical},
      t.deadline_ns};
}

PushOpening ServerJob::OpenPush(uint64_t it, uint64_t now_ns) {
  push_tol_ = PushTolerance(it);
  push_open_ns_ = now_ns;
  Journal("open push " + std::to_string(it) + " (round " +
          std::to_string(PushRound(it)) + ", p " + NumberText(push_tol_.p) +
          ")");
  return PlanPush(it);
}

const ReducedPush& ServerJob::ClosePush(uint64_t it, const ClosedPush& c,
                                        AcceptedSlots* accepted,
                                        std::vector<ControlRequest>* post) {
  // The mean divides by the workers that belong to this round: the live
  // ones, and a lost one whose chunks of it arrived before the loss (they
  // are in the sums). A worker lost before it sent any, even one lost
  // after this push opened (in the previous broadcast), is out: dividing
  // by it would scale the mean down by its missing share.
  uint32_t members = 0;
  for (uint32_t w = 0; w < workers(); ++w) {
    members += alive(w) || (w < c.arrived.size() && c.arrived[w].Count() > 0);
  }
  if (members > 0) iteration_.set_live_workers(members);
  const uint64_t began = c.first_ns != 0 ? c.first_ns : push_open_ns_;
  reduced_ = iteration_.Reduce(it, c.now_ns > began ? c.now_ns - began : 0);
  broadcast_it_ = it;
  if (LogEnabled(LogLevel::kDebug)) {
    std::string arrived;
    for (uint32_t w = 0; w < workers() && w < c.arrived.size(); ++w) {
      arrived += (w ? " " : "") + std::to_string(c.arrived[w].Count());
    }
    Journal("close push " + std::to_string(it) + ": divisor " +
            std::to_string(members) + ", chunks arrived [" + arrived + "] of " +
            std::to_string(layout_.num_chunks()) +
            (reduced_.resync ? ", resync" : "") + ", broadcast p " +
            NumberText(reduced_.broadcast.p) + ", next p " +
            NumberText(reduced_.next.p));
  }
  // The phase's failure (a lost server shard) comes first.
  std::string bad = CheckContributions(it, reduced_);
  if (reduced_.failure.empty()) reduced_.failure = std::move(bad);
  // After CheckContributions zeroed what was not finite, and only for a
  // broadcast that can be cut (by p, or by an LTP deadline): a consistent
  // broadcast already has its one subset, and a resync carries parameters,
  // whose size means nothing.
  const RoundTolerance& bt = reduced_.broadcast;
  if (order_kind_ == SendOrderKind::kMagnitude && reduced_.failure.empty() &&
      reduced_.subset.empty() && !reduced_.resync && !s_.push_only &&
      (bt.p > 0 || bt.deadline_ns != 0)) {
    orders_[0].Fill(BroadcastRound(it), layout_.num_chunks(),
                    magnitude_order_);
    OrderByMagnitude(iteration_.mean(), layout_, magnitude_order_,
                     chunk_norms_);
    reduced_.subset = magnitude_order_;
  }
  const ReducedPush& r = reduced_;
  const double n = layout_.num_chunks();
  const uint64_t clr_nonfinite = iteration_.policy()->nonfinite_norms();
  for (uint32_t w = 0; w < workers(); ++w) {
    ServerPush x{it,
                 w,
                 push_open_ns_,
                 c.stop_ns[w],
                 static_cast<double>(c.arrived[w].Count()) / n,
                 push_tol_,
                 r.norm,
                 c.burst,
                 r.resync};
    const MeanReducer::Tally& t = r.workers[w];
    x.worker_norm = std::sqrt(t.sum_squares);
    x.bad_chunks = t.nonfinite + t.overflow;
    x.clipped_chunks = t.clipped;
    x.clr_nonfinite = clr_nonfinite;
    rows_.push_back(ServerPushRow(x));
  }
  // The job ends here: no mean goes out.
  if (!r.failure.empty()) return r;
  // Without a broadcast the rows are complete: on disk now, before the
  // observer looks.
  if (s_.push_only && stream_ != nullptr) stream_->Sync(rows_);
  if (s_.on_reduced) s_.on_reduced(it, iteration_.mean(), c.arrived);
  // Each worker's ACCEPTED before the broadcast's ROUND_BEGIN, so it holds
  // it when the broadcast begins. A resync's push was reliable.
  if (s_.push_feedback && !r.resync) {
    for (uint32_t w = 0; w < workers(); ++w) {
      if (!alive(w)) continue;
      const std::span<const uint64_t> words = c.arrived[w].words();
      accepted->Stage(w, AcceptedMsg{PushRound(it),
                                     c.arrived[w].size(),
                                     {words.begin(), words.end()}});
      post->push_back(AcceptedRequest{static_cast<uint16_t>(w), PushRound(it)});
    }
  }
  // Always announced: a push bench's broadcast (push_only) closes at once
  // (a 1 ns deadline, a floor of no chunk), which ends the worker's round.
  const RoundTolerance& t = r.broadcast;
  post->push_back(RoundBeginRequest{Direction::kBroadcast, BroadcastRound(it),
                                    t.p, t.deadline_ns,
                                    t.deadline_ns ? t.min_fraction : 0,
                                    t.critical});
  next_ = r.next;
  return r;
}

void ServerJob::BroadcastOrder(uint32_t w, uint64_t it, uint32_t num_chunks,
                               std::vector<uint32_t>* out) const {
  if (!reduced_.subset.empty()) {
    out->assign(reduced_.subset.begin(), reduced_.subset.end());
  } else {
    orders_[w].Fill(BroadcastRound(it), num_chunks, *out);
  }
}

void ServerJob::CloseBroadcast(
    std::span<const std::span<const SendSide* const>> sides) {
  Journal("close broadcast " + std::to_string(broadcast_it_));
  const size_t first = rows_.size() - workers();
  for (uint32_t w = 0; w < workers(); ++w) {
    AddBroadcastToRow(sides[w], &rows_[first + w]);
  }
  // On disk before the next iteration: a kill -9 keeps them.
  if (stream_ != nullptr) stream_->Sync(rows_);
}

void ServerJob::OnBye(uint32_t w) {
  if (!bye_[w].exchange(true, std::memory_order_relaxed)) {
    Journal("bye from worker " + std::to_string(w));
  }
}

void ServerJob::Journal(const std::string& what) const {
  if (LogEnabled(LogLevel::kDebug)) {
    DBLP_LOG(Debug, "%s: job: %s", app_.c_str(), what.c_str());
  }
}

std::string ServerJob::CheckContributions(uint64_t it, const ReducedPush& r) {
  // Every worker is counted before the first text is returned: the
  // summary of an aborted job says how many lied, not just the first.
  std::string failure;
  for (uint32_t w = 0; w < workers(); ++w) {
    const MeanReducer::Tally& t = r.workers[w];
    const uint32_t bad = t.nonfinite + t.overflow;
    clipped_chunks_ += t.clipped;
    if (bad == 0) continue;
    nonfinite_chunks_ += t.nonfinite;
    overflow_chunks_ += t.overflow;
    const std::string text = BadGradientText(w, names_[w], it, t.nonfinite,
                                             t.overflow, t.first_bad_seq);
    // Logged at the worker's 1st, 2nd, 4th, 8th... bad iteration: a liar
    // cannot flood the log, and the count still grows in the summary.
    const uint64_t before = bad_by_worker_[w];
    bad_by_worker_[w] += bad;
    if (!s_.drop_bad_gradient) {
      if (failure.empty()) failure = text;
      continue;
    }
    if (before == 0 || std::bit_width(before) != std::bit_width(before + bad)) {
      DBLP_LOG(Warning, "%s: %s; dropped (%llu chunks so far)", app_.c_str(),
               text.c_str(),
               static_cast<unsigned long long>(bad_by_worker_[w]));
    }
  }
  if (!failure.empty()) return failure;
  if (!r.mean_finite) {
    ++nonfinite_means_;
    const std::string text = "the mean of iteration " + std::to_string(it) +
                             " is not finite (norm " + std::to_string(r.norm) +
                             "): --clip_norm=X bounds what each worker adds";
    if (!s_.drop_bad_gradient) return text;
    // Never broadcast: its non-finite floats go out as 0 (counted).
    nonfinite_mean_floats_ += ZeroNonFinite(iteration_.mean());
    if (nonfinite_means_ == 1) {
      DBLP_LOG(Warning, "%s: %s; its non-finite floats are sent as 0",
               app_.c_str(), text.c_str());
    }
  }
  return "";
}

void ServerJob::AddCounters(NamedCounters* out) const {
  uint64_t liars = 0;
  for (const uint64_t b : bad_by_worker_) liars += b > 0;
  out->emplace_back("bad_gradient_nonfinite_chunks", nonfinite_chunks_);
  out->emplace_back("bad_gradient_overflow_chunks", overflow_chunks_);
  out->emplace_back("bad_gradient_workers", liars);
  out->emplace_back("bad_gradient_nonfinite_means", nonfinite_means_);
  out->emplace_back("bad_gradient_zeroed_mean_floats", nonfinite_mean_floats_);
  out->emplace_back("clipped_chunks", clipped_chunks_);
  out->emplace_back("clr_nonfinite_norms",
                    iteration_.policy().nonfinite_norms());
}

std::vector<std::pair<std::string, std::string>> ServerJob::Info() const {
  return {{"chunks", std::to_string(layout_.num_chunks())},
          {"chunk_bytes", std::to_string(layout_.chunk_payload())},
          {"push_fill", FillModeName(s_.push_fill)},
          {"broadcast", s_.push_only              ? "none"
                        : s_.reliable_broadcast   ? "reliable"
                        : s_.consistent_broadcast ? "consistent"
                                                  : "same_p"},
          {"resync_every", std::to_string(s_.resync_every)},
          {"on_bad_gradient", s_.drop_bad_gradient ? "drop" : "abort"},
          {"clip_norm", std::to_string(s_.clip_norm)}};
}

uint32_t ServerJob::live_count() const {
  uint32_t n = 0;
  for (uint32_t w = 0; w < workers(); ++w) n += alive(w) ? 1 : 0;
  return n;
}

bool ServerJob::AllLiveSaidBye() const {
  for (uint32_t w = 0; w < workers(); ++w) {
    if (alive(w) && !said_bye(w)) return false;
  }
  return true;
}

std::string ServerJob::Lose(uint32_t w, const std::string& how, uint64_t it,
                            bool* lost_now) {
  if (lost_now != nullptr) *lost_now = false;
  if (!s_.continue_on_worker_loss) {
    return WorkerLostText(w, names_[w], how, it);
  }
  // Its frames are dropped from now on. Two lcores whose rounds stalled
  // at once may both name it: it is lost once.
  if (!alive_[w].exchange(false)) return "";
  if (lost_now != nullptr) *lost_now = true;
  Journal("lost worker " + std::to_string(w));
  DBLP_LOG(Warning, "%s: continuing without worker %u (%s)", app_.c_str(), w,
           how.c_str());
  if (live_count() == 0) return "every worker is gone";
  return "";
}

std::string ServerJob::OnGone(uint32_t w, bool failed, const std::string& why,
                              uint64_t it) {
  if (!alive(w) || (!failed && said_bye(w))) return "";
  std::string how = failed ? "failed" : "disconnected without BYE";
  if (!why.empty()) how += " (" + why + ")";
  return Lose(w, how, it);
}

}  // namespace dblp
