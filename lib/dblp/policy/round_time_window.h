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
#include <string>

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

// The early close a deadline policy carries (ltp, deadline, combined): its
// window of measured round times, the deadline factor x a statistic of them
// gives (the median for percentile 0, else that nearest-rank percentile),
// the floor of chunks a deadline needs, and the deadline in force
// (initial_deadline_ns until a round was measured).
class EarlyClose {
 public:
  EarlyClose(double percentile, double factor, uint32_t window,
             uint64_t initial_deadline_ns, double min_fraction)
      : percentile_(percentile),
        factor_(factor),
        initial_deadline_ns_(initial_deadline_ns),
        min_fraction_(min_fraction),
        history_(window),
        deadline_ns_(initial_deadline_ns) {}

  // One round's time (0: not measured, ignored).
  void Add(uint64_t round_time_ns);

  uint64_t deadline_ns() const { return deadline_ns_; }
  double min_fraction() const { return min_fraction_; }
  double factor() const { return factor_; }
  // ",window=W,initial_deadline_ns=N,min_fraction=F": the tail every
  // Describe() line of these policies shares.
  std::string DescribeTail() const;

 private:
  double percentile_;
  double factor_;
  uint64_t initial_deadline_ns_;
  double min_fraction_;
  RoundTimeWindow history_;
  uint64_t deadline_ns_;
};

}  // namespace dblp
