#!/usr/bin/env python3
"""The server's job makes the same calls in the same order on every
transport (issue #36, item 1).

ServerJob logs each call it is made, at debug level, as "<app>: job: ..."
(lib/dblp/job/server_job.h): a push opened (its p), a push closed (the
divisor, each worker's chunks, the broadcast's and the next push's p), a
broadcast closed, a BYE, a worker lost. The same job runs on the three
servers — dblp-sim (modelled time), dblp-udp-server (kernel UDP) and
dblp-server (DPDK, memif) — and their journals must be equal line for
line: the order of the calls (a push opens beside the broadcast of the
one before), and what each call decided.

Two jobs: a clean one (2 workers, 6 iterations, --policy=fixed: every
push and broadcast at p = 0.1, so each round may close short), and a
push-feedback job under --policy=reliable with resync every 3. The BYEs
(one per worker, after the last push) may interleave with the last
broadcast's close as the control and data planes race; the check keeps
them apart: the journals without BYEs must be equal, and each must end
with one BYE per worker after its last "open push".

Usage: server_call_order_test.py BUILD_DIR
"""

import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, eal, finish, free_port, make_secret  # noqa
from watchdog_test import Proc, detail, wait_ended  # noqa: E402

WORKERS = 2
ITERATIONS = 6
FLOATS = 20000
JOB_LINE = re.compile(r"^(?:dblp-server|dblp-udp-server|sim-server): "
                      r"job: (.*)$")


def journal(text):
    """The job's lines, without the app's name."""
    lines = []
    for line in text.splitlines():
        m = JOB_LINE.search(line)
        if m:
            lines.append(m.group(1).strip())
    return lines


def split_byes(lines):
    """(the journal without BYEs, whether each worker's BYE came once and
    after the last push opened)."""
    rest = [ln for ln in lines if not ln.startswith("bye from worker")]
    byes = [i for i, ln in enumerate(lines) if ln.startswith("bye from")]
    opens = [i for i, ln in enumerate(lines) if ln.startswith("open push")]
    who = sorted(lines[i] for i in byes)
    ok = (who == ["bye from worker %d" % w for w in range(WORKERS)] and
          bool(opens) and min(byes, default=-1) > max(opens))
    return rest, ok


def sim(build, tmp, name, flags):
    p = Proc(tmp, name + "-sim",
             [os.path.join(build, "apps", "dblp-sim"),
              "--workers=%d" % WORKERS, "--iterations=%d" % ITERATIONS,
              "--floats=%d" % FLOATS, "--out_dir=" + os.path.join(tmp, name +
                                                                  "-sim")] +
             flags)
    return [p]


def udp(build, tmp, name, flags, secret):
    port = free_port()
    srv = Proc(tmp, name + "-udp-server",
               [os.path.join(build, "apps", "dblp-udp-server"),
                "--workers=%d" % WORKERS, "--control=127.0.0.1:%d" % port,
                "--secret_file=" + secret, "--rank_order=name"] + flags)
    srv.wait_for(r"waiting for|listening|control", 20)
    time.sleep(0.3)
    ws = [Proc(tmp, "%s-udp-w%d" % (name, w),
               [os.path.join(build, "apps", "dblp-udp-worker"),
                "--server=127.0.0.1:%d" % port, "--secret_file=" + secret,
                "--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS,
                "--name=w%d" % w])
          for w in range(WORKERS)]
    return [srv] + ws


def dpdk(build, tmp, name, flags, secret):
    port = free_port()
    socks = [os.path.join(tmp, "%s-w%d.sock" % (name, w))
             for w in range(WORKERS)]
    vdevs = ["net_memif%d,role=server,socket=%s,id=0" % (w, s)
             for w, s in enumerate(socks)]
    args = eal("order", name + "-s", *vdevs)
    args[args.index("--log-level=*:warning")] = "--log-level=dblp:debug"
    srv = Proc(tmp, name + "-dpdk-server",
               [os.path.join(build, "apps", "dblp-server")] + args +
               ["--", "--workers=%d" % WORKERS,
                "--listen=127.0.0.1:%d" % port, "--secret_file=" + secret,
                "--stats_period=0", "--idle_sleep_us=100",
                "--rank_order=name"] + flags)
    srv.wait_for(r"waiting for \d+ workers", 60)
    ws = []
    for w in range(WORKERS):
        ws.append(Proc(tmp, "%s-dpdk-w%d" % (name, w),
                       [os.path.join(build, "apps", "dblp-worker")] +
                       eal("order", "%s-w%d" % (name, w),
                           "net_memif0,role=client,socket=%s,id=0" % socks[w],
                           lcore="1" if os.cpu_count() > 1 else "0") +
                       ["--", "--server=127.0.0.1:%d" % port,
                        "--secret_file=" + secret,
                        "--iterations=%d" % ITERATIONS,
                        "--floats=%d" % FLOATS, "--stats_period=0",
                        "--idle_sleep_us=100", "--name=w%d" % w]))
        time.sleep(0.2)
    return [srv] + ws


def run(procs):
    try:
        wait_ended(procs, 120)
    finally:
        for p in procs:
            p.kill()
    return procs[0]


def main():
    build = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dblp-order-")
    secret = make_secret(os.path.join(tmp, "secret"))
    os.environ["DBLP_LOG_LEVEL"] = "debug"  # dblp-sim, the UDP apps
    jobs = {
        "fixed": ["--policy=fixed", "--p_fixed=0.1"],
        "feedback": ["--policy=reliable", "--push_feedback",
                     "--resync_every=3"],
    }
    try:
        for name, flags in jobs.items():
            servers = {
                "sim": run(sim(build, tmp, name, flags)),
                "udp": run(udp(build, tmp, name, flags, secret)),
                "dpdk": run(dpdk(build, tmp, name, flags, secret)),
            }
            journals = {}
            for kind, srv in servers.items():
                lines = journal(srv.text())
                rest, byes_ok = split_byes(lines)
                journals[kind] = rest
                closes = sum(ln.startswith("close push") for ln in rest)
                check("%s, %s: the server ends well, its journal closes %d "
                      "pushes and as many broadcasts, and has one BYE per "
                      "worker after the last push opened" %
                      (name, kind, closes),
                      srv.p.returncode == 0 and byes_ok and
                      closes >= ITERATIONS and closes == sum(
                          ln.startswith("close broadcast") for ln in rest),
                      detail(srv))
            ref = journals["dpdk"]
            for kind in ("sim", "udp"):
                got = journals[kind]
                diff = next((i for i, (a, b) in enumerate(zip(ref, got))
                             if a != b), min(len(ref), len(got)))
                check("%s: %s's journal equals dblp-server's (%d lines)" %
                      (name, kind, len(ref)),
                      got == ref and len(ref) > 2 * ITERATIONS,
                      "first difference at line %d:\n  dpdk: %s\n  %s: %s" %
                      (diff, ref[diff] if diff < len(ref) else "(end)",
                       kind, got[diff] if diff < len(got) else "(end)"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    sys.exit(main())
