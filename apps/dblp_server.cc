// dblp-server [EAL options] -- [options]: the parameter server. Receives
// every worker's push under the current loss tolerance, reduces, runs the
// tolerance policy and broadcasts the mean back.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <exception>

#include "common_flags.h"
#include "dblp/control_sidecar.h"
#include "eal_app.h"
#include "server_engine.h"

DEFINE_string(listen, "127.0.0.1:9100", "TCP control address to listen on");
DEFINE_uint32(workers, 3, "number of workers in the job");
DEFINE_string(local_ip, "10.0.0.1", "the server's IPv4 on the data ports");
DEFINE_uint32(udp_port, 47000,
              "UDP port of pushes (worker r receives the "
              "broadcast on udp_port + 1 + r)");
DEFINE_string(policy, "dblp", "reliable | fixed | dblp | ltp");
DEFINE_double(p_fixed, 0.008, "fixed (MLT) tolerance");
DEFINE_double(p_low, 0.008, "dblp: tolerance inside a critical regime");
DEFINE_double(p_high, 0.408, "dblp: tolerance outside critical regimes");
DEFINE_uint32(clr_freq, 10,
              "dblp: check the gradient norm every N "
              "iterations; a detected regime lasts N iterations");
DEFINE_double(clr_eta, 0.5,
              "dblp: relative norm change that means a "
              "critical regime");
DEFINE_double(ltp_deadline_factor, 1.5,
              "ltp: deadline = factor x median "
              "round time");
DEFINE_uint32(ltp_window, 16, "ltp: rounds in the median");
DEFINE_double(ltp_min_fraction, 0.5,
              "ltp: fraction needed before a "
              "deadline may close a round");
DEFINE_string(push_fill, "rescale",
              "server mean of missing chunks: rescale (the sum over the "
              "workers whose chunk arrived, divided by their number) | "
              "zero (divided by W, the paper) | prev");
DEFINE_string(bcast_tolerance, "same",
              "broadcast with the same p (same: each worker gets its own "
              "1-p of the mean), one 1-p subset for every worker sent "
              "reliably with the rest carried to the next iteration "
              "(consistent), every chunk (reliable), or no broadcast at all "
              "(none: a push benchmark, the workers apply a zero mean)");
DEFINE_int32(resync_every, -1,
             "every N training steps the workers push their parameters "
             "reliably and all load the average, so replicas a truncated "
             "broadcast drifted apart are identical again (0 = never; -1 = "
             "10 when the broadcast gives each worker its own subset "
             "(--bcast_tolerance=same) under a policy that loses chunks and "
             "--push_fill is not prev, else never)");
DEFINE_bool(push_feedback, false,
            "after every push tell each worker the "
            "chunks the server summed, so it carries the rest into its next "
            "push (error feedback: nothing pushed is lost for good)");
DEFINE_string(on_worker_loss, "abort",
              "abort | continue (without the "
              "lost worker)");
DEFINE_uint32(session, 0,
              "session id (0 = derived from the job's random "
              "nonce)");
DEFINE_string(frame_auth, "header",
              "tag on every data frame of an "
              "authenticated job: header (SipHash over the DBLP header: who "
              "cannot see the job's traffic cannot inject; who can, can "
              "replace floats) | full (AES-GMAC over header and payload: no "
              "one without the secret can; costs more, docs/BENCHMARKS.md) | "
              "none. With --insecure: none");
DEFINE_uint32(max_gradient_mb, 1024,
              "refuse workers whose gradient is "
              "larger (the server keeps about three copies in memory)");
DEFINE_double(zero_fraction, 0,
              "experiment: zero this fraction of the mean's "
              "chunks (the same for every worker) in --zero_iters");
DEFINE_string(zero_iters, "",
              "experiment: FIRST,LAST iterations of "
              "--zero_fraction");
DEFINE_uint32(join_timeout_ms, 60000,
              "give up waiting for workers after "
              "this long");
// Bounds on what anyone who can reach --listen can make the server hold
// (dblp::ControlLimits).
DEFINE_uint32(control_max_connections, 256,
              "control connections open at once; more are closed at once "
              "and counted (0 = no limit; else at least --workers)");
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

DEFINE_bool(paper_mode, false,
            "the DBLP paper's loss handling: --push_fill=zero "
            "--bcast_tolerance=same --resync_every=0 --push_feedback=false "
            "(each worker applies its own 1-p of a mean divided by W; "
            "docs/EXPERIMENTS.md measures what it costs)");

