// dblp-worker [EAL options] -- [options]: pushes its gradient to
// dblp-server each iteration and receives the mean, over DBLP.
#include <gflags/gflags.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

#include "common_flags.h"
#include "dblp/base/log.h"
#include "dblp/handoff/gradient_source.h"
#include "runtime/eal_app.h"
#include "runtime_flags.h"
#include "test_hooks/dumps.h"
#ifdef DBLP_TEST_HOOKS
#include "test_hooks/hostile_frames.h"
#include "test_hooks/shard_map_override.h"
#endif
#include "worker/worker_engine.h"
#include "worker_flags.h"
#ifdef DBLP_WITH_TRAINING
#include "training/training_source.h"
#endif

DEFINE_uint32(join_timeout_ms, 30000, "give up joining after this long");
DEFINE_string(server, "127.0.0.1:9100", "dblp-server's control address");
DEFINE_string(name, "", "worker name shown by the server (default: host:pid)");
DEFINE_string(local_ip, "",
              "this worker's IPv4 on the data port (default: "
              "the server assigns 10.0.0.<2+rank>); the server pins it with "
              "the port's MAC at JOIN");
DEFINE_string(eth_peer, "",
              "MAC to send data frames to (default: the "
              "server's, from WELCOME)");
DEFINE_string(gradient, "synthetic",
              "synthetic | integer (exact test "
              "values) | train (a Fashion-MNIST model, libtorch; the job "
              "seed is --seed, the same on every worker) | shm (a PyTorch "
              "trainer posts each gradient over --shm: python/dblp, "
              "docs/PYTORCH.md)");
DEFINE_uint64(floats, 262144,
              "gradient size in float32 values (e.g. "
              "25557032 for ResNet-50)");
DEFINE_string(tx_payload, "copy",
              "how a push frame carries its chunk: copy (into the frame's "
              "mbuf) | extbuf (a second segment attached to the gradient "
              "in place, rte_pktmbuf_attach_extbuf: no copy by the worker; "
              "needs a port with multi-segment TX; on net_memif, which "
              "copies every segment into its ring anyway, copy is as fast)");
DEFINE_string(bcast_fill, "zero",
              "fill of chunks missing from the "
              "broadcast: zero | prev (keep zero with a server running "
              "--bcast_tolerance=consistent: it carries the missing chunks "
              "itself, and prev would count them twice)");
// --gradient=train. Defined in every build so that a build without
// libtorch answers --gradient=train with the fix, not "unknown flag".
DEFINE_string(model, "mlp",
              "train: mlp (235k params) | cnn (81k) | resnet (152k) | "
              "PATH.pt, a TorchScript module: forward(x) maps a float batch "
              "[N,1,28,28] (or --data's inputs) to logits [N,C]; loss is "
              "cross-entropy unless it defines loss(logits, target) -> "
              "Tensor; DBLP moves every requires_grad parameter in "
              "named_parameters() order (docs/PYTORCH.md; "
              "tools/make-torchscript-example.py writes one)");
DEFINE_string(data, "fashion-mnist",
              "train: fashion-mnist (from --data_dir) | PATH.pt, a "
              "TorchScript data hook: batch(step: int, rank: int, world: "
              "int, batch_size: int) -> (inputs, targets) for this worker's "
              "training step; optional eval_batch(index: int, batch_size: "
              "int) -> (inputs, targets), empty when done (no test accuracy "
              "without it), and steps_per_epoch(world: int, batch_size: int) "
              "-> int (the log period; without it one row at the end)");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist",
              "train: "
              "directory of the Fashion-MNIST *-ubyte.gz files (Debian "
              "package dataset-fashion-mnist)");
DEFINE_uint32(batch, 64, "train: minibatch size per worker");
DEFINE_double(lr, 0.05, "train: SGD learning rate (momentum 0.9)");
DEFINE_uint32(train_threads, 1, "train: torch intra-op threads");
DEFINE_bool(eval_every_epoch, true,
            "train: test accuracy after every "
            "epoch (always after the last iteration)");
// Not --log_dir: glog, which libtorch links in, owns that flag.
DEFINE_string(train_log_dir, "",
              "train: write per-epoch "
              "<log_dir>/training-w<rank>.csv (epoch, iteration, train_loss, "
              "test_accuracy, wall_s)");
DEFINE_uint32(max_eval, 10000, "train: test images used for the accuracy");
DEFINE_uint32(max_train, 0,
              "train: use only this many training images "
              "(before sharding; 0 = all 60000): short epochs for smoke runs");
// The tests' fault flags: only in the tests' twin (apps/hooked/,
// -Dtest_hooks=true); the installed worker has none.
#ifdef DBLP_TEST_HOOKS
DEFINE_uint32(hostile_per_round, 0,
              "test hook: forged frames sent at the "
              "server each round (stale, foreign, future, badly tagged, from "
              "an unpinned address, malformed); none may be accepted");

DEFINE_string(shard_map_override, "",
              "test hook: join server shard SHARD claiming the partition "
              "[FIRST, FIRST + N) instead of the directory's, "
              "SHARD:FIRST:N; the shard must refuse it");
#endif

