#include "dblp/policy/deadline_policy.h"

#include <string>

#include "dblp/policy/policy_text.h"
#include "dblp/policy/round_time_window.h"

namespace dblp {
namespace {

class DeadlinePolicy final : public TolerancePolicy {
 public:
  explicit DeadlinePolicy(const PolicyConfig& c)
      : percentile_(c.deadline_percentile),
        factor_(c.deadline_factor),
        initial_deadline_ns_(c.deadline_initial_ns),
        min_fraction_(c.deadline_min_fraction),
        history_(c.deadline_window),
        deadline_ns_(c.deadline_initial_ns) {}

  RoundTolerance Current() const override {
    RoundTolerance t;
    t.deadline_ns = deadline_ns_;
    t.min_fraction = min_fraction_;
    return t;
  }

  void OnIterationEnd(uint64_t, double, uint64_t round_time_ns) override {
    // The nearest rank is a round time that was measured: with no margin
    // (factor 1) the deadline is exactly as long as a round that happened,
    // never an interpolation shorter than any of them.
    if (history_.Add(round_time_ns)) {
      deadline_ns_ =
          ScaledDeadlineNs(factor_, history_.Percentile(percentile_));
    }
  }

  PolicyKind kind() const override { return PolicyKind::kDeadline; }
  std::string Describe() const override {
    return "deadline(percentile=" + PolicyNum(percentile_) +
           ",factor=" + PolicyNum(factor_) +
           ",window=" + std::to_string(history_.window()) +
           ",initial_deadline_ns=" + std::to_string(initial_deadline_ns_) +
           ",min_fraction=" + PolicyNum(min_fraction_) + ")";
  }

 private:
  double percentile_;
  double factor_;
  uint64_t initial_deadline_ns_;
  double min_fraction_;
  RoundTimeWindow history_;
  uint64_t deadline_ns_;
};

}  // namespace

std::unique_ptr<TolerancePolicy> MakeDeadlinePolicy(const PolicyConfig& c) {
  return std::make_unique<DeadlinePolicy>(c);
}

}  // namespace dblp
