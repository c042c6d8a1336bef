#include "dblp/control/server_shards.h"

#include <map>
#include <sstream>

#include "dblp/control/job_auth.h"

namespace dblp {
namespace {

std::string Shard(uint32_t k) { return "server shard " + std::to_string(k); }

std::string UseDirectory(const ShardRole& role) {
  return "start the worker with --server=" + role.directory +
         " (the job's directory, server shard 0)";
}

// "--name=value" lines by name.
std::map<std::string, std::string> FlagLines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    out[line.substr(0, eq)] = line;
  }
  return out;
}

}  // namespace

bool IsShardRegistration(const JoinMsg& j) {
  return j.shard_index > 0 && j.rank_plus_one == 0;
}

bool IsShardClaim(const JoinMsg& j) {
  return j.shard_index > 0 && j.rank_plus_one > 0;
}

std::string CheckJoinForRole(const JoinMsg& j, const ShardRole& role) {
  if (!role.sharded()) {
    if (j.shard_index == 0) return "";
    return "a JOIN for " + Shard(j.shard_index) + " of " +
           std::to_string(j.shard_count) +
           ", but this dblp-server runs unsharded (--shards=1): give every "
           "server shard the same --shards";
  }
  if (role.index == 0) {
    if (j.shard_index == 0) return "";
    if (j.shard_count != role.count) {
      return Shard(j.shard_index) +
             " runs with --shards=" + std::to_string(j.shard_count) +
             ", the directory with --shards=" + std::to_string(role.count) +
             ": give every server shard the same --shards";
    }
    if (IsShardClaim(j)) {
      return "a claim on " + Shard(j.shard_index) +
             " sent to the directory (server shard 0): JOIN that shard at "
             "the address the directory's WELCOME lists";
    }
    return "";  // a registration
  }
  const std::string here =
      "this is " + Shard(role.index) + " of " + std::to_string(role.count);
  if (j.shard_index == 0) {
    return here + ", not the job's directory: " + UseDirectory(role);
  }
  if (IsShardRegistration(j)) {
    return here + ": server shards register with the directory at " +
           role.directory + " (--directory)";
  }
  if (j.shard_index != role.index || j.shard_count != role.count) {
    return "the JOIN claims " + Shard(j.shard_index) + " of " +
           std::to_string(j.shard_count) + ", " + here +
           ": the worker's shard map is not this job's; " + UseDirectory(role);
  }
  return "";
}

std::string CheckClaim(const JoinMsg& j, const ShardAssignMsg& a,
                       uint32_t workers, const std::string& directory) {
  const std::string fix = ": start the worker with --server=" + directory +
                          " (the job's directory, server shard 0)";
  if (!AuthEqual(j.directory_nonce, a.directory_nonce)) {
    return "the JOIN's claim comes from another job's directory" + fix;
  }
  if (j.first_chunk != a.first_chunk || j.shard_chunks != a.num_chunks) {
    return "the JOIN claims chunks [" + std::to_string(j.first_chunk) + ", " +
           std::to_string(uint64_t{j.first_chunk} + j.shard_chunks) + "), " +
           Shard(a.shard_index) + " owns [" + std::to_string(a.first_chunk) +
           ", " + std::to_string(uint64_t{a.first_chunk} + a.num_chunks) + ")" +
           fix;
  }
  if (j.rank_plus_one > workers) {
    return "the JOIN claims rank " + std::to_string(j.rank_plus_one - 1) +
           " of a job of " + std::to_string(workers) + " workers" + fix;
  }
  return "";
}

std::string FlagDifference(const std::string& directory,
                           const std::string& shard, uint16_t k) {
  const auto mine = FlagLines(directory), theirs = FlagLines(shard);
  for (const auto& [name, line] : mine) {
    const auto it = theirs.find(name);
    const std::string other = it == theirs.end() ? "no " + name : it->second;
    if (other == line) continue;
    return line + " at the directory, " + other + " at " + Shard(k) +
           ": start every server shard with the same job flags";
  }
  for (const auto& [name, line] : theirs) {
    if (mine.count(name) == 0) {
      return "no " + name + " at the directory, " + line + " at " + Shard(k) +
             ": run the same DBLP build on every server shard";
    }
  }
  return "";
}

ShardRegistry::ShardRegistry(uint16_t count, std::string job_flags,
                             uint32_t mtu)
    : shards_(count), job_flags_(std::move(job_flags)), mtu_(mtu) {}

std::string ShardRegistry::OnRegistration(ConnId c, uint16_t k) {
  if (closed_) return "the job already started: " + Shard(k) + " is too late";
  if (k == 0 || k >= shards_.size()) {
    return "no " + Shard(k) + " in a job of " + std::to_string(shards_.size()) +
           " server shards";
  }
  if (shards_[k].joined) {
    return Shard(k) +
           " already registered: give every server shard its own "
           "--shard_index";
  }
  shards_[k] = Slot{c, true, false, {}};
  return "";
}

std::string ShardRegistry::OnHello(ConnId c, const ShardHelloMsg& h) {
  const int k = ShardOf(c);
  if (k < 0 || shards_[k].hello_seen) {
    return "SHARD_HELLO out of order (a server shard sends JOIN, PROOF, then "
           "one SHARD_HELLO)";
  }
  if (h.shard_index != k || h.shard_count != shards_.size()) {
    return "SHARD_HELLO names " + Shard(h.shard_index) + " of " +
           std::to_string(h.shard_count) + ", its JOIN " + Shard(k) + " of " +
           std::to_string(shards_.size());
  }
  if (h.mtu != mtu_) {
    return Shard(k) + "'s MTU is " + std::to_string(h.mtu) +
           ", the directory's " + std::to_string(mtu_) +
           ": pass the same --mtu to every app";
  }
  if (std::string why = FlagDifference(job_flags_, h.job_flags, k);
      !why.empty()) {
    return why;
  }
  shards_[k].hello_seen = true;
  shards_[k].hello = h;
  return "";
}

int ShardRegistry::OnClose(ConnId c) {
  const int k = ShardOf(c);
  if (k >= 0 && !closed_) shards_[k] = Slot{};
  return k;
}

bool ShardRegistry::complete() const {
  for (size_t k = 1; k < shards_.size(); ++k) {
    if (!shards_[k].hello_seen) return false;
  }
  return true;
}

int ShardRegistry::ShardOf(ConnId c) const {
  for (size_t k = 1; k < shards_.size(); ++k) {
    if (shards_[k].joined && shards_[k].conn == c) return static_cast<int>(k);
  }
  return -1;
}

std::string ShardRegistry::Shortfall() const {
  std::string who;
  uint32_t n = 0;
  for (size_t k = 1; k < shards_.size(); ++k) {
    if (shards_[k].hello_seen) continue;
    who += (n++ ? ", " : "") + std::to_string(k);
  }
  if (n == 0) return "";
  return std::string(n == 1 ? "server shard " : "server shards ") + who +
         " did not register with the directory";
}

}  // namespace dblp
