// One row per (iteration, worker) of a run, and its CSV / JSONL writers:
// what every app streams to iterations.csv / iterations.jsonl.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>

namespace dblp {

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
  bool resync = false;        // a re-synchronisation, not a training step
  // The server's check of this worker's push (mean_reducer.h): the L2 norm
  // of what it sent (before clipping), its chunks refused (NaN, infinity,
  // a sum that would overflow) and clipped, and the CLR detector's count
  // of non-finite mean norms so far. Zero in a worker's own rows.
  double worker_norm = 0;
  uint32_t bad_chunks = 0;
  uint32_t clipped_chunks = 0;
  uint64_t clr_nonfinite = 0;
};

// Column order of WriteCsv (and key order of WriteJsonl). Booleans are
// written as 0/1 in CSV, true/false in JSONL.
inline constexpr std::string_view kIterationCsvHeader =
    "iteration,rank,send_latency_us,bcast_latency_us,passes,bcast_passes,"
    "packets_sent,packets_resent,delivered_fraction,p,critical,grad_norm,"
    "burst,control_rtt_us,resync,worker_norm,bad_chunks,clipped_chunks,"
    "clr_nonfinite";

// Header line + one line per row, '\n' line endings. Non-finite doubles are
// written as nan/inf/-inf (pandas and strtod read them back).
void WriteCsv(std::ostream& os, std::span<const IterationRecord> rows);
// One compact JSON object per line; non-finite doubles become null.
void WriteJsonl(std::ostream& os, std::span<const IterationRecord> rows);
}  // namespace dblp
