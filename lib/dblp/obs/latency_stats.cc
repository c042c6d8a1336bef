#include "dblp/obs/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dblp/obs/number_text.h"

namespace dblp {
namespace {

using text::WriteCsvDouble;

// 1-based nearest rank of the q-th percentile among n > 0 samples.
uint64_t NearestRank(double q, uint64_t n) {
  if (!(q > 0)) q = 0;  // also catches NaN
  if (q > 100) q = 100;
  // q * n / 100 rather than q / 100 * n: for integral q and n the product is
  // exact, so e.g. 99% of 100 is exactly 99 and not 99.00000000000001 (which
  // ceil would turn into rank 100). The relative fuzz absorbs the few ulps a
  // non-integral q (99.9) can add; a true fractional part is never that small
  // for realistic n.
  const double x = q * static_cast<double>(n) / 100.0;
  const double r = std::ceil(x * (1.0 - 1e-12));
  if (r < 1) return 1;
  if (r >= static_cast<double>(n)) return n;
  return static_cast<uint64_t>(r);
}

std::vector<double> WithoutNaN(std::span<const double> samples) {
  std::vector<double> out;
  out.reserve(samples.size());
  for (double v : samples) {
    if (!std::isnan(v)) out.push_back(v);
  }
  return out;
}

}  // namespace

// --- LatencyHistogram -------------------------------------------------------

void LatencyHistogram::Reset() {
  buckets_.fill(0);
  count_ = 0;
  min_ = std::numeric_limits<uint64_t>::max();
  max_ = 0;
  sum_lo_ = 0;
  sum_hi_ = 0;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < kNumBuckets; ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  const uint64_t lo = sum_lo_ + other.sum_lo_;
  sum_hi_ += other.sum_hi_ + (lo < sum_lo_ ? 1 : 0);
  sum_lo_ = lo;
}

double LatencyHistogram::mean() const {
  if (count_ == 0) return 0;
  // long double keeps 64 mantissa bits on x86, so the 128-bit sum loses
  // nothing a double result could show.
  const long double sum = std::ldexp(static_cast<long double>(sum_hi_), 64) +
                          static_cast<long double>(sum_lo_);
  return static_cast<double>(sum / static_cast<long double>(count_));
}

uint64_t LatencyHistogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t rank = NearestRank(q, count_);
  uint64_t cum = 0;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    cum += buckets_[i];
    // The upper bound, not the lower: it keeps the documented guarantee
    // "at least q% of samples are <= result". Capping at max_ makes the top
    // percentiles exact and never reports a value that was not reached.
    if (cum >= rank) return std::min(BucketUpperBound(i), max_);
  }
  return max_;  // unreachable: cum ends at count_ >= rank
}

std::vector<std::pair<uint64_t, double>> LatencyHistogram::Cdf() const {
  std::vector<std::pair<uint64_t, double>> out;
  if (count_ == 0) return out;
  const double total = static_cast<double>(count_);
  uint64_t cum = 0;
  for (size_t i = 0; i < kNumBuckets; ++i) {
    if (buckets_[i] == 0) continue;
    cum += buckets_[i];
    // cum == count_ in the last non-empty bucket, so that fraction is
    // exactly 1.0.
    out.emplace_back(std::min(BucketUpperBound(i), max_),
                     static_cast<double>(cum) / total);
  }
  return out;
}

// --- Exact summaries --------------------------------------------------------

LatencySummary Summarize(std::span<const double> samples) {
  std::vector<double> sorted = WithoutNaN(samples);
  LatencySummary s;
  if (sorted.empty()) return s;
  std::sort(sorted.begin(), sorted.end());
  const uint64_t n = sorted.size();
  // long double: per-iteration sets are small, but a sum of microsecond
  // latencies should not lose the low digits of the mean.
  long double sum = 0;
  for (double v : sorted) sum += v;
  const auto at = [&](double q) { return sorted[NearestRank(q, n) - 1]; };
  s.count = n;
  s.mean = static_cast<double>(sum / static_cast<long double>(n));
  s.min = sorted.front();
  s.p50 = at(50);
  s.p90 = at(90);
  s.p99 = at(99);
  s.p999 = at(99.9);
  s.max = sorted.back();
  return s;
}

double PercentileNearestRank(std::vector<double> samples, double q) {
  std::erase_if(samples, [](double v) { return std::isnan(v); });
  if (samples.empty()) return 0;
  const uint64_t rank = NearestRank(q, samples.size());
  const auto nth = samples.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(samples.begin(), nth, samples.end());
  return *nth;
}

void WriteCdfCsv(std::ostream& os, std::span<const double> samples) {
  std::vector<double> sorted = WithoutNaN(samples);
  std::sort(sorted.begin(), sorted.end());
  os << "value,fraction\n";
  const double n = static_cast<double>(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    // One point per distinct value, at its last occurrence, so the fraction
    // counts every sample equal to it (a step CDF, not a ramp).
    if (i + 1 < sorted.size() && sorted[i + 1] == sorted[i]) continue;
    WriteCsvDouble(os, sorted[i]);
    os << ',';
    WriteCsvDouble(os, static_cast<double>(i + 1) / n);
    os << '\n';
  }
}

void WriteSummaryJson(JsonWriter& w, std::string_view key,
                      const LatencySummary& s) {
  // clang-format off
  w.Key(key)
      .BeginObject()
      .Key("count").Uint(s.count)
      .Key("mean").Double(s.mean)
      .Key("min").Double(s.min)
      .Key("p50").Double(s.p50)
      .Key("p90").Double(s.p90)
      .Key("p99").Double(s.p99)
      .Key("p999").Double(s.p999)
      .Key("max").Double(s.max)
      .EndObject();
  // clang-format on
}

}  // namespace dblp
