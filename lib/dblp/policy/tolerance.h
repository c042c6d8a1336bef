// Bounded-loss tolerance policies: which fraction p of a round's chunks the
// receiver may give up on, decided once per iteration by the server.
//
//   reliable  p = 0: every chunk (TCP-like baseline through the same code).
//   fixed     p = p_fixed for the whole run (MLT).
//   dblp      p = p_low while the CLR detector says critical (training starts
//             critical), p_high otherwise (DBLP).
//   ltp       p = 0, but the receiver closes the round early at a deadline
//             derived from recent round times (LTP's Early Close): a margin
//             over the median, with a high floor (bounded loss).
//   deadline  p = 0, but the receiver closes the round at a deadline set
//             from a high percentile of recent round times, with a small
//             floor (OptiReduce's adaptive timeout: bounded time).
//   combined  dblp's phases with ltp's early close outside them: strict
//             (p_low, no deadline) while the CLR detector says critical,
//             p_high plus an ltp deadline otherwise.
//
// The policy object lives at the server; whatever carries the round's
// RoundTolerance to the receiver (ROUND_BEGIN, or the server's own receiver)
// must take it from Current() every iteration: a receiver that keeps the
// value it started with would silently run DBLP as a fixed-p protocol.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dblp/policy/clr_detector.h"
#include "dblp/round/stop_decision.h"

namespace dblp {

enum class PolicyKind : uint8_t {
  kReliable,
  kFixed,
  kDblp,
  kLtp,
  kDeadline,
  kCombined
};

struct PolicyConfig {
  PolicyKind kind = PolicyKind::kDblp;
  double p_fixed = 0.008;  // fixed (MLT): 0.008 EfficientNetB0, 0.024 ResNet50
  double p_low = 0.008;    // dblp, combined: inside a CLR (= MLT's p)
  double p_high = 0.408;   // dblp, combined: outside a CLR (p_low + 40%)
  ClrParams clr;           // dblp, combined
  // ltp (early close), and combined outside a CLR: deadline =
  // ltp_deadline_factor * median of the last ltp_window completed round
  // times; before any history, ltp_initial_deadline_ns (0 = no deadline).
  // At the deadline the receiver closes the round if at least
  // ltp_min_fraction of the chunks arrived, otherwise it waits until that
  // floor is reached.
  double ltp_deadline_factor = 1.5;
  uint32_t ltp_window = 16;
  uint64_t ltp_initial_deadline_ns = 0;
  double ltp_min_fraction = 0.5;
  // deadline (bounded time): deadline = deadline_factor * the
  // deadline_percentile-th percentile (nearest rank) of the last
  // deadline_window completed round times; before any history,
  // deadline_initial_ns (0 = no deadline). At the deadline the receiver
  // closes the round once deadline_min_fraction of the chunks arrived. The
  // window of 20 puts the 95th percentile at the second-longest round, so
  // one burst does not stretch the deadline for the whole window.
  double deadline_percentile = 95;
  double deadline_factor = 1.0;
  uint32_t deadline_window = 20;
  uint64_t deadline_initial_ns = 0;
  double deadline_min_fraction = 0.1;
};

// "reliable" | "fixed" | "dblp" | "ltp" | "deadline" | "combined" (ASCII
// case-insensitive). Throws std::invalid_argument naming the choices.
PolicyKind ParsePolicyKind(std::string_view name);
// Lower-case name as accepted by ParsePolicyKind; "unknown" for a value
// outside the enum.
const char* PolicyKindName(PolicyKind kind);

// Throws std::invalid_argument with a message naming the flag and the fix.
// Every field is checked whatever the kind, so a bad value never waits for
// the day someone switches policies: p_fixed, p_low, p_high finite in [0, 1);
// p_low <= p_high; clr per ValidateClrParams; ltp_deadline_factor finite and
// >= 1; ltp_window >= 1; ltp_min_fraction in (0, 1]; deadline_percentile
// in (0, 100]; deadline_factor finite and >= 1; deadline_window >= 1;
// deadline_min_fraction in (0, 1]. Flag names used: --policy, --p_fixed,
// --p_low, --p_high, --clr_freq, --clr_eta, --ltp_deadline_factor,
// --ltp_window, --ltp_min_fraction, --deadline_percentile,
// --deadline_factor, --deadline_window, --deadline_min_fraction.
void ValidatePolicyConfig(const PolicyConfig& config);

// Whether a policy of this kind may give a round a deadline (ltp,
// deadline, combined): what must not cut a round short (a consistent
// broadcast's subset) refuses these.
bool PolicyMayCloseEarly(PolicyKind kind);

// What a receiver needs for one round's STOP decision.
struct RoundTolerance {
  double p = 0;               // STOP once StopThreshold(n, p) chunks arrived
  uint64_t deadline_ns = 0;   // early close after this long; 0 = none
  double min_fraction = 1.0;  // ...but only with >= this fraction of chunks
  bool critical = false;      // dblp, combined: inside a CLR; else false
};

// Per iteration, not per packet, so a virtual interface costs nothing.
// Not thread-safe: one owner (the server's iteration loop).
class TolerancePolicy {
 public:
  // Validates `config` (throws std::invalid_argument).
  static std::unique_ptr<TolerancePolicy> Create(const PolicyConfig& config);
  virtual ~TolerancePolicy() = default;

  // Tolerance for the iteration about to run.
  virtual RoundTolerance Current() const = 0;
  // Called by the server after each iteration with the averaged gradient's L2
  // norm and the iteration's push round time (ns; 0 = not measured, ignored
  // by the deadline kinds). Iterations are numbered from 0, consecutively.
  virtual void OnIterationEnd(uint64_t iteration, double avg_grad_norm,
                              uint64_t round_time_ns) = 0;
  virtual PolicyKind kind() const = 0;
  // Norms fed to OnIterationEnd that were not finite (or negative): the
  // CLR detector's count for dblp and combined, 0 for the kinds that do
  // not look.
  virtual uint64_t nonfinite_norms() const { return 0; }
  // One line with every parameter, e.g.
  // "dblp(p_low=0.008,p_high=0.408,freq=10,eta=0.5)".
  virtual std::string Describe() const = 0;
};

}  // namespace dblp
