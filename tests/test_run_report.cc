// Run reports that survive a crash and name every drop: RowStream
// (lib/dblp/obs/run_report.h) puts each row on disk as it happens, in the bytes
// the batch writers produce; the kernel-UDP tools (src/udp/udp_push.h) stream
// their rows through it and write every receive verdict and decode error.
// The DPDK apps' rows under kill -9 are tests/crash_rows_test.py.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dblp/obs/records.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/receiver_round.h"
#include "dblp/wire/wire.h"
#include "udp/udp_push.h"

namespace dblp {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A fresh directory under $TMPDIR, removed with the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dblp-report-XXXXXX");
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(ReadFile(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<IterationRecord> SampleRows() {
  std::vector<IterationRecord> rows(3);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].iteration = i;
    rows[i].rank = 2;
    rows[i].send_latency_us = 10.25 * static_cast<double>(i + 1);
    rows[i].packets_sent = 723;
    rows[i].delivered_fraction = 0.97;
  }
  // The odd values the writers spell specially.
  rows[1].grad_norm = std::numeric_limits<double>::quiet_NaN();
  rows[1].critical = true;
  rows[2].control_rtt_us = std::numeric_limits<double>::infinity();
  rows[2].resync = true;
  return rows;
}

TEST(RowStream, EachRowIsOnDiskBeforeTheNextAndTheBytesMatchTheWriters) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string out = dir.path() + "/run";
  // A summary of an earlier run in the same directory would not describe
  // the new rows.
  fs::create_directories(out);
  std::ofstream(out + "/summary.json") << "{\"iterations\":99}\n";
  RowStream stream;
  std::string err;
  ASSERT_TRUE(stream.Open(out, &err)) << err;
  EXPECT_FALSE(fs::exists(out + "/summary.json"));
  EXPECT_EQ(ReadFile(out + "/iterations.csv"),
            std::string(kIterationCsvHeader) + "\n");
  EXPECT_EQ(ReadFile(out + "/iterations.jsonl"), "");

  const std::vector<IterationRecord> rows = SampleRows();
  for (size_t i = 0; i < rows.size(); ++i) {
    stream.Append(rows[i]);
    // Read through another descriptor while the stream is still open: the
    // row is in the file, not in a buffer of this process.
    EXPECT_EQ(Lines(out + "/iterations.jsonl").size(), i + 1);
    EXPECT_EQ(Lines(out + "/iterations.csv").size(), i + 2);
  }
  EXPECT_EQ(stream.written(), rows.size());
  EXPECT_EQ(stream.error(), "");
  stream.Close();

  std::ostringstream jsonl, csv;
  WriteJsonl(jsonl, rows);
  WriteCsv(csv, rows);
  EXPECT_EQ(ReadFile(out + "/iterations.jsonl"), jsonl.str());
  EXPECT_EQ(ReadFile(out + "/iterations.csv"), csv.str());
}

TEST(RowStream, SyncAppendsOnlyTheRowsAddedSinceTheLastCall) {
  TempDir dir;
  RowStream stream;
  std::string err;
  ASSERT_TRUE(stream.Open(dir.path(), &err)) << err;
  std::vector<IterationRecord> rows = SampleRows();
  stream.Sync(std::span(rows).first(1));
  stream.Sync(std::span(rows).first(1));  // nothing new
  stream.Sync(rows);
  stream.Close();
  std::ostringstream jsonl;
  WriteJsonl(jsonl, rows);
  EXPECT_EQ(ReadFile(dir.path() + "/iterations.jsonl"), jsonl.str());
}

TEST(RowStream, ADirectoryThatCannotBeMadeFailsOpenNamingTheFlag) {
  TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  std::ofstream(file) << "x";
  RowStream stream;
  std::string err;
  EXPECT_FALSE(stream.Open(file + "/sub", &err));
  EXPECT_FALSE(stream.is_open());
  EXPECT_NE(err.find("--out_dir"), std::string::npos) << err;
  EXPECT_NE(err.find("writ"), std::string::npos) << err;  // the fix
}

// A file-size limit makes write(2) stop short inside a line, as a full
// disk does: the stream fails (or drops, by choice), says where, and cuts
// both files back to their last whole row.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit l = old_;
    l.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &l);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

void AppendUntilError(RowStream& stream, int max_rows) {
  std::vector<IterationRecord> rows = SampleRows();
  for (int i = 0; i < max_rows && stream.error().empty(); ++i) {
    IterationRecord r = rows[static_cast<size_t>(i) % rows.size()];
    r.iteration = static_cast<uint64_t>(i);
    stream.Append(r);
  }
}

