#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dblp/obs/latency_stats.h"
#include "dblp/obs/records.h"

namespace dblp {
namespace {

// Exact nearest-rank percentile of integer samples, the reference the
// histogram is checked against (independent of the library's helper).
uint64_t ExactPercentile(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  uint64_t rank = static_cast<uint64_t>(
      std::ceil(q / 100.0 * static_cast<double>(v.size()) - 1e-9));
  rank = std::clamp<uint64_t>(rank, 1, v.size());
  return v[rank - 1];
}

// The histogram is ~58 KiB; keep it off the test's stack.
std::unique_ptr<LatencyHistogram> NewHistogram() {
  return std::make_unique<LatencyHistogram>();
}

void ExpectPercentilesWithinBound(const LatencyHistogram& h,
                                  const std::vector<uint64_t>& samples) {
  for (double q : {0.0, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9, 100.0}) {
    const uint64_t exact = ExactPercentile(samples, q);
    const uint64_t got = h.Percentile(q);
    // Never below the exact answer (at least q% are <= got), never above max.
    EXPECT_GE(got, exact) << "q=" << q;
    EXPECT_LE(got, h.max()) << "q=" << q;
    EXPECT_LE(static_cast<double>(got - exact),
              static_cast<double>(exact) * LatencyHistogram::kMaxRelativeError)
        << "q=" << q << " exact=" << exact << " got=" << got;
  }
}

TEST(LatencyHistogram, BucketGeometryIsContiguousAndBounded) {
  // Every bucket starts right after the previous one ends, and its width is
  // within the relative error bound of its lower bound.
  for (size_t i = 1; i < LatencyHistogram::kNumBuckets; ++i) {
    ASSERT_EQ(LatencyHistogram::BucketLowerBound(i),
              LatencyHistogram::BucketUpperBound(i - 1) + 1)
        << "bucket " << i;
    const uint64_t lo = LatencyHistogram::BucketLowerBound(i);
    const uint64_t hi = LatencyHistogram::BucketUpperBound(i);
    ASSERT_LE(static_cast<double>(hi - lo),
              static_cast<double>(lo) * LatencyHistogram::kMaxRelativeError);
    ASSERT_EQ(LatencyHistogram::BucketIndex(lo), i);
    ASSERT_EQ(LatencyHistogram::BucketIndex(hi), i);
  }
  EXPECT_EQ(
      LatencyHistogram::BucketUpperBound(LatencyHistogram::kNumBuckets - 1),
      std::numeric_limits<uint64_t>::max());
}

TEST(LatencyHistogram, UniformPercentilesWithinRelativeError) {
  auto h = NewHistogram();
  std::vector<uint64_t> samples;
  for (uint64_t v = 1; v <= 100000; ++v) samples.push_back(v);
  // Shuffled so that nothing depends on insertion order.
  std::shuffle(samples.begin(), samples.end(), std::mt19937_64(42));
  for (uint64_t v : samples) h->Record(v);
  EXPECT_EQ(h->count(), 100000u);
  ExpectPercentilesWithinBound(*h, samples);
  EXPECT_EQ(h->Percentile(100), 100000u);  // capped at the exact max
  EXPECT_EQ(h->Percentile(0), 1u);         // values < 256 are exact
}

TEST(LatencyHistogram, ConstantIsReportedExactly) {
  auto h = NewHistogram();
  for (int i = 0; i < 1000; ++i) h->Record(123457);
  // A single value: min == max, so the max cap makes every percentile exact.
  for (double q : {0.0, 50.0, 99.0, 100.0}) {
    EXPECT_EQ(h->Percentile(q), 123457u) << q;
  }
  EXPECT_EQ(h->min(), 123457u);
  EXPECT_EQ(h->max(), 123457u);
  EXPECT_DOUBLE_EQ(h->mean(), 123457.0);
}

TEST(LatencyHistogram, BimodalPercentilesWithinRelativeError) {
  // 90% fast (~10 us), 10% slow (~5 ms): the p90/p99 boundary must land in
  // the right mode.
  auto h = NewHistogram();
  std::mt19937_64 rng(7);
  std::normal_distribution<double> fast(10000, 500), slow(5e6, 2e5);
  std::vector<uint64_t> samples;
  for (int i = 0; i < 20000; ++i) {
    const double v = (i % 10 == 9) ? slow(rng) : fast(rng);
    samples.push_back(static_cast<uint64_t>(std::max(v, 1.0)));
  }
  for (uint64_t v : samples) h->Record(v);
  ExpectPercentilesWithinBound(*h, samples);
  EXPECT_LT(h->Percentile(90), 100000u);
  EXPECT_GT(h->Percentile(91), 1000000u);
}

TEST(LatencyHistogram, MinMaxMeanExact) {
  auto h = NewHistogram();
  const std::vector<uint64_t> v = {1000003, 17, 999999937, 4242, 65537};
  long double sum = 0;
  for (uint64_t x : v) {
    h->Record(x);
    sum += static_cast<long double>(x);
  }
  EXPECT_EQ(h->min(), 17u);
  EXPECT_EQ(h->max(), 999999937u);
  EXPECT_EQ(h->mean(), static_cast<double>(sum / 5));
}

TEST(LatencyHistogram, ZeroAndHugeValues) {
  auto h = NewHistogram();
  const uint64_t hour_ns = 3600ull * 1000 * 1000 * 1000;
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  h->Record(0);
  h->Record(hour_ns);
  h->Record(top);
  h->Record(top);
  EXPECT_EQ(h->count(), 4u);
  EXPECT_EQ(h->min(), 0u);
  EXPECT_EQ(h->max(), top);
  EXPECT_EQ(h->Percentile(0), 0u);  // 0 is in the exact region
  EXPECT_EQ(h->Percentile(25), 0u);
  const uint64_t p50 = h->Percentile(50);
  EXPECT_GE(p50, hour_ns);
  EXPECT_LE(static_cast<double>(p50 - hour_ns),
            static_cast<double>(hour_ns) * LatencyHistogram::kMaxRelativeError);
  EXPECT_EQ(h->Percentile(100), top);  // top bucket, no overflow
  // The 128-bit sum does not wrap: (0 + 1h + 2 * (2^64 - 1)) / 4.
  const double expect_mean =
      (static_cast<double>(hour_ns) + 2.0 * 18446744073709551615.0) / 4.0;
  EXPECT_DOUBLE_EQ(h->mean(), expect_mean);
  EXPECT_EQ(LatencyHistogram::BucketIndex(top),
            LatencyHistogram::kNumBuckets - 1);
}

TEST(LatencyHistogram, MergeEqualsRecordingAll) {
  auto a = NewHistogram(), b = NewHistogram(), all = NewHistogram();
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> dist(10, 2);
  for (int i = 0; i < 5000; ++i) {
    const uint64_t v = static_cast<uint64_t>(dist(rng));
    (i % 3 == 0 ? *a : *b).Record(v);
    all->Record(v);
  }
  // Two sums above 2^63 each: their low words must carry in the merge.
  const uint64_t big = (uint64_t{1} << 63) + 12345;
  a->Record(big);
  b->Record(big);
  all->Record(big);
  all->Record(big);
  a->Merge(*b);
  EXPECT_EQ(a->count(), all->count());
  EXPECT_EQ(a->min(), all->min());
  EXPECT_EQ(a->max(), all->max());
  EXPECT_EQ(a->mean(), all->mean());
  EXPECT_EQ(a->Cdf(), all->Cdf());
  for (double q = 0; q <= 100; q += 0.5) {
    EXPECT_EQ(a->Percentile(q), all->Percentile(q)) << q;
  }
}

TEST(LatencyHistogram, CdfMonotoneEndingAtOne) {
  auto h = NewHistogram();
  std::mt19937_64 rng(11);
  std::exponential_distribution<double> dist(1.0 / 50000);
  for (int i = 0; i < 10000; ++i) h->Record(static_cast<uint64_t>(dist(rng)));
  const auto cdf = h->Cdf();
  ASSERT_FALSE(cdf.empty());
  for (size_t i = 1; i < cdf.size(); ++i) {
    EXPECT_GT(cdf[i].first, cdf[i - 1].first);
    EXPECT_GT(cdf[i].second, cdf[i - 1].second);
  }
  EXPECT_EQ(cdf.back().second, 1.0);
  EXPECT_EQ(cdf.back().first, h->max());
  EXPECT_GE(cdf.front().first, h->min());
}

TEST(LatencyHistogram, EmptyAndReset) {
  auto h = NewHistogram();
  EXPECT_EQ(h->count(), 0u);
  EXPECT_EQ(h->min(), 0u);
  EXPECT_EQ(h->max(), 0u);
  EXPECT_EQ(h->mean(), 0.0);
  EXPECT_EQ(h->Percentile(50), 0u);
  EXPECT_TRUE(h->Cdf().empty());
  h->Record(500);
  h->Record(7);
  h->Reset();
  EXPECT_EQ(h->count(), 0u);
  EXPECT_EQ(h->min(), 0u);
  EXPECT_EQ(h->max(), 0u);
  EXPECT_EQ(h->Percentile(100), 0u);
  EXPECT_TRUE(h->Cdf().empty());
  // Reset restores the min sentinel: a later sample is the new min.
  h->Record(900);
  EXPECT_EQ(h->min(), 900u);
  // Merging an empty histogram changes nothing.
  auto empty = NewHistogram();
  h->Merge(*empty);
  EXPECT_EQ(h->min(), 900u);
  EXPECT_EQ(h->count(), 1u);
}

TEST(Summarize, NearestRankHandChecked) {
  std::vector<double> v = {7, 3, 10, 1, 5, 9, 2, 8, 6, 4};  // 1..10 shuffled
  const LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.p50, 5);   // ceil(5.0) = 5th
  EXPECT_EQ(s.p90, 9);   // ceil(9.0) = 9th
  EXPECT_EQ(s.p99, 10);  // ceil(9.9) = 10th
  EXPECT_EQ(s.p999, 10);
  EXPECT_EQ(s.max, 10);
  // Exact ranks must not be pushed up by floating point: 99% of 100 is the
  // 99th value, 99.9% of 1000 the 999th.
  std::vector<double> hundred, thousand;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  for (int i = 1; i <= 1000; ++i) thousand.push_back(i);
  EXPECT_EQ(PercentileNearestRank(hundred, 99), 99);
  EXPECT_EQ(PercentileNearestRank(hundred, 0), 1);
  EXPECT_EQ(PercentileNearestRank(hundred, 100), 100);
  EXPECT_EQ(PercentileNearestRank(thousand, 99.9), 999);
  EXPECT_EQ(Summarize(thousand).p999, 999);
  EXPECT_EQ(PercentileNearestRank(v, 50), 5);
  EXPECT_EQ(PercentileNearestRank(v, 51), 6);
}

TEST(Summarize, EmptyAndNaN) {
  const LatencySummary e = Summarize({});
  EXPECT_EQ(e.count, 0u);
  EXPECT_EQ(e.mean, 0);
  EXPECT_EQ(e.min, 0);
  EXPECT_EQ(e.p99, 0);
  EXPECT_EQ(e.max, 0);
  EXPECT_EQ(PercentileNearestRank({}, 50), 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = {nan, 4, nan, 2};
  const LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 2u);
  EXPECT_EQ(s.min, 2);
  EXPECT_EQ(s.max, 4);
  EXPECT_EQ(s.mean, 3);
  EXPECT_EQ(PercentileNearestRank(v, 100), 4);
}

std::vector<std::string> Split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(line);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!line.empty() && line.back() == sep) out.emplace_back();
  return out;
}

