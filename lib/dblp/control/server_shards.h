// The door of a sharded job (dblp-server --shards=S --shard_index=k
// --directory=HOST:PORT): which JOINs each server shard admits, and the
// directory's registry of the other shards. Transport-free; the TCP side
// is lib/dblp/job/shard_links.h, the phase lib/dblp/job/phase_link.h.
//
// Three kinds of JOIN (control.h v6):
//   plain         shard_index 0: a worker joining the directory (or an
//                 unsharded server);
//   registration  shard_index k > 0, rank_plus_one 0: server shard k
//                 registering with the directory (SHARD_HELLO follows);
//   claim         shard_index k > 0, rank_plus_one r + 1: worker r joining
//                 shard k with what the directory's WELCOME told it.
// Each server refuses the kinds that are not for it, naming the server to
// use instead. Control thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"

namespace dblp {

// This server's place in the job.
struct ShardRole {
  uint16_t index = 0;  // --shard_index
  uint16_t count = 1;  // --shards
  // Shard 0's control address (--directory; on shard 0 its own --listen):
  // named in every refusal that sends a worker elsewhere.
  std::string directory;
  bool sharded() const { return count > 1; }
};

bool IsShardRegistration(const JoinMsg& j);
bool IsShardClaim(const JoinMsg& j);

// A JOIN's kind against this server's role, as soon as it arrives: "" or
// the refusal, naming the directory.
std::string CheckJoinForRole(const JoinMsg& j, const ShardRole& role);

// At shard k > 0, once the directory assigned its partition: "" or why
// worker's claim is refused (another partition, another directory's job,
// a rank outside 0..workers-1).
std::string CheckClaim(const JoinMsg& j, const ShardAssignMsg& a,
                       uint32_t workers, const std::string& directory);

// The first job flag that differs between two SHARD_HELLO job_flags texts
// ("--name=value" lines): "" or "--p_low=0.1 at the directory, --p_low=0.2
// at server shard 1: start every server shard with the same job flags".
std::string FlagDifference(const std::string& directory,
                           const std::string& shard, uint16_t k);

// The directory's registry of server shards 1..S-1.
class ShardRegistry {
 public:
  // `job_flags`: the directory's own SHARD_HELLO text; `mtu` its port's.
  ShardRegistry(uint16_t count, std::string job_flags, uint32_t mtu);

  // Connection `c` proved the secret with a registration JOIN for shard
  // `k`: "" (it waits for its SHARD_HELLO) or the refusal (taken).
  std::string OnRegistration(ConnId c, uint16_t k);
  // A SHARD_HELLO on `c`: "" or the refusal (not registered, another
  // shard's index, job flags or MTU unlike the directory's).
  std::string OnHello(ConnId c, const ShardHelloMsg& h);
  // A connection closed: the shard it was, or -1. Before complete() its
  // place is free again.
  int OnClose(ConnId c);

  bool complete() const;
  // The shard on `c` (registered, HELLO or not), or -1.
  int ShardOf(ConnId c) const;
  ConnId conn(uint16_t k) const { return shards_[k].conn; }
  const ShardHelloMsg& hello(uint16_t k) const { return shards_[k].hello; }
  uint16_t count() const { return static_cast<uint16_t>(shards_.size()); }
  // "server shards 1, 2 did not register with the directory".
  std::string Shortfall() const;
  // Freezes the registry: a later close is a lost shard.
  void Close() { closed_ = true; }

 private:
  struct Slot {
    ConnId conn = 0;
    bool joined = false;
    bool hello_seen = false;
    ShardHelloMsg hello;
  };
  std::vector<Slot> shards_;  // [0] unused: the directory itself
  std::string job_flags_;
  uint32_t mtu_;
  bool closed_ = false;
};

}  // namespace dblp
