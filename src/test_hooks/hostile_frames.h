// Test hook of dblp-worker (--hostile_per_round), outside the production
// job: before each push it sends at the server what an attacker on the
// data path would, none of which may be accepted (tests/memif_cluster_test.py
// and tests/soak_test.py count every one of them).
#pragma once

#include <cstdint>

#include "worker/worker_engine.h"

namespace dblp {

// The hook, sending `per_round` frames of each kind per push round.
PushHookFactory HostileFrames(uint32_t per_round);

}  // namespace dblp