std::vector<IterationRecord> SampleRows() {
  IterationRecord a;
  a.iteration = 18446744073709551615ull;
  a.rank = 3;
  a.send_latency_us = 0.1 + 0.2;  // not exactly 0.3: round-trip must hold
  a.bcast_latency_us = 1234.5678901234567;
  a.passes = 2;
  a.bcast_passes = 1;
  a.packets_sent = 1000000007;
  a.packets_resent = 12;
  a.delivered_fraction = 2.0 / 3.0;
  a.p = 0.3;
  a.critical = true;
  a.grad_norm = 1e-300;
  a.burst = false;
  a.control_rtt_us = 41.25;
  a.worker_norm = 3.5;
  a.bad_chunks = 2;
  a.clipped_chunks = 7;
  a.clr_nonfinite = 1;
  IterationRecord b;
  b.iteration = 1;
  b.send_latency_us = 5e20;
  b.delivered_fraction = 1;
  b.burst = true;
  b.resync = true;
  return {a, b};
}

TEST(Writers, CsvParsesBackExactly) {
  const auto rows = SampleRows();
  std::ostringstream os;
  WriteCsv(os, rows);
  std::istringstream in(os.str());
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, kIterationCsvHeader);
  EXPECT_EQ(Split(line, ',').size(), 19u);
  for (const IterationRecord& r : rows) {
    ASSERT_TRUE(std::getline(in, line));
    const auto f = Split(line, ',');
    ASSERT_EQ(f.size(), 19u) << line;
    const auto u = [&](int i) {
      return std::strtoull(f[i].c_str(), nullptr, 10);
    };
    const auto d = [&](int i) { return std::strtod(f[i].c_str(), nullptr); };
    EXPECT_EQ(u(0), r.iteration);
    EXPECT_EQ(u(1), r.rank);
    EXPECT_EQ(d(2), r.send_latency_us);  // bitwise round trip, not NEAR
    EXPECT_EQ(d(3), r.bcast_latency_us);
    EXPECT_EQ(u(4), r.passes);
    EXPECT_EQ(u(5), r.bcast_passes);
    EXPECT_EQ(u(6), r.packets_sent);
    EXPECT_EQ(u(7), r.packets_resent);
    EXPECT_EQ(d(8), r.delivered_fraction);
    EXPECT_EQ(d(9), r.p);
    EXPECT_EQ(f[10], r.critical ? "1" : "0");
    EXPECT_EQ(d(11), r.grad_norm);
    EXPECT_EQ(f[12], r.burst ? "1" : "0");
    EXPECT_EQ(std::strtod(f[13].c_str(), nullptr), r.control_rtt_us);
    EXPECT_EQ(f[14], r.resync ? "1" : "0");
    EXPECT_EQ(d(15), r.worker_norm);
    EXPECT_EQ(u(16), r.bad_chunks);
    EXPECT_EQ(u(17), r.clipped_chunks);
    EXPECT_EQ(u(18), r.clr_nonfinite);
  }
  EXPECT_FALSE(std::getline(in, line));
  // Shortest form, not %.17g noise.
  EXPECT_NE(os.str().find(",0.3,"), std::string::npos);
}

