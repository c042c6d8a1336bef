#!/usr/bin/env python3
"""Server shards over memif: one job on S dblp-server processes (each owns a
partition of the gradient's chunks, shard 0 is the directory) against the
same job on one dblp-server.

Modes (one per meson test):

  parity  (default) 1 server, then 2 shards, 3 workers each, integer
          gradients, no injected loss. Every dumped mean (the shards'
          partitions laid end to end) and every worker's applied average
          must be bit-identical to the one-server job's, and every shard's
          rows must carry the one-server job's p, phase and mean norm every
          iteration (--policy=dblp: the reference must itself leave and
          re-enter the critical regime, or the test shows nothing).
  --loss  2 shards under Bernoulli loss and a 70% burst: every shard's push
          rounds deliver >= ceil((1 - p) N_k) of its own N_k chunks, and
          every worker's average equals the shards' mean on every chunk its
          broadcast bitmaps hold (zero elsewhere).
  --kill  2 shards, 2 workers; shard 1 is killed (SIGKILL) mid-job: every
          worker and shard 0 must end with an error naming shard 1 within
          the round timeout (+ slack), none by a signal.
  --wrong_map  a worker that JOINs shard 1 as if it were the directory is
          refused with an error that names the directory; a worker given a
          wrong shard map (--shard_map_override) is refused by the shard it
          claims, naming the claim and the directory.

Usage: shard_cluster_test.py BUILD_DIR [--policy=fixed|dblp] [--resync=K]
           [--loss | --kill | --wrong_map]
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

from dblp_testlib import (check, finish, free_port, make_secret, read_bits,
                          read_f32)

WORKERS = 3
ITERATIONS = 12
FLOATS = 90000  # 251 chunks of 359 floats: partitions [0, 128), [128, 251)
DUMP_ITERS = 6
P_FIXED = 0.05
P_LOW, P_HIGH, CLR_FREQ, CLR_ETA = 0.02, 0.3, 2, 0.05
TIMEOUT_S = 240
KILL_ROUND_TIMEOUT_MS = 3000


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def parse_args():
    a = {"build": sys.argv[1], "policy": "fixed", "resync": 0,
         "mode": "parity"}
    for arg in sys.argv[2:]:
        key, _, value = arg.lstrip("-").partition("=")
        if key in ("loss", "kill", "wrong_map"):
            a["mode"] = key
        elif key == "resync":
            a["resync"] = int(value)
        elif key == "policy":
            a["policy"] = value
        else:
            fail("unknown argument " + arg)
    return a


class Job:
    """One job's processes: S servers (memif server ports, one per worker)
    and W workers (one memif client port per server)."""

    def __init__(self, a, tmp, shards, workers, flags, worker_flags):
        self.a, self.tmp, self.shards, self.workers = a, tmp, shards, workers
        self.flags, self.worker_flags = flags, worker_flags
        self.ports = [free_port() for _ in range(shards)]
        self.procs = []  # (name, Popen)
        self.uniq = "sc%d-%s" % (os.getpid(), os.path.basename(tmp)[-6:])

    def app(self, name):
        path = os.path.join(self.a["build"], "apps", name)
        if not os.access(path, os.X_OK):
            fail("missing " + path)
        return path

    def eal(self, who, vdevs, lcore):
        return (["-l", lcore, "--no-huge", "-m", "256", "--no-pci",
                 "--file-prefix=dblp-%s-%s" % (self.uniq, who),
                 "--log-level=*:warning"] + ["--vdev=" + v for v in vdevs])

    def sock(self, k, w):
        return "%s/s%dw%d.sock" % (self.tmp, k, w)

    def server_cmd(self, k):
        vdevs = ["net_memif%d,role=server,socket=%s,id=0" % (w, self.sock(k, w))
                 for w in range(self.workers)]
        own = ["--listen=127.0.0.1:%d" % self.ports[k], "--stats_period=0",
               "--out_dir=%s/server%d" % (self.tmp, k),
               "--dump_dir=%s/dump/s%d" % (self.tmp, k)]
        if self.shards > 1:
            own += ["--shards=%d" % self.shards, "--shard_index=%d" % k]
            if k > 0:
                own.append("--directory=127.0.0.1:%d" % self.ports[0])
        return ([self.app("dblp-server")] + self.eal("s%d" % k, vdevs, "0") +
                ["--"] + own + self.flags)

    def worker_cmd(self, w, server=None):
        vdevs = ["net_memif%d,role=client,socket=%s,id=0" % (k, self.sock(k, w))
                 for k in range(self.shards)]
        cpu = "1" if (os.cpu_count() or 1) > 1 else "0"
        own = ["--server=127.0.0.1:%d" % (server or self.ports[0]),
               "--stats_period=0", "--name=w%d" % w,
               "--out_dir=%s/worker%d" % (self.tmp, w),
               "--dump_dir=%s/dump/w" % self.tmp]
        return ([self.app("dblp-worker")] + self.eal("w%d" % w, vdevs, cpu) +
                ["--"] + own + self.worker_flags)

    def spawn(self, name, cmd):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.procs.append((name, p))
        return p

    def start(self):
        for k in range(self.shards):
            os.makedirs("%s/dump/s%d" % (self.tmp, k), exist_ok=True)
        os.makedirs("%s/dump/w" % self.tmp, exist_ok=True)
        for k in range(self.shards):
            self.spawn("shard%d" % k, self.server_cmd(k))
            time.sleep(0.5)
        time.sleep(0.5)
        for w in range(self.workers):
            self.spawn("worker%d" % w, self.worker_cmd(w))
            time.sleep(0.2)  # join in rank order: rank == start order

    def wait(self, timeout):
        """Every process's (exit code, output, seconds from now)."""
        t0 = time.time()
        deadline = t0 + timeout
        results = {}
        for name, p in self.procs:
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.kill()
                out, _ = p.communicate()
                results[name] = (None, out, time.time() - t0)
                continue
            results[name] = (p.returncode, out, time.time() - t0)
        return results

    def kill(self):
        for _, p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def job_flags(a, secret, lossy):
    common = ["--secret_file=" + secret, "--seed=11", "--idle_sleep_us=50",
              "--round_timeout_ms=20000", "--dump_iterations=%d" % DUMP_ITERS]
    if lossy:
        common += ["--loss=bernoulli:0.05", "--burst_iters=3",
                   "--burst_loss=0.7"]
    policy = (["--policy=fixed", "--p_fixed=%g" % P_FIXED]
              if a["policy"] == "fixed" else
              ["--policy=dblp", "--p_low=%g" % P_LOW, "--p_high=%g" % P_HIGH,
               "--clr_freq=%d" % CLR_FREQ, "--clr_eta=%g" % CLR_ETA])
    server = (["--workers=%d" % WORKERS, "--push_fill=rescale",
               "--resync_every=%d" % a["resync"]] + policy + common)
    worker = (["--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS,
               "--gradient=integer"] + common)
    if a["policy"] == "dblp":
        # The mean's norm x4 for iterations 4-6: the detector leaves the
        # critical regime at the check of iteration 3 and comes back.
        worker += ["--norm_jumps=4", "--jump_length=3"]
    return server, worker


