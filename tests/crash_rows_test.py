#!/usr/bin/env python3
"""Rows survive a crash: kill -9 mid-job leaves every completed iteration.

dblp-worker, dblp-server and dblp-udp-bench stream one row per iteration
to --out_dir/iterations.jsonl and .csv as it ends; summary.json comes at
exit. Each case starts a long job, waits until the victim's file holds a
few rows, kills it with SIGKILL and checks what is on disk: every line a
complete JSON object, iterations 0..k-1 in order (k >= 3), the CSV the
same rows (it may lag the JSONL by the row being written at the kill), and
no summary.json (the victim never reached its exit). A directory that
cannot take the rows fails each app at start, naming --out_dir, instead of
after the whole job.

Usage: crash_rows_test.py BUILD_DIR
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dblp_testlib import (check, finish, free_port, kill_all,  # noqa: E402
                          make_secret)

MIN_ROWS = 3
CSV_HEADER = ("iteration,rank,send_latency_us,bcast_latency_us,passes,"
              "bcast_passes,packets_sent,packets_resent,delivered_fraction,"
              "p,critical,grad_norm,burst,control_rtt_us,resync,worker_norm,"
              "bad_chunks,clipped_chunks,clr_nonfinite")






def eal(prefix, *vdevs, lcore="0"):
    return (["-l", lcore, "--no-huge", "-m", "256", "--no-pci",
             "--file-prefix=dblp-crash-%d-%s" % (os.getpid(), prefix),
             "--log-level=*:warning"] + ["--vdev=" + v for v in vdevs])


def line_count(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


class Procs:
    """Every process a case starts, killed and reaped however it ends."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.all = []

    def start(self, name, cmd):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own descriptor
        p.log_path = os.path.join(self.tmp, name + ".log")
        self.all.append(p)
        return p

    def cleanup(self):
        kill_all(self.all)


def output(p):
    with open(p.log_path, errors="replace") as f:
        return f.read()


def wait_exit(p, timeout):
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


def kill_after_rows(name, victim, rows_paths, others=(), timeout=60):
    """SIGKILLs `victim` once each of `rows_paths` holds MIN_ROWS lines;
    False (and a failed check) if it exits or the rows do not come in
    time."""
    deadline = time.time() + timeout
    while min(line_count(p) for p in rows_paths) < MIN_ROWS:
        for p in (victim,) + tuple(others):
            if p.poll() is not None:
                check(name + ": job running until the kill", False,
                      "a process exited (%d) before %d rows:\n%s" %
                      (p.returncode, MIN_ROWS, output(p)[-1500:]))
                return False
        if time.time() > deadline:
            check(name + ": rows appear while the job runs", False,
                  "%s: %s lines after %d s (rows written only at exit?)"
                  % (rows_paths, [line_count(p) for p in rows_paths],
                     timeout))
            return False
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return True


