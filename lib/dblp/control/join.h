// A server's admission of workers: every JOIN is checked (with a reason
// that names the fix), the first one fixes the job's gradient layout, and
// each admitted worker gets a rank in JOIN order. Shared by dblp-server and
// the kernel-UDP server. Control thread only; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"

namespace dblp {

// A worker that names no data IPv4 gets this one plus its rank (10.0.0.2,
// 10.0.0.3, ...); the server's default is 10.0.0.1.
inline constexpr uint32_t kDefaultWorkerIpv4 = 0x0A000002u;

struct JoinPolicy {
  uint32_t workers = 1;
  uint32_t mtu = 1500;  // every worker's must match
  // A larger gradient is refused (the server holds a few copies of it).
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
  // The kernel-UDP server pins each worker's socket: its JOIN must name
  // its data port (the DPDK server assigns base + 1 + rank).
  bool require_data_port = false;
  // Ranks by worker name (natural order: "rank2" before "rank10") rather
  // than by the order the JOINs came in: a launcher that names its workers
  // after its own ranks (torch.distributed's) gets the same ranks here.
  bool rank_by_name = false;
  // A server shard k > 0 (dblp/control/server_shards.h): each worker takes the
  // rank its claim names (the directory's), so every shard's rank r is the same
  // worker. Duplicates and ranks >= workers are refused.
  bool rank_by_claim = false;
};

class JoinDesk {
 public:
  struct Member {
    ConnId conn = 0;
    std::string name;
    std::array<uint8_t, 6> data_mac{};  // its JOIN's data source
    uint32_t data_ipv4 = 0;             // 0: the server assigns one
    uint16_t data_udp_port = 0;         // 0: base port + 1 + rank
    uint16_t rank_plus_one = 0;         // its claim's (rank_by_claim)
  };

  explicit JoinDesk(const JoinPolicy& policy) : policy_(policy) {}

  // Checks `j` from connection `c`. Returns "" and admits it (the next
  // rank), or the refusal to send back.
  std::string Admit(ConnId c, const JoinMsg& j);
  // A connection that closed before the job started frees its place.
  void Leave(ConnId c);
  // The worker of connection `c`, or -1.
  int RankOf(ConnId c) const;
  // Natural order of worker names: equal prefixes compare by their
  // trailing numbers ("w2" < "w10").
  static bool NameBefore(const std::string& a, const std::string& b);
  bool full() const { return members_.size() == policy_.workers; }
  // Every worker joined: later JOINs are refused, and the members take
  // their final ranks (JoinPolicy::rank_by_name).
  void Close();

  const std::vector<Member>& members() const { return members_; }
  const JoinPolicy& policy() const { return policy_; }
  // Why the job did not start: "only K of N workers joined", and how many
  // had joined at most when some left again (a worker gives up at its own
  // join timeout, which may be shorter than the server's).
  std::string Shortfall() const;
  // The job's layout: the first admitted JOIN.
  const JoinMsg& first() const { return first_; }
  // WELCOME for `rank`: its rank, the worker count and the first JOIN's
  // layout cut into chunks of `chunk_payload`; the caller adds what is its
  // own (session, addresses, shards, policy).
  WelcomeMsg Welcome(uint32_t rank, uint32_t chunk_payload) const;

 private:
  JoinPolicy policy_;
  std::vector<Member> members_;
  size_t most_members_ = 0;
  JoinMsg first_;
  bool closed_ = false;
};

}  // namespace dblp
