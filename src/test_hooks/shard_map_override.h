// Test hook of dblp-worker (--shard_map_override), outside the production
// job: the worker joins the server shards with a WRONG shard map (another
// partition for one shard than the directory's WELCOME gave), so the tests
// can check that the shard refuses the claim with a clear error (issue #22:
// "a worker given a wrong shard map is refused").
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dblp/control/control.h"

namespace dblp {

using ShardMapHook = std::function<void(std::vector<ShardEntry>*)>;

// `spec` is SHARD:FIRST_CHUNK:NUM_CHUNKS: entry SHARD's partition is
// replaced by [FIRST_CHUNK, FIRST_CHUNK + NUM_CHUNKS). Empty: no hook.
// Throws std::invalid_argument naming the form on anything else; a SHARD
// past the map's end is left alone (the join then goes as the map says).
ShardMapHook ShardMapOverride(const std::string& spec);

}  // namespace dblp
