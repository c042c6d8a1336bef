// dblp-server's options: the job's (ServerJobSettings, the same struct as
// dblp-udp-server's) and the DPDK transport's. apps/server_flags.h fills
// them; the setup and the engine read them.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/server_shards.h"
#include "dblp/job/server_iteration.h"
#include "port/steering.h"
#include "runtime/app_options.h"
#include "server/bcast_frames.h"

namespace dblp {

// dblp-server's options: the job's (ServerJobSettings, the same struct as
// dblp-udp-server's) and the DPDK transport's.
struct ServerOptions : ServerJobSettings {
  std::string listen = "127.0.0.1:9100";  // TCP control address
  uint32_t workers = 3;
  std::string local_ip = "10.0.0.1";
  // Pushes arrive here (lcore k's range on udp_port + k); worker r gets
  // +1+r.
  uint16_t udp_port = 47000;
  // Several lcores on a real port: how its queues are steered.
  SteeringOptions steering;
  DatapathOptions dp;    // loss: on the push frames it receives
  uint32_t session = 0;  // 0 = derived from the job's random nonce
  JobSecret secret;      // --secret_file (empty: --insecure)
  // Tags on every data frame (dblp/frame_auth.h); kNone when insecure.
  FrameAuthMode frame_auth = FrameAuthMode::kFull;
  uint32_t join_timeout_ms = 60000;
  // Bounds on the control connections (--control_* flags).
  ControlLimits control_limits;
  // A JOIN asking for more is refused: the server holds about three copies
  // of the gradient (sums, mean, previous mean) in memory.
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
  bool rank_by_name = false;  // --rank_order=name (JoinPolicy)
  // A server shard of a sharded job (--shards, --shard_index,
  // --directory; lib/dblp/job/shard_links.h) and the job flags every shard must
  // share ("--name=value" lines).
  ShardRole shard_role;
  std::string shard_job_flags;
  // --bcast_frames: the broadcast's frames copy the mean's chunk or share
  // it (bcast_frames.h); auto picks per port driver at setup.
  bool bcast_frames_auto = true;
  BcastFrameMode bcast_frames = BcastFrameMode::kCopy;
};

}  // namespace dblp
