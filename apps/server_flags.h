// Flags of both servers (dblp-server over DPDK, dblp-udp-server over
// kernel UDP) with the same meaning: the job's size, the tolerance policy,
// the broadcast, resync, feedback and the zeroing experiment
// (JobSettingsFromFlags), frame tags and limits. Include after job_flags.h (or
// common_flags.h) from the app's single translation unit.
#pragma once

#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/job/server_iteration.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/tolerance.h"
#include "dblp/security/frame_auth.h"
#include "job_flags.h"
#include "test_hooks/dumps.h"

DEFINE_uint32(workers, 3, "number of workers in the job");
DEFINE_string(policy, "dblp",
              "reliable | fixed | dblp | ltp | deadline (bounded time: a "
              "deadline from a high percentile of recent rounds) | combined "
              "(dblp's p_low and no deadline inside a critical regime, "
              "p_high plus ltp's deadline outside)");
DEFINE_double(p_fixed, 0.008, "fixed (MLT) tolerance");
DEFINE_double(p_low, 0.008,
              "dblp, combined: tolerance inside a critical regime");
DEFINE_double(p_high, 0.408,
              "dblp, combined: tolerance outside critical regimes");
DEFINE_uint32(clr_freq, 10,
              "dblp, combined: check the gradient norm every N "
              "iterations; a detected regime lasts N iterations");
DEFINE_double(clr_eta, 0.5,
              "dblp, combined: relative norm change that means a "
              "critical regime");
DEFINE_double(ltp_deadline_factor, 1.5,
              "ltp, combined outside critical regimes: deadline = factor x "
              "median round time");
DEFINE_uint32(ltp_window, 16, "ltp, combined: rounds in the median");
DEFINE_double(ltp_min_fraction, 0.5,
              "ltp, combined: fraction needed before a "
              "deadline may close a round");
DEFINE_double(deadline_percentile, 95,
              "deadline: deadline = --deadline_factor x this percentile "
              "(nearest rank, in (0, 100]) of the recent round times");
DEFINE_double(deadline_factor, 1.0,
              "deadline: multiplies the percentile (>= 1; 1 = "
              "OptiReduce's timeout, no margin)");
DEFINE_uint32(deadline_window, 20,
              "deadline: rounds in the percentile (20: the 95th is the "
              "second-longest, so one burst does not set the deadline)");
DEFINE_double(deadline_min_fraction, 0.1,
              "deadline: fraction needed before the deadline may close a "
              "round (small: the deadline bounds time, not loss)");
DEFINE_string(frame_auth, "full",
              "tag on every data frame of an "
              "authenticated job, under a key per worker: full (AES-GMAC "
              "over header and payload: no one without that worker's key "
              "can inject or change a float) | header (SipHash over the DBLP "
              "header only: it does NOT protect the payload, so whoever can "
              "see the job's frames can re-send them with other floats and "
              "move the mean; cheaper, docs/BENCHMARKS.md) | none. With "
              "--insecure: none");
DEFINE_uint32(max_gradient_mb, 1024,
              "refuse workers whose gradient is "
              "larger (the server keeps about three copies in memory)");
DEFINE_string(push_fill, "rescale",
              "server mean of missing chunks: rescale (the sum over the "
              "workers whose chunk arrived, divided by their number) | "
              "zero (divided by W, the paper) | prev");
DEFINE_int32(resync_every, -1,
             "every N training steps the workers push their parameters "
             "reliably and all load the average, so replicas a truncated "
             "broadcast drifted apart are identical again (0 = never; -1 = "
             "10 when the broadcast gives each worker its own subset "
             "(--bcast_tolerance=same) under a policy that loses chunks and "
             "--push_fill is not prev, else never)");
DEFINE_string(rank_order, "join",
              "how workers get their ranks: join (the order their JOINs "
              "came in) | name (natural order of --name: rank0, rank1, ..., "
              "rank10; what dblp's torch.distributed backend uses)");
DEFINE_uint32(join_timeout_ms, 60000,
              "give up waiting for workers after "
              "this long");
// Bounds on what anyone who can reach --listen can make the server hold
// (dblp::ControlLimits).
DEFINE_uint32(control_max_connections, 256,
              "control connections open at once; a newcomer beyond it "
              "evicts an unauthenticated one, or is closed at once when all "
              "are authenticated (0 = no limit; else at least --workers)");
DEFINE_uint32(control_max_unauthenticated, 128,
              "control connections that have not authenticated yet, open at "
              "once; a newcomer beyond it evicts the oldest of the source "
              "address with the most (0 = no limit)");
DEFINE_uint32(control_max_unauthenticated_per_source, 64,
              "control connections from one IPv4 address that have not "
              "authenticated yet; a newcomer beyond it evicts that "
              "address's oldest (0 = no limit)");
