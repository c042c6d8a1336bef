#include "dblp/control/shard_claim.h"

#include <algorithm>

namespace dblp {
namespace {

std::string Dotted(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) +
         "." + std::to_string((ip >> 8) & 255) + "." + std::to_string(ip & 255);
}

// "what G, expected C" when they differ.
template <class T>
std::string Differs(const char* what, T got, T want) {
  if (got == want) return "";
  return std::string(what) + " " + std::to_string(got) + ", expected " +
         std::to_string(want);
}

}  // namespace

std::string ShardControlAddress(const ShardEntry& e) {
  return Dotted(e.control_ipv4) + ":" + std::to_string(e.control_port);
}

std::string CheckShardMap(const WelcomeMsg& d) {
  const size_t n = d.shards.size();
  if (n < 2 || n != d.shard_count || n > kMaxServerShards) {
    return "the shard map lists " + std::to_string(n) +
           " shards for a job of " + std::to_string(d.shard_count);
  }
  if (d.shard_index != 0 || d.first_chunk != 0 || d.chunk_payload == 0) {
    return "the directory is not shard 0 at chunk 0";
  }
  const uint64_t chunks =
      (d.model_bytes + d.chunk_payload - 1) / d.chunk_payload;
  uint64_t next = 0;
  for (size_t k = 0; k < n; ++k) {
    const ShardEntry& e = d.shards[k];
    if (e.first_chunk != next || e.first_chunk % 64 != 0) {
      return "shard " + std::to_string(k) + "'s partition starts at chunk " +
             std::to_string(e.first_chunk) + ", not " + std::to_string(next) +
             " (partitions are contiguous and 64-chunk aligned)";
    }
    if (e.queues == 0 || e.control_port == 0 || e.udp_base_port == 0) {
      return "shard " + std::to_string(k) + " has no queues or ports";
    }
    next += e.num_chunks;
  }
  if (next != chunks) {
    return "the partitions hold " + std::to_string(next) +
           " chunks, the gradient " + std::to_string(chunks);
  }
  if (d.shards[0].num_chunks != d.num_chunks) {
    return "the directory's own partition differs from its entry";
  }
  return "";
}

JoinMsg ShardJoin(const JoinMsg& base, const WelcomeMsg& directory, uint16_t k,
                  const ShardEntry& entry) {
  JoinMsg j = base;
  // The directory's assignment: every shard pins one address for us.
  j.data_ipv4 = directory.worker_ipv4;
  j.shard_index = k;
  j.shard_count = directory.shard_count;
  j.first_chunk = entry.first_chunk;
  j.shard_chunks = entry.num_chunks;
  j.rank_plus_one = static_cast<uint16_t>(directory.rank + 1);
  j.directory_nonce = directory.job_nonce;
  return j;
}

std::string CheckShardWelcome(const WelcomeMsg& directory, const JoinMsg& claim,
                              const ShardEntry& entry, const WelcomeMsg& got) {
  const std::string checks[] = {
      Differs<uint32_t>("shard index", got.shard_index, claim.shard_index),
      Differs<uint32_t>("shard count", got.shard_count, claim.shard_count),
      Differs<uint32_t>("first chunk", got.first_chunk, claim.first_chunk),
      Differs<uint32_t>("partition of chunks", got.num_chunks,
                        claim.shard_chunks),
      Differs<uint32_t>("rank + 1", got.rank + 1, claim.rank_plus_one),
      Differs<uint32_t>("worker count", got.num_workers, directory.num_workers),
      Differs<uint64_t>("gradient bytes", got.model_bytes,
                        directory.model_bytes),
      Differs<uint32_t>("chunk payload", got.chunk_payload,
                        directory.chunk_payload),
      Differs<uint32_t>("data IPv4", got.server_ipv4, entry.data_ipv4),
      Differs<uint32_t>("UDP base port", got.udp_base_port,
                        entry.udp_base_port),
      Differs<uint32_t>("queues", got.lanes, entry.queues),
  };
  for (const std::string& c : checks) {
    if (!c.empty()) return c;
  }
  // Its partition's bytes: whole chunks, the last shard's last one short.
  const uint64_t begin = uint64_t{got.first_chunk} * got.chunk_payload;
  const uint64_t bytes =
      std::min<uint64_t>(uint64_t{got.num_chunks} * got.chunk_payload,
                         got.model_bytes > begin ? got.model_bytes - begin : 0);
  return Differs<uint64_t>("partition bytes", got.total_bytes, bytes);
}

}  // namespace dblp
