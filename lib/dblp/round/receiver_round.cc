#include "dblp/round/receiver_round.h"

#include <algorithm>

namespace dblp {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kAccepted:
      return "accepted";
    case Verdict::kDuplicate:
      return "duplicate";
    case Verdict::kStaleRound:
      return "stale_round";
    case Verdict::kFutureRound:
      return "future_round";
    case Verdict::kLate:
      return "late";
    case Verdict::kWrongSession:
      return "wrong_session";
    case Verdict::kWrongSender:
      return "wrong_sender";
    case Verdict::kWrongType:
      return "wrong_type";
    case Verdict::kOutOfRange:
      return "out_of_range";
    case Verdict::kMalformed:
      return "malformed";
    case Verdict::kIdle:
      return "idle";
    case Verdict::kMisrouted:
      return "misrouted";
    case Verdict::kBadTag:
      return "bad_tag";
  }
  return "unknown";
}

ReceiverRound::ReceiverRound(const ReceiverConfig& config)
    : config_(config),
      auth_(config.frame_key),
      tag_bytes_(auth_.tag_bytes()),
      seq_span_(config.seq_end > config.seq_begin
                    ? config.seq_end - config.seq_begin
                    : 0),
      body_span_(0),
      chunk_payload_(config.layout.chunk_payload()) {
  const uint32_t chunks = config.layout.num_chunks();
  const uint32_t body_end =
      std::min(config.seq_end, chunks == 0 ? 0 : chunks - 1);
  if (body_end > config.seq_begin) body_span_ = body_end - config.seq_begin;
  bitmap_.Reset(config_.layout.num_chunks());
}

void ReceiverRound::Begin(uint32_t round, double p, uint64_t deadline_ns,
                          double deadline_min_fraction) {
  const uint32_t n = config_.layout.num_chunks();
  const uint32_t threshold = StopThreshold(n, p);  // validates p
  bitmap_.Reset(n);
  p_.store(p, std::memory_order_relaxed);
  threshold_.store(threshold, std::memory_order_relaxed);
  SetDeadline(deadline_ns, deadline_min_fraction);
  stop_taken_.store(false, std::memory_order_relaxed);
  round_.store(round, std::memory_order_release);
  begun_ = true;
  open_.store(true, std::memory_order_release);
}

void ReceiverRound::SetTolerance(double p) {
  const uint32_t threshold = StopThreshold(config_.layout.num_chunks(), p);
  p_.store(p, std::memory_order_release);
  threshold_.store(threshold, std::memory_order_release);
}

void ReceiverRound::SetDeadline(uint64_t deadline_ns, double min_fraction) {
  deadline_floor_.store(
      FractionFloor(config_.layout.num_chunks(), min_fraction),
      std::memory_order_release);
  deadline_ns_.store(deadline_ns, std::memory_order_release);
}

StopRule ReceiverRound::Rule() const {
  StopRule rule;
  rule.threshold = threshold_.load(std::memory_order_acquire);
  rule.deadline_ns = deadline_ns_.load(std::memory_order_acquire);
  rule.deadline_floor = deadline_floor_.load(std::memory_order_acquire);
  return rule;
}

bool ReceiverRound::StopReached(uint64_t now_ns) const {
  return Rule().Evaluate(received(), now_ns) != StopTrigger::kNone;
}

StopTrigger ReceiverRound::PollStop(uint64_t now_ns) {
  if (!open() || stop_taken_.load(std::memory_order_acquire)) {
    return StopTrigger::kNone;
  }
  const StopTrigger t = Rule().Evaluate(received(), now_ns);
  if (t == StopTrigger::kNone) return t;
  // Several threads may poll; only the one that flips the flag sends STOP.
  if (stop_taken_.exchange(true, std::memory_order_acq_rel)) {
    return StopTrigger::kNone;
  }
  return t;
}

}  // namespace dblp
