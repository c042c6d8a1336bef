#!/usr/bin/env python3
"""SIGINT and SIGTERM end the kernel-UDP apps as they end the DPDK apps
(issue #35, item 5): the signalled app says "interrupted", exits 1 and
writes its summary.json and rows; its peer ends naming it. On 2e16acc both
dblp-udp-server and dblp-udp-worker died by the signal with no summary.

Usage: udp_signal_test.py BUILD_DIR
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, finish, free_port, make_secret  # noqa: E402
from watchdog_test import Proc, detail, wait_ended  # noqa: E402


def summary(out_dir):
    try:
        with open(os.path.join(out_dir, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rows(out_dir):
    try:
        return os.path.getsize(os.path.join(out_dir, "iterations.jsonl"))
    except OSError:
        return 0


def case(build, tmp, secret, victim_role, sig):
    name = "%s-%s" % (victim_role, sig.name)
    port = free_port()
    common = ["--secret_file=" + secret, "--round_timeout_ms=5000"]
    out = {r: os.path.join(tmp, name, r) for r in ("server", "worker")}
    srv = Proc(tmp, name + "-server",
               [os.path.join(build, "apps", "dblp-udp-server"), "--workers=1",
                "--control=127.0.0.1:%d" % port,
                "--out_dir=" + out["server"]] + common)
    time.sleep(0.3)
    w = Proc(tmp, name + "-worker",
             [os.path.join(build, "apps", "dblp-udp-worker"),
              "--server=127.0.0.1:%d" % port, "--iterations=100000000",
              "--floats=20000", "--out_dir=" + out["worker"]] + common)
    procs = {"server": srv, "worker": w}
    try:
        deadline = time.time() + 30
        while rows(out["worker"]) == 0 and time.time() < deadline and \
                not (srv.poll() or w.poll()):
            time.sleep(0.05)
        victim = procs[victim_role]
        victim.p.send_signal(sig)
        wait_ended([srv, w], 15)
        s = summary(out[victim_role])
        check("udp: %s to the %s: it ends with exit 1 saying interrupted, "
              "summary.json written" % (sig.name, victim_role),
              victim.ended is not None and victim.p.returncode == 1 and
              "interrupted" in victim.text() and s is not None and
              rows(out[victim_role]) > 0, detail(victim))
        peer_role = "worker" if victim_role == "server" else "server"
        peer = procs[peer_role]
        check("udp: %s to the %s: its peer ends too, with its summary" %
              (sig.name, victim_role),
              peer.ended is not None and summary(out[peer_role]) is not None,
              detail(peer))
    finally:
        for p in (srv, w):
            p.kill()


def main():
    build = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dblp-udpsig-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    try:
        for role in ("worker", "server"):
            for sig in (signal.SIGINT, signal.SIGTERM):
                case(build, tmp, secret, role, sig)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    sys.exit(main())
