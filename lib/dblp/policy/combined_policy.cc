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
        // The median, as ltp: it ignores the very bursts early close is
        // meant to cut short, where a mean or a high percentile would
        // chase them.
        close_(0, c.ltp_deadline_factor, c.ltp_window,
               c.ltp_initial_deadline_ns, c.ltp_min_fraction) {}

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
    t.deadline_ns = close_.deadline_ns();
    t.min_fraction = close_.min_fraction();
    return t;
  }

  void OnIterationEnd(uint64_t iteration, double avg_grad_norm,
                      uint64_t round_time_ns) override {
    detector_.Observe(iteration, avg_grad_norm);
    close_.Add(round_time_ns);
  }

  PolicyKind kind() const override { return PolicyKind::kCombined; }
  uint64_t nonfinite_norms() const override { return detector_.nonfinite(); }
  std::string Describe() const override {
    return "combined(p_low=" + PolicyNum(p_low_) +
           ",p_high=" + PolicyNum(p_high_) +
           ",freq=" + std::to_string(detector_.params().freq) +
           ",eta=" + PolicyNum(detector_.params().eta) +
           ",deadline_factor=" + PolicyNum(close_.factor()) +
           close_.DescribeTail() + ")";
  }

 private:
  double p_low_;
  double p_high_;
  ClrDetector detector_;
  EarlyClose close_;
};

}  // namespace

std::unique_ptr<TolerancePolicy> MakeCombinedPolicy(const PolicyConfig& c) {
  return std::make_unique<CombinedPolicy>(c);
}

}  // namespace dblp
