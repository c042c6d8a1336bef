// Machine-readable results of a run: iterations.jsonl / .csv and
// summary.json in --out_dir, plus the human summary on stdout.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dblp/latency_stats.h"

namespace dblp {

using NamedCounters = std::vector<std::pair<std::string, uint64_t>>;

struct RunReport {
  std::string role;  // "worker" or "server"
  int32_t rank = -1;
  std::string policy;
  std::vector<IterationRecord> rows;
  std::vector<uint64_t> burst_iterations;
  NamedCounters counters;
  std::vector<std::pair<std::string, std::string>> info;  // free-form
};

// Writes iterations.jsonl, iterations.csv and summary.json into `dir`
// (created if needed). Returns false with *error on I/O failure.
bool WriteRunReport(const std::string& dir, const RunReport& report,
                    std::string* error);

// One-paragraph human summary (latency percentiles, bursts, counters).
std::string FormatRunSummary(const RunReport& report);

}  // namespace dblp
