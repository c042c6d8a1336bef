// A server's admission of workers: every JOIN is checked (with a reason
// that names the fix), the first one fixes the job's gradient layout, and
// each admitted worker gets a rank in JOIN order. Shared by dblp-server and
// the kernel-UDP server. Control thread only; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dblp/control.h"
#include "dblp/control_sidecar.h"

namespace dblp {

struct JoinPolicy {
  uint32_t workers = 1;
  uint32_t mtu = 1500;  // every worker's must match
  // A larger gradient is refused (the server holds a few copies of it).
  uint64_t max_gradient_bytes = uint64_t{1} << 30;
};

class JoinDesk {
 public:
  struct Member {
    ConnId conn = 0;
    std::string name;
  };

  explicit JoinDesk(const JoinPolicy& policy) : policy_(policy) {}

  // Checks `j` from connection `c`. Returns "" and admits it (the next
  // rank), or the refusal to send back.
  std::string Admit(ConnId c, const JoinMsg& j);
  // A connection that closed before the job started frees its place.
  void Leave(ConnId c);
  // The worker of connection `c`, or -1.
  int RankOf(ConnId c) const;
  bool full() const { return members_.size() == policy_.workers; }
  // Every worker joined and was welcomed: later JOINs are refused.
  void Close() { closed_ = true; }

  const std::vector<Member>& members() const { return members_; }
  // The job's layout: the first admitted JOIN.
  const JoinMsg& first() const { return first_; }
  // WELCOME for `rank`: its rank, the worker count and the first JOIN's
  // layout cut into chunks of `chunk_payload`; the caller adds what is its
  // own (session, addresses, shards, policy).
  WelcomeMsg Welcome(uint32_t rank, uint32_t chunk_payload) const;

 private:
  JoinPolicy policy_;
  std::vector<Member> members_;
  JoinMsg first_;
  bool closed_ = false;
};

}  // namespace dblp
