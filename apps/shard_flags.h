// The flags of a sharded job, the same on both servers (dblp-server and
// dblp-udp-server): --shards, --shard_index, --directory, the checks that
// refuse what a sharded job cannot take, and the job flags every shard
// must share. Include after server_flags.h from the app's single
// translation unit.
#pragma once

#include <gflags/gflags.h>

#include <charconv>
#include <cstdlib>
#include <string>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/control/control.h"
#include "dblp/control/server_shards.h"
#include "server_flags.h"

DEFINE_uint32(shards, 1,
              "server shards of the job: server processes that each own a "
              "partition of the gradient's chunks (1..64)");
DEFINE_uint32(shard_index, 0,
              "this server's shard, 0..shards-1; shard 0 is the job's "
              "directory, the address every worker joins");
DEFINE_string(directory, "",
              "shard 0's control address, for a shard index > 0; it "
              "registers there");

namespace dblp {

// The flags every server shard must share: a shard whose differ is
// refused, naming the first (ShardRegistry). A flag the app lacks is
// left out.
inline constexpr const char* kShardJobFlags[] = {
    "workers",
    // The tolerance policy's.
    "policy", "p_fixed", "p_low", "p_high", "clr_freq", "clr_eta",
    "ltp_deadline_factor", "ltp_window", "ltp_min_fraction",
    "deadline_percentile", "deadline_factor", "deadline_window",
    "deadline_min_fraction",
    // The rest of the job's.
    "frame_auth", "push_fill", "resync_every", "bcast_tolerance",
    "push_feedback", "on_bad_gradient", "clip_norm", "on_worker_loss",
    "zero_fraction", "zero_iters", "mtu", "insecure", "paper_mode",
    "max_gradient_mb"};

// "--name=value" lines of kShardJobFlags. Doubles in their shortest exact
// form ("0.008", not gflags' "0.0080000000000000002"): the same value gives
// the same text.
inline std::string ShardJobFlags() {
  std::string out;
  for (const char* name : kShardJobFlags) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name, &info)) continue;
    std::string value = info.current_value;
    if (info.type == "double") {
      char buf[64];
      const double d = std::strtod(value.c_str(), nullptr);
      const auto r = std::to_chars(buf, buf + sizeof buf, d);
      value.assign(buf, r.ptr);
    }
    out += std::string("--") + name + "=" + value + "\n";
  }
  return out;
}

inline bool IsLoopbackEndpoint(const std::string& endpoint) {
  return endpoint.rfind("127.", 0) == 0 || endpoint.rfind("localhost", 0) == 0;
}

// What a sharded job cannot take: losing a worker mid-job (each shard
// would drop it at its own iteration), a loopback control address
// advertised to workers on other hosts, and a control budget without room
// for the other shards' connections.
inline void ShardedJobFlagChecks(const std::string& listen,
                                 const char* listen_flag) {
  if (FLAGS_on_worker_loss != "abort") {
    FlagError("--on_worker_loss=" + FLAGS_on_worker_loss +
              " is not supported with --shards > 1 (each shard would "
              "drop a lost worker at its own iteration): use "
              "--on_worker_loss=abort");
  }
  if (FLAGS_shard_index > 0 && IsLoopbackEndpoint(listen) &&
      !IsLoopbackEndpoint(FLAGS_directory)) {
    FlagError(std::string("--") + listen_flag + "=" + listen +
              " is a loopback address, but the directory (" + FLAGS_directory +
              ") is on another host and advertises it to the workers: "
              "give --" +
              listen_flag + " an address they can reach");
  }
  if (FLAGS_shard_index == 0 &&
      FLAGS_control_max_connections < FLAGS_workers + FLAGS_shards - 1) {
    FlagError("--control_max_connections=" +
              std::to_string(FLAGS_control_max_connections) +
              " leaves no room for the job: the directory holds --workers + "
              "--shards - 1 = " +
              std::to_string(FLAGS_workers + FLAGS_shards - 1) +
              " connections");
  }
}

// This server's place in the job; exits 2 naming the flag. `listen` is
// the server's control address (flag `listen_flag`): shard 0's is the
// directory.
inline ShardRole ShardRoleFromFlags(const std::string& listen,
                                    const char* listen_flag) {
  if (FLAGS_shards < 1 || FLAGS_shards > kMaxServerShards) {
    FlagError("--shards=" + std::to_string(FLAGS_shards) +
              " is out of range: use 1.." + std::to_string(kMaxServerShards));
  }
  if (FLAGS_shard_index >= FLAGS_shards) {
    FlagError("--shard_index=" + std::to_string(FLAGS_shard_index) +
              " needs --shards above it: use 0.." +
              std::to_string(FLAGS_shards - 1));
  }
  if (FLAGS_shard_index > 0 && FLAGS_directory.empty()) {
    FlagError("--shard_index=" + std::to_string(FLAGS_shard_index) +
              " needs --directory=IP:PORT, the --" + listen_flag +
              " of shard 0");
  }
  if (FLAGS_shard_index == 0 && !FLAGS_directory.empty()) {
    FlagError(
        "--directory is for shards 1..shards-1; shard 0 is the "
        "directory (drop --directory or set --shard_index)");
  }
  // Before the checks that compare it with the control address: a
  // malformed directory is named as such, not as "another host".
  if (FLAGS_shard_index > 0) {
    sockaddr_in sa{};
    std::string err;
    if (!ParseIpv4Endpoint(FLAGS_directory, false, false, "10.0.0.1:9100", &sa,
                           &err)) {
      FlagError("--directory=" + FLAGS_directory + ": " + err);
    }
  }
  if (FLAGS_shards > 1) ShardedJobFlagChecks(listen, listen_flag);
  ShardRole role;
  role.index = static_cast<uint16_t>(FLAGS_shard_index);
  role.count = static_cast<uint16_t>(FLAGS_shards);
  role.directory = FLAGS_shard_index > 0 ? FLAGS_directory : listen;
  return role;
}

}  // namespace dblp
