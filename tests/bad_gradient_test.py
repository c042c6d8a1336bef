#!/usr/bin/env python3
"""Members who lie (issue #21, item 3), end to end: one worker of three
pushes NaN or +Inf (the --lying_gradient test hook), over the simulator
(dblp-sim), kernel UDP (dblp-udp-server + 3 dblp-udp-workers) and DPDK
memif (dblp-server on two lcores, whose shards each tally the liar).

  * --on_bad_gradient=abort (the default): the server exits nonzero and
    its error names the worker and the iteration;
  * --on_bad_gradient=drop: the job finishes (exit 0), the server's mean of
    every dumped iteration equals, bit for bit, the mean of the honest
    workers (the liar's chunks left out of the divisor), every worker's
    copy is finite, and the summary and the rows count the refused chunks.

Usage: bad_gradient_test.py BUILD_DIR
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dblp_testlib import (check, f32, finish, free_port, hooked_app,  # noqa: E402
                          integer_value, kill_all, make_secret, read_f32)
from udp_job_test import Job, wait_all  # noqa: E402

WORKERS = 3
ITERATIONS = 4
FLOATS = 5000
TIMEOUT_S = 60


def sim(build, *flags):
    return subprocess.run(
        [hooked_app(build, "dblp-sim"), "--workers=%d" % WORKERS,
         "--iterations=%d" % ITERATIONS, "--gradient=integer",
         "--floats=%d" % FLOATS, "--policy=reliable", "--push_fill=zero",
         "--resync_every=0"] + list(flags),
        capture_output=True, text=True, timeout=TIMEOUT_S)


class LyingJob(Job):
    """udp_job_test's job with the workers' twin that takes
    --lying_gradient (-Dtest_hooks=true)."""

    def __init__(self, build, tmp, name):
        super().__init__(build, tmp, name)
        self.worker_bin = hooked_app(build, "dblp-udp-worker")


def check_honest_means(what, dump, liar, first_lie):
    """Each dumped mean: every worker's before the lie, the others' after."""
    bad, unfinite = [], []
    for it in range(ITERATIONS):
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        members = [r for r in range(WORKERS) if r != liar or it < first_lie]
        for j in range(FLOATS):
            want = f32(sum(integer_value(j, it, r) for r in members)
                       / len(members))
            if mean[j] != want:
                bad.append("it %d float %d: %r != %r" % (it, j, mean[j], want))
                break
        for r in range(WORKERS):
            avg = read_f32(os.path.join(dump, "w%d_it%d_avg.f32" % (r, it)))
            if not all(math.isfinite(x) for x in avg):
                unfinite.append("worker %d it %d" % (r, it))
    check(what + ": the server's mean is the honest workers', bit for bit",
          not bad, "\n".join(bad[:5]))
    check(what + ": every worker's copy of the mean is finite",
          not unfinite, unfinite[:5])


def check_counted(what, server_dir, liar, lying_iterations):
    with open(os.path.join(server_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(server_dir, "iterations.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    chunks = int(summary["info"]["chunks"])
    c = summary["counters"]
    want = chunks * lying_iterations
    check(what + ": the summary counts every refused chunk (%d) and one liar"
          % want, c.get("bad_gradient_nonfinite_chunks") == want
          and c.get("bad_gradient_workers") == 1, c)
    liar_rows = [r for r in rows if r["rank"] == liar and r["bad_chunks"] > 0]
    honest = [r for r in rows if r["rank"] != liar and r["bad_chunks"] > 0]
    check(what + ": the rows name the liar's refused chunks and no one else's",
          len(liar_rows) == lying_iterations and not honest, rows[:6])
    check(what + ": the rows carry each worker's norm",
          all(r["worker_norm"] > 0 for r in rows if r["rank"] != liar), rows[:3])


def sim_cases(build, tmp):
    p = sim(build, "--lying_gradient=nan:1:2")
    text = p.stdout + p.stderr
    check("sim abort: dblp-sim exits nonzero", p.returncode != 0,
          "exit %d\n%s" % (p.returncode, text[-800:]))
    check("sim abort: the error names worker 1 and iteration 2",
          "worker 1 " in p.stderr and "iteration 2" in p.stderr, p.stderr[-800:])

    out = os.path.join(tmp, "sim-drop")
    dump = os.path.join(out, "dump")
    os.makedirs(dump)
    p = sim(build, "--on_bad_gradient=drop", "--lying_gradient=inf:2:1",
            "--out_dir=" + out, "--dump_dir=" + dump,
            "--dump_iterations=%d" % ITERATIONS)
    check("sim drop: dblp-sim exits 0", p.returncode == 0,
          "exit %d\n%s" % (p.returncode, (p.stdout + p.stderr)[-800:]))
    if p.returncode != 0:
        return
    check_honest_means("sim drop", dump, liar=2, first_lie=1)
    check_counted("sim drop", os.path.join(out, "server"), liar=2,
                  lying_iterations=ITERATIONS - 1)
    check("sim drop: the liar is logged", "worker 2 " in p.stderr,
          p.stderr[-800:])


def udp_cases(build, tmp):
    job = LyingJob(build, tmp, "udp-abort")
    try:
        server = job.server("--policy=reliable")
        for w in range(WORKERS):
            job.worker(w, "--iterations=%d" % ITERATIONS,
                       "--lying_gradient=nan:1:1")
        late = wait_all(job, TIMEOUT_S)
        check("udp abort: the job ends", not late, late)
        log = job.log("server")
        check("udp abort: dblp-udp-server exits 1", server.returncode == 1,
              "exit %s\n%s" % (server.returncode, log[-800:]))
        check("udp abort: the error names worker 1 (w1) and iteration 1",
              "worker 1 (w1)" in log and "iteration 1" in log, log[-800:])
    finally:
        job.close()

    job = LyingJob(build, tmp, "udp-drop")
    dump = os.path.join(job.tmp, "dump")
    os.makedirs(dump)
    common = ["--dump_dir=" + dump, "--dump_iterations=%d" % ITERATIONS]
    try:
        server = job.server("--policy=reliable", "--push_fill=zero",
                            "--resync_every=0", "--on_bad_gradient=drop",
                            *common)
        for w in range(WORKERS):
            job.worker(w, "--iterations=%d" % ITERATIONS,
                       "--floats=%d" % FLOATS, "--lying_gradient=nan:0:0",
                       *common)
        late = wait_all(job, TIMEOUT_S)
        check("udp drop: the job ends", not late, late)
        log = job.log("server")
        check("udp drop: dblp-udp-server exits 0", server.returncode == 0,
              "exit %s\n%s" % (server.returncode, log[-800:]))
        if server.returncode != 0:
            return
        check_honest_means("udp drop", dump, liar=0, first_lie=0)
        check_counted("udp drop", os.path.join(job.tmp, "server"), liar=0,
                      lying_iterations=ITERATIONS)
    finally:
        job.close()


def memif_job(build, tmp, name, server_flags, dump_flags, lie):
    """dblp-server (two lcores) and three dblp-workers over memif; returns
    the server's exit code and output, with every process ended."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    secret = make_secret(os.path.join(d, "job.secret"))
    port = free_port()
    uniq = "badgrad-%d-%s" % (os.getpid(), name)
    ncpu = os.cpu_count() or 1
    eal = ["--lcores", "0@0,1@%d" % (1 % ncpu), "--no-huge", "-m", "256",
           "--no-pci", "--file-prefix=%s-srv" % uniq, "--log-level=*:warning"]
    for w in range(WORKERS):
        eal.append("--vdev=net_memif%d,role=server,socket=%s/w%d.sock,id=0"
                   % (w, d, w))
    procs = []
    try:
        server = subprocess.Popen(
            [os.path.join(build, "apps", "dblp-server")] + eal +
            ["--", "--listen=127.0.0.1:%d" % port, "--stats_period=0",
             "--secret_file=" + secret, "--workers=%d" % WORKERS,
             "--policy=reliable", "--push_fill=zero", "--resync_every=0",
             "--round_timeout_ms=20000", "--idle_sleep_us=50",
             "--out_dir=" + os.path.join(d, "server")] + server_flags +
            dump_flags,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(server)
        time.sleep(1.0)
        for w in range(WORKERS):
            weal = ["-l", str(1 % ncpu), "--no-huge", "-m", "256", "--no-pci",
                    "--file-prefix=%s-w%d" % (uniq, w),
                    "--log-level=*:warning",
                    "--vdev=net_memif0,role=client,socket=%s/w%d.sock,id=0"
                    % (d, w)]
            procs.append(subprocess.Popen(
                [hooked_app(build, "dblp-worker")] + weal +
                ["--", "--server=127.0.0.1:%d" % port, "--stats_period=0",
                 "--secret_file=" + secret, "--gradient=integer",
                 "--floats=%d" % FLOATS, "--iterations=%d" % ITERATIONS,
                 "--idle_sleep_us=50", "--round_timeout_ms=20000",
                 "--lying_gradient=" + lie] + dump_flags,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.2)  # join in rank order
        try:
            out, _ = server.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, "server still running after %d s" % TIMEOUT_S, d
        for p in procs[1:]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        return server.returncode, out, d
    finally:
        kill_all(procs)


def memif_cases(build, tmp):
    rc, out, _ = memif_job(build, tmp, "memif-abort", [], [], "inf:1:1")
    check("memif abort: dblp-server exits 1", rc == 1,
          "exit %s\n%s" % (rc, out[-800:]))
    check("memif abort: the error names worker 1 and iteration 1",
          "worker 1 " in out and "iteration 1" in out, out[-800:])
    dump = os.path.join(tmp, "memif-dump")
    os.makedirs(dump)
    rc, out, d = memif_job(build, tmp, "memif-drop", ["--on_bad_gradient=drop"],
                           ["--dump_dir=" + dump,
                            "--dump_iterations=%d" % ITERATIONS], "nan:2:1")
    check("memif drop: dblp-server exits 0", rc == 0,
          "exit %s\n%s" % (rc, out[-800:]))
    if rc != 0:
        return
    check_honest_means("memif drop", dump, liar=2, first_lie=1)
    check_counted("memif drop", os.path.join(d, "server"), liar=2,
                  lying_iterations=ITERATIONS - 1)


def main():
    build = sys.argv[1]
    for b in ("dblp-sim", "dblp-udp-server", "dblp-udp-worker"):
        if not os.access(os.path.join(build, "apps", b), os.X_OK):
            print("FAIL: missing %s" % b)
            sys.exit(1)
    # The DPDK apps are built where DPDK is found.
    dpdk = all(os.access(os.path.join(build, "apps", b), os.X_OK)
               for b in ("dblp-server", "dblp-worker"))
    tmp = tempfile.mkdtemp(prefix="dblp-bad-gradient-")
    try:
        sim_cases(build, tmp)
        udp_cases(build, tmp)
        if dpdk:
            memif_cases(build, tmp)
        else:
            print("skip memif cases: no dblp-server/dblp-worker in this build")
    finally:
        if not __import__("dblp_testlib").FAILURES and "--keep" not in sys.argv:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs kept in " + tmp)
    finish()


if __name__ == "__main__":
    main()