DEFINE_uint32(control_join_deadline_ms, 10000,
              "close a control connection that has not authenticated "
              "within this long (0 = never: only on a trusted network)");
DEFINE_uint32(control_max_untrusted_frame, 64 * 1024,
              "largest control message (bytes) from a connection that has "
              "not authenticated yet; raise it if a JOIN with very many "
              "layers is refused as too large");
DEFINE_uint32(control_partial_timeout_ms, 5000,
              "close a control connection whose message stays incomplete "
              "this long after its first byte (0 = never)");
DEFINE_uint32(control_idle_timeout_ms, 0,
              "close a control connection that sends nothing for this long "
              "(0 = never: workers are quiet while their model computes)");

DEFINE_string(bcast_tolerance, "same",
              "broadcast with the same p (same: each worker gets its own "
              "1-p of the mean), one 1-p subset for every worker sent "
              "reliably with the rest carried to the next iteration "
              "(consistent), every chunk (reliable), or no broadcast at all "
              "(none: a push benchmark, the workers apply a zero mean)");
DEFINE_bool(push_feedback, false,
            "after every push tell each worker the "
            "chunks the server summed, so it carries the rest into its next "
            "push (error feedback: nothing pushed is lost for good)");
DEFINE_string(on_bad_gradient, "abort",
              "a worker's chunk with NaN or infinite floats, or one whose "
              "sum would overflow float32, is refused and left out of its "
              "chunk's mean; then: abort (end the job naming the worker and "
              "the iteration) | drop (go on without it, counted in the "
              "summary and the rows, logged)");
DEFINE_double(clip_norm, 0,
              "scale each worker's contribution so its L2 norm is at most "
              "this, chunk by chunk (a chunk of n of the N floats gets "
              "X*sqrt(n/N)); 0 = off");
DEFINE_string(on_worker_loss, "abort",
              "abort | continue (without the "
              "lost worker)");
DEFINE_double(zero_fraction, 0,
              "experiment: zero this fraction of the mean's "
              "chunks (the same for every worker) in --zero_iters");
DEFINE_string(zero_iters, "",
              "experiment: FIRST,LAST iterations of "
              "--zero_fraction");

DEFINE_bool(paper_mode, false,
            "the DBLP paper's loss handling: --push_fill=zero "
            "--bcast_tolerance=same --resync_every=0 --push_feedback=false "
            "and, unless named, --send_order=permuted (each worker applies "
            "its own 1-p of a mean divided by W; give the workers "
            "--send_order=permuted too; docs/EXPERIMENTS.md measures what "
            "it costs)");

