// Critical-learning-regime (CLR) detection, as in DBLP (after Accordion): the
// server feeds the L2 norm of each iteration's averaged gradient and learns
// whether the next iteration is critical (use P_low) or not (use P_high).
//
// Exact schedule (iterations are numbered from 0; windows are
// [w*freq, (w+1)*freq - 1]):
//   * Iterations 0 .. freq-1 (the first window) are critical: training starts
//     critical.
//   * A *check* happens when Observe() is given the last iteration of a
//     window, i.e. iteration % freq == freq - 1. Only the norm of a check
//     iteration is compared; norms of other iterations are ignored (except
//     for the invalid-norm rule below).
//   * The first check has no reference: the next window stays critical and
//     the norm becomes the reference. So a model whose norm never changes is
//     critical for the first 2*freq iterations and non-critical afterwards.
//   * Every later check computes rel = |prev - curr| / prev against the norm
//     of the previous check. rel >= eta: the whole next window (exactly freq
//     iterations) is critical; otherwise it is not. The decision lasts until
//     the next check. prev == 0 has no relative scale: rel = +inf (critical)
//     if curr != 0, rel = 0 (not critical) if curr == 0 as well.
//   * An invalid norm (NaN, +-inf, or negative - an L2 norm cannot be) is
//     counted in nonfinite() and makes the following iterations critical up
//     to and including the next check iteration; if it arrives at a check,
//     the whole next window is critical. It never becomes the reference: the
//     next check compares with the last valid check norm (if there is none,
//     that check behaves like the first one).
//
// The window position comes from the iteration number, not from the number of
// calls, so a resumed run (starting at iteration 500, say) keeps the same
// check positions. Callers are expected to feed every iteration once, in
// order; skipped iterations are simply never observed.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

namespace dblp {

struct ClrParams {
  uint32_t freq = 10;  // iterations per detection window (DBLP_freq)
  double eta = 0.5;    // relative-change threshold (Accordion's value)
};

// Throws std::invalid_argument naming the flag and the fix: freq >= 1 and eta
// finite and > 0. Flag names used: --clr_freq, --clr_eta.
void ValidateClrParams(const ClrParams& params);

class ClrDetector {
 public:
  // Validates `params` (throws std::invalid_argument).
  explicit ClrDetector(const ClrParams& params);

  // Feeds the L2 norm of the averaged gradient of `iteration`. Returns
  // whether iteration + 1 is critical (the same value as critical()).
  bool Observe(uint64_t iteration, double grad_norm);

  // Whether the iteration after the last observed one is critical; true
  // before the first Observe() (iteration 0 is critical).
  bool critical() const { return critical_; }
  // Checks done (Observe() calls at a window's last iteration).
  uint64_t checks() const { return checks_; }
  // Changes of critical() (either direction).
  uint64_t switches() const { return switches_; }
  // Invalid norms seen (non-finite or negative), at any iteration.
  uint64_t nonfinite() const { return nonfinite_; }
  // rel computed at the most recent check; NaN when that check could not
  // compute one (first check, no valid reference, invalid norm) or before
  // any check. +inf when prev == 0 and curr != 0.
  double last_relative_change() const { return last_relative_change_; }
  const ClrParams& params() const { return params_; }

 private:
  void Set(bool critical);

  ClrParams params_;
  bool critical_ = true;
  bool has_reference_ = false;
  double reference_norm_ = 0;  // norm at the last check with a valid norm
  uint64_t checks_ = 0;
  uint64_t switches_ = 0;
  uint64_t nonfinite_ = 0;
  double last_relative_change_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace dblp
