// Software loss injection: this kernel has no `tc netem`, so the transport
// itself decides, per packet, whether to pretend the network dropped it.
//
// Everything here is seeded and deterministic: the same spec, burst schedule
// and seed reproduce the same drop sequence on every platform (dblp::Rng, no
// std::*_distribution). LossInjector::ShouldDrop() runs once per packet on a
// DPDK lcore, so it is inline, allocation-free and dispatches with a switch on
// LossKind rather than a virtual call.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dblp/base/rng.h"

namespace dblp {

enum class LossKind : uint8_t { kNone, kBernoulli, kGilbertElliott };

// The steady-state ("base") loss model of a link.
//
// Gilbert-Elliott is a two-state Markov chain evaluated once per packet: the
// packet is lost with probability ge_loss_good / ge_loss_bad depending on the
// current state, then the chain moves good->bad with ge_good_to_bad or
// bad->good with ge_bad_to_good. With loss_good = 0 and loss_bad = 1 the
// losses come in runs of mean length 1 / ge_bad_to_good, which is what makes
// it a model of bursty loss.
struct LossSpec {
  LossKind kind = LossKind::kNone;
  double p = 0;  // kBernoulli: independent per-packet loss probability
  double ge_good_to_bad = 0;
  double ge_bad_to_good = 1;
  double ge_loss_good = 0;
  double ge_loss_bad = 1;

  bool operator==(const LossSpec&) const = default;
};

// Accepted forms (lowercase, no spaces):
//   "none"
//   "bernoulli:<p>"                                  e.g. "bernoulli:0.01"
//   "ge:<p_good_to_bad>,<p_bad_to_good>,<loss_good>,<loss_bad>"
//                                                    e.g. "ge:0.01,0.3,0,1"
// Every probability must be finite and in [0, 1], and p_bad_to_good > 0 (a
// bad state that is never left is not a link, it is a cut cable). Throws
// std::invalid_argument naming the accepted syntax on anything else.
LossSpec ParseLossSpec(std::string_view text);

// Inverse of ParseLossSpec: ParseLossSpec(FormatLossSpec(s)) == s (numbers are
// printed in the shortest form that round-trips exactly).
std::string FormatLossSpec(const LossSpec& spec);

// Long-run fraction of packets dropped by `spec`. For Gilbert-Elliott this is
// pi_bad * loss_bad + pi_good * loss_good with pi_bad = p_gb / (p_gb + p_bg).
double MeanLossRate(const LossSpec& spec);

// Microbursts on top of the base model (the seeds' "one-iteration 70% loss"
// experiments): whole training iterations, and optionally a time window,
// during which every packet is dropped with probability burst_loss.
struct BurstSchedule {
  std::vector<uint64_t> iterations;  // sorted, unique
  double burst_loss = 0.7;
  // [window_start_ns, window_end_ns) in the injector's clock
  // (LossInjector::SetTimeNs); no window if start >= end.
  uint64_t window_start_ns = 0;
  uint64_t window_end_ns = 0;

  bool Contains(uint64_t iteration) const;  // binary search
  bool HasWindow() const { return window_start_ns < window_end_ns; }
  bool empty() const { return iterations.empty() && !HasWindow(); }
};

// "279,651" -> iterations {279, 651}; "" -> no bursts. Spaces around numbers
// are tolerated, duplicates are merged, the result is sorted. Throws
// std::invalid_argument on anything that is not a comma-separated list of
// unsigned decimal integers, or if burst_loss is not a finite value in [0, 1].
BurstSchedule ParseBurstIterations(std::string_view csv, double burst_loss);

// `count` distinct iterations drawn uniformly from [first, last] (inclusive),
// sorted; the same seed always gives the same set. Throws
// std::invalid_argument if first > last, count exceeds the range size, or
// burst_loss is not a finite value in [0, 1].
BurstSchedule RandomBurstIterations(uint32_t count, uint64_t first,
                                    uint64_t last, uint64_t seed,
                                    double burst_loss);

// One injector per sending thread (e.g. per TX lcore): it is not thread-safe,
// and sharing one would also make the drop sequence depend on scheduling.
class LossInjector {
 public:
  // Throws std::invalid_argument if `base` or `bursts` holds a probability
  // outside [0, 1] (specs from ParseLossSpec are always valid).
  LossInjector(const LossSpec& base, const BurstSchedule& bursts,
               uint64_t seed);