// Value text of "key": in a flat JSON object line (enough for our rows).
std::string JsonField(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  if (at == std::string::npos) return "<missing>";
  const size_t start = at + k.size();
  const size_t end = line.find_first_of(",}", start);
  return line.substr(start, end - start);
}

TEST(Writers, JsonlLinesParseBack) {
  auto rows = SampleRows();
  rows[1].grad_norm = std::numeric_limits<double>::quiet_NaN();
  std::ostringstream os;
  WriteJsonl(os, rows);
  std::istringstream in(os.str());
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line.front(), '{');
  EXPECT_EQ(line.back(), '}');
  EXPECT_EQ(JsonField(line, "iteration"), "18446744073709551615");
  EXPECT_EQ(JsonField(line, "rank"), "3");
  EXPECT_EQ(std::strtod(JsonField(line, "send_latency_us").c_str(), nullptr),
            0.1 + 0.2);
  EXPECT_EQ(std::strtod(JsonField(line, "delivered_fraction").c_str(), nullptr),
            2.0 / 3.0);
  EXPECT_EQ(JsonField(line, "p"), "0.3");
  EXPECT_EQ(JsonField(line, "critical"), "true");
  EXPECT_EQ(JsonField(line, "burst"), "false");
  EXPECT_EQ(JsonField(line, "resync"), "false");
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(JsonField(line, "iteration"), "1");
  EXPECT_EQ(JsonField(line, "delivered_fraction"), "1.0");  // stays a float
  EXPECT_EQ(JsonField(line, "send_latency_us"), "5e+20");
  EXPECT_EQ(JsonField(line, "grad_norm"), "null");
  EXPECT_EQ(JsonField(line, "burst"), "true");
  EXPECT_EQ(JsonField(line, "resync"), "true");
  EXPECT_FALSE(std::getline(in, line));
}

