// Latency statistics and result writers.
//
// LatencyHistogram - fixed-size log-linear histogram of nanosecond values, for
//                    long runs and datapath cores (Record never allocates).
// Summarize        - exact statistics of a small sample set (per-iteration
//                    latencies of one run, a few thousand values at most).
// IterationRecord  - one row per (iteration, worker); written as CSV/JSONL.
// JsonWriter       - minimal streaming JSON writer for summary.json.
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

// One row per (iteration, worker) of a run.
struct IterationRecord {
  uint64_t iteration = 0;
  uint32_t rank = 0;
  double send_latency_us = 0;   // push round: first frame sent -> STOP/complete
                                // seen by the worker
  double bcast_latency_us = 0;  // broadcast round as seen by the worker
  uint32_t passes = 0;
  uint32_t bcast_passes = 0;
  uint64_t packets_sent = 0;
  uint64_t packets_resent = 0;
  double delivered_fraction = 0;
  double p = 0;
  bool critical = false;
  double grad_norm = 0;
  bool burst = false;
  double control_rtt_us = 0;  // mean PROBE -> BITMAP time seen by the sender
  bool resync = false;  // a re-synchronisation, not a training step
};

// Column order of WriteCsv (and key order of WriteJsonl). Booleans are
// written as 0/1 in CSV, true/false in JSONL.
inline constexpr std::string_view kIterationCsvHeader =
    "iteration,rank,send_latency_us,bcast_latency_us,passes,bcast_passes,"
    "packets_sent,packets_resent,delivered_fraction,p,critical,grad_norm,"
    "burst,control_rtt_us,resync";

// Header line + one line per row, '\n' line endings. Non-finite doubles are
// written as nan/inf/-inf (pandas and strtod read them back).
void WriteCsv(std::ostream& os, std::span<const IterationRecord> rows);
// One compact JSON object per line; non-finite doubles become null.
void WriteJsonl(std::ostream& os, std::span<const IterationRecord> rows);
// Exact empirical CDF: header "value,fraction", then one line per distinct
// sample value, ascending, with the fraction of samples <= value (the last
// line is 1). NaN samples are ignored.
void WriteCdfCsv(std::ostream& os, std::span<const double> samples);

// Minimal streaming JSON writer, compact output (no whitespace). Commas are
// inserted automatically; inside an object every value must be preceded by
// Key(). Writes one top-level value. Misuse (unbalanced End*, Key outside an
// object) is a programming error and asserts in debug builds.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& os) : os_(os) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  // Escapes '"', '\\' and all control characters (short forms \b \f \n \r \t,
  // others as \u00XX); other bytes, including UTF-8, pass through.
  JsonWriter& String(std::string_view s);
  JsonWriter& Int(int64_t v);
  JsonWriter& Uint(uint64_t v);
  // Shortest round-trip form, with ".0" appended to integral values so that
  // readers keep the field a float; NaN and +-Inf are written as null.
  JsonWriter& Double(double v);
  JsonWriter& Bool(bool v);
  JsonWriter& Null();

  // True once every opened container has been closed.
  bool Balanced() const { return stack_.empty() && !after_key_; }

 private:
  struct Frame {
    bool is_object;
    bool empty;
  };
  // Emits the separator a new value (or key) needs at this position.
  void BeforeValue();
  void WriteEscaped(std::string_view s);

  std::ostream& os_;
  std::vector<Frame> stack_;
  bool after_key_ = false;  // a Key() was written; its value comes next
};

// Writes "key": {"count":..,"mean":..,"min":..,"p50":..,"p90":..,"p99":..,
// "p999":..,"max":..} into the object `w` is currently in.
void WriteSummaryJson(JsonWriter& w, std::string_view key,
                      const LatencySummary& s);

}  // namespace dblp
