// dblp-server's engine: admits N workers over the control sidecar, then per
// iteration receives every worker's push under the current p, reduces,
// runs the tolerance policy on the mean's norm and broadcasts the mean.
#pragma once

#include <cstdint>
#include <string>

#include "app_options.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/tolerance.h"

namespace dblp {

struct ServerOptions {
  std::string listen = "127.0.0.1:9100";  // TCP control address
  uint32_t workers = 3;
  std::string local_ip = "10.0.0.1";
  uint16_t udp_port = 47000;  // pushes arrive here; worker r gets +1+r
  DatapathOptions dp;         // loss: on the push frames it receives
  PolicyConfig policy;
  FillMode push_fill = FillMode::kZero;
  bool reliable_broadcast = false;  // broadcast with p = 0
  // One subset of the mean per iteration for every worker, sent reliably;
  // the rest carried into the next iteration (dblp/broadcast_carry.h).
  bool consistent_broadcast = false;
  // Benchmark mode: no broadcast. The broadcast round is announced with a
  // 1 ns deadline and a floor of zero chunks, so every worker closes it as
  // soon as the announcement arrives and the job measures pushes only.
  bool push_only = false;
  // Every this many training steps, a re-synchronisation iteration: the
  // workers push their parameters reliably and load the average
  // (dblp/resync.h). 0: never.
  uint32_t resync_every = 0;
  // After every push the server tells each worker the chunks it summed
  // (ACCEPTED) and the worker carries the rest into its next push.
  bool push_feedback = false;
  bool continue_on_worker_loss = false;
  uint32_t session = 0;  // 0 = derived from the job's random nonce
  JobSecret secret;      // --secret_file (empty: --insecure)
  // Tags on every data frame (dblp/frame_auth.h); kNone when insecure.
  FrameAuthMode frame_auth = FrameAuthMode::kHeader;
  uint32_t join_timeout_ms = 60000;
  // Bounds on the control connections (--control_* flags).
  ControlLimits control_limits;
  // A JOIN asking for more is refused: the server holds about three copies
  // of the gradient (sums, mean, previous mean) in memory.
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
  bool rank_by_name = false;  // --rank_order=name (JoinPolicy)
  // Experiment hook (DBLP paper, Fig. 1): zero this fraction of the mean's
  // chunks in iterations [zero_first, zero_last].
  double zero_fraction = 0;
  uint64_t zero_first = 0;
  uint64_t zero_last = 0;
};

int RunServer(const ServerOptions& opts);

}  // namespace dblp
