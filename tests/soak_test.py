#!/usr/bin/env python3
"""Soak: a long job under random Bernoulli loss, Gilbert-Elliott bursts,
70% microbursts and forged frames every round, with every round's promises
checked (issue #11):

  * every push round delivered >= ceil((1 - p) N) chunks (server rows), and
    every broadcast as well (worker rows);
  * no stale, foreign, badly tagged or unpinned frame was accepted: the
    forged frames of this round carry other floats, so one accepted would
    break the next check; the counters show each kind refused;
  * the server's mean equals, bit for bit, the mean of the integer
    gradients over the chunks that arrived (zero fill), every iteration;
    each worker's average equals it on the chunks its broadcast got;
  * mbufs in use and resident memory at the end are back to their values
    half-way through the run (once every buffer and pool page has been
    touched), within the rows the apps keep for their summary statistics.

The dumps are checked and deleted while the job runs, so disk use stays
small however long it soaks.

Usage: soak_test.py BUILD_DIR [--iterations=N] [--workers=W]
  N iterations are 2N rounds per worker (a push and a broadcast each):
  tools/dblp-soak runs N = 5000 (10,000 rounds per worker); CI runs 300.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dblp_testlib import (f32, free_port, hooked_app, integer_value,  # noqa: E402
                          read_bits, read_f32)

MTU = 1500
TAG = 16  # the default --frame_auth=full
P = 0.2
FLOATS = 4000


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)












class Checker:
    """Checks one iteration's dumps, then deletes them."""

    def __init__(self, dump, workers, n_chunks, chunk_floats, threshold):
        self.dump, self.W = dump, workers
        self.n, self.cf, self.threshold = n_chunks, chunk_floats, threshold
        self.checked = 0
        # The expected gradients' values repeat with period 17 in j, it and
        # rank: precomputed per (it % 17).
        self.values = {}

    def paths(self, it):
        d = self.dump
        p = [os.path.join(d, "mean_it%d.f32" % it)]
        for r in range(self.W):
            p += [os.path.join(d, "w%d_it%d_push.bits" % (r, it)),
                  os.path.join(d, "w%d_it%d_avg.f32" % (r, it)),
                  os.path.join(d, "w%d_it%d_bcast.bits" % (r, it))]
        return p

    def ready(self, it):
        return all(os.path.exists(p) for p in self.paths(it))

    def check(self, it):
        mean = read_f32(os.path.join(self.dump, "mean_it%d.f32" % it))
        if len(mean) != FLOATS:
            fail("iteration %d: mean of %d floats" % (it, len(mean)))
        arrived = [read_bits(os.path.join(self.dump, "w%d_it%d_push.bits"
                                          % (r, it)), self.n)
                   for r in range(self.W)]
        for r in range(self.W):
            if sum(arrived[r]) < self.threshold:
                fail("iteration %d worker %d: push delivered %d < %d"
                     % (it, r, sum(arrived[r]), self.threshold))
        for j in range(FLOATS):
            c = j // self.cf
            s = sum(integer_value(j, it, r) for r in range(self.W)
                    if arrived[r][c])
            if mean[j] != f32(s / self.W):
                fail("iteration %d float %d: mean %r != %r (a forged or "
                     "stale frame was summed?)" % (it, j, mean[j],
                                                   f32(s / self.W)))
        for r in range(self.W):
            avg = read_f32(os.path.join(self.dump, "w%d_it%d_avg.f32"
                                        % (r, it)))
            got = read_bits(os.path.join(self.dump, "w%d_it%d_bcast.bits"
                                         % (r, it)), self.n)
            if sum(got) < self.threshold:
                fail("iteration %d worker %d: broadcast delivered %d < %d"
                     % (it, r, sum(got), self.threshold))
            for j in range(FLOATS):
                want = mean[j] if got[j // self.cf] else 0.0
                if avg[j] != want:
                    fail("iteration %d worker %d float %d: %r != %r"
                         % (it, r, j, avg[j], want))
        for p in self.paths(it):
            os.unlink(p)
        self.checked += 1


def main():
    build = sys.argv[1]
    iterations, workers = 300, 2
    for a in sys.argv[2:]:
        if a.startswith("--iterations="):
            iterations = int(a.split("=", 1)[1])
        elif a.startswith("--workers="):
            workers = int(a.split("=", 1)[1])
    server_bin = os.path.join(build, "apps", "dblp-server")
    worker_bin = hooked_app(build, "dblp-worker")  # --hostile_per_round
    tmp = tempfile.mkdtemp(prefix="dblp-soak-")
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump)
    secret = os.path.join(tmp, "job.secret")
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600),
                   "wb") as f:
        f.write(os.urandom(32))
    chunk_floats = (((MTU - 20 - 8 - 20) & ~3) - TAG) // 4
    n_chunks = (FLOATS + chunk_floats - 1) // chunk_floats
    threshold = n_chunks - math.floor(P * n_chunks * (1 + 1e-12))
    uniq = "soak%d" % os.getpid()
    port = free_port()
    bursts = max(1, iterations // 50)
    common = ["--secret_file=" + secret, "--seed=23", "--stats_period=0",
              "--idle_sleep_us=50", "--round_timeout_ms=20000",
              "--burst_random=%d" % bursts,
              "--burst_range=1,%d" % max(2, iterations - 1),
              "--burst_loss=0.7", "--dump_dir=" + dump,
              "--dump_iterations=%d" % iterations]
    cpu = "1" if (os.cpu_count() or 1) > 1 else "0"
    eal = ["-l", "0", "--no-huge", "-m", "256", "--no-pci",
           "--file-prefix=dblp-%s-srv" % uniq, "--log-level=*:warning"]
    for w in range(workers):
        eal.append("--vdev=net_memif%d,role=server,socket=%s/w%d.sock,id=0"
                   % (w, tmp, w))
    procs = []
    t0 = time.time()
    checker = Checker(dump, workers, n_chunks, chunk_floats, threshold)
    try:
        procs.append(("server", subprocess.Popen(
            [server_bin] + eal + [
                "--", "--workers=%d" % workers,
                "--listen=127.0.0.1:%d" % port, "--policy=fixed",
                "--p_fixed=%g" % P, "--push_fill=zero", "--resync_every=0",
                # Bursty loss on the pushes: Gilbert-Elliott.
                "--loss=ge:0.02,0.25,0.01,0.6",
                "--out_dir=" + os.path.join(tmp, "server")] + common,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        time.sleep(1.0)
        for w in range(workers):
            weal = ["-l", cpu, "--no-huge", "-m", "256", "--no-pci",
                    "--file-prefix=dblp-%s-w%d" % (uniq, w),
                    "--log-level=*:warning",
                    "--vdev=net_memif0,role=client,socket=%s/w%d.sock,id=0"
                    % (tmp, w)]
            procs.append(("worker%d" % w, subprocess.Popen(
                [worker_bin] + weal + [
                    "--", "--server=127.0.0.1:%d" % port,
                    "--name=soak-%d" % w, "--iterations=%d" % iterations,
                    "--floats=%d" % FLOATS, "--gradient=integer",
                    "--hostile_per_round=4", "--loss=bernoulli:0.05",
                    "--out_dir=" + os.path.join(tmp, "worker%d" % w)]
                + common,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
            time.sleep(0.2)
        # Check (and delete) dumps as they appear.
        it = 0
        while it < iterations:
            if checker.ready(it) and (it + 1 == iterations or
                                      checker.ready(it + 1) or
                                      all(p.poll() is not None
                                          for _, p in procs)):
                checker.check(it)
                it += 1
                continue
            if any(p.poll() not in (None, 0) for _, p in procs):
                break
            if all(p.poll() is not None for _, p in procs) and \
                    not checker.ready(it):
                break
            time.sleep(0.01)
        outs = {}
        for name, p in procs:
            outs[name] = p.communicate(timeout=120)[0]
            if p.returncode != 0:
                fail("%s exited %d:\n%s" % (name, p.returncode,
                                            outs[name][-1500:]))
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    if checker.checked != iterations:
        fail("checked %d of %d iterations" % (checker.checked, iterations))

    srv = json.load(open(os.path.join(tmp, "server", "summary.json")))
    c = srv["counters"]
    rows = [json.loads(l) for l in open(os.path.join(tmp, "server",
                                                     "iterations.jsonl"))]
    if len(rows) != iterations * workers:
        fail("server rows %d != %d" % (len(rows), iterations * workers))
    for row in rows:
        if row["delivered_fraction"] * n_chunks + 1e-9 < threshold:
            fail("push round below threshold: %s" % row)
    # Each forged kind goes out every round (1 to 4 frames); the loss
    # injector drops some of them too, so at least half must show.
    hostile_rounds = (iterations - 1) * workers // 2
    for key, least in (("push_stale_round", hostile_rounds),
                       ("push_wrong_session", hostile_rounds),
                       ("push_future_round", hostile_rounds),
                       ("push_bad_tag", hostile_rounds),
                       ("frames_unpinned_source", hostile_rounds),
                       ("push_out_of_range", hostile_rounds)):
        if c.get(key, 0) < least:
            fail("%s = %d, expected >= %d" % (key, c.get(key, 0), least))
    if c["push_accepted"] > iterations * workers * n_chunks:
        fail("accepted %d > chunks sent %d: counted twice?"
             % (c["push_accepted"], iterations * workers * n_chunks))
    # Resources: at the end, back to their value half-way through (by then
    # every buffer and pool page was touched: --no-huge memory becomes
    # resident as the mempool cycles through its mbufs). The apps keep every
    # row for the summary's percentiles (~150 B each): allowed.
    slack_kib = 1024 + iterations * workers * 150 // 1024
    for name in ["server"] + ["worker%d" % w for w in range(workers)]:
        cc = json.load(open(os.path.join(tmp, name, "summary.json")))[
            "counters"]
        m0, m1 = cc["mid_run_mbufs_in_use"], cc["end_mbufs_in_use"]
        r0, r1 = cc["mid_run_rss_kib"], cc["end_rss_kib"]
        print("%s: mbufs in use %d -> %d, RSS %d -> %d KiB (iteration %d -> "
              "the end)" % (name, m0, m1, r0, r1, cc["mid_run_iteration"]))
        if cc["mid_run_iteration"] == 0:
            fail("%s: no mid-run sample" % name)
        if m1 > m0 + 64:
            fail("%s: mbufs in use grew %d -> %d (a leak)" % (name, m0, m1))
        if r1 > r0 + slack_kib:
            fail("%s: RSS grew %d -> %d KiB (allowed %d)"
                 % (name, r0, r1, slack_kib))
        for row in (json.loads(l) for l in open(os.path.join(
                tmp, name, "iterations.jsonl"))):
            if name != "server" and \
                    row["delivered_fraction"] * n_chunks + 1e-9 < threshold:
                fail("%s: broadcast below threshold: %s" % (name, row))
    print("soak: %d iterations x %d workers (%d rounds per worker) in %.0f s;"
          " every mean bit-exact; refused: stale=%d wrong_session=%d "
          "future=%d bad_tag=%d unpinned=%d out_of_range=%d; injected drops "
          "%d" % (iterations, workers, 2 * iterations, time.time() - t0,
                  c["push_stale_round"], c["push_wrong_session"],
                  c["push_future_round"], c["push_bad_tag"],
                  c["frames_unpinned_source"], c["push_out_of_range"],
                  c["injected_drops"]))
    shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