namespace {

constexpr uint32_t kAutoResyncEvery = 10;

dblp::ControlLimits ControlLimitsFromFlags() {
  if (FLAGS_control_max_connections != 0 &&
      FLAGS_control_max_connections < FLAGS_workers) {
    dblp::FlagError(
        "--control_max_connections=" +
        std::to_string(FLAGS_control_max_connections) +
        " leaves no room for --workers=" + std::to_string(FLAGS_workers) +
        ": use at least --workers (or 0 for no limit)");
  }
  // The smallest JOIN (no layers, a short name) is about 100 bytes; below
  // 1 KiB a worker could not even join.
  if (FLAGS_control_max_untrusted_frame < 1024 ||
      FLAGS_control_max_untrusted_frame > dblp::kMaxControlFrame) {
    dblp::FlagError("--control_max_untrusted_frame=" +
                    std::to_string(FLAGS_control_max_untrusted_frame) +
                    ": use 1024.." + std::to_string(dblp::kMaxControlFrame));
  }
  dblp::ControlLimits l;
  l.max_connections = FLAGS_control_max_connections;
  l.join_deadline = std::chrono::milliseconds(FLAGS_control_join_deadline_ms);
  l.max_untrusted_frame = FLAGS_control_max_untrusted_frame;
  l.partial_message_timeout =
      std::chrono::milliseconds(FLAGS_control_partial_timeout_ms);
  l.idle_timeout = std::chrono::milliseconds(FLAGS_control_idle_timeout_ms);
  return l;
}

// --paper_mode sets the loss-handling flags; naming one of them as well is
// a contradiction, said as such.
void ApplyPaperMode() {
  if (!FLAGS_paper_mode) return;
  for (const char* name :
       {"push_fill", "bcast_tolerance", "resync_every", "push_feedback"}) {
    if (!gflags::GetCommandLineFlagInfoOrDie(name).is_default) {
      dblp::FlagError(std::string("--paper_mode sets --") + name +
                      "; drop one of the two");
    }
  }
  FLAGS_push_fill = "zero";
  FLAGS_bcast_tolerance = "same";
  FLAGS_resync_every = 0;
  FLAGS_push_feedback = false;
}

}  // namespace