TEST(RowStream, AShortWriteIsCutBackToTheLastWholeRowAndFailsTheJob) {
  TempDir dir;
  RowStream stream;
  std::string err;
  ASSERT_TRUE(stream.Open(dir.path(), &err)) << err;
  {
    const FileSizeLimit limit(1000);
    AppendUntilError(stream, 100);
  }
  ASSERT_FALSE(stream.error().empty());
  EXPECT_TRUE(stream.failed());
  EXPECT_EQ(stream.dropped(), 1u);
  EXPECT_NE(stream.error().find(dir.path() + "/iterations."), std::string::npos)
      << stream.error();
  EXPECT_NE(
      stream.error().find("at iteration " + std::to_string(stream.written())),
      std::string::npos)
      << stream.error();
  EXPECT_NE(stream.error().find("--out_dir"), std::string::npos);
  // A failed stream writes no summary: it would read as a whole run.
  EXPECT_EQ(CloseRunReport(stream, RunReport{}), stream.error());
  EXPECT_FALSE(fs::exists(dir.path() + "/summary.json"));
  const std::string jsonl = ReadFile(dir.path() + "/iterations.jsonl");
  ASSERT_FALSE(jsonl.empty());
  EXPECT_EQ(jsonl.back(), '\n');
  EXPECT_EQ(Lines(dir.path() + "/iterations.jsonl").size(), stream.written());
  EXPECT_EQ(Lines(dir.path() + "/iterations.csv").size(), stream.written() + 1);
}

TEST(RowStream, DropGoesOnCountingTheRowsItCouldNotWrite) {
  TempDir dir;
  RowStream stream;
  stream.set_on_error(RowsOnError::kDrop);
  std::string err;
  ASSERT_TRUE(stream.Open(dir.path(), &err)) << err;
  {
    const FileSizeLimit limit(1000);
    AppendUntilError(stream, 100);
    ASSERT_FALSE(stream.error().empty());
    EXPECT_FALSE(stream.failed());
    const uint64_t written = stream.written();
    for (int i = 0; i < 5; ++i) stream.Append(SampleRows()[0]);
    EXPECT_EQ(stream.written(), written);
    EXPECT_EQ(stream.dropped(), 6u);
  }
  EXPECT_EQ(Lines(dir.path() + "/iterations.jsonl").size(), stream.written());
  RunReport report;
  EXPECT_EQ(CloseRunReport(stream, report), "");  // the job's result stands
  EXPECT_NE(ReadFile(dir.path() + "/summary.json").find("\"rows_dropped\":6"),
            std::string::npos);
}

TEST(RowStream, ClosedStreamWritesNothing) {
  RowStream stream;
  stream.Append(SampleRows()[0]);
  EXPECT_EQ(stream.written(), 0u);
  EXPECT_EQ(stream.error(), "");
}

UdpPushBenchOptions SmallBench(const std::string& out_dir) {
  UdpPushBenchOptions o;
  o.size_mb = 0.25;
  o.iterations = 4;
  o.round_timeout_ms = 10000;
  o.server_cpu = -1;  // tests may run next to each other
  o.worker_cpu = -1;
  o.out_dir = out_dir;
  return o;
}