TEST(Writers, CdfCsvIsExactStepFunction) {
  const std::vector<double> v = {3, 1, 2, 2, std::nan(""), 2.5};
  std::ostringstream os;
  WriteCdfCsv(os, v);
  EXPECT_EQ(os.str(),
            "value,fraction\n"
            "1,0.2\n"
            "2,0.6\n"
            "2.5,0.8\n"
            "3,1\n");
  std::ostringstream empty;
  WriteCdfCsv(empty, {});
  EXPECT_EQ(empty.str(), "value,fraction\n");
}

TEST(JsonWriter, EscapingAndNonFinite) {
  std::ostringstream os;
  JsonWriter w(os);
  w.BeginArray()
      .String("a\"b\\c\nd")
      .String(std::string("\x01\x1f\t\r\b\f", 6))
      .String("caf\xc3\xa9/")
      .Double(std::numeric_limits<double>::quiet_NaN())
      .Double(std::numeric_limits<double>::infinity())
      .Double(-std::numeric_limits<double>::infinity())
      .Double(0.1)
      .Double(-2)
      .Int(std::numeric_limits<int64_t>::min())
      .Uint(std::numeric_limits<uint64_t>::max())
      .Bool(false)
      .Null()
      .EndArray();
  EXPECT_EQ(
      os.str(),
      R"(["a\"b\\c\nd","\u0001\u001f\t\r\b\f","café/",null,null,null,)"
      R"(0.1,-2.0,-9223372036854775808,18446744073709551615,false,null])");
  EXPECT_TRUE(w.Balanced());
}

