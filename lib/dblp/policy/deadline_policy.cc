#include "dblp/policy/deadline_policy.h"

#include <string>

#include "dblp/policy/policy_text.h"
#include "dblp/policy/round_time_window.h"

namespace dblp {
namespace {

class DeadlinePolicy final : public TolerancePolicy {
 public:
  // The nearest rank is a round time that was measured: with no margin
  // (factor 1) the deadline is exactly as long as a round that happened,
  // never an interpolation shorter than any of them.
  explicit DeadlinePolicy(const PolicyConfig& c)
      : percentile_(c.deadline_percentile),
        close_(c.deadline_percentile, c.deadline_factor, c.deadline_window,
               c.deadline_initial_ns, c.deadline_min_fraction) {}

  RoundTolerance Current() const override {
    RoundTolerance t;
    t.deadline_ns = close_.deadline_ns();
    t.min_fraction = close_.min_fraction();
    return t;
  }

  void OnIterationEnd(uint64_t, double, uint64_t round_time_ns) override {
    close_.Add(round_time_ns);
  }

  PolicyKind kind() const override { return PolicyKind::kDeadline; }
  std::string Describe() const override {
    return "deadline(percentile=" + PolicyNum(percentile_) +
           ",factor=" + PolicyNum(close_.factor()) + close_.DescribeTail() +
           ")";
  }

 private:
  double percentile_;
  EarlyClose close_;
};

}  // namespace

std::unique_ptr<TolerancePolicy> MakeDeadlinePolicy(const PolicyConfig& c) {
  return std::make_unique<DeadlinePolicy>(c);
}

}  // namespace dblp
