// The recent round times a deadline policy looks back on (ltp, deadline,
// combined), and the deadline a statistic of them gives.
//
// Only measured rounds count: a round time of 0 means the caller had no
// measurement (no real round completes in 0 ns), and letting it in would
// drag every statistic towards a deadline that closes each round at its
// floor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace dblp {

class RoundTimeWindow {
 public:
  // Keeps the last `window` (>= 1, the policy's validation) round times.
  explicit RoundTimeWindow(uint32_t window) : window_(window) {}

  // Records one round time, dropping the oldest beyond the window. Returns
  // false, recording nothing, for 0 (not measured).
  bool Add(uint64_t round_time_ns);

  uint32_t window() const { return window_; }
  bool empty() const { return times_.empty(); }
  size_t size() const { return times_.size(); }

  // Median; the mean of the two middle values for an even count. 0 when
  // empty.
  double Median() const;
  // Nearest-rank percentile, q in (0, 100]: the smallest recorded time with
  // at least q% of the window at or below it, so always a time that was
  // measured (q = 100: the longest). 0 when empty.
  double Percentile(double q) const;

 private:
  uint32_t window_;
  std::deque<uint64_t> times_;  // oldest first, at most window_ entries
};

// round(factor * statistic_ns) as a deadline: at least 1 ns (0 would read
// as "no deadline"), saturated at the largest uint64_t.
uint64_t ScaledDeadlineNs(double factor, double statistic_ns);

}  // namespace dblp
