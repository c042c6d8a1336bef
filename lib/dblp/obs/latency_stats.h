// Latency statistics and result writers.
//
// LatencyHistogram - fixed-size log-linear histogram of nanosecond values, for
//                    long runs and datapath cores (Record never allocates).
// Summarize        - exact statistics of a small sample set (per-iteration
//                    latencies of one run, a few thousand values at most).
// WriteCdfCsv      - an exact empirical CDF as CSV.
// (Rows are in records.h, the JSON writer in json_writer.h.)
//
// Percentiles everywhere use the nearest-rank definition: the q-th percentile
// of n samples is the ceil(q/100 * n)-th smallest (1-based, at least the 1st).
// It always returns an observed value (no interpolation), which is what the
// paper's tail numbers (p99 of per-iteration send latency) mean.
//
// Doubles are written with the shortest representation that round-trips
// (std::to_chars), independent of the stream's locale.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "dblp/obs/json_writer.h"

namespace dblp {

// HdrHistogram-like log-linear histogram of uint64 nanosecond values.
//
// Values below 2^(kSubBucketBits+1) = 256 are counted exactly. Above that,
// every power-of-two range [2^e, 2^(e+1)) is split into 2^kSubBucketBits = 128
// equal sub-buckets, so a bucket's width is at most 1/128 of its lower bound:
// any value reported from a bucket (its upper bound) is within
// kMaxRelativeError of every sample it holds. The buckets cover the whole
// uint64 range, so no value is ever clamped: UINT64_MAX lands in the top
// bucket [255 * 2^56, 2^64 - 1] like any other value.
//
// Memory is fixed (kNumBuckets counters, ~58 KiB, inline - no heap at all);
// Record is O(1) (a count-leading-zeros and a shift) with no allocation. Not
// thread safe: keep one histogram per core and Merge them off the datapath.
class LatencyHistogram {
 public:
  static constexpr int kSubBucketBits = 7;
  static constexpr uint64_t kSubBuckets = uint64_t{1} << kSubBucketBits;
  // Exact region [0, 2*kSubBuckets) plus kSubBuckets buckets for every
  // exponent 8..63.
  static constexpr size_t kNumBuckets =
      (64 - kSubBucketBits - 1 + 2) * kSubBuckets;
  static constexpr double kMaxRelativeError = 1.0 / kSubBuckets;

  LatencyHistogram() { Reset(); }

  void Record(uint64_t ns) {
    ++buckets_[BucketIndex(ns)];
    ++count_;
    if (ns < min_) min_ = ns;
    if (ns > max_) max_ = ns;
    // 128-bit running sum (two words) so that mean() stays exact even for
    // huge values; the carry is the only extra work.
    const uint64_t lo = sum_lo_ + ns;
    sum_hi_ += lo < sum_lo_ ? 1 : 0;
    sum_lo_ = lo;
  }
  void Merge(const LatencyHistogram& other);
  void Reset();

  uint64_t count() const { return count_; }
  // Exact; 0 when empty.
  uint64_t min() const { return count_ == 0 ? 0 : min_; }
  uint64_t max() const { return max_; }
  // Exact mean of the recorded values (up to double rounding); 0 when empty.
  double mean() const;

  // q in [0, 100] (clamped; NaN counts as 0). Returns the upper bound of the
  // bucket holding the nearest-rank sample, capped at max(): at least q% of
  // the samples are <= the result, and it exceeds the exact nearest-rank
  // value by at most kMaxRelativeError of it. 0 when empty.
  uint64_t Percentile(double q) const;

  // One point per non-empty bucket, ascending: (bucket upper bound capped at
  // max(), fraction of samples <= that value). The last fraction is exactly
  // 1.0. Empty histogram -> empty vector.
  std::vector<std::pair<uint64_t, double>> Cdf() const;

  // Bucket geometry, public for tests and for anyone exporting raw buckets.
  static constexpr size_t BucketIndex(uint64_t v) {
    if (v < 2 * kSubBuckets) return static_cast<size_t>(v);
    // >= 1 here.
    const int shift = static_cast<int>(std::bit_width(v)) - 1 - kSubBucketBits;
    return static_cast<size_t>(shift) * kSubBuckets + (v >> shift);
  }
  static constexpr uint64_t BucketLowerBound(size_t index) {
    if (index < 2 * kSubBuckets) return index;
    const uint64_t shift = index / kSubBuckets - 1;
    const uint64_t mantissa = index % kSubBuckets + kSubBuckets;
    return mantissa << shift;
  }
  static constexpr uint64_t BucketUpperBound(size_t index) {
    if (index < 2 * kSubBuckets) return index;
    const uint64_t shift = index / kSubBuckets - 1;
    // lower + (width - 1) rather than next_lower - 1: the top bucket's next
    // lower bound would be 2^64.
    return BucketLowerBound(index) + ((uint64_t{1} << shift) - 1);
  }

 private:
  std::array<uint64_t, kNumBuckets> buckets_;
  uint64_t count_ = 0;
  uint64_t min_ = 0;
  uint64_t max_ = 0;
  uint64_t sum_lo_ = 0;
  uint64_t sum_hi_ = 0;
};

// Exact statistics of a small sample set. NaN samples are ignored (they are
// not latencies; count excludes them). All fields are 0 for an empty set.
struct LatencySummary {
  uint64_t count = 0;
  double mean = 0, min = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};
LatencySummary Summarize(std::span<const double> samples);

// Nearest-rank percentile (see top of file) of `samples`, q in [0, 100]
// (clamped). Takes the vector by value because it reorders it. NaN samples
// are ignored; 0 if no samples remain.
double PercentileNearestRank(std::vector<double> samples, double q);

// Exact empirical CDF: header "value,fraction", then one line per distinct
// sample value, ascending, with the fraction of samples <= value (the last
// line is 1). NaN samples are ignored.
void WriteCdfCsv(std::ostream& os, std::span<const double> samples);

// Writes "key": {"count":..,"mean":..,"min":..,"p50":..,"p90":..,"p99":..,
// "p999":..,"max":..} into the object `w` is currently in.
void WriteSummaryJson(JsonWriter& w, std::string_view key,
                      const LatencySummary& s);

}  // namespace dblp
