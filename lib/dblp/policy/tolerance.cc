#include "dblp/policy/tolerance.h"

#include <cmath>
#include <stdexcept>

#include "dblp/policy/combined_policy.h"
#include "dblp/policy/deadline_policy.h"
#include "dblp/policy/policy_text.h"
#include "dblp/policy/round_time_window.h"

namespace dblp {
namespace {

constexpr const char* kPolicyChoices =
    "reliable, fixed, dblp, ltp, deadline, combined";

void CheckProbability(const char* flag, double p, const char* role) {
  if (!std::isfinite(p) || p < 0 || p >= 1) {
    throw std::invalid_argument(std::string(flag) +
                                " must be a finite number in [0, 1) (" + role +
                                "), got " + PolicyNum(p));
  }
}

// The deadline policy's flags; its own function so ValidatePolicyConfig
// stays a list of checks.
void ValidateDeadlineParams(const PolicyConfig& c) {
  if (!std::isfinite(c.deadline_percentile) || c.deadline_percentile <= 0 ||
      c.deadline_percentile > 100) {
    throw std::invalid_argument(
        "--deadline_percentile must be in (0, 100] (percentile of the "
        "recent round times that sets the deadline), got " +
        PolicyNum(c.deadline_percentile) + ": e.g. 95");
  }
  if (!std::isfinite(c.deadline_factor) || c.deadline_factor < 1) {
    throw std::invalid_argument(
        "--deadline_factor must be a finite number >= 1, got " +
        PolicyNum(c.deadline_factor) +
        ": below 1 the deadline is shorter than the rounds it was set from; "
        "to close rounds sooner, lower --deadline_percentile instead (e.g. "
        "--deadline_factor=1 --deadline_percentile=90)");
  }
  if (c.deadline_window < 1) {
    throw std::invalid_argument(
        "--deadline_window must be >= 1 (completed rounds whose percentile "
        "sets the deadline), got 0: e.g. 20");
  }
  if (!std::isfinite(c.deadline_min_fraction) || c.deadline_min_fraction <= 0 ||
      c.deadline_min_fraction > 1) {
    throw std::invalid_argument(
        "--deadline_min_fraction must be in (0, 1] (fraction of chunks a "
        "round needs before the deadline may close it), got " +
        PolicyNum(c.deadline_min_fraction) + ": e.g. 0.1");
  }
}

class ReliablePolicy final : public TolerancePolicy {
 public:
  RoundTolerance Current() const override { return RoundTolerance{}; }
  void OnIterationEnd(uint64_t, double, uint64_t) override {}
  PolicyKind kind() const override { return PolicyKind::kReliable; }
  std::string Describe() const override { return "reliable"; }
};

class FixedPolicy final : public TolerancePolicy {
 public:
  explicit FixedPolicy(double p) : p_(p) {}
  RoundTolerance Current() const override {
    RoundTolerance t;
    t.p = p_;
    return t;
  }
  void OnIterationEnd(uint64_t, double, uint64_t) override {}
  PolicyKind kind() const override { return PolicyKind::kFixed; }
  std::string Describe() const override {
    return "fixed(p=" + PolicyNum(p_) + ")";
  }

 private:
  double p_;
};

class DblpPolicy final : public TolerancePolicy {
 public:
  DblpPolicy(double p_low, double p_high, const ClrParams& clr)
      : p_low_(p_low), p_high_(p_high), detector_(clr) {}
  RoundTolerance Current() const override {
    RoundTolerance t;
    t.critical = detector_.critical();
    t.p = t.critical ? p_low_ : p_high_;
    return t;
  }
  void OnIterationEnd(uint64_t iteration, double avg_grad_norm,
                      uint64_t) override {
    detector_.Observe(iteration, avg_grad_norm);
  }
  PolicyKind kind() const override { return PolicyKind::kDblp; }
  uint64_t nonfinite_norms() const override { return detector_.nonfinite(); }
  std::string Describe() const override {
    return "dblp(p_low=" + PolicyNum(p_low_) + ",p_high=" + PolicyNum(p_high_) +
           ",freq=" + std::to_string(detector_.params().freq) +
           ",eta=" + PolicyNum(detector_.params().eta) + ")";
  }

 private:
  double p_low_;
  double p_high_;
  ClrDetector detector_;
};

class LtpPolicy final : public TolerancePolicy {
 public:
  // The median times the factor: the median ignores the very bursts early
  // close is meant to cut short, where a mean or a max would chase them.
  explicit LtpPolicy(const PolicyConfig& c)
      : close_(0, c.ltp_deadline_factor, c.ltp_window,
               c.ltp_initial_deadline_ns, c.ltp_min_fraction) {}

