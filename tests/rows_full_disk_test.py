#!/usr/bin/env python3
"""Rows are never lost silently (issue #21, item 6): a full disk under
--out_dir, on every transport.

--out_dir lies on a 64 KiB tmpfs (mount -t tmpfs, needs root; exit 77 to
skip without it), which fills after some hundred rows. Each job is far
longer than the disk can hold:

  * the default (--rows_on_error=fail): the app whose row did not fit says
    so at once, naming the file and the fix, and the job ends there (the
    error names the iteration of the row that did not fit, and no later
    row is on disk); every process exits nonzero within the time limit;
  * --rows_on_error=drop: the job runs to its end (exit 0) and says how
    many rows it dropped;
  * in every case every line of every iterations.jsonl parses as JSON and
    iterations.csv holds the same rows (no truncated line).

Transports: kernel UDP (dblp-udp-server + 2 dblp-udp-workers), DPDK over
memif (dblp-server + dblp-worker, --no-huge) and the simulator (dblp-sim).

Usage: rows_full_disk_test.py BUILD_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dblp_testlib import check, eal, finish, free_port, kill_all, make_secret

TIMEOUT_S = int(os.environ.get("ROWS_TIMEOUT_S", "60"))
LONG_JOB = "1000000"  # iterations: far more rows than 64 KiB holds


def mount_tmpfs(path):
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                        path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    return r.returncode == 0


class Procs:
    """Processes of one case, logged to files, all killed at the end."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, cmd):
        log = open(os.path.join(self.logdir, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def wait_all(self, timeout):
        """{name: exit code or None (still running at the deadline)}."""
        end = time.time() + timeout
        codes = {}
        for name, p, _ in self.procs:
            try:
                codes[name] = p.wait(max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def log(self, name):
        with open(os.path.join(self.logdir, name + ".log"),
                  errors="replace") as f:
            return f.read()

    def cleanup(self):
        kill_all([p for _, p, _ in self.procs])
        for _, _, log in self.procs:
            log.close()
        self.procs = []


def rows_of(out_dir):
    """(parsed jsonl rows, the bad lines, csv data lines) of one out_dir."""
    rows, bad, csv = [], [], 0
    path = os.path.join(out_dir, "iterations.jsonl")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f.read().split("\n")[:-1]:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    bad.append(line[:80])
        with open(path, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            bad.append("no newline at the end: " + repr(data[-40:]))
    path = os.path.join(out_dir, "iterations.csv")
    if os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
        csv = max(0, data.count(b"\n") - 1)
        if data and not data.endswith(b"\n"):
            bad.append("csv: no newline at the end")
    return rows, bad, csv


def check_files(case, dirs):
    total = 0
    for d in dirs:
        rows, bad, csv = rows_of(d)
        total += len(rows)
        check("%s: every line of %s parses" % (case, os.path.basename(d)),
              not bad, "\n".join(bad[:3]))
        check("%s: %s/iterations.csv holds the same rows" %
              (case, os.path.basename(d)), csv == len(rows),
              "csv %d, jsonl %d" % (csv, len(rows)))
    check("%s: some rows were written" % case, total > 0)


def check_failed(case, procs, codes, dirs, disk):
    """The default: the job ends at the first row that did not fit."""
    check("%s: every process ends within %d s" % (case, TIMEOUT_S),
          all(c is not None for c in codes.values()), codes)
    check("%s: every process exits nonzero" % case,
          all(c not in (None, 0) for c in codes.values()), codes)
    named = [n for n in codes if re.search(
        re.escape(disk) + r"/\S*iterations\.(jsonl|csv)", procs.log(n))
        and "free space" in procs.log(n)]
    check("%s: the error names the file and the fix" % case, named,
          {n: procs.log(n)[-600:] for n in codes})
    # The row that did not fit is the last one tried: none after it.
    for n in named:
        m = re.search(r"at iteration (\d+), rank (\d+)", procs.log(n))
        if not m:
            check("%s: %s names the row's iteration" % (case, n), False,
                  procs.log(n)[-600:])
            continue
        it = int(m.group(1))
        later = [r for r in rows_of(dirs[n])[0] if r["iteration"] > it]
        check("%s: %s stopped at the row that did not fit" % (case, n),
              not later, "rows after iteration %d: %d" % (it, len(later)))
    check_files(case, dirs.values())


def check_dropped(case, procs, codes, dirs):
    check("%s: every process exits 0" % case,
          all(c == 0 for c in codes.values()),
          {n: (codes[n], procs.log(n)[-400:]) for n in codes})
    said = [n for n in codes if re.search(r"\d+ rows dropped", procs.log(n))]
    check("%s: the dropped rows are counted on stderr" % case, said,
          {n: procs.log(n)[-400:] for n in codes})
    check_files(case, dirs.values())


def udp_case(build, tmp, disk, mode, iterations):
    case = "udp " + mode
    procs = Procs(tmp)
    secret = make_secret(os.path.join(tmp, "udp.secret"))
    port = free_port()
    out = os.path.join(disk, "udp-" + mode)
    dirs = {"server": out + "/server", "w0": out + "/w0", "w1": out + "/w1"}
    common = ["--secret_file=" + secret, "--round_timeout_ms=10000"]
    if mode != "fail":  # the default
        common.append("--rows_on_error=" + mode)
    try:
        procs.start("server", [
            os.path.join(build, "apps", "dblp-udp-server"), "--workers=2",
            "--control=127.0.0.1:%d" % port, "--join_timeout_ms=20000",
            "--out_dir=" + dirs["server"]] + common)
        time.sleep(0.3)
        for w in ("w0", "w1"):
            procs.start(w, [
                os.path.join(build, "apps", "dblp-udp-worker"),
                "--server=127.0.0.1:%d" % port, "--name=" + w,
                "--floats=1000", "--iterations=" + iterations,
                "--out_dir=" + dirs[w]] + common)
        codes = procs.wait_all(TIMEOUT_S)
        if mode == "fail":
            check_failed(case, procs, codes, dirs, disk)
        else:
            check_dropped(case, procs, codes, dirs)
    finally:
        procs.cleanup()
        shutil.rmtree(out, ignore_errors=True)


def memif_case(build, tmp, disk):
    case = "memif fail"
    procs = Procs(tmp)
    secret = make_secret(os.path.join(tmp, "memif.secret"))
    port = free_port()
    sock = os.path.join(tmp, "rows.sock")
    out = os.path.join(disk, "memif")
    dirs = {"server": out + "/server", "w0": out + "/w0"}
    common = ["--secret_file=" + secret, "--stats_period=0",
              "--idle_sleep_us=100", "--round_timeout_ms=10000"]
    wcore = "1" if (os.cpu_count() or 1) > 1 else "0"
    try:
        procs.start("server", [os.path.join(build, "apps", "dblp-server")] +
                    eal("rowsdisk", "srv",
                        "net_memif0,role=server,socket=%s,id=0" % sock) +
                    ["--", "--workers=1", "--listen=127.0.0.1:%d" % port,
                     "--join_timeout_ms=30000",
                     "--out_dir=" + dirs["server"]] + common)
        time.sleep(0.8)
        procs.start("w0", [os.path.join(build, "apps", "dblp-worker")] +
                    eal("rowsdisk", "w0",
                        "net_memif0,role=client,socket=%s,id=0" % sock,
                        lcore=wcore) +
                    ["--", "--server=127.0.0.1:%d" % port,
                     "--iterations=" + LONG_JOB, "--floats=1000",
                     "--out_dir=" + dirs["w0"]] + common)
        codes = procs.wait_all(TIMEOUT_S)
        check_failed(case, procs, codes, dirs, disk)
    finally:
        procs.cleanup()
        shutil.rmtree(out, ignore_errors=True)


def sim_case(build, tmp, disk):
    case = "sim fail"
    procs = Procs(tmp)
    out = os.path.join(disk, "sim")
    try:
        procs.start("sim", [os.path.join(build, "apps", "dblp-sim"),
                            "--workers=2", "--floats=1000",
                            "--iterations=" + LONG_JOB, "--out_dir=" + out])
        codes = procs.wait_all(TIMEOUT_S)
        check("sim fail: ends nonzero within %d s" % TIMEOUT_S,
              codes["sim"] not in (None, 0), codes)
        log = procs.log("sim")
        check("sim fail: the error names the file and the fix",
              re.search(re.escape(out) + r"/\S*iterations\.(jsonl|csv)", log)
              and "free space" in log, log[-600:])
        check_files(case, [os.path.join(out, d) for d in
                           ("server", "worker0", "worker1")])
    finally:
        procs.cleanup()
        shutil.rmtree(out, ignore_errors=True)


def main():
    build = sys.argv[1]
    if os.geteuid() != 0:
        print("SKIP: mounting a tmpfs needs root")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="dblp-rowsdisk-")
    disk = os.path.join(tmp, "disk")
    os.makedirs(disk)
    if not mount_tmpfs(disk):
        shutil.rmtree(tmp, ignore_errors=True)
        print("SKIP: cannot mount a tmpfs here")
        sys.exit(77)
    try:
        if os.path.exists(os.path.join(build, "apps", "dblp-server")):
            memif_case(build, tmp, disk)
        udp_case(build, tmp, disk, "fail", LONG_JOB)
        udp_case(build, tmp, disk, "drop", "400")
        sim_case(build, tmp, disk)
    finally:
        subprocess.run(["umount", disk])
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
