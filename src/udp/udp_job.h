// A whole DBLP job over kernel UDP sockets (UdpSocketPort) and the real TCP
// control channel (ControlSidecar): the fallback where DPDK cannot run.
// Every iteration as the DPDK apps run it (src/dpdk/server/server_engine.cc,
// src/dpdk/worker/worker_engine.cc): the workers push under the current p, the
// server reduces the mean, its tolerance policy picks the next p, and the
// server broadcasts the mean to every worker under that p; each worker fills
// what its broadcast missed and applies the mean.
//
// The rounds are the shared sides' (dblp/send_side.h, dblp/receive_side.h):
// the server has a ReceiveSide (push) and a SendSide (broadcast) per worker,
// the worker a SendSide (push) and a ReceiveSide (broadcast) per server
// (one, or every server shard with --shards: udp_server_link.h). The
// server runs one control sidecar thread, the worker one per server; each
// app one datapath thread (the caller's).
//
// Round numbering as in the DPDK apps: iteration i pushes in round 2i and
// broadcasts in round 2i + 1. udp_push.h's push bench is this job without
// the broadcast (push_only).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dblp/base/deep_idle.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/server_shards.h"
#include "dblp/emul/loss_model.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/job/server_iteration.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/records.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/send_order.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/bitmap.h"

