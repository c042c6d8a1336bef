#include "dblp/control/join.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <utility>

#include "dblp/wire/chunking.h"

namespace dblp {

std::string JoinDesk::Admit(ConnId c, const JoinMsg& j) {
  if (closed_ || full()) return "job already has all workers";
  if (j.protocol_version != kControlVersion) {
    return "control protocol version " + std::to_string(j.protocol_version) +
           " != server's " + std::to_string(kControlVersion) +
           ": run the same DBLP build everywhere";
  }
  if (j.total_bytes == 0 || j.total_bytes % 4 != 0) {
    return "gradient size must be a positive multiple of 4";
  }
  if (j.total_bytes > policy_.max_gradient_bytes) {
    return "gradient of " + std::to_string(j.total_bytes) +
           " bytes is above the server's limit of " +
           std::to_string(policy_.max_gradient_bytes) +
           ": lower --floats or raise the server's limit";
  }
  if (RankOf(c) >= 0) return "JOIN sent twice";
  if (policy_.require_data_port && j.data_udp_port == 0) {
    return "JOIN names no data UDP port, which this server pins: run a "
           "kernel-UDP worker of the same DBLP build";
  }
  if (j.worker_name.empty()) {
    return "empty worker name: give every worker a unique --name";
  }
  for (const Member& m : members_) {
    if (m.name == j.worker_name) {
      return "a worker named \"" + j.worker_name +
             "\" already joined: give every worker a unique --name";
    }
  }
  if (j.mtu != policy_.mtu) {
    return "worker MTU " + std::to_string(j.mtu) + " != server MTU " +
           std::to_string(policy_.mtu) + ": pass the same --mtu to every app";
  }
  if (policy_.rank_by_claim) {
    if (j.rank_plus_one == 0 || j.rank_plus_one > policy_.workers) {
      return "the JOIN claims no rank of this job's " +
             std::to_string(policy_.workers) + " workers";
    }
    for (const Member& m : members_) {
      if (m.rank_plus_one == j.rank_plus_one) {
        return "rank " + std::to_string(j.rank_plus_one - 1) +
               " already joined: every worker JOINs each server shard once, "
               "with the rank the directory gave it";
      }
    }
  }
  if (members_.empty()) {
    first_ = j;
  } else if (j.total_bytes != first_.total_bytes || j.layers != first_.layers) {
    return "gradient layout differs from the first worker's: every worker "
           "must run the same model (--floats / --model)";
  }
  members_.push_back(Member{c, j.worker_name, j.data_mac, j.data_ipv4,
                            j.data_udp_port, j.rank_plus_one});
  most_members_ = std::max(most_members_, members_.size());
  return "";
}

std::string JoinDesk::Shortfall() const {
  std::string s = "only " + std::to_string(members_.size()) + " of " +
                  std::to_string(policy_.workers) + " workers joined";
  if (most_members_ > members_.size()) {
    s += " (" + std::to_string(most_members_) +
         " had joined; the others left again, e.g. at their own "
         "--join_timeout_ms)";
  }
  return s;
}

void JoinDesk::Close() {
  if (!closed_ && policy_.rank_by_claim) {
    std::sort(members_.begin(), members_.end(),
              [](const Member& a, const Member& b) {
                return a.rank_plus_one < b.rank_plus_one;
              });
  } else if (!closed_ && policy_.rank_by_name) {
    std::stable_sort(members_.begin(), members_.end(),
                     [](const Member& a, const Member& b) {
                       return NameBefore(a.name, b.name);
                     });
  }
  closed_ = true;
}

bool JoinDesk::NameBefore(const std::string& a, const std::string& b) {
  // A total order on keys (prefix, numbered?, digits' count and value with
  // leading zeros dropped, the whole name): a strict weak ordering, as
  // std::stable_sort needs, that puts "w2" before "w10".
  const auto key = [](const std::string& s) {
    size_t d = s.size();
    while (d > 0 && s[d - 1] >= '0' && s[d - 1] <= '9') --d;
    const std::string_view name(s);
    std::string_view digits = name.substr(d);
    const size_t z = digits.find_first_not_of('0');
    digits = z == std::string_view::npos ? std::string_view() : digits.substr(z);
    return std::make_tuple(name.substr(0, d), d < s.size(), digits.size(),
                           digits, name);
  };
  return key(a) < key(b);
}

void JoinDesk::Leave(ConnId c) {
  const int w = RankOf(c);
  if (w >= 0 && !closed_) members_.erase(members_.begin() + w);
}

int JoinDesk::RankOf(ConnId c) const {
  for (size_t w = 0; w < members_.size(); ++w) {
    if (members_[w].conn == c) return static_cast<int>(w);
  }
  return -1;
}

WelcomeMsg JoinDesk::Welcome(uint32_t rank, uint32_t chunk_payload) const {
  const ChunkLayout layout(first_.total_bytes, chunk_payload);
  WelcomeMsg wm;
  wm.rank = static_cast<uint16_t>(rank);
  wm.num_workers = static_cast<uint16_t>(policy_.workers);
  wm.mtu = policy_.mtu;
  wm.chunk_payload = chunk_payload;
  wm.num_chunks = layout.num_chunks();
  wm.total_bytes = layout.total_bytes();
  wm.layers = first_.layers;
  return wm;
}

}  // namespace dblp
