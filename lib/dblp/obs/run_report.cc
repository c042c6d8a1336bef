#include "dblp/obs/run_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dblp/base/log.h"
#include "dblp/obs/latency_stats.h"

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

bool RowStream::Open(const std::string& dir, std::string* error,
                     const std::string& flag) {
  Close();
  error_.clear();
  written_ = 0;
  dropped_ = 0;
  flag_ = flag;
  const std::string fix =
      ": give " + flag + " a directory this user can create and write";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *error =
        "cannot create " + flag + "=" + dir + " (" + ec.message() + ")" + fix;
    return false;
  }
  auto open = [&](const char* name, int* fd) {
    const std::string path = dir + "/" + name;
    *fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0) {
      *error = "cannot write " + path + " (" + std::strerror(errno) + ")" + fix;
      return false;
    }
    return true;
  };
  if (!open("iterations.jsonl", &jsonl_fd_) ||
      !open("iterations.csv", &csv_fd_)) {
    Close();
    return false;
  }
  dir_ = dir;
  const std::string summary = dir + "/summary.json";
  if (::unlink(summary.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove the earlier run's " + summary + " (" +
             std::strerror(errno) + ")" + fix;
    Close();
    return false;
  }
  const std::string header = std::string(kIterationCsvHeader) + '\n';
  if (!WriteAll(csv_fd_, header, "iterations.csv")) {
    *error = error_ + fix;
    Close();
    return false;
  }
  jsonl_end_ = 0;
  csv_end_ = static_cast<off_t>(header.size());
  return true;
}

bool RowStream::WriteAll(int fd, const std::string& bytes, const char* file) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = "cannot write " + dir_ + "/" + file + " (" +
               (n < 0 ? std::strerror(errno) : "no progress") + ")";
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

void RowStream::Append(const IterationRecord& row) {
  if (!is_open()) return;
  if (!error_.empty()) {
    ++dropped_;
    return;
  }
  const std::span<const IterationRecord> one(&row, 1);
  std::ostringstream jsonl, csv;
  WriteJsonl(jsonl, one);
  WriteCsv(csv, one);
  // Each line is built whole and written with one call.
  const std::string line = jsonl.str();
  // WriteCsv starts with the header, which Open wrote once.
  const std::string csv_row = csv.str().substr(kIterationCsvHeader.size() + 1);
  if (WriteAll(jsonl_fd_, line, "iterations.jsonl") &&
      WriteAll(csv_fd_, csv_row, "iterations.csv")) {
    jsonl_end_ += static_cast<off_t>(line.size());
    csv_end_ += static_cast<off_t>(csv_row.size());
    ++written_;
    return;
  }
  OnWriteError(row);
}

// A short write leaves part of a line: both files are cut back to their
// last complete row, so every line that stays parses and the two files
// hold the same rows. Said at once, with the fix.
void RowStream::OnWriteError(const IterationRecord& row) {
  ++dropped_;
  const bool cut = ::ftruncate(jsonl_fd_, jsonl_end_) == 0 &&
                   ::ftruncate(csv_fd_, csv_end_) == 0;
  error_ += " at iteration " + std::to_string(row.iteration) + ", rank " +
            std::to_string(row.rank) + ": free space there or give " + flag_ +
            " a directory with room";
  if (!cut) {
    error_ += " (the last line could not be cut back: " +
              std::string(std::strerror(errno)) + "; drop it before reading)";
  }
  if (on_error_ == RowsOnError::kFail) {
    DBLP_LOG(Error,
             "error: %s; the job stops (--rows_on_error=drop would let it "
             "go on without its rows)",
             error_.c_str());
  } else {
    DBLP_LOG(Warning,
             "warning: %s; --rows_on_error=drop: the job goes on, this and "
             "every later row are dropped (counted as rows_dropped)",
             error_.c_str());
  }
}

// After a write error every later row still passes through Append, which
// counts it in rows_dropped.
void RowStream::Sync(std::span<const IterationRecord> rows) {
  while (synced_ < rows.size() && is_open()) Append(rows[synced_++]);
}

void RowStream::Close() {
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
  if (csv_fd_ >= 0) ::close(csv_fd_);
  jsonl_fd_ = csv_fd_ = -1;
}

bool WriteRunSummary(const std::string& dir, const RunReport& r,
                     std::string* error) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // RowStream::Open made it
  if (ec) {
    *error = "cannot create " + dir + ": " + ec.message();
    return false;
  }
  // Built in memory, written to a temporary name and renamed: a full disk
  // leaves no truncated summary.json.
  std::ostringstream s;
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
  if (!r.xstats.empty()) {
    // The ports' extended statistics at the end (DPDK apps).
    w.Key("xstats").BeginObject();
    for (const auto& [port, stats] : r.xstats) {
      w.Key(port).BeginObject();
      for (const auto& [k, v] : stats) w.Key(k).Uint(v);
      w.EndObject();
    }
    w.EndObject();
  }
  w.EndObject();
  s << '\n';
  const std::string path = dir + "/summary.json";
  const std::string tmp = path + ".tmp";
  const std::string text = s.str();
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    *error = "cannot write " + path +
             " (is the disk full?): free space there or give --out_dir a "
             "directory with room";
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

std::string CloseRunReport(RowStream& stream, const RunReport& report) {
  if (!stream.is_open()) return "";
  std::string err = stream.error();
  stream.Close();
  if (err.empty()) {
    WriteRunSummary(stream.dir(), report, &err);
    return err;
  }
  if (stream.failed()) return err;
  // --rows_on_error=drop: the job's result stands; what is missing is said.
  DBLP_LOG(Warning, "warning: %llu rows dropped (not in %s/iterations.jsonl)",
           static_cast<unsigned long long>(stream.dropped()),
           stream.dir().c_str());
  RunReport with_count = report;
  with_count.counters.emplace_back("rows_dropped", stream.dropped());
  if (std::string e; !WriteRunSummary(stream.dir(), with_count, &e)) {
    DBLP_LOG(Warning, "warning: %s", e.c_str());
  }
  return "";
}

void DumpBinary(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

}  // namespace dblp