  // The application's current iteration; call once per iteration (binary
  // search in the schedule, so it stays off the per-packet path).
  void SetIteration(uint64_t it);
  // Time since start, only needed for a time-window burst.
  void SetTimeNs(uint64_t ns_since_start);

  // A burst added at run time (the prompt's `inject burst`) for the current
  // iteration, at its own loss; loss <= 0 ends it. Call after SetIteration.
  void SetInjectedBurst(double loss);

  bool InBurst() const {
    return in_burst_iteration_ || in_burst_window_ || injected_burst_;
  }

  // Per packet: inside a burst, drop with probability burst_loss; otherwise
  // ask the base model. The Gilbert-Elliott chain does not advance during a
  // burst, so a burst is an overlay that leaves the base process where it was.
  bool ShouldDrop() {
    ++considered_;
    bool drop = false;
    if (InBurst()) [[unlikely]] {
      drop = Hit(injected_burst_ ? injected_threshold_ : burst_threshold_);
      dropped_in_burst_ += drop;
    } else {
      switch (kind_) {
        case LossKind::kNone:
          break;
        case LossKind::kBernoulli:
          drop = Hit(p_threshold_);
          break;
        case LossKind::kGilbertElliott:
          drop = Hit(ge_bad_ ? loss_bad_threshold_ : loss_good_threshold_);
          if (Hit(ge_bad_ ? bad_to_good_threshold_ : good_to_bad_threshold_)) {
            ge_bad_ = !ge_bad_;
          }
          break;
      }
    }
    dropped_ += drop;
    return drop;
  }

  // ShouldDrop() would only count the packet, until the next SetIteration,
  // SetInjectedBurst or SetTimeNs: no base loss, no burst now, and no time
  // window that could open one (RxLossInjector skips its per-packet call).
  bool Quiet() const {
    return kind_ == LossKind::kNone && !InBurst() && !bursts_.HasWindow();
  }
  // What ShouldDrop() does while Quiet().
  void PassQuiet() { ++considered_; }

  uint64_t considered() const { return considered_; }
  uint64_t dropped() const { return dropped_; }
  uint64_t dropped_in_burst() const { return dropped_in_burst_; }
  const LossSpec& base() const { return base_; }
  const BurstSchedule& bursts() const { return bursts_; }

 private:
  // A probability as an integer threshold on 53 random bits:
  // (Next() >> 11) < Threshold(p) is exactly Rng::NextDouble() < p, without
  // the int->double conversion on the per-packet path.
  static uint64_t Threshold(double p);
  bool Hit(uint64_t threshold) { return (rng_.Next() >> 11) < threshold; }

  LossSpec base_;
  BurstSchedule bursts_;
  Rng rng_;
  LossKind kind_;
  bool ge_bad_ = false;
  bool in_burst_iteration_ = false;
  bool in_burst_window_ = false;
  uint64_t p_threshold_ = 0;
  uint64_t good_to_bad_threshold_ = 0;
  uint64_t bad_to_good_threshold_ = 0;
  uint64_t loss_good_threshold_ = 0;
  uint64_t loss_bad_threshold_ = 0;
  uint64_t burst_threshold_ = 0;
  bool injected_burst_ = false;
  uint64_t injected_threshold_ = 0;
  uint64_t considered_ = 0;
  uint64_t dropped_ = 0;
  uint64_t dropped_in_burst_ = 0;
};

}  // namespace dblp