def check_rows(name, out_dir, rows_per_iteration=1):
    """The rows a killed process left: complete, consecutive, no summary."""
    jsonl = os.path.join(out_dir, "iterations.jsonl")
    with open(jsonl, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    check(name + ": the last row is complete", data.endswith(b"\n"),
          repr(data[-200:]))
    rows, bad = [], []
    for line in lines[:-1]:
        try:
            rows.append(json.loads(line))
        except ValueError:
            bad.append(line)
    check(name + ": every line is a JSON row", not bad, repr(bad[:3]))
    k = len(rows) // rows_per_iteration
    want = [i // rows_per_iteration for i in range(len(rows))]
    got = [r.get("iteration") for r in rows]
    check(name + ": iterations 0..k-1 in order, k >= %d" % MIN_ROWS,
          k >= MIN_ROWS and got == want and
          len(rows) % rows_per_iteration == 0,
          "iterations %s" % got[:20])
    with open(os.path.join(out_dir, "iterations.csv")) as f:
        csv = f.read().split("\n")
    csv_its = [int(l.split(",", 1)[0]) for l in csv[1:-1]]
    check(name + ": the CSV holds the same rows",
          csv[0] == CSV_HEADER and csv[-1] == "" and
          csv_its == want[:len(csv_its)] and
          len(rows) - 1 <= len(csv_its) <= len(rows),
          "header %r, %d CSV rows for %d JSON rows" %
          (csv[0], len(csv_its), len(rows)))
    check(name + ": no summary.json (the process never reached its exit)",
          not os.path.exists(os.path.join(out_dir, "summary.json")))
    print("     (%d rows on disk)" % len(rows))
    return len(rows)


def main():
    build = sys.argv[1]
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    udp = os.path.join(build, "apps", "dblp-udp-bench")
    tmp = tempfile.mkdtemp(prefix="dblp-crash-")
    procs = Procs(tmp)
    wcore = "1" if (os.cpu_count() or 1) > 1 else "0"
    try:
        secret_path = make_secret(os.path.join(tmp, "job.secret"))

        def secret(binary, dpdk=True):
            return ["--secret_file=" + secret_path]

        quiet = ["--stats_period=0", "--idle_sleep_us=100",
                 "--round_timeout_ms=10000"]
        server_flags = quiet + secret(server)
        worker_flags = quiet + secret(worker)
        udp_flags = secret(udp, dpdk=False)

        def job(name, out_server, out_worker):
            """1 server + 1 worker over memif, paced (--link_gbps) so the
            job runs for minutes unless killed."""
            port = free_port()
            sock = os.path.join(tmp, name + ".sock")
            srv = procs.start(name + "-server", [server] + eal(
                name + "-srv",
                "net_memif0,role=server,socket=%s,id=0" % sock) +
                ["--", "--workers=1", "--listen=127.0.0.1:%d" % port,
                 "--policy=fixed", "--join_timeout_ms=30000",
                 "--out_dir=" + out_server] + server_flags)
            time.sleep(0.8)
            wrk = procs.start(name + "-worker", [worker] + eal(
                name + "-w0",
                "net_memif0,role=client,socket=%s,id=0" % sock,
                lcore=wcore) +
                ["--", "--server=127.0.0.1:%d" % port,
                 "--iterations=1000000", "--floats=50000",
                 "--link_gbps=0.2", "--out_dir=" + out_worker] +
                worker_flags)
            return srv, wrk

        # ---- a worker killed mid-job ----
        d = os.path.join(tmp, "wkill")
        srv, wrk = job("wkill", os.path.join(d, "server"),
                       os.path.join(d, "worker0"))
        if kill_after_rows("worker killed", wrk,
                           [os.path.join(d, "worker0", "iterations.jsonl")],
                           others=(srv,)):
            check_rows("worker killed", os.path.join(d, "worker0"))
            rc = wait_exit(srv, 60)
            check("worker killed: the server ends by itself", rc is not None,
                  output(srv)[-800:])

        # ---- the server killed mid-job ----
        d = os.path.join(tmp, "skill")
        srv, wrk = job("skill", os.path.join(d, "server"),
                       os.path.join(d, "worker0"))
        if kill_after_rows("server killed", srv,
                           [os.path.join(d, "server", "iterations.jsonl")],
                           others=(wrk,)):
            n = check_rows("server killed", os.path.join(d, "server"))
            rc = wait_exit(wrk, 60)
            check("server killed: the worker ends by itself, non-zero",
                  rc not in (0, None), output(wrk)[-800:])
            # The worker's exit is orderly: its summary counts the rows
            # it streamed.
            wdir = os.path.join(d, "worker0")
            try:
                with open(os.path.join(wdir, "summary.json")) as f:
                    its = json.load(f)["iterations"]
            except (OSError, ValueError) as e:
                its = repr(e)
            check("server killed: the worker's summary counts its streamed "
                  "rows", its == line_count(
                      os.path.join(wdir, "iterations.jsonl")) and
                  its >= n - 1, "summary %s, rows %d, server rows %d, exit %s\n%s" %
                  (its, line_count(os.path.join(wdir, "iterations.jsonl")),
                   n, rc, output(wrk)[-1500:]))

        # ---- the kernel-UDP bench killed mid-job ----
        d = os.path.join(tmp, "udp")
        bench = procs.start("udp", [
            udp, "--iterations=100000000", "--size_mb=0.25",
            "--server_cpu=-1", "--worker_cpu=-1", "--out_dir=" + d] +
            udp_flags)
        # The server's row of a round comes before the worker's (its STOP
        # is still on the way): wait for both.
        if kill_after_rows("udp bench killed", bench,
                           [os.path.join(d, side, "iterations.jsonl")
                            for side in ("server", "worker")]):
            check_rows("udp bench killed: server", os.path.join(d, "server"))
            check_rows("udp bench killed: worker", os.path.join(d, "worker"))

        # ---- an out_dir that cannot be made fails each app at start ----
        plain = os.path.join(tmp, "plain-file")
        with open(plain, "w") as f:
            f.write("x")
        bad = os.path.join(plain, "sub")
        port = free_port()  # nobody listens: only the out_dir may end it
        for name, cmd in [
                ("server", [server] + eal("bad-srv", "net_null0") +
                 ["--", "--workers=1", "--listen=127.0.0.1:%d" % port,
                  "--join_timeout_ms=30000", "--out_dir=" + bad] +
                 server_flags),
                ("worker", [worker] + eal("bad-w0", "net_null0",
                                          lcore=wcore) +
                 ["--", "--server=127.0.0.1:%d" % port,
                  "--join_timeout_ms=30000", "--out_dir=" + bad] +
                 worker_flags),
                ("udp", [udp, "--role=server", "--control=127.0.0.1:%d" % port,
                         "--out_dir=" + bad] + udp_flags)]:
            p = procs.start("bad-" + name, cmd)
            rc = wait_exit(p, 20)
            out = output(p)
            check("unwritable --out_dir: %s fails at start naming it" % name,
                  rc not in (0, None) and "--out_dir" in out and
                  "cannot" in out, "rc=%s\n%s" % (rc, out[-600:]))
    finally:
        procs.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
        # A killed EAL leaves its runtime directory (megabytes of mapped
        # files) behind: remove this run's, no process holds them now.
        for d in glob.glob("/var/run/dpdk/dblp-crash-%d-*" % os.getpid()):
            shutil.rmtree(d, ignore_errors=True)

    finish()


if __name__ == "__main__":
    main()
