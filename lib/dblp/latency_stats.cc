#include "dblp/latency_stats.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

namespace dblp {
namespace {

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

// Large enough for any shortest double ("-1.2345678901234567e-308" is 24)
// and any 64-bit integer.
using NumberBuffer = std::array<char, 32>;

template <typename T>
void WriteInteger(std::ostream& os, T v) {
  NumberBuffer buf;
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  assert(res.ec == std::errc());
  os.write(buf.data(), res.ptr - buf.data());
}

// Shortest text that parses back to exactly `v`; requires a finite v.
std::string_view FormatFinite(double v, NumberBuffer& buf) {
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  assert(res.ec == std::errc());
  return std::string_view(buf.data(),
                          static_cast<size_t>(res.ptr - buf.data()));
}

// CSV flavour: the spellings strtod and pandas read back for non-finite
// values (to_chars would write "-nan" for a negative NaN).
void WriteCsvDouble(std::ostream& os, double v) {
  if (std::isnan(v)) {
    os << "nan";
  } else if (std::isinf(v)) {
    os << (v > 0 ? "inf" : "-inf");
  } else {
    NumberBuffer buf;
    os << FormatFinite(v, buf);
  }
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

// --- Row writers ------------------------------------------------------------

void WriteCsv(std::ostream& os, std::span<const IterationRecord> rows) {
  os << kIterationCsvHeader << '\n';
  for (const IterationRecord& r : rows) {
    WriteInteger(os, r.iteration);
    os << ',';
    WriteInteger(os, r.rank);
    os << ',';
    WriteCsvDouble(os, r.send_latency_us);
    os << ',';
    WriteCsvDouble(os, r.bcast_latency_us);
    os << ',';
    WriteInteger(os, r.passes);
    os << ',';
    WriteInteger(os, r.bcast_passes);
    os << ',';
    WriteInteger(os, r.packets_sent);
    os << ',';
    WriteInteger(os, r.packets_resent);
    os << ',';
    WriteCsvDouble(os, r.delivered_fraction);
    os << ',';
    WriteCsvDouble(os, r.p);
    os << ',' << (r.critical ? '1' : '0') << ',';
    WriteCsvDouble(os, r.grad_norm);
    os << ',' << (r.burst ? '1' : '0') << ',';
    WriteCsvDouble(os, r.control_rtt_us);
    os << ',' << (r.resync ? '1' : '0') << '\n';
  }
}

void WriteJsonl(std::ostream& os, std::span<const IterationRecord> rows) {
  for (const IterationRecord& r : rows) {
    // A fresh writer per line: each line is its own top-level value.
    JsonWriter w(os);
    // One key/value pair per line reads like the schema.
    // clang-format off
    w.BeginObject()
        .Key("iteration").Uint(r.iteration)
        .Key("rank").Uint(r.rank)
        .Key("send_latency_us").Double(r.send_latency_us)
        .Key("bcast_latency_us").Double(r.bcast_latency_us)
        .Key("passes").Uint(r.passes)
        .Key("bcast_passes").Uint(r.bcast_passes)
        .Key("packets_sent").Uint(r.packets_sent)
        .Key("packets_resent").Uint(r.packets_resent)
        .Key("delivered_fraction").Double(r.delivered_fraction)
        .Key("p").Double(r.p)
        .Key("critical").Bool(r.critical)
        .Key("grad_norm").Double(r.grad_norm)
        .Key("burst").Bool(r.burst)
        .Key("control_rtt_us").Double(r.control_rtt_us)
        .Key("resync").Bool(r.resync)
        .EndObject();
    // clang-format on
    os << '\n';
  }
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

// --- JsonWriter -------------------------------------------------------------

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;  // the key already wrote its separator
    return;
  }
  if (stack_.empty()) return;
  assert(!stack_.back().is_object && "a value inside an object needs Key()");
  if (!stack_.back().empty) os_.put(',');
  stack_.back().empty = false;
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  os_.put('{');
  stack_.push_back({/*is_object=*/true, /*empty=*/true});
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  assert(!stack_.empty() && stack_.back().is_object && !after_key_);
  stack_.pop_back();
  os_.put('}');
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  os_.put('[');
  stack_.push_back({/*is_object=*/false, /*empty=*/true});
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  assert(!stack_.empty() && !stack_.back().is_object);
  stack_.pop_back();
  os_.put(']');
  return *this;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  assert(!stack_.empty() && stack_.back().is_object && !after_key_);
  if (!stack_.back().empty) os_.put(',');
  stack_.back().empty = false;
  WriteEscaped(key);
  os_.put(':');
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view s) {
  BeforeValue();
  WriteEscaped(s);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t v) {
  BeforeValue();
  WriteInteger(os_, v);
  return *this;
}

JsonWriter& JsonWriter::Uint(uint64_t v) {
  BeforeValue();
  WriteInteger(os_, v);
  return *this;
}

JsonWriter& JsonWriter::Double(double v) {
  BeforeValue();
  // JSON has no NaN/Infinity; null is what Python's and most readers'
  // strict modes accept, and it marks the value as missing.
  if (!std::isfinite(v)) {
    os_ << "null";
    return *this;
  }
  NumberBuffer buf;
  const std::string_view text = FormatFinite(v, buf);
  os_ << text;
  // "3" would read back as an integer in Python/JS; keep floats floats.
  if (text.find_first_of(".e") == std::string_view::npos) os_ << ".0";
  return *this;
}

JsonWriter& JsonWriter::Bool(bool v) {
  BeforeValue();
  os_ << (v ? "true" : "false");
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  os_ << "null";
  return *this;
}

void JsonWriter::WriteEscaped(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  os_.put('"');
  size_t run_start = 0;  // unescaped bytes are written in runs, not one by one
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const char* short_form = nullptr;
    switch (c) {
      case '"':
        short_form = "\\\"";
        break;
      case '\\':
        short_form = "\\\\";
        break;
      case '\b':
        short_form = "\\b";
        break;
      case '\f':
        short_form = "\\f";
        break;
      case '\n':
        short_form = "\\n";
        break;
      case '\r':
        short_form = "\\r";
        break;
      case '\t':
        short_form = "\\t";
        break;
      default:
        if (c >= 0x20) continue;
    }
    os_.write(s.data() + run_start,
              static_cast<std::streamsize>(i - run_start));
    run_start = i + 1;
    if (short_form != nullptr) {
      os_ << short_form;
    } else {
      const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
      os_.write(esc, sizeof(esc));
    }
  }
  os_.write(s.data() + run_start,
            static_cast<std::streamsize>(s.size() - run_start));
  os_.put('"');
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
