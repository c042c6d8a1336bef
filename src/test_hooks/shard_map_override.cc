#include "test_hooks/shard_map_override.h"

#include <cstdint>
#include <cstdio>
#include <stdexcept>

namespace dblp {

ShardMapHook ShardMapOverride(const std::string& spec) {
  if (spec.empty()) return nullptr;
  unsigned shard = 0, first = 0, chunks = 0;
  char tail = 0;
  if (std::sscanf(spec.c_str(), "%u:%u:%u%c", &shard, &first, &chunks, &tail) !=
          3 ||
      shard == 0 || shard >= kMaxServerShards) {
    throw std::invalid_argument(
        "--shard_map_override: use SHARD:FIRST_CHUNK:NUM_CHUNKS with SHARD "
        "a server shard other than the directory (1.." +
        std::to_string(kMaxServerShards - 1) + "), e.g. 1:0:64");
  }
  return [=](std::vector<ShardEntry>* map) {
    if (shard >= map->size()) return;
    (*map)[shard].first_chunk = first;
    (*map)[shard].num_chunks = chunks;
    std::fprintf(stderr,
                 "dblp-worker: test hook: claiming chunks [%u, %u) of server "
                 "shard %u\n",
                 first, first + chunks, shard);
  };
}

}  // namespace dblp
