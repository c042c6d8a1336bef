// The push direction of DBLP over kernel UDP sockets (UdpSocketPort) and the
// real TCP control channel (ControlSidecar): the same rounds as the DPDK
// apps (src/dpdk/worker/worker_engine.cc, src/dpdk/server/server_engine.cc),
// without DPDK, for a benchmark comparison. It is udp_job.h's job without the
// broadcast, run with a fixed p and a deterministic bench gradient.
//
// Each side runs a control sidecar thread and one datapath thread (the
// caller's). The rounds are the shared sides' (dblp/send_side.h,
// dblp/receive_side.h): the server has a ReceiveSide per worker, the worker
// a SendSide; the sidecar hands them PROBE, STOP and BITMAP directly
// (round_control.h). Their requests, and the few other control events
// (ROUND_BEGIN, BYE, a lost peer), travel as typed values through queues
// the datapath checks with one atomic load, locking only when something
// is queued.
//
// Round numbering as in the DPDK apps: iteration i pushes in round 2i.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/job_auth.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/bitmap.h"
#include "udp/udp_job.h"

namespace dblp {

// The gradient a bench worker of `rank` pushes: a deterministic pattern,
// so a test can recompute it and check the server's mean bit for bit.
void FillBenchGradient(uint32_t rank, std::span<float> out);

// One push round as the worker saw it.
struct UdpRoundRecord {
  uint64_t iteration = 0;
  // From the round's first send (ROUND_BEGIN already in) to STOP's arrival.
  double latency_us = 0;
  uint64_t packets_sent = 0;
  uint32_t passes = 0;
  // Chunks the server had when it said STOP, over the round's chunk count.
  double delivered_fraction = 0;
};

struct UdpPushServerOptions {
  JobSecret secret;  // empty: insecure (then frame_auth must be kNone)
  FrameAuthMode frame_auth = FrameAuthMode::kFull;
  std::string control = "127.0.0.1:0";  // TCP listen ip:port (0: ephemeral)
  std::string data = "127.0.0.1:0";     // UDP bind ip:port (0: ephemeral)
  uint32_t workers = 1;
  uint32_t mtu = 1500;
  double p = 0;               // loss tolerance of every round, [0, 1)
  std::string loss = "none";  // ParseLossSpec spelling, at the receive side
  uint64_t seed = 1;
  uint32_t round_timeout_ms = 30000;
  uint32_t join_timeout_ms = 30000;
  // A JOIN asking for more is refused (the server holds the sums and the
  // mean: about two copies of the gradient).
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
  int cpu = -1;  // pin the datapath thread (-1: no pinning)
  uint32_t idle_sleep_us = 20;
  // Called once both sockets are bound (ports resolved), before any JOIN.
  std::function<void(uint16_t control_port, uint16_t udp_port)> on_listening;
  std::function<void(const UdpServerRoundView&)> on_round;
  bool quiet = true;  // no progress lines on stdout
  // Rows (one per closed round and worker) streamed to iterations.jsonl /
  // .csv here as the rounds close, summary.json (every counter) at the
  // end; made before the sockets open. Empty: none.
  std::string out_dir;
};

// The job server's result (udp_job.h): rounds, counters, the error.
using UdpPushServerResult = UdpJobServerResult;

struct UdpPushWorkerOptions {
  JobSecret secret;                       // the server's
  std::string server = "127.0.0.1:9100";  // the server's control ip:port
  std::string data = "127.0.0.1:0";       // our UDP bind ip:port
  uint64_t size_bytes = 1 << 20;          // gradient bytes (multiple of 4)
  uint32_t mtu = 1500;
  uint32_t burst = 32;
  uint32_t iterations = 10;
  uint64_t seed = 1;
  uint32_t round_timeout_ms = 30000;
  uint32_t join_timeout_ms = 30000;
  int cpu = -1;
  uint32_t idle_sleep_us = 20;
  std::string name = "udp-worker";
  std::function<void(const UdpRoundRecord&)> on_round;
  // Rows (one per push round) streamed to iterations.jsonl / .csv here,
  // each before on_round sees it, summary.json at the end. Empty: none.
  std::string out_dir;
};

struct UdpPushWorkerResult {
  int exit_code = 0;
  std::string error;
  uint32_t rank = 0;
  uint32_t chunks = 0;
  double p = 0;  // the tolerance the server announced (last ROUND_BEGIN)
  std::vector<UdpRoundRecord> rounds;
  // tx_frames, tx_eagain, tx_errors, bitmaps, probes.
  std::map<std::string, uint64_t> counters;
};

// Serve push rounds until every worker said BYE (or a failure, returned
// with exit_code 1 and a message naming the cause).
UdpPushServerResult RunUdpPushServer(const UdpPushServerOptions& o);
// JOIN, then o.iterations push rounds, then BYE.
UdpPushWorkerResult RunUdpPushWorker(const UdpPushWorkerOptions& o);

struct UdpPushBenchOptions {
  // Both sides share it; empty: a random one per run (the bench runs both
  // ends, so a secret file buys nothing). Frames are tagged in `frame_auth`.
  JobSecret secret;
  FrameAuthMode frame_auth = FrameAuthMode::kFull;
  double size_mb = 1;
  uint32_t iterations = 10;
  std::string loss = "none";
  double p = 0;
  uint32_t mtu = 1500;
  uint32_t burst = 32;
  uint64_t seed = 1;
  int server_cpu = 0;
  int worker_cpu = 1;
  std::string control = "127.0.0.1:0";
  uint16_t udp_port = 0;  // the server's; the worker's is ephemeral
  uint32_t round_timeout_ms = 30000;
  uint32_t idle_sleep_us = 20;
  std::function<void(const UdpRoundRecord&)> on_round;  // worker thread
  std::function<void(const UdpServerRoundView&)> on_server_round;
  std::function<void(uint16_t udp_port)> on_server_listening;
  // The server's rows and summary in out_dir/server, the worker's in
  // out_dir/worker (see the two options above). Empty: none.
  std::string out_dir;
};

struct UdpPushBenchResult {
  int exit_code = 0;
  std::string error;
  uint64_t size_bytes = 0;
  uint32_t chunks = 0;
  std::vector<UdpRoundRecord> rounds;  // the worker's
  std::vector<UdpServerRound> server_rounds;
  // rx_frames, tx_frames, injected_drops, socket_drops, tx_eagain,
  // malformed, ...
  std::map<std::string, uint64_t> counters;
};

// One server and one worker in this process over 127.0.0.1. Throws nothing:
// option errors come back as exit_code 2, run failures as 1.
UdpPushBenchResult RunUdpPushBench(const UdpPushBenchOptions& o);

// The bench's JSON report (see apps/dblp_udp_bench.cc).
std::string FormatUdpBenchJson(const UdpPushBenchOptions& o,
                               const UdpPushBenchResult& r);

}  // namespace dblp