int main(int argc, char** argv) {
  dblp::ParseAppFlagsOrDie(
      argc, argv,
      "dblp-worker [EAL options] -- [options]\n"
      "  e.g. dblp-worker -l 1 --no-huge -m 256 --no-pci --file-prefix=w0 "
      "--vdev=net_memif0,role=client,socket=/tmp/dblp-w0.sock -- "
      "--server=127.0.0.1:9100 --iterations=100");

  dblp::WorkerOptions o;
  o.server = FLAGS_server;
  o.name =
      FLAGS_name.empty() ? "worker-" + std::to_string(getpid()) : FLAGS_name;
  o.local_ip = FLAGS_local_ip;
  o.eth_peer = FLAGS_eth_peer;
  o.iterations = FLAGS_iterations;
  o.dp = dblp::DatapathOptionsFromFlags();
  if (FLAGS_tx_payload == "extbuf") {
    o.dp.tx_extbuf = true;
    o.dp.port.multi_seg_tx = true;
    o.dp.port.multi_seg_required = true;
  } else if (FLAGS_tx_payload != "copy") {
    dblp::FlagError("--tx_payload=" + FLAGS_tx_payload +
                    ": use copy or extbuf");
  }
  o.bcast_fill = dblp::BcastFillFromFlags();
  o.join_timeout_ms = FLAGS_join_timeout_ms;
  o.on_absorbed = dblp::WorkerDumps(FLAGS_dump_dir, FLAGS_dump_iterations);
#ifdef DBLP_TEST_HOOKS
  if (FLAGS_hostile_per_round > 0) {
    o.push_hook = dblp::HostileFrames(FLAGS_hostile_per_round);
  }
  try {
    o.shard_map_hook = dblp::ShardMapOverride(FLAGS_shard_map_override);
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(e.what());
  }
#endif
  o.secret = dblp::JobSecretFromFlags("dblp-worker");

  static const char* const kTrainFlags[] = {
      "model",    "data",          "data_dir",         "batch",
      "lr",       "train_threads", "eval_every_epoch", "train_log_dir",
      "max_eval", "max_train"};
  const bool train = FLAGS_gradient == "train";
  for (const char* flag : kTrainFlags) {
    if (!train && !gflags::GetCommandLineFlagInfoOrDie(flag).is_default) {
      dblp::FlagError(std::string("--") + flag +
                      " only applies to --gradient=train");
    }
  }
  if (train && !gflags::GetCommandLineFlagInfoOrDie("floats").is_default) {
    dblp::FlagError(
        "--floats: with --gradient=train the model sets the "
        "gradient size; drop --floats");
  }

  std::unique_ptr<dblp::GradientSource> source;
  try {
    source = dblp::WorkerSourceFromFlags();  // synthetic, integer or shm
    if (!source && train) {
#ifdef DBLP_WITH_TRAINING
      dblp::training::TrainingOptions t;
      t.model = FLAGS_model;
      t.data = FLAGS_data;
      t.data_dir = FLAGS_data_dir;
      t.batch = FLAGS_batch;
      t.lr = FLAGS_lr;
      t.threads = FLAGS_train_threads;
      t.eval_every_epoch = FLAGS_eval_every_epoch;
      t.log_dir = FLAGS_train_log_dir;
      t.max_eval = FLAGS_max_eval;
      t.max_train = FLAGS_max_train;
      t.seed = FLAGS_seed;
      t.iterations = FLAGS_iterations;
      // Reads the dataset now: a missing one fails before the EAL starts.
      source = std::make_unique<dblp::training::TrainingSource>(t);
#else
      dblp::FlagError(
          "--gradient=train: this dblp-worker was built without training "
          "(libtorch-dev missing at configure time, or -Dtraining=disabled)."
          " Install it (apt-get install libtorch-dev dataset-fashion-mnist), "
          "then reconfigure and rebuild: meson setup --reconfigure build "
          "-Dtraining=enabled && ninja -C build");
#endif
    } else if (!source) {
      dblp::FlagError("--gradient=" + FLAGS_gradient +
                      ": use synthetic, integer, train or shm");
    }
  } catch (const std::invalid_argument& e) {
    dblp::FlagError(e.what());
  } catch (const std::exception& e) {
    DBLP_LOG(Error, "error: %s", e.what());
    return 1;
  }
  // The prompt's command file is checked before the EAL starts.
  const dblp::PromptOptions prompt = dblp::PromptOptionsFromFlags(
      "dblp-worker", nullptr, &o.dp.stats_period_s);
  dblp::InitEalOrDie(argc, argv);
  auto runtime_session = std::make_unique<dblp::RuntimeSession>(prompt);
  int rc = 1;
  try {
    rc = dblp::RunWorker(o, std::move(source));
  } catch (const std::exception& e) {
    // Setup steps outside the datapath that throw (libcrypto, the random
    // number generator): a message and exit 1, never std::terminate.
    DBLP_LOG(Error, "error: %s", e.what());
  }
  runtime_session.reset();  // the prompt ends, capture stops
  // No rte_eal_cleanup(): it unmaps the EAL's memory under a still-running
  // interrupt thread (eal_cleanup.h, "Why not rte_eal_cleanup"); exit
  // reclaims it, and the atexit handler removes the files.
  return rc;
}
