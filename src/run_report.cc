#include "run_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dblp {
namespace {

bool IsBurst(const RunReport& r, uint64_t it) {
  return std::binary_search(r.burst_iterations.begin(),
                            r.burst_iterations.end(), it);
}

std::vector<double> Column(const RunReport& r, bool clean_only,
                           double IterationRecord::*field) {
  std::vector<double> v;
  for (const auto& row : r.rows) {
    // A resync round moves the model, reliably: not a gradient round.
    if (row.resync || (clean_only && IsBurst(r, row.iteration))) continue;
    v.push_back(row.*field);
  }
  return v;
}

double MeanRtt(const RunReport& r) {
  double sum = 0;
  int n = 0;
  for (const auto& row : r.rows) {
    if (row.control_rtt_us > 0) {
      sum += row.control_rtt_us;
      ++n;
    }
  }
  return n > 0 ? sum / n : 0;
}

// The cost of one frame on this link, calibrated to the analytic model: a
// clean one-pass round takes packets * t + rtt / 2 (the STOP travelling
// back), so t = (latency - rtt / 2) / packets over clean one-pass rounds.
// Turns the model's expected packets and passes into time.
double UsPerPacketClean(const RunReport& r) {
  const double half_rtt = MeanRtt(r) / 2;
  double us = 0, pkts = 0;
  for (const auto& row : r.rows) {
    if (row.resync || IsBurst(r, row.iteration) || row.passes != 1) continue;
    us += std::max(0.0, row.send_latency_us - half_rtt);
    pkts += static_cast<double>(row.packets_sent);
  }
  return pkts > 0 ? us / pkts : 0;
}

}  // namespace

bool WriteRunReport(const std::string& dir, const RunReport& r,
                    std::string* error) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *error = "cannot create --out_dir " + dir + ": " + ec.message();
    return false;
  }
  {
    std::ofstream f(dir + "/iterations.jsonl");
    WriteJsonl(f, r.rows);
    std::ofstream c(dir + "/iterations.csv");
    WriteCsv(c, r.rows);
    if (!f || !c) {
      *error = "cannot write iterations.jsonl/csv in " + dir;
      return false;
    }
  }
  std::ofstream s(dir + "/summary.json");
  JsonWriter w(s);
  w.BeginObject();
  w.Key("role").String(r.role);
  w.Key("rank").Int(r.rank);
  w.Key("policy").String(r.policy);
  w.Key("iterations").Uint(r.rows.size());
  w.Key("resync_rows")
      .Uint(static_cast<uint64_t>(std::count_if(
          r.rows.begin(), r.rows.end(),
          [](const IterationRecord& row) { return row.resync; })));
  WriteSummaryJson(
      w, "send_latency_us",
      Summarize(Column(r, false, &IterationRecord::send_latency_us)));
  WriteSummaryJson(
      w, "clean_send_latency_us",
      Summarize(Column(r, true, &IterationRecord::send_latency_us)));
  WriteSummaryJson(
      w, "bcast_latency_us",
      Summarize(Column(r, false, &IterationRecord::bcast_latency_us)));
  w.Key("us_per_packet_clean").Double(UsPerPacketClean(r));
  w.Key("control_rtt_us").Double(MeanRtt(r));
  w.Key("bursts").BeginArray();
  for (const auto& row : r.rows) {
    if (row.resync || !IsBurst(r, row.iteration)) continue;
    w.BeginObject();
    w.Key("iteration").Uint(row.iteration);
    w.Key("rank").Uint(row.rank);
    w.Key("send_latency_us").Double(row.send_latency_us);
    w.Key("passes").Uint(row.passes);
    w.Key("packets_sent").Uint(row.packets_sent);
    w.Key("p").Double(row.p);
    w.Key("critical").Bool(row.critical);
    w.EndObject();
  }
  w.EndArray();
  w.Key("counters").BeginObject();
  for (const auto& [k, v] : r.counters) w.Key(k).Uint(v);
  w.EndObject();
  w.Key("info").BeginObject();
  for (const auto& [k, v] : r.info) w.Key(k).String(v);
  w.EndObject();
  w.EndObject();
  s << '\n';
  if (!s) {
    *error = "cannot write summary.json in " + dir;
    return false;
  }
  return true;
}

std::string FormatRunSummary(const RunReport& r) {
  std::ostringstream o;
  const LatencySummary s =
      Summarize(Column(r, false, &IterationRecord::send_latency_us));
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s%s: %zu iterations, send latency us: mean %.1f p50 %.1f "
                "p99 %.1f max %.1f\n",
                r.role.c_str(),
                r.rank >= 0 ? (" " + std::to_string(r.rank)).c_str() : "",
                r.rows.size(), s.mean, s.p50, s.p99, s.max);
  o << line;
  for (const auto& row : r.rows) {
    // The server's rows describe receivers: passes are the workers' story.
    if (row.resync || !IsBurst(r, row.iteration) || r.role != "worker") {
      continue;
    }
    std::snprintf(line, sizeof(line),
                  "  burst iteration %llu (rank %u): %.1f us, %u passes, "
                  "%llu packets, p=%.3f\n",
                  static_cast<unsigned long long>(row.iteration), row.rank,
                  row.send_latency_us, row.passes,
                  static_cast<unsigned long long>(row.packets_sent), row.p);
    o << line;
  }
  o << "  counters:";
  for (const auto& [k, v] : r.counters) {
    if (v != 0) o << ' ' << k << '=' << v;
  }
  o << '\n';
  return o.str();
}

}  // namespace dblp
