// Flags of every DBLP app, DPDK or kernel UDP: the job secret, the loss
// and burst injector, the seed and send order, timeouts, outputs and test
// hooks. Defined once per executable (each app includes this, directly or
// through common_flags.h, from its single translation unit). Every bad
// value ends with a message naming the flag and an accepted value (exit 2).
#pragma once

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "dblp/base/deep_idle.h"
#include "dblp/base/log.h"
#include "dblp/control/job_auth.h"
#include "dblp/emul/loss_model.h"
#include "dblp/handoff/synthetic_gradient.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/send_order.h"
#include "dblp/wire/chunking.h"
#include "flag_checks.h"

DEFINE_uint32(mtu, 1500,
              "IP MTU of the data frames (576..9216; jumbo "
              "needs a device that supports it)");
DEFINE_uint32(burst, 32, "frames per TX burst");
DEFINE_uint32(idle_sleep_us, 20,
              "idle back-off: longest sleep of an idle "
              "poll loop in us (0 = pure busy polling)");
DEFINE_uint32(idle_deep_sleep_us, 0,
              "idle back-off, second stage: once a poll loop has been idle "
              "for --idle_deep_after_us, sleep up to this long (a trainer "
              "computing between rounds keeps its CPU; the next round's "
              "first frame waits up to this long; 0 = off)");
DEFINE_uint32(idle_deep_after_us, 2000,
              "idle back-off: idleness (summed sleeps) before the second "
              "stage");
DEFINE_string(out_dir, "",
              "write iterations.jsonl/.csv and summary.json "
              "here");
DEFINE_string(rows_on_error, "fail",
              "when a row cannot be written to --out_dir (a full disk): "
              "fail (end the job at once, naming the file and the fix) | "
              "drop (go on; the lost rows are counted as rows_dropped and "
              "said on stderr)");
DEFINE_string(loss, "none",
              "software loss on the data frames this app receives, outside "
              "bursts: none | bernoulli:P | ge:P_GB,P_BG,LOSS_GOOD,LOSS_BAD");
DEFINE_string(burst_iters, "",
              "iterations with a one-iteration microburst, "
              "e.g. 279,651");
DEFINE_uint32(burst_random, 0,
              "place this many bursts at random iterations "
              "in --burst_range (same --burst_seed on every app)");
DEFINE_string(burst_range, "10,1000",
              "FIRST,LAST iterations for "
              "--burst_random");
DEFINE_uint64(burst_seed, 7, "seed of --burst_random");
DEFINE_string(burst_window_ms, "",
              "START,END ms after the first iteration: "
              "a time-window burst");
DEFINE_double(burst_loss, 0.7, "loss rate inside a burst");
DEFINE_uint64(seed, 1,
              "job seed, the same on every app: loss injector, "
              "send order and, for dblp-worker --gradient=train, the model's "
              "initial weights, the data shards and the batch order");
DEFINE_string(send_order, "magnitude",
              "magnitude (the chunks of largest L2 norm first, so early "
              "stop drops the smallest; the server's broadcast sends every "
              "worker the mean's in one such order) | sequential | rotating "
              "| permuted | blocked (shuffled blocks of 32 chunks: faster "
              "for large gradients)");
DEFINE_uint32(round_timeout_ms, 30000,
              "fail with a clear error when a round "
              "makes no progress for this long");
DEFINE_string(secret_file, "",
              "the job secret: a file of 16..4096 bytes, "
              "mode 0600, the same for every app of the job (make one with "
              "head -c 32 /dev/urandom > FILE && chmod 600 FILE). JOIN is "
              "then mutually authenticated and data frames are tagged");
DEFINE_bool(insecure, false,
            "run without a job secret: anyone who reaches "
            "the control port can join and anyone who reaches the data port "
            "can move the mean (a closed lab network only)");
DEFINE_string(dump_dir, "", "test hook: dump what arrived (means, bitmaps)");
DEFINE_uint32(dump_iterations, 0, "test hook: iterations to dump");

