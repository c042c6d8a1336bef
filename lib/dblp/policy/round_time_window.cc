#include "dblp/policy/round_time_window.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dblp/policy/policy_text.h"

namespace dblp {

bool RoundTimeWindow::Add(uint64_t round_time_ns) {
  if (round_time_ns == 0) return false;
  times_.push_back(round_time_ns);
  if (times_.size() > window_) times_.pop_front();
  return true;
}

double RoundTimeWindow::Median() const {
  if (times_.empty()) return 0;
  std::vector<uint64_t> v(times_.begin(), times_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double median = static_cast<double>(v[mid]);
  if (v.size() % 2 == 0) {
    const uint64_t lower = *std::max_element(v.begin(), v.begin() + mid);
    median = (median + static_cast<double>(lower)) / 2;
  }
  return median;
}

double RoundTimeWindow::Percentile(double q) const {
  if (times_.empty()) return 0;
  std::vector<uint64_t> v(times_.begin(), times_.end());
  const double n = static_cast<double>(v.size());
  // Rank ceil(q/100 * n), 1-based. q * n / 100 keeps whole products exact
  // (95 * 20 / 100 = 19, where 0.95 * 20 is 18.999...); the small slack
  // stops a product one ulp above a whole number from taking the next rank.
  double rank = std::ceil(q * n / 100 - 1e-9);
  rank = std::clamp(rank, 1.0, n);
  const size_t k = static_cast<size_t>(rank) - 1;
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return static_cast<double>(v[k]);
}

uint64_t ScaledDeadlineNs(double factor, double statistic_ns) {
  const double d = std::round(factor * statistic_ns);
  if (d < 1) return 1;
  if (d >= 0x1.0p64) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(d);
}

void EarlyClose::Add(uint64_t round_time_ns) {
  if (history_.Add(round_time_ns)) {
    deadline_ns_ = ScaledDeadlineNs(
        factor_, percentile_ > 0 ? history_.Percentile(percentile_)
                                 : history_.Median());
  }
}

std::string EarlyClose::DescribeTail() const {
  return ",window=" + std::to_string(history_.window()) +
         ",initial_deadline_ns=" + std::to_string(initial_deadline_ns_) +
         ",min_fraction=" + PolicyNum(min_fraction_);
}

}  // namespace dblp
