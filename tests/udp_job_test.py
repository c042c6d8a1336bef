#!/usr/bin/env python3
"""A whole DBLP job over kernel UDP: 1 dblp-udp-server + 3 dblp-udp-workers.

Job 1 runs integer gradients (sums exact in float32) with loss on every
data direction, a microburst and p > 0, and checks from the dumps and rows:

  * the server's mean of every dumped iteration equals, bit for bit, the
    mean recomputed here from the known gradients and its push bitmaps
    (zero fill: sum over the workers whose chunk arrived, divided by W);
  * each worker's applied mean equals the server's on every chunk its
    broadcast bitmap has and is zero elsewhere (and some chunk was missing,
    so the zero fill was exercised);
  * every worker row delivered at least ceil((1 - p) N) broadcast chunks
    under the announced p, and every server row as many pushed chunks.

Job 2 kills one worker (SIGKILL) mid-job: the server and the two other
workers must exit 1 within a few seconds, each naming the lost worker.

Usage: udp_job_test.py BUILD_DIR
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dblp_testlib import (check, f32, finish, free_port, integer_value,  # noqa: E402
                          kill_all, make_secret, read_bits, read_f32)

WORKERS = 3
ITERATIONS = 8
DUMP_ITERS = 4
FLOATS = 20000  # 56 chunks of 1436 B (header tags)
MTU = 1500
P = 0.1
LOSS = "bernoulli:0.2"
TIMEOUT_S = 120
LOST_WITHIN_S = 5.0


class Job:
    """One server and its workers, killed and reaped however the case ends."""

    def __init__(self, build, tmp, name):
        self.server_bin = os.path.join(build, "apps", "dblp-udp-server")
        self.worker_bin = os.path.join(build, "apps", "dblp-udp-worker")
        self.tmp = os.path.join(tmp, name)
        os.makedirs(self.tmp)
        self.secret = make_secret(os.path.join(self.tmp, "job.secret"))
        self.port = free_port()
        self.procs = []

    def start(self, name, cmd):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def server(self, *extra):
        return self.start("server", [
            self.server_bin, "--secret_file=" + self.secret,
            "--workers=%d" % WORKERS, "--control=127.0.0.1:%d" % self.port,
            "--round_timeout_ms=20000", "--join_timeout_ms=20000",
            "--out_dir=" + os.path.join(self.tmp, "server")] + list(extra))

    def worker(self, w, *extra):
        p = self.start("w%d" % w, [
            self.worker_bin, "--secret_file=" + self.secret,
            "--server=127.0.0.1:%d" % self.port, "--name=w%d" % w,
            "--gradient=integer", "--floats=%d" % FLOATS,
            "--round_timeout_ms=20000",
            "--out_dir=" + os.path.join(self.tmp, "w%d" % w)] + list(extra))
        time.sleep(0.2)  # join in order: rank == start order
        return p

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()

    def rows(self, name):
        with open(os.path.join(self.tmp, name, "iterations.jsonl")) as f:
            return [json.loads(line) for line in f]

    def close(self):
        kill_all([p for _, p, _ in self.procs])
        for _, _, log in self.procs:
            log.close()


def wait_all(job, timeout_s):
    deadline = time.time() + timeout_s
    for name, p, _ in job.procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            return name + " still running after %d s" % timeout_s
    return ""


def check_means(job, dump, n_chunks, chunk_floats):
    """Server means bit for bit; worker means equal them or zero."""
    server_bad, worker_bad, missing = [], [], 0
    for it in range(DUMP_ITERS):
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        pushed = [read_bits(os.path.join(dump, "w%d_it%d_push.bits" % (r, it)),
                            n_chunks) for r in range(WORKERS)]
        for j in range(FLOATS):
            c = j // chunk_floats
            s = sum(integer_value(j, it, r) for r in range(WORKERS)
                    if pushed[r][c])
            if mean[j] != f32(s / WORKERS):
                server_bad.append("it %d float %d: server mean %r != %r"
                           % (it, j, mean[j], f32(s / WORKERS)))
                break
        for r in range(WORKERS):
            avg = read_f32(os.path.join(dump, "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(dump, "w%d_it%d_bcast.bits" % (r, it)),
                            n_chunks)
            missing += n_chunks - sum(got)
            for j in range(FLOATS):
                want = mean[j] if got[j // chunk_floats] else 0.0
                if avg[j] != want:
                    worker_bad.append("it %d worker %d float %d: %r != %r"
                               % (it, r, j, avg[j], want))
                    break
    check("server means are the recomputed means, bit for bit",
          not server_bad, "\n".join(server_bad[:5]))
    check("worker means equal the server's where the broadcast arrived, "
          "zero elsewhere", not worker_bad, "\n".join(worker_bad[:5]))
    check("some broadcast chunks were missing (the zero fill ran)",
          missing > 0, "no chunk missing in %d iterations" % DUMP_ITERS)


def lossy_job(build, tmp):
    job = Job(build, tmp, "lossy")
    dump = os.path.join(job.tmp, "dump")
    os.makedirs(dump)
    common = ["--loss=" + LOSS, "--burst_iters=2", "--burst_loss=0.6",
              "--seed=5", "--dump_dir=" + dump,
              "--dump_iterations=%d" % DUMP_ITERS]
    try:
        # The zero fill the means are recomputed with, and no resync.
        job.server("--policy=fixed", "--p_fixed=%g" % P, "--push_fill=zero",
                   "--resync_every=0", *common)
        time.sleep(0.3)
        for w in range(WORKERS):
            job.worker(w, "--iterations=%d" % ITERATIONS, *common)
        err = wait_all(job, TIMEOUT_S)
        check("lossy job: every app ends by itself", not err, err)
        codes = dict((n, p.returncode) for n, p, _ in job.procs)
        check("lossy job: every app exits 0", set(codes.values()) == {0},
              "%s\n%s" % (codes, "\n".join(job.log(n)[-600:] for n in codes)))
    finally:
        job.close()
    if any(p.returncode != 0 for _, p, _ in job.procs):
        return
    chunk_floats = (((MTU - 20 - 8 - 20) & ~3) - 16) // 4
    n_chunks = (FLOATS + chunk_floats - 1) // chunk_floats
    threshold = n_chunks - math.floor(P * n_chunks * (1 + 1e-12))
    check_means(job, dump, n_chunks, chunk_floats)
    wrows = [row for w in range(WORKERS) for row in job.rows("w%d" % w)]
    srows = job.rows("server")
    check("every worker wrote a row per iteration",
          len(wrows) == WORKERS * ITERATIONS, len(wrows))
    check("the server wrote a row per iteration and worker",
          len(srows) == WORKERS * ITERATIONS, len(srows))
    low = [r for r in wrows + srows
           if r["delivered_fraction"] * n_chunks + 1e-9 < threshold
           or r["delivered_fraction"] + 1e-9 < 1 - r["p"]]
    check("every round delivered >= 1-p of its chunks", not low, low[:3])
    check("every row carries the announced p",
          all(abs(r["p"] - P) < 1e-12 for r in wrows + srows))
    check("the burst iteration needed more passes",
          max(r["passes"] for r in wrows if r["iteration"] == 2) >= 2)


def lost_worker_job(build, tmp):
    job = Job(build, tmp, "lost")
    try:
        server = job.server("--policy=dblp", "--loss=bernoulli:0.02")
        time.sleep(0.3)
        workers = [job.worker(w, "--iterations=1000000") for w in range(WORKERS)]
        rows = os.path.join(job.tmp, "w1", "iterations.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and (
                not os.path.exists(rows) or os.path.getsize(rows) < 2000):
            time.sleep(0.05)
        workers[1].send_signal(signal.SIGKILL)
        killed = time.time()
        survivors = [("server", server), ("w0", workers[0]),
                     ("w2", workers[2])]
        late = []
        for name, p in survivors:
            try:
                p.wait(timeout=max(0.1, killed + LOST_WITHIN_S - time.time()))
            except subprocess.TimeoutExpired:
                late.append(name)
        check("lost worker: the server and the others end within %g s"
              % LOST_WITHIN_S, not late, late)
        for name, p in survivors:
            if name in late:
                continue
            log = job.log(name)
            check("lost worker: %s exits 1" % name, p.returncode == 1,
                  "exit %s\n%s" % (p.returncode, log[-600:]))
            check("lost worker: %s names worker 1 (w1)" % name,
                  "worker 1 (w1)" in log, log[-600:])
    finally:
        job.close()


def main():
    build = sys.argv[1]
    for b in ("dblp-udp-server", "dblp-udp-worker"):
        if not os.access(os.path.join(build, "apps", b), os.X_OK):
            print("FAIL: missing %s" % b)
            sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="dblp-udp-job-")
    try:
        lossy_job(build, tmp)
        lost_worker_job(build, tmp)
    finally:
        if not __import__("dblp_testlib").FAILURES and "--keep" not in sys.argv:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs kept in " + tmp)
    finish()


if __name__ == "__main__":
    main()