def run_job(a, tmp, shards, lossy=False):
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, lossy)
    job = Job(a, tmp, shards, WORKERS, server, worker)
    try:
        job.start()
        results = job.wait(TIMEOUT_S)
    finally:
        job.kill()
    bad = {n: r for n, r in results.items() if r[0] != 0}
    if bad:
        for n, r in results.items():
            print("---- %s (exit %s)\n%s" % (n, r[0], r[1][-1500:]))
        fail("%d-shard job: %s did not exit 0" % (shards, ", ".join(bad)))
    return results


def rows_of(tmp, k):
    with open(os.path.join(tmp, "server%d" % k, "iterations.jsonl")) as f:
        return [json.loads(line) for line in f]


def per_iteration(rows, key):
    out = {}
    for r in rows:
        out.setdefault(r["iteration"], r[key])
    return out


def ranks_of(tmp):
    ranks = {}
    for w in range(WORKERS):
        with open(os.path.join(tmp, "worker%d" % w, "summary.json")) as f:
            ranks[w] = json.load(f)["rank"]
    return ranks


def sharded_mean(tmp, shards, it):
    mean = []
    for k in range(shards):
        mean += read_f32(os.path.join(tmp, "dump", "s%d" % k,
                                      "mean_it%d.f32" % it))
    return mean