namespace dblp {

// --idle_deep_sleep_us / --idle_deep_after_us.
inline DeepIdle DeepIdleFromFlags() {
  return DeepIdle{FLAGS_idle_deep_after_us, FLAGS_idle_deep_sleep_us};
}

// The job secret from --secret_file, or none with --insecure (said on
// stderr); anything else ends the app naming the fix. Read before the EAL
// starts, so a bad secret costs no hugepages.
inline dblp::JobSecret JobSecretFromFlags(const char* app) {
  if (!FLAGS_secret_file.empty() && FLAGS_insecure) {
    FlagError("--secret_file and --insecure: choose one");
  }
  if (FLAGS_insecure) {
    DBLP_LOG(Warning,
                 "%s: WARNING: --insecure: no job secret; joins and data "
                 "frames are not authenticated",
                 app);
    return dblp::JobSecret();
  }
  if (FLAGS_secret_file.empty()) {
    FlagError(
        "no job secret: give every app of the job --secret_file=FILE "
        "(head -c 32 /dev/urandom > FILE && chmod 600 FILE), or --insecure "
        "on a closed lab network");
  }
  std::string err;
  std::optional<dblp::JobSecret> s =
      dblp::JobSecret::Load(FLAGS_secret_file, &err);
  if (!s) FlagError("--secret_file: " + err);
  return *std::move(s);
}

inline std::pair<uint64_t, uint64_t> ParsePair(const std::string& text,
                                               const char* flag) {
  std::vector<uint64_t> v;
  try {
    v = ParseIterationList(text);
  } catch (const std::invalid_argument& e) {
    FlagError(std::string("--") + flag + "=" + text + ": " + e.what());
  }
  if (v.size() != 2 || v[0] > v[1]) {
    FlagError(std::string("--") + flag + "=" + text +
              ": expected FIRST,LAST with FIRST <= LAST, e.g. 10,1000");
  }
  return {v[0], v[1]};
}

inline RowsOnError RowsOnErrorFromFlags() {
  if (FLAGS_rows_on_error != "fail" && FLAGS_rows_on_error != "drop") {
    FlagError("--rows_on_error=" + FLAGS_rows_on_error + ": use fail or drop");
  }
  return FLAGS_rows_on_error == "drop" ? RowsOnError::kDrop
                                       : RowsOnError::kFail;
}

inline LossSpec LossFromFlags() {
  try {
    return ParseLossSpec(FLAGS_loss);
  } catch (const std::invalid_argument& e) {
    FlagError(std::string("--loss: ") + e.what());
  }
}

inline BurstSchedule BurstsFromFlags() {
  try {
    BurstSchedule b;
    if (FLAGS_burst_random > 0) {
      const auto [first, last] = ParsePair(FLAGS_burst_range, "burst_range");
      b = RandomBurstIterations(FLAGS_burst_random, first, last,
                                FLAGS_burst_seed, FLAGS_burst_loss);
      if (!FLAGS_burst_iters.empty()) {
        FlagError("use either --burst_iters or --burst_random, not both");
      }
    } else {
      try {
        b = ParseBurstIterations(FLAGS_burst_iters, FLAGS_burst_loss);
      } catch (const std::invalid_argument& e) {
        FlagError("--burst_iters=" + FLAGS_burst_iters + " (--burst_loss=" +
                  std::to_string(FLAGS_burst_loss) + "): " + e.what());
      }
    }
    if (!FLAGS_burst_window_ms.empty()) {
      const auto [a, z] = ParsePair(FLAGS_burst_window_ms, "burst_window_ms");
      if (z > UINT64_MAX / 1000000) {  // the ns below must not wrap
        FlagError("--burst_window_ms=" + FLAGS_burst_window_ms +
                  ": END is too large (e.g. --burst_window_ms=1000,2000)");
      }
      b.window_start_ns = a * 1000000;
      b.window_end_ns = z * 1000000;
    }
    return b;
  } catch (const std::invalid_argument& e) {
    // RandomBurstIterations: the count, the range and the loss together.
    FlagError(std::string("--burst_random, --burst_range, --burst_loss: ") +
              e.what());
  }
}

inline SendOrderKind SendOrderFromFlags() {
  try {
    return ParseSendOrder(FLAGS_send_order);
  } catch (const std::invalid_argument& e) {
    FlagError(std::string("--send_order: ") + e.what());
  }
}

// --mtu, --burst (1..max_burst) and --round_timeout_ms, checked.
inline uint32_t MtuFromFlags() {
  if (FLAGS_mtu < kMinMtu || FLAGS_mtu > kMaxMtu) {
    FlagError("--mtu=" + std::to_string(FLAGS_mtu) + " is outside " +
              std::to_string(kMinMtu) + ".." + std::to_string(kMaxMtu) +
              ": use 1500, or up to 9000 for jumbo frames");
  }
  return FLAGS_mtu;
}

inline uint32_t BurstFromFlags(uint32_t max_burst) {
  if (FLAGS_burst == 0 || FLAGS_burst > max_burst) {
    FlagError("--burst must be in 1.." + std::to_string(max_burst));
  }
  return FLAGS_burst;
}

inline uint32_t RoundTimeoutFromFlags() {
  if (FLAGS_round_timeout_ms == 0) {
    FlagError("--round_timeout_ms must be > 0 (a stuck round must end)");
  }
  return FLAGS_round_timeout_ms;
}

}  // namespace dblp
