// dblp-worker's options, and what its push hook (a test seam) may use.
// apps/worker_flags.h fills them; the setup and the engine read them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/job_auth.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/job/worker_job.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/chunking.h"
#include "port/datapath.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "runtime/app_options.h"

namespace dblp {

// What a push hook may use: the engine's own data path, valid for the
// whole job.
struct PushHookContext {
  const WelcomeMsg* welcome = nullptr;
  rte_mempool* pool = nullptr;
  DatapathCounters* counters = nullptr;
  const FrameTemplate* to_server = nullptr;
  const PortCaps* caps = nullptr;
  Endpoint local;  // our data address, as the server pinned it
  const uint8_t* gradient = nullptr;  // what the push sends
  const ChunkLayout* layout = nullptr;
  uint16_t queues = 1;  // the server's shards
  FrameKey frame_key;   // this member's (job_auth.h)
};

// Called before each push (iteration `it`, `round`, the push's send order).
// Once per iteration, so a virtual call.
class PushHook {
 public:
  virtual ~PushHook() = default;
  virtual void BeforePush(uint64_t it, uint32_t round,
                          std::span<const uint32_t> order) = 0;
};
using PushHookFactory =
    std::function<std::unique_ptr<PushHook>(const PushHookContext&)>;

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
  // Test seams, empty in a production job: makes the hook the engine
  // calls before each push (src/test_hooks/hostile_frames.h); sees each
  // absorbed iteration (src/test_hooks/dumps.h).
  PushHookFactory push_hook;
  AbsorbedObserver on_absorbed;
  // Rewrites the directory's shard map before the worker joins the other
  // server shards (src/test_hooks/shard_map_override.h: a wrong map, which
  // the shards must refuse).
  std::function<void(std::vector<ShardEntry>*)> shard_map_hook;
};

// Runs the whole job; returns the process exit code. Errors that a user can
// fix end the process with a message naming the fix.

}  // namespace dblp