def parity(a):
    ref = tempfile.mkdtemp(prefix="dblp-shards-ref-")
    sh = tempfile.mkdtemp(prefix="dblp-shards-2-")
    run_job(a, ref, 1)
    out = run_job(a, sh, 2)
    check("shard 1 registered with the directory and ran its partition",
          "shard 1" in out["shard1"][1] or "shard 1" in out["shard0"][1],
          out["shard1"][1][-600:])
    ref_rows, s0, s1 = rows_of(ref, 0), rows_of(sh, 0), rows_of(sh, 1)
    for key in ("p", "critical", "grad_norm"):
        want = per_iteration(ref_rows, key)
        for k, rows in enumerate((s0, s1)):
            got = per_iteration(rows, key)
            check("shard %d: %s of every iteration as one server's" % (k, key),
                  got == want, "one server %s\nshard %d %s" % (want, k, got))
    if a["policy"] == "dblp":
        ps = [p for _, p in sorted(per_iteration(ref_rows, "p").items())]
        check("the reference left and re-entered the critical regime",
              P_HIGH in ps and any(x == P_HIGH and y == P_LOW
                                   for x, y in zip(ps, ps[1:])), ps)
    same_means, same_avgs = True, True
    detail = ""
    rr, rs = ranks_of(ref), ranks_of(sh)
    for it in range(DUMP_ITERS):
        want = read_f32(os.path.join(ref, "dump", "s0", "mean_it%d.f32" % it))
        got = sharded_mean(sh, 2, it)
        if list(want) != list(got):
            same_means = False
            detail = "iteration %d: %d floats vs %d" % (it, len(want), len(got))
        for w in range(WORKERS):
            path = "w%d_it%d_avg.f32"
            x = read_f32(os.path.join(ref, "dump", "w", path % (rr[w], it)))
            y = read_f32(os.path.join(sh, "dump", "w", path % (rs[w], it)))
            if x != y:
                same_avgs = False
                detail = "iteration %d worker %d" % (it, w)
    check("the shards' means are the one server's, bit for bit", same_means,
          detail)
    check("every worker applied the one server's averages, bit for bit",
          same_avgs, detail)
    shutil.rmtree(ref, ignore_errors=True)
    shutil.rmtree(sh, ignore_errors=True)