// Datagrams no worker would send, at the server's data port: too short
// for a header, a bad magic, and a valid header of another job (the
// server's session is random and odd, never 0).
void SendHostileDatagrams(uint16_t udp_port) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(udp_port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto send = [&](const std::vector<uint8_t>& b) {
    ASSERT_EQ(sendto(fd, b.data(), b.size(), 0,
                     reinterpret_cast<const sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(b.size()));
  };
  send(std::vector<uint8_t>(5, 0xAB));
  send(std::vector<uint8_t>(kDataHeaderBytes + 16, 0));
  std::vector<uint8_t> foreign(kDataHeaderBytes + 16, 0);
  const DataHeader h{FrameType::kPush, 0, 0, 16, 0, 0};
  EncodeDataHeader(h, foreign.data());
  send(foreign);
  close(fd);
}

TEST(UdpServerReport, EveryVerdictAndDecodeErrorIsWrittenByName) {
  TempDir dir;
  UdpPushBenchOptions o = SmallBench(dir.path());
  o.on_server_listening = SendHostileDatagrams;
  const UdpPushBenchResult r = RunUdpPushBench(o);
  ASSERT_EQ(r.exit_code, 0) << r.error;

  const std::string json = FormatUdpBenchJson(o, r);
  const std::string summary = ReadFile(dir.path() + "/server/summary.json");
  ASSERT_FALSE(summary.empty());
  std::vector<std::string> names;
  // By index: a verdict or decode status added to the enums must show up
  // here without a change to this test.
  for (int v = 0; v < kNumVerdicts; ++v) {
    names.push_back(std::string("push_") +
                    VerdictName(static_cast<Verdict>(v)));
  }
  for (int s = 1; s < kNumDecodeStatus; ++s) {
    names.push_back(std::string("decode_") +
                    DecodeStatusName(static_cast<DecodeStatus>(s)));
  }
  for (const std::string& name : names) {
    EXPECT_NE(name, "unknown");
    const auto c = r.counters.find(name);
    ASSERT_NE(c, r.counters.end()) << name;
    const std::string kv = "\"" + name + "\":" + std::to_string(c->second);
    EXPECT_NE(json.find(kv), std::string::npos) << kv << " in " << json;
    EXPECT_NE(summary.find(kv), std::string::npos) << kv << " in " << summary;
  }
  // Every other counter of the run is in the JSON report too.
  for (const auto& [name, value] : r.counters) {
    const std::string kv = "\"" + name + "\":" + std::to_string(value);
    EXPECT_NE(json.find(kv), std::string::npos) << kv << " in " << json;
  }
  // The reasons provoked above moved, and nothing was accepted from them.
  // A server that pins each worker's source address turns the stranger's
  // datagrams away before the receiver looks at them; one that does not
  // counts each by what is wrong with it.
  const auto unpinned = r.counters.find("frames_unpinned_source");
  if (unpinned != r.counters.end() && unpinned->second > 0) {
    EXPECT_EQ(unpinned->second, 3u);
    EXPECT_EQ(r.counters.at("push_malformed"), 0u);
    EXPECT_EQ(r.counters.at("push_wrong_session"), 0u);
  } else {
    EXPECT_EQ(r.counters.at("decode_short_buffer"), 1u);
    EXPECT_EQ(r.counters.at("decode_bad_magic"), 1u);
    EXPECT_EQ(r.counters.at("push_malformed"), 2u);
    EXPECT_EQ(r.counters.at("push_wrong_session"), 1u);
  }
  EXPECT_EQ(r.counters.at("push_accepted"), uint64_t{o.iterations} * r.chunks);
}

TEST(UdpRows, EachRoundIsOnDiskBeforeTheNextBegins) {
  TempDir dir;
  UdpPushBenchOptions o = SmallBench(dir.path());
  const std::string wrows = dir.path() + "/worker/iterations.jsonl";
  const std::string srows = dir.path() + "/server/iterations.jsonl";
  std::vector<size_t> worker_seen, server_seen;
  o.on_round = [&](const UdpRoundRecord&) {
    worker_seen.push_back(Lines(wrows).size());
  };
  o.on_server_round = [&](const UdpServerRoundView&) {
    server_seen.push_back(Lines(srows).size());
  };
  const UdpPushBenchResult r = RunUdpPushBench(o);
  ASSERT_EQ(r.exit_code, 0) << r.error;
  // Round k's callback already finds k + 1 rows in the file (one worker).
  EXPECT_EQ(worker_seen, (std::vector<size_t>{1, 2, 3, 4}));
  EXPECT_EQ(server_seen, (std::vector<size_t>{1, 2, 3, 4}));
  const std::vector<std::string> lines = Lines(wrows);
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].rfind("{\"iteration\":" + std::to_string(i) + ",", 0),
              0u)
        << lines[i];
  }
  EXPECT_EQ(Lines(dir.path() + "/worker/iterations.csv").size(), 5u);
  EXPECT_NE(
      ReadFile(dir.path() + "/worker/summary.json").find("\"iterations\":4"),
      std::string::npos);
}

TEST(UdpRows, AnUnwritableOutDirFailsBeforeTheJob) {
  TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  std::ofstream(file) << "x";
  const auto t0 = Clock::now();
  // Nobody would join this server: it must fail before waiting for one.
  UdpPushServerOptions so;
  so.join_timeout_ms = 20000;
  so.out_dir = file + "/server";
  const UdpPushServerResult s = RunUdpPushServer(so);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.error.find("--out_dir"), std::string::npos) << s.error;
  UdpPushWorkerOptions wo;
  wo.server = "127.0.0.1:9";  // never reached
  wo.join_timeout_ms = 20000;
  wo.out_dir = file + "/worker";
  const UdpPushWorkerResult w = RunUdpPushWorker(wo);
  EXPECT_EQ(w.exit_code, 2);
  EXPECT_NE(w.error.find("--out_dir"), std::string::npos) << w.error;
  const UdpPushBenchResult b = RunUdpPushBench(SmallBench(file));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.error.find("--out_dir"), std::string::npos) << b.error;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
}

}  // namespace
}  // namespace dblp
