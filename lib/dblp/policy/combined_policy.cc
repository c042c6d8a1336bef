#include "dblp/policy/combined_policy.h"

#include <string>

#include "dblp/policy/clr_detector.h"
#include "dblp/policy/policy_text.h"
#include "dblp/policy/round_time_window.h"

namespace dblp {
namespace {

class CombinedPolicy final : public TolerancePolicy {
 public:
  explicit CombinedPolicy(const PolicyConfig& c)
      : p_low_(c.p_low),
        p_high_(c.p_high),
        detector_(c.clr),
        factor_(c.ltp_deadline_factor),
        initial_deadline_ns_(c.ltp_initial_deadline_ns),
        min_fraction_(c.ltp_min_fraction),
        history_(c.ltp_window),
        deadline_ns_(c.ltp_initial_deadline_ns) {}

  RoundTolerance Current() const override {
    RoundTolerance t;
    t.critical = detector_.critical();
    if (t.critical) {
      // Strict: RoundTolerance's defaults (no deadline, every chunk before
      // one could close the round) with MLT's p.
      t.p = p_low_;
      return t;
    }
    t.p = p_high_;
    t.deadline_ns = deadline_ns_;
    t.min_fraction = min_fraction_;
    return t;
  }

  void OnIterationEnd(uint64_t iteration, double avg_grad_norm,
                      uint64_t round_time_ns) override {
    detector_.Observe(iteration, avg_grad_norm);
    // The median, as ltp: it ignores the very bursts early close is meant
    // to cut short, where a mean or a high percentile would chase them.
    if (history_.Add(round_time_ns)) {
      deadline_ns_ = ScaledDeadlineNs(factor_, history_.Median());
    }
  }

  PolicyKind kind() const override { return PolicyKind::kCombined; }
  uint64_t nonfinite_norms() const override { return detector_.nonfinite(); }
  std::string Describe() const override {
    return "combined(p_low=" + PolicyNum(p_low_) +
           ",p_high=" + PolicyNum(p_high_) +
           ",freq=" + std::to_string(detector_.params().freq) +
           ",eta=" + PolicyNum(detector_.params().eta) +
           ",deadline_factor=" + PolicyNum(factor_) +
           ",window=" + std::to_string(history_.window()) +
           ",initial_deadline_ns=" + std::to_string(initial_deadline_ns_) +
           ",min_fraction=" + PolicyNum(min_fraction_) + ")";
  }

 private:
  double p_low_;
  double p_high_;
  ClrDetector detector_;
  double factor_;
  uint64_t initial_deadline_ns_;
  double min_fraction_;
  RoundTimeWindow history_;
  uint64_t deadline_ns_;
};

}  // namespace

std::unique_ptr<TolerancePolicy> MakeCombinedPolicy(const PolicyConfig& c) {
  return std::make_unique<CombinedPolicy>(c);
}

}  // namespace dblp
