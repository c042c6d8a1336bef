#!/usr/bin/env python3
"""Training smoke test: 1 dblp-server + 2 dblp-workers over memif train the
MLP on Fashion-MNIST for a few short epochs (the dblp policy, a 70% burst
in the middle) and must learn: the training loss of the last epoch is below
the first epoch's, and the test accuracy is well above chance (10%).

With --resync the server re-synchronises the replicas every RESYNC_EVERY
steps (--resync_every) under a lossy broadcast (p_high, plus Bernoulli loss
on every link), and the test also checks, from the workers' dumps, that
before a resync the replicas had drifted apart and after every resync they
are bit-identical and equal to the average the server broadcast.

Usage: training_smoke_test.py BUILD_DIR [--resync]
Exit 77 (skipped) if the dataset package is missing or the worker was built
without training.
"""

import csv
import os
import socket
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"
EPOCHS = 4
MAX_TRAIN = 2560  # 1280 images per worker = 20 batches of 64 per epoch
ITERATIONS = EPOCHS * (MAX_TRAIN // 2 // 64)
RESYNC_EVERY = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_f32(path):
    with open(path, "rb") as f:
        return f.read()


def check_resyncs(dump, workers, protocol_iterations):
    """Failures: replicas not identical after a resync, or never apart."""
    failed = 0
    resyncs = [it for it in range(protocol_iterations)
               if (it + 1) % (RESYNC_EVERY + 1) == 0]
    drifted = 0
    for it in resyncs:
        before = [read_f32(os.path.join(dump, "w%d_it%d_model_before.f32"
                                        % (w, it))) for w in workers]
        after = [read_f32(os.path.join(dump, "w%d_it%d_model.f32" % (w, it)))
                 for w in workers]
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        if len(set(before)) > 1:
            drifted += 1
        if len(set(after)) != 1:
            print("FAIL: after resync iteration %d the workers' models differ"
                  % it)
            failed += 1
        elif after[0] != mean:
            print("FAIL: after resync iteration %d the models are not the "
                  "server's average" % it)
            failed += 1
    print("resync: %d resyncs, replicas apart before %d of them, identical "
          "after all" % (len(resyncs), drifted) if not failed else
          "resync: %d resyncs checked" % len(resyncs))
    if not resyncs:
        print("FAIL: no resync iteration ran")
        failed += 1
    if drifted == 0:
        print("FAIL: the replicas never drifted apart before a resync, so "
              "the test shows nothing (is the broadcast lossy?)")
        failed += 1
    return failed


def main():
    build = sys.argv[1]
    resync = "--resync" in sys.argv[2:]
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("SKIP: dataset-fashion-mnist is not installed")
        sys.exit(77)
    probe = subprocess.run([worker, "--", "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if "-max_train" not in probe.stdout:
        print("SKIP: dblp-worker was built without training (libtorch)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="dblp-train-smoke-")
    port = free_port()
    uniq = "ts%d" % os.getpid()
    secret = os.path.join(tmp, "job.secret")
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(32))
    common = ["--secret_file=" + secret, "--seed=3", "--burst_iters=%d" % (ITERATIONS // 2),
              "--burst_loss=0.7", "--stats_period=0", "--idle_sleep_us=50"]
    dump = os.path.join(tmp, "dump")
    server_extra = []
    protocol_iterations = ITERATIONS
    if resync:
        os.makedirs(dump)
        protocol_iterations = ITERATIONS + (ITERATIONS - 1) // RESYNC_EVERY
        common += ["--loss=bernoulli:0.05", "--dump_dir=" + dump,
                   "--dump_iterations=%d" % protocol_iterations]
        server_extra = ["--resync_every=%d" % RESYNC_EVERY,
                        "--push_fill=rescale", "--p_high=0.4"]
    eal = ["-l", "0", "--no-huge", "-m", "256", "--no-pci",
           "--log-level=*:warning"]
    procs = []
    try:
        srv = subprocess.Popen(
            [server] + eal + ["--file-prefix=dblp-%s-srv" % uniq] +
            ["--vdev=net_memif%d,role=server,socket=%s/w%d.sock,id=0"
             % (w, tmp, w) for w in (0, 1)] +
            ["--", "--workers=2", "--listen=127.0.0.1:%d" % port,
             "--policy=dblp", "--clr_freq=5"] + server_extra + common,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(("server", srv))
        time.sleep(0.8)
        for w in (0, 1):
            p = subprocess.Popen(
                [worker] + eal + ["--file-prefix=dblp-%s-w%d" % (uniq, w),
                                  "--vdev=net_memif0,role=client,"
                                  "socket=%s/w%d.sock,id=0" % (tmp, w),
                                  "--", "--server=127.0.0.1:%d" % port,
                                  "--iterations=%d" % ITERATIONS,
                                  "--gradient=train", "--model=mlp",
                                  "--max_train=%d" % MAX_TRAIN,
                                  "--max_eval=2000",
                                  "--train_log_dir=" + tmp] + common,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(("worker%d" % w, p))
            time.sleep(0.3)
        outs = {}
        for name, p in procs:
            try:
                outs[name] = p.communicate(timeout=240)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                outs[name] = p.communicate()[0]
        for name, p in procs:
            if p.returncode != 0:
                for n, o in outs.items():
                    print("---- " + n)
                    print(o[-1500:])
                print("FAIL: %s exited with %s" % (name, p.returncode))
                sys.exit(1)
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
    failed = check_resyncs(dump, (0, 1), protocol_iterations) if resync else 0
    for rank in (0, 1):
        path = os.path.join(tmp, "training-w%d.csv" % rank)
        with open(path) as f:
            rows = list(csv.DictReader(f))
        if len(rows) < EPOCHS:
            print("FAIL: %s has %d rows, want %d" % (path, len(rows), EPOCHS))
            failed += 1
            continue
        first, last = float(rows[0]["train_loss"]), float(rows[-1]["train_loss"])
        acc = float(rows[-1]["test_accuracy"])
        print("worker %d: train loss %.3f -> %.3f, test accuracy %.3f"
              % (rank, first, last, acc))
        if not last < first:
            print("FAIL: worker %d: the loss did not go down" % rank)
            failed += 1
        if not acc > 0.4:
            print("FAIL: worker %d: accuracy %.3f is not well above chance"
                  % (rank, acc))
            failed += 1
    print("%d passed, %d failed" % (2 - min(failed, 2), min(failed, 2)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