TEST(JsonWriter, NestedCommasAndSummary) {
  std::ostringstream os;
  JsonWriter w(os);
  w.BeginObject();
  w.Key("run").String("dblp");
  w.Key("empty_obj").BeginObject().EndObject();
  w.Key("empty_arr").BeginArray().EndArray();
  w.Key("nested")
      .BeginArray()
      .BeginObject()
      .Key("a")
      .Int(1)
      .Key("b")
      .BeginArray()
      .Int(2)
      .Int(3)
      .EndArray()
      .EndObject()
      .BeginArray()
      .EndArray()
      .Uint(4)
      .EndArray();
  std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  WriteSummaryJson(w, "send_us", Summarize(v));
  w.Key("k\"ey").Bool(true);
  EXPECT_FALSE(w.Balanced());
  w.EndObject();
  EXPECT_TRUE(w.Balanced());
  EXPECT_EQ(os.str(), R"({"run":"dblp","empty_obj":{},"empty_arr":[],)"
                      R"("nested":[{"a":1,"b":[2,3]},[],4],)"
                      R"("send_us":{"count":10,"mean":5.5,"min":1.0,"p50":5.0,)"
                      R"("p90":9.0,"p99":10.0,"p999":10.0,"max":10.0},)"
                      R"("k\"ey":true})");
}

}  // namespace
}  // namespace dblp
