// Machine-readable results of a run: iterations.jsonl / .csv and
// summary.json in --out_dir, plus the human summary on stdout.
//
// The rows are streamed (RowStream) as the job produces them, so a process
// killed mid-job (kill -9, OOM, a crashed host process) leaves every
// completed iteration on disk; summary.json, which needs the whole run,
// comes at exit (WriteRunSummary).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dblp/obs/records.h"

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
  // Per port ("port0", ...): rte_eth_xstats at the end; DPDK apps only.
  std::vector<std::pair<std::string, NamedCounters>> xstats;
};

// What a run does when a row cannot be written (--rows_on_error): fail
// the job at once, or go on without its rows (counted and said).
enum class RowsOnError { kFail, kDrop };

// Appends rows to `dir`/iterations.jsonl and `dir`/iterations.csv as they
// happen: one write(2) per row and file, so once Append returns, the row
// survives the process (not the host: there is no fsync, which would cost
// a disk round trip per iteration). The files' bytes are exactly what
// WriteJsonl / WriteCsv write for the same rows. A row is in both files
// whole or in neither: a short write (a full disk) is cut back to the last
// complete line.
class RowStream {
 public:
  RowStream() = default;
  ~RowStream() { Close(); }
  RowStream(const RowStream&) = delete;
  RowStream& operator=(const RowStream&) = delete;

  // Creates `dir` (and its parents), starts both files afresh (the CSV
  // with its header) and removes a summary.json of an earlier run, which
  // would not describe these rows. Call it before the job starts: false
  // with *error naming `flag` and the fix when `dir` cannot be created or
  // written, so a bad directory fails the run at once, not at its end.
  bool Open(const std::string& dir, std::string* error,
            const std::string& flag = "--out_dir");
  bool is_open() const { return jsonl_fd_ >= 0; }
  void set_on_error(RowsOnError e) { on_error_ = e; }
  const std::string& dir() const { return dir_; }

  // Appends one row to both files (nothing when not open). A failed write
  // is logged at once (the path and the fix), kept in error(), and the
  // later rows are not written (counted in dropped()): a file with a hole
  // would read as a complete run.
  void Append(const IterationRecord& row);
  // Appends the rows added since the last call (after an error, counts
  // them as dropped): for reports that keep every row (RunReport::rows)
  // and complete them in steps (the server's push, then its broadcast).
  void Sync(std::span<const IterationRecord> rows);
  uint64_t written() const { return written_; }
  // Empty while every row reached both files.
  const std::string& error() const { return error_; }
  // Rows not written since the error (the one that failed included).
  uint64_t dropped() const { return dropped_; }
  // The job must end now: a row was lost under RowsOnError::kFail.
  bool failed() const {
    return !error_.empty() && on_error_ == RowsOnError::kFail;
  }
  void Close();

 private:
  bool WriteAll(int fd, const std::string& bytes, const char* file);
  void OnWriteError(const IterationRecord& row);

  std::string dir_;
  std::string flag_ = "--out_dir";
  int jsonl_fd_ = -1;
  int csv_fd_ = -1;
  off_t jsonl_end_ = 0;  // the end of the last complete line
  off_t csv_end_ = 0;
  uint64_t written_ = 0;
  uint64_t synced_ = 0;  // rows Sync handed to Append
  uint64_t dropped_ = 0;
  RowsOnError on_error_ = RowsOnError::kFail;
  std::string error_;
};

// Writes summary.json into `dir`: the iteration statistics of `report`'s
// rows, its counters and info. Returns false with *error on I/O failure.
bool WriteRunSummary(const std::string& dir, const RunReport& report,
                     std::string* error);

// At the end of a run: closes `stream` and, if every row reached it, writes
// summary.json beside them. Returns the first error ("" when both are on
// disk); nothing when the stream was never opened. Under
// RowsOnError::kDrop lost rows are no error: the count is logged and the
// summary (rows_dropped) is written if it can be.
std::string CloseRunReport(RowStream& stream, const RunReport& report);

// Test hook: writes `n` bytes to `path` (dumps of means and bitmaps).
void DumpBinary(const std::string& path, const void* data, size_t n);

// One-paragraph human summary (latency percentiles, bursts, counters).
std::string FormatRunSummary(const RunReport& report);

}  // namespace dblp
