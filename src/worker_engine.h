// dblp-worker's engine: joins the server over the control sidecar, then per
// iteration pushes its gradient (SenderRound, early stop on STOP) and
// receives the server's mean (ReceiverRound, STOP at the current p).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "app_options.h"
#include "dblp/control/job_auth.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/policy/loss_fill.h"

namespace dblp {

struct WorkerOptions {
  std::string server = "127.0.0.1:9100";  // TCP control address
  std::string name = "worker";
  std::string local_ip;  // default 10.0.0.(2 + rank)
  std::string eth_peer;  // server MAC override ("" = from WELCOME)
  uint32_t iterations = 100;
  DatapathOptions dp;  // loss: on the broadcast frames it receives
  FillMode bcast_fill = FillMode::kZero;
  uint32_t join_timeout_ms = 30000;
  JobSecret secret;  // --secret_file (empty: --insecure)
  // Test hook: frames of the previous round and malformed frames sent at
  // the server at the start of each push round.
  uint32_t hostile_per_round = 0;
};

// Runs the whole job; returns the process exit code. Errors that a user can
// fix end the process with a message naming the fix.
int RunWorker(const WorkerOptions& opts, std::unique_ptr<GradientSource> src);

}  // namespace dblp