  RoundTolerance Current() const override {
    RoundTolerance t;
    t.deadline_ns = close_.deadline_ns();
    t.min_fraction = close_.min_fraction();
    return t;
  }

  void OnIterationEnd(uint64_t, double, uint64_t round_time_ns) override {
    close_.Add(round_time_ns);
  }

  PolicyKind kind() const override { return PolicyKind::kLtp; }
  std::string Describe() const override {
    return "ltp(deadline_factor=" + PolicyNum(close_.factor()) +
           close_.DescribeTail() + ")";
  }

 private:
  EarlyClose close_;
};

}  // namespace

PolicyKind ParsePolicyKind(std::string_view name) {
  std::string lower(name);
  for (char& ch : lower) {
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  if (lower == "reliable") return PolicyKind::kReliable;
  if (lower == "fixed") return PolicyKind::kFixed;
  if (lower == "dblp") return PolicyKind::kDblp;
  if (lower == "ltp") return PolicyKind::kLtp;
  if (lower == "deadline") return PolicyKind::kDeadline;
  if (lower == "combined") return PolicyKind::kCombined;
  throw std::invalid_argument("unknown --policy \"" + std::string(name) +
                              "\": choose one of " + kPolicyChoices);
}

const char* PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kReliable:
      return "reliable";
    case PolicyKind::kFixed:
      return "fixed";
    case PolicyKind::kDblp:
      return "dblp";
    case PolicyKind::kLtp:
      return "ltp";
    case PolicyKind::kDeadline:
      return "deadline";
    case PolicyKind::kCombined:
      return "combined";
  }
  return "unknown";
}

bool PolicyMayCloseEarly(PolicyKind kind) {
  return kind == PolicyKind::kLtp || kind == PolicyKind::kDeadline ||
         kind == PolicyKind::kCombined;
}

void ValidatePolicyConfig(const PolicyConfig& c) {
  if (std::string_view(PolicyKindName(c.kind)) == "unknown") {
    throw std::invalid_argument("--policy holds an invalid value (" +
                                std::to_string(static_cast<unsigned>(c.kind)) +
                                "): choose one of " + kPolicyChoices);
  }
  CheckProbability("--p_fixed", c.p_fixed,
                   "fraction of chunks a fixed-policy round may lose, e.g. "
                   "0.008");
  CheckProbability("--p_low", c.p_low,
                   "dblp tolerance inside a critical regime, e.g. 0.008");
  CheckProbability("--p_high", c.p_high,
                   "dblp tolerance outside a critical regime, e.g. 0.408");
  if (c.p_low > c.p_high) {
    throw std::invalid_argument(
        "--p_low (" + PolicyNum(c.p_low) + ") must be <= --p_high (" +
        PolicyNum(c.p_high) +
        "): critical regimes need the lower loss tolerance; swap the values");
  }
  ValidateClrParams(c.clr);
  if (!std::isfinite(c.ltp_deadline_factor) || c.ltp_deadline_factor < 1) {
    throw std::invalid_argument(
        "--ltp_deadline_factor must be a finite number >= 1, got " +
        PolicyNum(c.ltp_deadline_factor) +
        ": below 1 the deadline is shorter than a typical round and closes "
        "most rounds early (LTP-like runs use about 1.5)");
  }
  if (c.ltp_window < 1) {
    throw std::invalid_argument(
        "--ltp_window must be >= 1 (completed rounds whose median sets the "
        "deadline), got 0: e.g. 16");
  }
  if (!std::isfinite(c.ltp_min_fraction) || c.ltp_min_fraction <= 0 ||
      c.ltp_min_fraction > 1) {
    throw std::invalid_argument(
        "--ltp_min_fraction must be in (0, 1] (fraction of chunks a round "
        "needs before the deadline may close it), got " +
        PolicyNum(c.ltp_min_fraction) + ": e.g. 0.5");
  }
  ValidateDeadlineParams(c);
}

std::unique_ptr<TolerancePolicy> TolerancePolicy::Create(
    const PolicyConfig& config) {
  ValidatePolicyConfig(config);
  switch (config.kind) {
    case PolicyKind::kReliable:
      return std::make_unique<ReliablePolicy>();
    case PolicyKind::kFixed:
      return std::make_unique<FixedPolicy>(config.p_fixed);
    case PolicyKind::kDblp:
      return std::make_unique<DblpPolicy>(config.p_low, config.p_high,
                                          config.clr);
    case PolicyKind::kLtp:
      return std::make_unique<LtpPolicy>(config);
    case PolicyKind::kDeadline:
      return MakeDeadlinePolicy(config);
    case PolicyKind::kCombined:
      return MakeCombinedPolicy(config);
  }
  return nullptr;  // unreachable: ValidatePolicyConfig rejected the value
}

}  // namespace dblp