int main(int argc, char** argv) {
  dblp::ParseAppFlagsOrDie(
      argc, argv,
      "dblp-server [EAL options] -- [options]\n"
      "  e.g. dblp-server -l 0 --no-huge -m 512 --no-pci --file-prefix=srv "
      "--vdev=net_memif0,role=server,socket=/tmp/dblp-w0.sock -- "
      "--workers=1 --policy=dblp");

  ApplyPaperMode();
  dblp::ServerOptions o;
  o.listen = FLAGS_listen;
  o.workers = FLAGS_workers;
  o.local_ip = FLAGS_local_ip;
  if (FLAGS_udp_port == 0 || FLAGS_udp_port + 1 + FLAGS_workers > 65535) {
    dblp::FlagError("--udp_port must leave room for one port per worker");
  }
  o.udp_port = static_cast<uint16_t>(FLAGS_udp_port);
  o.dp = dblp::DatapathOptionsFromFlags();
  try {
    o.policy.kind = dblp::ParsePolicyKind(FLAGS_policy);
    o.policy.p_fixed = FLAGS_p_fixed;
    o.policy.p_low = FLAGS_p_low;
    o.policy.p_high = FLAGS_p_high;
    o.policy.clr.freq = FLAGS_clr_freq;
    o.policy.clr.eta = FLAGS_clr_eta;
    o.policy.ltp_deadline_factor = FLAGS_ltp_deadline_factor;
    o.policy.ltp_window = FLAGS_ltp_window;
    o.policy.ltp_min_fraction = FLAGS_ltp_min_fraction;
    dblp::ValidatePolicyConfig(o.policy);
    o.push_fill = dblp::ParseFillMode(FLAGS_push_fill);
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(e.what());
  }
  if (FLAGS_bcast_tolerance != "same" && FLAGS_bcast_tolerance != "reliable" &&
      FLAGS_bcast_tolerance != "consistent" &&
      FLAGS_bcast_tolerance != "none") {
    dblp::FlagError("--bcast_tolerance=" + FLAGS_bcast_tolerance +
                    ": use same, consistent, reliable or none");
  }
  o.reliable_broadcast = FLAGS_bcast_tolerance == "reliable";
  o.consistent_broadcast = FLAGS_bcast_tolerance == "consistent";
  o.push_only = FLAGS_bcast_tolerance == "none";
  if (FLAGS_resync_every < -1) {
    dblp::FlagError("--resync_every=" + std::to_string(FLAGS_resync_every) +
                    ": use 0 (never), N >= 1, or -1 (automatic)");
  }
  o.resync_every = static_cast<uint32_t>(FLAGS_resync_every);
  if (FLAGS_resync_every == -1) {
    // Measured in docs/EXPERIMENTS.md: every 10 steps keeps the replicas
    // close for a few percent of the time; replicas that cannot drift need
    // none.
    const bool drifts = FLAGS_bcast_tolerance == "same" &&
                        o.policy.kind != dblp::PolicyKind::kReliable &&
                        o.push_fill != dblp::FillMode::kPrevious;
    o.resync_every = drifts ? kAutoResyncEvery : 0;
  }
  o.push_feedback = FLAGS_push_feedback;
  if (o.push_feedback && o.push_fill != dblp::FillMode::kZero) {
    // Rescale and prev already stand in for a missing chunk; the worker's
    // carry would then count it twice.
    if (!gflags::GetCommandLineFlagInfoOrDie("push_fill").is_default) {
      dblp::FlagError(
          "--push_feedback needs --push_fill=zero: rescale and "
          "prev already stand in for a missing chunk, which the "
          "worker then sends again");
    }
    o.push_fill = dblp::FillMode::kZero;
  }
  if (o.consistent_broadcast && (o.push_fill == dblp::FillMode::kPrevious ||
                                 o.policy.kind == dblp::PolicyKind::kLtp)) {
    dblp::FlagError(
        "--bcast_tolerance=consistent carries what it does not "
        "send: not with --push_fill=prev (a carried chunk would "
        "be filled again) nor --policy=ltp (its deadlines would "
        "cut the subset); use --bcast_tolerance=same");
  }
  if (o.resync_every > 0 && o.push_only) {
    dblp::FlagError(
        "--resync_every needs a broadcast: drop "
        "--bcast_tolerance=none or --resync_every");
  }
  if (o.resync_every > 0 && o.push_fill == dblp::FillMode::kPrevious) {
    dblp::FlagError(
        "--resync_every with --push_fill=prev would fill "
        "gradients from an averaged model: use --push_fill=zero "
        "or rescale");
  }
  if (FLAGS_on_worker_loss != "abort" && FLAGS_on_worker_loss != "continue") {
    dblp::FlagError("--on_worker_loss=" + FLAGS_on_worker_loss +
                    ": use abort or continue");
  }
  o.continue_on_worker_loss = FLAGS_on_worker_loss == "continue";
  o.session = FLAGS_session;
  if (FLAGS_max_gradient_mb == 0) {
    dblp::FlagError("--max_gradient_mb must be >= 1");
  }
  o.max_gradient_bytes = uint64_t{FLAGS_max_gradient_mb} << 20;
  if (!(FLAGS_zero_fraction >= 0 && FLAGS_zero_fraction <= 1)) {
    dblp::FlagError("--zero_fraction must be in [0, 1]");
  }
  o.zero_fraction = FLAGS_zero_fraction;
  if (o.zero_fraction == 0 && !FLAGS_zero_iters.empty()) {
    dblp::FlagError("--zero_iters needs --zero_fraction > 0");
  }
  if (o.zero_fraction > 0) {
    if (FLAGS_zero_iters.empty()) {
      dblp::FlagError("--zero_fraction needs --zero_iters=FIRST,LAST");
    }
    const auto [first, last] = dblp::ParsePair(FLAGS_zero_iters, "zero_iters");
    o.zero_first = first;
    o.zero_last = last;
  }
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.control_limits = ControlLimitsFromFlags();
  o.secret = dblp::JobSecretFromFlags("dblp-server");
  if (!dblp::ParseFrameAuthMode(FLAGS_frame_auth, &o.frame_auth)) {
    dblp::FlagError("--frame_auth=" + FLAGS_frame_auth +
                    ": use header, full or none");
  }
  if (o.secret.insecure() && o.frame_auth != dblp::FrameAuthMode::kNone) {
    if (!gflags::GetCommandLineFlagInfoOrDie("frame_auth").is_default) {
      dblp::FlagError("--frame_auth=" + FLAGS_frame_auth +
                      " needs a key: give --secret_file instead of "
                      "--insecure");
    }
    o.frame_auth = dblp::FrameAuthMode::kNone;
  }
  dblp::InitEalOrDie(argc, argv);
  int rc = 1;
  try {
    rc = dblp::RunServer(o);
  } catch (const std::exception& e) {
    // Setup steps outside the datapath that throw (libcrypto, the random
    // number generator): a message and exit 1, never std::terminate.
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  rte_eal_cleanup();
  return rc;
}