namespace dblp {

// The policy flags, validated: a bad value ends the app naming the flag.
inline PolicyConfig PolicyFromFlags() {
  PolicyConfig p;
  try {
    p.kind = ParsePolicyKind(FLAGS_policy);
    p.p_fixed = FLAGS_p_fixed;
    p.p_low = FLAGS_p_low;
    p.p_high = FLAGS_p_high;
    p.clr.freq = FLAGS_clr_freq;
    p.clr.eta = FLAGS_clr_eta;
    p.ltp_deadline_factor = FLAGS_ltp_deadline_factor;
    p.ltp_window = FLAGS_ltp_window;
    p.ltp_min_fraction = FLAGS_ltp_min_fraction;
    p.deadline_percentile = FLAGS_deadline_percentile;
    p.deadline_factor = FLAGS_deadline_factor;
    p.deadline_window = FLAGS_deadline_window;
    p.deadline_min_fraction = FLAGS_deadline_min_fraction;
    ValidatePolicyConfig(p);
  } catch (const std::invalid_argument& e) {
    FlagError(e.what());
  }
  return p;
}

// --frame_auth for a job run with `secret`: an insecure job has no key, so
// it tags nothing (said as an error if --frame_auth was asked for).
inline FrameAuthMode FrameAuthFromFlags(const JobSecret& secret) {
  FrameAuthMode mode = FrameAuthMode::kFull;
  if (!ParseFrameAuthMode(FLAGS_frame_auth, &mode)) {
    FlagError("--frame_auth=" + FLAGS_frame_auth +
              ": use header, full or none");
  }
  if (secret.insecure() && mode != FrameAuthMode::kNone) {
    if (!gflags::GetCommandLineFlagInfoOrDie("frame_auth").is_default) {
      FlagError("--frame_auth=" + FLAGS_frame_auth +
                " needs a key: give --secret_file instead of --insecure");
    }
    mode = FrameAuthMode::kNone;
  }
  return mode;
}

inline FillMode PushFillFromFlags() {
  try {
    return ParseFillMode(FLAGS_push_fill);
  } catch (const std::invalid_argument& e) {
    FlagError("--push_fill=" + FLAGS_push_fill + ": " + e.what());
  }
}

// --resync_every, -1 resolved: every 10 steps (docs/EXPERIMENTS.md: that
// keeps the replicas close for a few percent of the time) when the
// broadcast can give each worker its own subset under a lossy policy;
// replicas that cannot drift need none.
inline uint32_t ResyncEveryFromFlags(bool broadcast_per_worker,
                                     const PolicyConfig& policy,
                                     FillMode push_fill) {
  if (FLAGS_resync_every < -1) {
    FlagError("--resync_every=" + std::to_string(FLAGS_resync_every) +
              ": use 0 (never), N >= 1, or -1 (automatic)");
  }
  if (FLAGS_resync_every > 0 && push_fill == FillMode::kPrevious) {
    FlagError(
        "--resync_every with --push_fill=prev would fill gradients from an "
        "averaged model: use --push_fill=zero or rescale");
  }
  if (FLAGS_resync_every >= 0) return static_cast<uint32_t>(FLAGS_resync_every);
  const bool drifts = broadcast_per_worker &&
                      policy.kind != PolicyKind::kReliable &&
                      push_fill != FillMode::kPrevious;
  return drifts ? 10 : 0;
}

inline bool RankByNameFromFlags() {
  if (FLAGS_rank_order != "join" && FLAGS_rank_order != "name") {
    FlagError("--rank_order=" + FLAGS_rank_order + ": use join or name");
  }
  return FLAGS_rank_order == "name";
}

inline uint64_t MaxGradientBytesFromFlags() {
  if (FLAGS_max_gradient_mb == 0) FlagError("--max_gradient_mb must be >= 1");
  return uint64_t{FLAGS_max_gradient_mb} << 20;
}

// The control port's limits (dblp::ControlLimits), checked against
// --workers.
inline ControlLimits ControlLimitsFromFlags() {
  if (FLAGS_control_max_connections != 0 &&
      FLAGS_control_max_connections < FLAGS_workers) {
    FlagError("--control_max_connections=" +
              std::to_string(FLAGS_control_max_connections) +
              " leaves no room for --workers=" + std::to_string(FLAGS_workers) +
              ": use at least --workers (or 0 for no limit)");
  }
  // Workers that join together must not evict each other's handshakes:
  // the default budget grows to --workers, a chosen one must hold them.
  if (gflags::GetCommandLineFlagInfoOrDie("control_max_unauthenticated")
          .is_default) {
    FLAGS_control_max_unauthenticated =
        std::max(FLAGS_control_max_unauthenticated, FLAGS_workers);
  }
  if (FLAGS_control_max_unauthenticated != 0 &&
      FLAGS_control_max_unauthenticated < FLAGS_workers) {
    FlagError("--control_max_unauthenticated=" +
              std::to_string(FLAGS_control_max_unauthenticated) +
              " is below --workers=" + std::to_string(FLAGS_workers) +
              ": workers joining at once would evict each other; use at "
              "least --workers (or 0 for no limit)");
  }
  if (FLAGS_control_max_unauthenticated_per_source != 0 &&
      FLAGS_control_max_unauthenticated_per_source < FLAGS_workers) {
    DBLP_LOG(Warning,
             "--control_max_unauthenticated_per_source=%u is below "
             "--workers=%u: if more than that many workers share one IPv4 "
             "address (one host, or behind NAT) and join at once, raise it",
             FLAGS_control_max_unauthenticated_per_source, FLAGS_workers);
  }
  // The smallest JOIN (no layers, a short name) is about 100 bytes; below
  // 1 KiB a worker could not even join.
  if (FLAGS_control_max_untrusted_frame < 1024 ||
      FLAGS_control_max_untrusted_frame > kMaxControlFrame) {
    FlagError("--control_max_untrusted_frame=" +
              std::to_string(FLAGS_control_max_untrusted_frame) +
              ": use 1024.." + std::to_string(kMaxControlFrame));
  }
  ControlLimits l;
  l.max_connections = FLAGS_control_max_connections;
  l.max_unauthenticated = FLAGS_control_max_unauthenticated;
  l.max_unauthenticated_per_source =
      FLAGS_control_max_unauthenticated_per_source;
  l.join_deadline = std::chrono::milliseconds(FLAGS_control_join_deadline_ms);
  l.max_untrusted_frame = FLAGS_control_max_untrusted_frame;
  l.partial_message_timeout =
      std::chrono::milliseconds(FLAGS_control_partial_timeout_ms);
  l.idle_timeout = std::chrono::milliseconds(FLAGS_control_idle_timeout_ms);
  return l;
}

// --paper_mode sets the loss-handling flags; naming one of them as well is
// a contradiction, said as such.
inline void ApplyPaperMode() {
  if (!FLAGS_paper_mode) return;
  for (const char* name :
       {"push_fill", "bcast_tolerance", "resync_every", "push_feedback"}) {
    if (!gflags::GetCommandLineFlagInfoOrDie(name).is_default) {
      FlagError(std::string("--paper_mode sets --") + name +
                "; drop one of the two");
    }
  }
  FLAGS_push_fill = "zero";
  FLAGS_bcast_tolerance = "same";
  FLAGS_resync_every = 0;
  FLAGS_push_feedback = false;
  // The paper's broadcast drops a spread-out share, not the smallest
  // chunks; a named order is kept (the paper's own was sequential). The
  // workers' push order is theirs: give them --send_order=permuted too.
  if (gflags::GetCommandLineFlagInfoOrDie("send_order").is_default) {
    FLAGS_send_order = "permuted";
  }
}

// --bcast_tolerance, the broadcast's and the push's checks.
inline void BroadcastFromFlags(ServerJobSettings* o) {
  const std::string& b = FLAGS_bcast_tolerance;
  if (b != "same" && b != "reliable" && b != "consistent" && b != "none") {
    FlagError("--bcast_tolerance=" + b +
              ": use same, consistent, reliable or none");
  }
  o->reliable_broadcast = b == "reliable";
  o->consistent_broadcast = b == "consistent";
  o->push_only = b == "none";
  if (o->consistent_broadcast && (o->push_fill == FillMode::kPrevious ||
                                  PolicyMayCloseEarly(o->policy.kind))) {
    FlagError(
        "--bcast_tolerance=consistent carries what it does not "
        "send: not with --push_fill=prev (a carried chunk would "
        "be filled again) nor --policy=ltp, deadline or combined "
        "(their deadlines would cut the subset); use "
        "--bcast_tolerance=same");
  }
}

// --zero_fraction and --zero_iters (the DBLP paper's Fig. 1 experiment).
inline void ZeroWindowFromFlags(ServerJobSettings* o) {
  if (!(FLAGS_zero_fraction >= 0 && FLAGS_zero_fraction <= 1)) {
    FlagError("--zero_fraction must be in [0, 1]");
  }
  o->zero_fraction = FLAGS_zero_fraction;
  if (o->zero_fraction == 0 && !FLAGS_zero_iters.empty()) {
    FlagError("--zero_iters needs --zero_fraction > 0");
  }
  if (o->zero_fraction > 0) {
    if (FLAGS_zero_iters.empty()) {
      FlagError("--zero_fraction needs --zero_iters=FIRST,LAST");
    }
    const auto [first, last] = ParsePair(FLAGS_zero_iters, "zero_iters");
    o->zero_first = first;
    o->zero_last = last;
  }
}

// The job's settings of both servers, checked: a bad value or combination
// ends the app naming the flag and a value that works.
inline ServerJobSettings JobSettingsFromFlags() {
  ApplyPaperMode();
  ServerJobSettings o;
  o.policy = PolicyFromFlags();
  o.push_fill = PushFillFromFlags();
  o.push_feedback = FLAGS_push_feedback;
  if (o.push_feedback && o.push_fill != FillMode::kZero) {
    // Rescale and prev already stand in for a missing chunk; the worker's
    // carry would then count it twice.
    if (!gflags::GetCommandLineFlagInfoOrDie("push_fill").is_default) {
      FlagError(
          "--push_feedback needs --push_fill=zero: rescale and "
          "prev already stand in for a missing chunk, which the "
          "worker then sends again");
    }
    o.push_fill = FillMode::kZero;
  }
  BroadcastFromFlags(&o);
  o.resync_every = ResyncEveryFromFlags(FLAGS_bcast_tolerance == "same",
                                        o.policy, o.push_fill);
  if (o.resync_every > 0 && o.push_only) {
    FlagError(
        "--resync_every needs a broadcast: drop "
        "--bcast_tolerance=none or --resync_every");
  }
  if (FLAGS_on_worker_loss != "abort" && FLAGS_on_worker_loss != "continue") {
    FlagError("--on_worker_loss=" + FLAGS_on_worker_loss +
              ": use abort or continue");
  }
  o.continue_on_worker_loss = FLAGS_on_worker_loss == "continue";
  if (FLAGS_on_bad_gradient != "abort" && FLAGS_on_bad_gradient != "drop") {
    FlagError("--on_bad_gradient=" + FLAGS_on_bad_gradient +
              ": use abort or drop");
  }
  o.drop_bad_gradient = FLAGS_on_bad_gradient == "drop";
  if (!(FLAGS_clip_norm >= 0) || !std::isfinite(FLAGS_clip_norm)) {
    FlagError("--clip_norm must be a finite number >= 0 (0 = off), got " +
              std::to_string(FLAGS_clip_norm));
  }
  o.clip_norm = FLAGS_clip_norm;
  ZeroWindowFromFlags(&o);
  o.on_reduced = ServerDumps(FLAGS_dump_dir, FLAGS_dump_iterations);
  return o;
}

}  // namespace dblp