namespace dblp {

// dblp-udp-server and its control address flag, as the control sidecar
// names them in the fixes of its errors.
inline ServerApp UdpServerApp() { return {"dblp-udp-server", "--control"}; }

// One push round as the server closed it (one worker's receiver).
struct UdpServerRound {
  uint64_t iteration = 0;
  uint32_t rank = 0;
  double delivered_fraction = 0;  // at Close, late frames included
};

// What the push server's on_round callback sees after each reduction (before
// the broadcast of that mean begins). Valid only during the call.
struct UdpServerRoundView {
  uint64_t iteration = 0;
  std::span<const float> mean;
  std::span<const Bitmap> arrived;  // per worker rank
};

// dblp-udp-server's options: the job's (ServerJobSettings, the same struct
// as dblp-server's) and the kernel-UDP transport's.
struct UdpJobServerOptions : ServerJobSettings {
  JobSecret secret;  // empty: insecure (then frame_auth must be kNone)
  FrameAuthMode frame_auth = FrameAuthMode::kFull;
  std::string control = "127.0.0.1:0";  // TCP listen ip:port (0: ephemeral)
  std::string data = "127.0.0.1:0";     // UDP bind ip:port (0: ephemeral)
  uint32_t workers = 1;
  uint32_t mtu = 1500;
  uint32_t burst = 32;        // broadcast frames per sendmmsg() (1..128)
  std::string loss = "none";  // ParseLossSpec spelling, on received pushes
  BurstSchedule bursts;       // microbursts on received pushes
  uint64_t seed = 1;          // loss injector and broadcast send order
  SendOrderKind send_order = kDefaultSendOrder;
  uint32_t round_timeout_ms = 30000;
  uint32_t join_timeout_ms = 30000;
  // A JOIN asking for more is refused (the server holds the sums and the
  // mean: about two copies of the gradient).
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
  bool rank_by_name = false;  // --rank_order=name (JoinPolicy)
  // A server shard of a sharded job (--shards > 1, dblp/job/shard_links.h):
  // its place, and the "--name=value" job flags every shard must share.
  ShardRole shard_role;
  std::string shard_job_flags;
  // What anyone who reaches the control port can make the server hold.
  ControlLimits control_limits;
  int cpu = -1;  // pin the datapath thread (-1: no pinning)
  uint32_t idle_sleep_us = 20;
  DeepIdle deep_idle;  // the back-off's second stage (deep_idle.h)
  // SIGINT/SIGTERM (quit_signal.h; null: none): the job ends as on a
  // failure ("interrupted"), its summary and rows written, ERROR sent.
  const std::atomic<bool>* quit = nullptr;
  // Called once both sockets are bound (ports resolved), before any JOIN.
  std::function<void(uint16_t control_port, uint16_t udp_port)> on_listening;
  bool quiet = true;  // no progress lines on stdout
  // Rows (one per iteration and worker) streamed to iterations.jsonl /
  // .csv here as the iterations end, summary.json (every counter) at the
  // end; made before the sockets open. Empty: none.
  std::string out_dir;
  RowsOnError rows_on_error = RowsOnError::kFail;  // a row not written
};

struct UdpJobServerResult {
  int exit_code = 0;
  std::string error;
  uint32_t chunks = 0;
  uint64_t iterations = 0;  // reduced
  std::vector<UdpServerRound> rounds;
  // rx_frames, tx_frames, injected_drops, socket_drops, rx_truncated,
  // rcvbuf_bytes, every receiver verdict by VerdictName (accepted,
  // duplicate, stale_round, ...) and every decode error as
  // decode_<DecodeStatusName>.
  std::map<std::string, uint64_t> counters;
};

struct UdpJobWorkerOptions {
  JobSecret secret;                       // the server's
  // The server's control ip:port (a sharded job's directory, shard 0).
  std::string server = "127.0.0.1:9100";
  std::string data = "127.0.0.1:0";       // our UDP bind ip:port
  uint32_t mtu = 1500;
  uint32_t burst = 32;
  // Iterations to run, unless the source is Unbounded().
  uint64_t iterations = 10;
  uint64_t seed = 1;  // send order and loss injector
  SendOrderKind send_order = kDefaultSendOrder;
  FillMode bcast_fill = FillMode::kZero;  // chunks the broadcast missed
  // No broadcast to wait for (the push bench, udp_push.h): rows then
  // carry the push's delivered fraction.
  bool push_only = false;
  std::string loss = "none";  // on received broadcast frames
  BurstSchedule bursts;
  uint32_t round_timeout_ms = 30000;
  uint32_t join_timeout_ms = 30000;
  int cpu = -1;
  uint32_t idle_sleep_us = 20;
  DeepIdle deep_idle;  // the back-off's second stage (deep_idle.h)
  std::string name = "udp-worker";
  // SIGINT/SIGTERM (quit_signal.h; null: none): the job ends as on a
  // failure ("interrupted"), its summary and rows written, ERROR sent.
  const std::atomic<bool>* quit = nullptr;
  // After each iteration's row is on disk (datapath thread).
  std::function<void(const IterationRecord&)> on_iteration;
  // Rows streamed to iterations.jsonl / .csv here, summary.json at the
  // end. Empty: none.
  std::string out_dir;
  RowsOnError rows_on_error = RowsOnError::kFail;  // a row not written
  // Test seam (src/test_hooks/dumps.h): each absorbed iteration.
  AbsorbedObserver on_absorbed;
};

struct UdpJobWorkerResult {
  int exit_code = 0;
  std::string error;
  uint32_t rank = 0;
  uint32_t chunks = 0;
  double p = 0;  // the tolerance of the last push ROUND_BEGIN
  std::vector<IterationRecord> rows;
  // tx_frames, tx_eagain, tx_errors, rx_frames, probes, bitmaps,
  // injected_drops, unpinned_source and bcast_<verdict> for every verdict.
  std::map<std::string, uint64_t> counters;
};

// Serves iterations until every worker said BYE. A worker that leaves
// without BYE or sends ERROR fails the job: every other worker gets an
// ERROR naming it and why, and the result is exit_code 1 with that text.
// Option errors: exit_code 2.
UdpJobServerResult RunUdpJobServer(const UdpJobServerOptions& o);
// JOIN, then iterations (push, broadcast, fill, Apply) until
// o.iterations or, for an Unbounded() source, until AwaitIteration says
// the trainer ended; then BYE. A failure is told to the server (ERROR)
// and to the source (Fail), and returned with exit_code 1.
UdpJobWorkerResult RunUdpJobWorker(const UdpJobWorkerOptions& o,
                                   GradientSource& source);

}  // namespace dblp
