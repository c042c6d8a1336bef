// dblp-worker's engine: joins the server over the control sidecar, then per
// iteration pushes its gradient (SenderRound, early stop on STOP) and
// receives the server's mean (ReceiverRound, STOP at the current p).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dblp/gradient_source.h"
#include "dblp/loss_fill.h"
#include "dblp/loss_model.h"
#include "dblp/send_order.h"
#include "port.h"

namespace dblp {

struct WorkerOptions {
  std::string server = "127.0.0.1:9100";  // TCP control address
  std::string name = "worker";
  std::string local_ip;     // default 10.0.0.(2 + rank)
  std::string eth_peer;     // server MAC override ("" = from WELCOME)
  uint32_t iterations = 100;
  PortOptions port;
  uint32_t mbufs = 0;       // 0 = sized from the port
  uint32_t burst = 32;
  LossSpec loss;            // push direction (worker TX)
  BurstSchedule bursts;
  uint64_t loss_seed = 1;
  FillMode bcast_fill = FillMode::kZero;
  SendOrderKind send_order = kDefaultSendOrder;
  uint64_t order_seed = 1;
  uint32_t idle_spin = 512;
  uint32_t idle_sleep_us = 20;
  double stats_period_s = 1.0;
  uint32_t join_timeout_ms = 30000;
  uint32_t round_timeout_ms = 30000;  // no progress for this long: fail
  std::string out_dir;
  // Test hooks: frames of the previous round and malformed frames sent at
  // the server at the start of each push round; dumps of what arrived.
  uint32_t hostile_per_round = 0;
  std::string dump_dir;
  uint32_t dump_iterations = 0;
};

// Runs the whole job; returns the process exit code. Errors that a user can
// fix end the process with a message naming the fix.
int RunWorker(const WorkerOptions& opts, std::unique_ptr<GradientSource> src);

}  // namespace dblp