def lossy(a):
    sh = tempfile.mkdtemp(prefix="dblp-shards-loss-")
    run_job(a, sh, 2, lossy=True)
    tag = 16
    chunk_floats = (((1500 - 20 - 8 - 20) & ~3) - tag) // 4
    n = (FLOATS + chunk_floats - 1) // chunk_floats
    bounds = [0, 128, n]
    for k in range(2):
        nk = bounds[k + 1] - bounds[k]
        low = []
        for r in rows_of(sh, k):
            need = nk - math.floor(r["p"] * nk * (1 + 1e-12))
            if r["delivered_fraction"] * nk + 1e-9 < need:
                low.append(r)
        check("shard %d: every push round delivered >= ceil((1-p) N_k)" % k,
              not low, low[:3])
    ranks = ranks_of(sh)
    bad = ""
    for it in range(DUMP_ITERS):
        mean = sharded_mean(sh, 2, it)
        for w in range(WORKERS):
            r = ranks[w]
            avg = read_f32(os.path.join(sh, "dump", "w",
                                        "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(sh, "dump", "w",
                                         "w%d_it%d_bcast.bits" % (r, it)), n)
            for j in range(FLOATS):
                want = mean[j] if got[j // chunk_floats] else 0.0
                if avg[j] != want:
                    bad = "iteration %d worker %d float %d" % (it, w, j)
                    break
    check("every worker's average is the shards' mean where it arrived",
          not bad, bad)
    shutil.rmtree(sh, ignore_errors=True)


def kill_shard(a):
    tmp = tempfile.mkdtemp(prefix="dblp-shards-kill-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    server = [f for f in server if not f.startswith("--workers")] + [
        "--workers=2"]
    flags = [f.replace("--round_timeout_ms=20000",
                       "--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
             for f in server]
    wflags = [f.replace("--round_timeout_ms=20000",
                        "--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
              .replace("--iterations=%d" % ITERATIONS, "--iterations=100000")
              for f in worker]
    job = Job(a, tmp, 2, 2, flags, wflags)
    try:
        job.start()
        rows = os.path.join(tmp, "worker0", "iterations.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(rows) and sum(1 for _ in open(rows)) >= 5:
                break
            time.sleep(0.2)
        else:
            job.kill()
            fail("the 2-shard job never got going")
        victim = dict(job.procs)["shard1"]
        victim.send_signal(signal.SIGKILL)
        job.procs = [(n, p) for n, p in job.procs if n != "shard1"]
        limit = KILL_ROUND_TIMEOUT_MS / 1000.0 + 3
        results = job.wait(limit + 20)
    finally:
        job.kill()
    for name, (rc, out, secs) in results.items():
        check("%s ended with an error (exit 1), not a signal" % name,
              rc == 1, "exit %s\n%s" % (rc, out[-800:]))
        check("%s ended within the round timeout (%.1f s <= %.1f s)"
              % (name, secs, limit), secs <= limit)
        check("%s's error names shard 1" % name, "shard 1" in out,
              out[-800:])
    shutil.rmtree(tmp, ignore_errors=True)


def wrong_map(a):
    tmp = tempfile.mkdtemp(prefix="dblp-shards-map-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    job = Job(a, tmp, 2, WORKERS, server, worker)
    try:
        for k in range(2):
            job.spawn("shard%d" % k, job.server_cmd(k))
            time.sleep(0.5)
        time.sleep(0.5)
        # JOINs shard 1 as if it were the directory.
        p = job.spawn("lost", job.worker_cmd(0, server=job.ports[1]))
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = "(no answer in 30 s)"
        check("a worker that JOINs shard 1 as the directory is refused",
              p.returncode not in (0, None) and p.returncode > 0,
              "exit %s" % p.returncode)
        check("...with an error naming the directory (shard 0)",
              "directory" in out and str(job.ports[0]) in out, out[-800:])
    finally:
        job.kill()
    shutil.rmtree(tmp, ignore_errors=True)
    wrong_claim(a)


def wrong_claim(a):
    """A worker given a wrong shard map (dblp-worker's test hook
    --shard_map_override: it claims chunks [0, 64) of shard 1, which owns
    [128, 251)) is refused by shard 1 with an error naming the claim and
    the directory; no process ends by a signal or hangs."""
    tmp = tempfile.mkdtemp(prefix="dblp-shards-claim-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    server = [f for f in server if not f.startswith("--round_timeout_ms")]
    server.append("--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
    job = Job(a, tmp, 2, WORKERS, server, worker)
    plain = job.worker_cmd
    liar = WORKERS - 1
    job.worker_cmd = lambda w, server=None: plain(w, server) + (
        ["--shard_map_override=1:0:64"] if w == liar else [])
    try:
        job.start()
        results = job.wait(60)
    finally:
        job.kill()
    rc, out, _ = results["worker%d" % liar]
    check("a worker given a wrong shard map is refused (exit 1)", rc == 1,
          "exit %s\n%s" % (rc, out[-800:]))
    check("...naming server shard 1, the claim and the directory",
          "server shard 1" in out and "claims chunks [0, 64)" in out and
          "directory" in out and str(job.ports[0]) in out, out[-800:])
    check("no process ended by a signal or hung",
          all(r[0] is not None and r[0] >= 0 for r in results.values()),
          {n: r[0] for n, r in results.items()})
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    a = parse_args()
    {"parity": parity, "loss": lossy, "kill": kill_shard,
     "wrong_map": wrong_map}[a["mode"]](a)
    finish()


if __name__ == "__main__":
    main()
