#include "dblp/policy/tolerance.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <vector>

namespace dblp {
namespace {

// Shortest text that reads back as the same double ("0.008", not
// "0.008000"), so Describe() lines can be pasted back as flags.
std::string Num(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

void CheckProbability(const char* flag, double p, const char* role) {
  if (!std::isfinite(p) || p < 0 || p >= 1) {
    throw std::invalid_argument(std::string(flag) +
                                " must be a finite number in [0, 1) (" + role +
                                "), got " + Num(p));
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
  std::string Describe() const override { return "fixed(p=" + Num(p_) + ")"; }

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
    return "dblp(p_low=" + Num(p_low_) + ",p_high=" + Num(p_high_) +
           ",freq=" + std::to_string(detector_.params().freq) +
           ",eta=" + Num(detector_.params().eta) + ")";
  }

 private:
  double p_low_;
  double p_high_;
  ClrDetector detector_;
};

class LtpPolicy final : public TolerancePolicy {
 public:
  explicit LtpPolicy(const PolicyConfig& c)
      : factor_(c.ltp_deadline_factor),
        window_(c.ltp_window),
        initial_deadline_ns_(c.ltp_initial_deadline_ns),
        min_fraction_(c.ltp_min_fraction),
        deadline_ns_(c.ltp_initial_deadline_ns) {}

  RoundTolerance Current() const override {
    RoundTolerance t;
    t.deadline_ns = deadline_ns_;
    t.min_fraction = min_fraction_;
    return t;
  }

  void OnIterationEnd(uint64_t, double, uint64_t round_time_ns) override {
    // No real round completes in 0 ns: 0 means the caller had no
    // measurement, and letting it in would drag the median towards a
    // deadline that closes every round at its floor.
    if (round_time_ns == 0) return;
    history_.push_back(round_time_ns);
    if (history_.size() > window_) history_.pop_front();
    deadline_ns_ = DeadlineFromHistory();
  }

  PolicyKind kind() const override { return PolicyKind::kLtp; }
  std::string Describe() const override {
    return "ltp(deadline_factor=" + Num(factor_) +
           ",window=" + std::to_string(window_) +
           ",initial_deadline_ns=" + std::to_string(initial_deadline_ns_) +
           ",min_fraction=" + Num(min_fraction_) + ")";
  }

 private:
  // Median (mean of the two middle values for an even count) times the
  // factor: the median ignores the very bursts early close is meant to cut
  // short, where a mean or a max would chase them.
  uint64_t DeadlineFromHistory() const {
    std::vector<uint64_t> v(history_.begin(), history_.end());
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    double median = static_cast<double>(v[mid]);
    if (v.size() % 2 == 0) {
      const uint64_t lower = *std::max_element(v.begin(), v.begin() + mid);
      median = (median + static_cast<double>(lower)) / 2;
    }
    const double d = std::round(factor_ * median);
    // 0 would read as "no deadline"; beyond 2^64 cannot be represented.
    if (d < 1) return 1;
    if (d >= 0x1.0p64) return std::numeric_limits<uint64_t>::max();
    return static_cast<uint64_t>(d);
  }

  double factor_;
  uint32_t window_;
  uint64_t initial_deadline_ns_;
  double min_fraction_;
  uint64_t deadline_ns_;
  std::deque<uint64_t> history_;  // oldest first, at most window_ entries
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
  throw std::invalid_argument("unknown --policy \"" + std::string(name) +
                              "\": choose one of reliable, fixed, dblp, ltp");
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
  }
  return "unknown";
}

void ValidatePolicyConfig(const PolicyConfig& c) {
  if (std::string_view(PolicyKindName(c.kind)) == "unknown") {
    throw std::invalid_argument("--policy holds an invalid value (" +
                                std::to_string(static_cast<unsigned>(c.kind)) +
                                "): choose one of reliable, fixed, dblp, ltp");
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
        "--p_low (" + Num(c.p_low) + ") must be <= --p_high (" + Num(c.p_high) +
        "): critical regimes need the lower loss tolerance; swap the values");
  }
  ValidateClrParams(c.clr);
  if (!std::isfinite(c.ltp_deadline_factor) || c.ltp_deadline_factor < 1) {
    throw std::invalid_argument(
        "--ltp_deadline_factor must be a finite number >= 1, got " +
        Num(c.ltp_deadline_factor) +
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
        Num(c.ltp_min_fraction) + ": e.g. 0.5");
  }
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
  }
  return nullptr;  // unreachable: ValidatePolicyConfig rejected the value
}

}  // namespace dblp
