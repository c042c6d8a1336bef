// A worker's side of joining a sharded job (issue #22): the directory's
// WELCOME lists every server shard (ShardEntry); the worker then JOINs each
// shard k > 0 with a claim (its index, the partition the map gives it, the
// directory's rank and job nonce), and checks that the shard's WELCOME
// confirms that claim. The shard refuses a claim that does not match its
// own registration; these checks catch a shard that accepted one anyway.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/control/control.h"

namespace dblp {

// Whether the directory's WELCOME describes a sharded job.
inline bool IsShardedWelcome(const WelcomeMsg& w) {
  return w.shard_count > 1 || !w.shards.empty();
}

// "" if the directory's WELCOME is a consistent shard map (one entry per
// shard, itself first at chunk 0, partitions contiguous from chunk 0 and
// 64-chunk aligned, covering the whole gradient), else what is wrong.
std::string CheckShardMap(const WelcomeMsg& directory);

// The control address of shard `e`, "a.b.c.d:port".
std::string ShardControlAddress(const ShardEntry& e);

// The JOIN for server shard `k` (> 0) of the job the directory's WELCOME
// `directory` describes: `base` (the JOIN the directory got: name, size,
// layers, MTU) with `mac` as our data source toward it, our data IPv4 as
// the directory assigned it, and the claim from `entry` (the map's entry
// for shard k, normally directory.shards[k]).
JoinMsg ShardJoin(const JoinMsg& base, const WelcomeMsg& directory, uint16_t k,
                  const ShardEntry& entry);

// "" if a shard's WELCOME `got` confirms the claim `claim` (the JOIN we sent
// it, from map entry `entry`): its index and count, the partition, the rank
// and worker count the directory gave us, the whole gradient's size and
// chunking, the data address and queues the map announced; else what
// differs.
std::string CheckShardWelcome(const WelcomeMsg& directory, const JoinMsg& claim,
                              const ShardEntry& entry, const WelcomeMsg& got);

}  // namespace dblp
