// dblp-server [EAL options] -- [options]: the parameter server. Receives
// every worker's push under the current loss tolerance, reduces, runs the
// tolerance policy and broadcasts the mean back.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>

#include "dblp/base/log.h"
#include "common_flags.h"
#include "dblp/control/control_sidecar.h"
#include "eal_app.h"
#include "runtime_flags.h"
#include "server_engine.h"
#include "server_flags.h"

DEFINE_string(listen, "127.0.0.1:9100", "TCP control address to listen on");
DEFINE_string(local_ip, "10.0.0.1", "the server's IPv4 on the data ports");
DEFINE_uint32(udp_port, 47000,
              "UDP port of pushes (worker r receives the "
              "broadcast on udp_port + 1 + r)");
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
DEFINE_string(on_worker_loss, "abort",
              "abort | continue (without the "
              "lost worker)");
DEFINE_uint32(session, 0,
              "session id (0 = derived from the job's random "
              "nonce)");
DEFINE_double(zero_fraction, 0,
              "experiment: zero this fraction of the mean's "
              "chunks (the same for every worker) in --zero_iters");
DEFINE_string(zero_iters, "",
              "experiment: FIRST,LAST iterations of "
              "--zero_fraction");

DEFINE_bool(paper_mode, false,
            "the DBLP paper's loss handling: --push_fill=zero "
            "--bcast_tolerance=same --resync_every=0 --push_feedback=false "
            "(each worker applies its own 1-p of a mean divided by W; "
            "docs/EXPERIMENTS.md measures what it costs)");

namespace {

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
  o.policy = dblp::PolicyFromFlags();
  o.push_fill = dblp::PushFillFromFlags();
  if (FLAGS_bcast_tolerance != "same" && FLAGS_bcast_tolerance != "reliable" &&
      FLAGS_bcast_tolerance != "consistent" &&
      FLAGS_bcast_tolerance != "none") {
    dblp::FlagError("--bcast_tolerance=" + FLAGS_bcast_tolerance +
                    ": use same, consistent, reliable or none");
  }
  o.reliable_broadcast = FLAGS_bcast_tolerance == "reliable";
  o.consistent_broadcast = FLAGS_bcast_tolerance == "consistent";
  o.push_only = FLAGS_bcast_tolerance == "none";
  o.resync_every = dblp::ResyncEveryFromFlags(
      FLAGS_bcast_tolerance == "same", o.policy, o.push_fill);
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
  if (FLAGS_on_worker_loss != "abort" && FLAGS_on_worker_loss != "continue") {
    dblp::FlagError("--on_worker_loss=" + FLAGS_on_worker_loss +
                    ": use abort or continue");
  }
  o.continue_on_worker_loss = FLAGS_on_worker_loss == "continue";
  o.session = FLAGS_session;
  o.max_gradient_bytes = dblp::MaxGradientBytesFromFlags();
  o.rank_by_name = dblp::RankByNameFromFlags();
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
  o.control_limits = dblp::ControlLimitsFromFlags();
  o.secret = dblp::JobSecretFromFlags("dblp-server");
  o.frame_auth = dblp::FrameAuthFromFlags(o.secret);
  // The prompt's command file is checked before the EAL starts.
  const dblp::PromptOptions prompt = dblp::PromptOptionsFromFlags(
      "dblp-server", &o.policy, &o.dp.stats_period_s);
  dblp::InitEalOrDie(argc, argv);
  auto runtime_session = std::make_unique<dblp::RuntimeSession>(prompt);
  int rc = 1;
  try {
    rc = dblp::RunServer(o);
  } catch (const std::exception& e) {
    // Setup steps outside the datapath that throw (libcrypto, the random
    // number generator): a message and exit 1, never std::terminate.
    DBLP_LOG(Error, "error: %s", e.what());
  }
  runtime_session.reset();  // the prompt ends, capture stops
  rte_eal_cleanup();
  return rc;
}
