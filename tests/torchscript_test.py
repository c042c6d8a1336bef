#!/usr/bin/env python3
"""dblp-worker --gradient=train with a bring-your-own TorchScript model
(--model=PATH.pt) and data hook (--data=PATH.pt), docs/PYTORCH.md.

Usage: torchscript_test.py BUILD_DIR model|data|errors

model:  tools/make-torchscript-example.py writes a small CNN; 1 dblp-server
        and 2 dblp-workers over memif train it on a Fashion-MNIST subset,
        the server re-synchronising the replicas every few steps. The loss
        must go down, the accuracy beat chance, and the replicas be
        identical after every resync (ExportModel/ImportModel).
data:   the same job on the example data hook's synthetic 16x16 images,
        with a model that defines its own loss().
errors: files that miss the contract (missing, not TorchScript, wrong
        output shape, no parameters, no forward, a non-scalar loss(), no
        batch(), ragged batches, a model that cannot take the hook's
        inputs) and misused flags end the worker with exit 1 or 2 and a
        message naming the problem, never a crash.

Exit 77 (skipped) without /usr/bin/python3's torch, without the dataset
(model), or with a worker built without training.
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dblp_testlib as t  # noqa: E402

TORCH_PYTHON = "/usr/bin/python3"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                    "tools", "make-torchscript-example.py")
BATCH = 64
RESYNC_EVERY = 10

# Modules that miss the contract, written next to the example ones by the
# same python run (one torch import).
FIXTURES = r'''
import importlib.util, sys, torch
from torch import nn, Tensor
from typing import Tuple
spec = importlib.util.spec_from_file_location("example", sys.argv[1])
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
out = sys.argv[2]
ex.main(["--model", out + "/cnn.pt", "--data", out + "/blobs.pt",
         "--train_size", "1024", "--test_size", "512"])
ex.main(["--model", out + "/cnn_smooth.pt", "--label_smoothing", "0.1"])

class Flat(nn.Module):  # logits [N] instead of [N, C]
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1)).sum(1)

class Few(nn.Module):  # 5 classes where the data has 10
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 5)
    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1))

class BadLoss(ex.SmallCnn):  # loss() must return a scalar
    @torch.jit.export
    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return logits

class RaggedData(nn.Module):  # targets with fewer rows than the inputs
    @torch.jit.export
    def batch(self, step: int, rank: int, world: int,
              batch_size: int) -> Tuple[Tensor, Tensor]:
        return (torch.zeros(batch_size, 1, 28, 28),
                torch.zeros(1, dtype=torch.long))

class NoParams(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1)[:, :10]

torch.jit.script(Flat()).save(out + "/flat.pt")
torch.jit.script(Few()).save(out + "/few.pt")
torch.jit.script(NoParams()).save(out + "/noparams.pt")
torch.jit.script(BadLoss()).save(out + "/badloss.pt")
torch.jit.script(RaggedData()).save(out + "/ragged.pt")
'''


def have_torch_python():
    return subprocess.run([TORCH_PYTHON, "-c", "import torch"],
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def make_fixtures(tmp):
    # A file, not -c: torch.jit.script reads the classes' source.
    script = os.path.join(tmp, "fixtures.py")
    with open(script, "w") as f:
        f.write(FIXTURES)
    r = subprocess.run([TORCH_PYTHON, script, TOOL, tmp],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        print(r.stdout)
        print("FAIL: writing the TorchScript files failed")
        sys.exit(1)


def run_job(build, tmp, iterations, worker_args):
    """1 server + 2 workers over memif; returns {name: (rc, output)}."""
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    port = t.free_port()
    secret = t.make_secret(os.path.join(tmp, "job.secret"))
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump, exist_ok=True)
    protocol_iterations = iterations + (iterations - 1) // RESYNC_EVERY
    common = ["--secret_file=" + secret, "--seed=3", "--stats_period=0",
              "--idle_sleep_us=50", "--dump_dir=" + dump,
              "--dump_iterations=%d" % protocol_iterations]
    procs = []
    try:
        procs.append(("server", subprocess.Popen(
            [server] + t.eal("ts", "srv", *[
                "net_memif%d,role=server,socket=%s/w%d.sock,id=0"
                % (w, tmp, w) for w in (0, 1)]) +
            ["--", "--workers=2", "--listen=127.0.0.1:%d" % port,
             "--policy=fixed", "--resync_every=%d" % RESYNC_EVERY] + common,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        time.sleep(0.8)
        for w in (0, 1):
            procs.append(("worker%d" % w, subprocess.Popen(
                [worker] + t.eal("ts", "w%d" % w,
                                 "net_memif0,role=client,socket=%s/w%d.sock,"
                                 "id=0" % (tmp, w)) +
                ["--", "--server=127.0.0.1:%d" % port,
                 "--iterations=%d" % iterations, "--gradient=train",
                 "--batch=%d" % BATCH, "--train_log_dir=" + tmp] +
                worker_args + common,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
            time.sleep(0.3)
        outs = {}
        for name, p in procs:
            try:
                outs[name] = (None, p.communicate(timeout=120)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs[name] = ("timeout", p.communicate()[0])
        return {n: (p.returncode if outs[n][0] is None else outs[n][0],
                    outs[n][1]) for n, p in procs}, dump, protocol_iterations
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()


def check_job(name, build, tmp, iterations, worker_args, min_accuracy):
    results, dump, protocol_iterations = run_job(build, tmp, iterations,
                                                 worker_args)
    ok = all(rc == 0 for rc, _ in results.values())
    t.check(name + ": server and both workers exit 0", ok,
            "\n".join("---- %s (exit %s)\n%s" % (n, rc, out[-1500:])
                      for n, (rc, out) in results.items()))
    if not ok:
        return
    t.check(name + ": the worker describes the TorchScript model",
            "params" in results["worker0"][1] and
            worker_args[0][len("--model="):] in results["worker0"][1],
            results["worker0"][1][-800:])
    for rank in (0, 1):
        with open(os.path.join(tmp, "training-w%d.csv" % rank)) as f:
            rows = list(csv.DictReader(f))
        if not rows:
            t.check("%s: worker %d wrote rows" % (name, rank), False)
            continue
        first = float(rows[0]["train_loss"])
        last = float(rows[-1]["train_loss"])
        acc = float(rows[-1]["test_accuracy"])
        print("%s worker %d: %d rows, train loss %.3f -> %.3f, test "
              "accuracy %.3f" % (name, rank, len(rows), first, last, acc))
        t.check("%s: worker %d wrote a row per epoch" % (name, rank),
                len(rows) >= 4, rows)
        t.check("%s: worker %d's loss went down" % (name, rank), last < first)
        t.check("%s: worker %d's accuracy %.3f > %.2f"
                % (name, rank, acc, min_accuracy), acc > min_accuracy)
    resyncs = [it for it in range(protocol_iterations)
               if (it + 1) % (RESYNC_EVERY + 1) == 0]
    same = []
    for it in resyncs:
        models = [t.read_f32(os.path.join(dump, "w%d_it%d_model.f32"
                                          % (w, it))) for w in (0, 1)]
        same.append(models[0] == models[1] and len(models[0]) > 0)
    t.check("%s: replicas identical after all %d resyncs"
            % (name, len(resyncs)), resyncs and all(same), same)


def run_worker(build, args):
    worker = os.path.join(build, "apps", "dblp-worker")
    return subprocess.run([worker, "--"] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)


def check_errors(build, tmp):
    secret = t.make_secret(os.path.join(tmp, "job.secret"))
    not_ts = os.path.join(tmp, "notes.pt")
    with open(not_ts, "w") as f:
        f.write("not a TorchScript archive\n")
    cnn, blobs = tmp + "/cnn.pt", tmp + "/blobs.pt"
    cases = [
        ("missing model file", ["--model=" + tmp + "/missing.pt"],
         "no such file"),
        ("not TorchScript", ["--model=" + not_ts], "not a TorchScript file"),
        ("forward returns [N]", ["--model=" + tmp + "/flat.pt"],
         "must return float logits [N, C]"),
        ("5 classes for Fashion-MNIST's 10", ["--model=" + tmp + "/few.pt"],
         "C >= 10 classes"),
        ("no parameters", ["--model=" + tmp + "/noparams.pt"],
         "no parameters"),
        ("no forward (a data hook given as --model)", ["--model=" + blobs],
         "no forward(x) method"),
        ("no batch() (a model given as --data)",
         ["--model=" + cnn, "--data=" + cnn], "no batch("),
        ("loss() returns the logits", ["--model=" + tmp + "/badloss.pt"],
         "loss(logits, target) must return a scalar Tensor"),
        ("batch() targets with 1 row for 64 inputs",
         ["--model=" + cnn, "--data=" + tmp + "/ragged.pt"],
         "both need the same number N >= 1 of rows"),
        ("missing data hook", ["--data=" + tmp + "/missing.pt"],
         "no such file"),
        ("built-in cnn on the hook's 16x16 images",
         ["--model=cnn", "--data=" + blobs], "must take the data's inputs"),
        ("--max_train with a data hook",
         ["--model=" + cnn, "--data=" + blobs, "--max_train=100"],
         "--max_train only applies to --data=fashion-mnist"),
        ("--data neither fashion-mnist nor a file", ["--data=cifar"],
         "use fashion-mnist or a TorchScript data hook"),
    ]
    for name, args, want in cases:
        r = run_worker(build, ["--gradient=train", "--secret_file=" + secret,
                               "--iterations=5"] + args)
        t.check("%s: exit %d, says %r" % (name, r.returncode, want),
                r.returncode in (1, 2) and want in r.stdout and
                "terminate called" not in r.stdout, r.stdout[-1200:])
    r = run_worker(build, ["--gradient=synthetic", "--secret_file=" + secret,
                           "--data=" + blobs])
    t.check("--data without --gradient=train is refused",
            r.returncode == 2 and "--data only applies" in r.stdout,
            r.stdout[-600:])


def main():
    build, mode = sys.argv[1], sys.argv[2]
    probe = run_worker(build, ["--help"])
    if "-max_train" not in probe.stdout:
        print("SKIP: dblp-worker was built without training (libtorch)")
        sys.exit(77)
    if not have_torch_python():
        print("SKIP: %s has no torch (apt-get install python3-torch)"
              % TORCH_PYTHON)
        sys.exit(77)
    if mode == "model" and not os.path.exists(
            os.path.join(FASHION_MNIST, "train-images-idx3-ubyte.gz")):
        print("SKIP: dataset-fashion-mnist is not installed")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="dblp-torchscript-%s-" % mode)
    make_fixtures(tmp)
    if mode == "model":
        # 640 images per worker: 10 batches of 64 per epoch, 4 epochs.
        check_job("model", build, tmp, 40,
                  ["--model=" + tmp + "/cnn.pt", "--max_train=1280",
                   "--max_eval=1000"], 0.25)
    elif mode == "data":
        # steps_per_epoch(2, 64) = 1024 / 2 / 64 = 8: 4 epochs.
        check_job("data", build, tmp, 32,
                  ["--model=" + tmp + "/cnn_smooth.pt",
                   "--data=" + tmp + "/blobs.pt"], 0.5)
    else:
        check_errors(build, tmp)
    if not t.FAILURES:
        shutil.rmtree(tmp, ignore_errors=True)  # kept for a failure's autopsy
    t.finish()


if __name__ == "__main__":
    main()
