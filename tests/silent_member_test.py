#!/usr/bin/env python3
"""A member that stays connected but goes silent (SIGSTOP: the kernel keeps
its TCP connection open, so only the datapath can tell) — issue #35, item 1.

Under --on_worker_loss=continue the server declares it lost one
--round_timeout_ms after the round stopped moving, the round closes without
it and the job goes on: the healthy workers keep iterating, their own
watchdogs quiet (a worker whose sides are done and that waits for the
server to open the next round allows two timeouts: round_pacer.h). Under
abort every process ends, the healthy workers naming the silent one (the
server's ERROR), not a stall of their own.

memif (dblp-server, dblp-worker) and kernel UDP (dblp-udp-server,
dblp-udp-worker), 3 workers, the last one stopped a few iterations in. The
simulator (dblp-sim --silent_worker) models the same member in modelled
time, silent from a push and from a broadcast.

Usage: silent_member_test.py BUILD_DIR
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, finish, free_port, make_secret  # noqa
import watchdog_test as wt  # noqa: E402
from watchdog_test import Proc, detail, wait_ended  # noqa: E402

TIMEOUT_MS = 2000
wt.TIMEOUT_MS = TIMEOUT_MS  # its memif_job's apps
WORKERS = 3


def server_rows(out_dir):
    """Iterations the server has written rows for."""
    path = os.path.join(out_dir, "iterations.jsonl")
    its = set()
    try:
        with open(path) as f:
            for line in f:
                try:
                    its.add(json.loads(line)["iteration"])
                except (ValueError, KeyError):
                    pass
    except OSError:
        pass
    return len(its)


def memif_job(build, tmp, name, secret, server_flags):
    out = os.path.join(tmp, name + "-server")
    _, srv, ws = wt.memif_job(
        build, tmp, name, secret, WORKERS,
        server_flags + ["--out_dir=" + out, "--rank_order=name"],
        names=["w%d" % w for w in range(WORKERS)])
    return srv, ws, out


def udp_job(build, tmp, name, secret, server_flags):
    port = free_port()
    out = os.path.join(tmp, name + "-server")
    common = ["--secret_file=" + secret, "--round_timeout_ms=%d" % TIMEOUT_MS]
    srv = Proc(tmp, name + "-server",
               [os.path.join(build, "apps", "dblp-udp-server"),
                "--workers=%d" % WORKERS, "--control=127.0.0.1:%d" % port,
                "--out_dir=" + out, "--rank_order=name"] + common +
               server_flags)
    time.sleep(0.3)
    ws = [Proc(tmp, "%s-w%d" % (name, w),
               [os.path.join(build, "apps", "dblp-udp-worker"),
                "--server=127.0.0.1:%d" % port, "--iterations=100000",
                "--floats=20000", "--name=w%d" % w] + common)
          for w in range(WORKERS)]
    return srv, ws, out


def wait_rows(out, n, timeout_s, procs):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server_rows(out) >= n:
            return True
        if any(p.poll() for p in procs):
            return False
        time.sleep(0.05)
    return False


def case(build, tmp, secret, transport, policy):
    name = "%s-%s" % (transport, policy)
    job = memif_job if transport == "memif" else udp_job
    srv, ws, out = job(build, tmp, name, secret,
                       ["--on_worker_loss=" + policy])
    victim, healthy = ws[-1], ws[:-1]
    label = "worker %d (w%d)" % (WORKERS - 1, WORKERS - 1)
    try:
        running = wait_rows(out, 5, 60, [srv] + ws)
        victim.p.send_signal(signal.SIGSTOP)
        stopped = time.time()
        if policy == "continue":
            lost = srv.wait_for(r"continuing without worker %d \(went silent"
                                % (WORKERS - 1), TIMEOUT_MS / 1000.0 * 3 + 10)
            at_loss = server_rows(out)
            # Two more timeouts' worth: the healthy ones must still run and
            # the server must still close rounds.
            time.sleep(2.5 * TIMEOUT_MS / 1000.0)
            after = server_rows(out)
            alive = not any(p.poll() for p in [srv] + healthy)
            check("%s, continue: a silent member is declared lost within "
                  "the timeout + 2 s, named, and the round goes on" %
                  transport,
                  running and lost is not None and
                  lost - stopped <= TIMEOUT_MS / 1000.0 + 2.0,
                  detail(srv, *ws))
            check("%s, continue: the healthy workers and the server keep "
                  "iterating (rows %d at the loss, %d after 2.5 timeouts)" %
                  (transport, at_loss, after),
                  alive and after >= at_loss + 3, detail(srv, *ws))
            # Woken, the lost member learns why it is out (the server's
            # ERROR), not a stall of its own after another timeout.
            victim.p.send_signal(signal.SIGCONT)
            woke = time.time()
            wait_ended([victim], TIMEOUT_MS / 1000.0 * 3 + 10)
            # (A DPDK app's own exit, EAL and memif teardown, takes a
            # few seconds on this host; the text shows it was the ERROR.)
            check("%s, continue: the lost member, woken, ends within 5 s "
                  "(%s) saying the job went on without it" %
                  (transport, None if victim.ended is None else
                   "%.1f s" % (victim.ended - woke)),
                  victim.ended is not None and victim.ended - woke <= 5.0 and
                  victim.p.returncode == 1 and
                  "went on without this worker" in victim.text(),
                  detail(victim))
        else:
            wait_ended([srv] + healthy, TIMEOUT_MS / 1000.0 * 3 + 15)
            ended = all(p.ended is not None for p in [srv] + healthy)
            check("%s, abort: the server ends naming the silent member" %
                  transport,
                  running and ended and srv.p.returncode == 1 and
                  label in srv.text(), detail(srv))
            check("%s, abort: each healthy worker ends naming the silent "
                  "member (the server's cause), not a stall of its own" %
                  transport,
                  ended and all(p.p.returncode == 1 and label in p.text()
                                and "stalled" not in p.text()
                                for p in healthy), detail(*healthy))
    finally:
        for p in [srv] + ws:
            p.kill()


def sim_rows(out_dir):
    path = os.path.join(out_dir, "iterations.jsonl")
    try:
        with open(path) as f:
            return len(f.read().splitlines())
    except OSError:
        return -1


STOPPED_AT = 5  # the simulator's silent member's iteration


def sim_case(build, tmp, policy, during):
    """dblp-sim, 3 workers, worker 2 silent from iteration 5's `during`:
    its rows stop at 5 (iterations 0-4, one each), the others' go on."""
    out = os.path.join(tmp, "sim-%s-%s" % (policy, during))
    p = Proc(tmp, "sim-%s-%s" % (policy, during),
             [os.path.join(build, "apps", "dblp-sim"), "--workers=3",
              "--iterations=12", "--floats=20000", "--out_dir=" + out,
              "--round_timeout_ms=%d" % TIMEOUT_MS, "--silent_worker=2",
              "--silent_iteration=%d" % STOPPED_AT,
              "--silent_during=" + during,
              "--on_worker_loss=" + policy])
    try:
        wait_ended([p], 60)
    finally:
        p.kill()
    text = p.text()
    if policy == "continue":
        check("sim, continue, silent at the %s: lost after the timeout "
              "(modelled), the job runs its 12 iterations, the member's "
              "rows stop at 5" % during,
              p.p.returncode == 0 and
              "continuing without worker 2 (went silent: %s round" %
              during in text and sim_rows(out + "/worker0") >= 12 and
              sim_rows(out + "/server") == 3 * sim_rows(out + "/worker0")
              and sim_rows(out + "/worker2") == STOPPED_AT, detail(p))
    else:
        check("sim, abort, silent at the %s: the job ends naming the "
              "member" % during,
              p.p.returncode == 1 and
              ("worker 2 (simulated) 0/" in text if during == "push"
               else "not delivered to: worker 2 (simulated)" in text),
              detail(p))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dblp-silent-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    try:
        for policy in ("continue", "abort"):
            for during in ("push", "broadcast"):
                sim_case(build, tmp, policy, during)
        for transport in ("memif", "udp"):
            for policy in ("continue", "abort"):
                case(build, tmp, secret, transport, policy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    sys.exit(main())
