#!/usr/bin/env python3
"""Admission that a flood of strangers cannot starve (issue #21, item 4).

256 strangers flood the control port of a dblp-udp-server (its default
--control_* limits) and reconnect as soon as the server closes them: from
127.0.0.2..127.0.0.5 and from 127.0.0.1, the worker's own address; they send nothing (every slot
stays held until its 10 s join deadline on the old code). While they run, a
real dblp-udp-worker retries its JOIN (a fresh process per try, as an
operator's retry loop would) until one gets in.

Checked: the worker's first row is written within 5 s of its first try;
the job completes (server and worker exit 0); the server counted the
strangers it evicted (control_connections_evicted in its report) and is
still serving strangers afterwards (the flood kept connecting).

On 8cec710 every slot stayed held: each try was told "too many
connections ... try later" until the flood stopped.

Usage: control_admission_test.py BUILD_DIR
"""

import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dblp_testlib import check, finish, free_port, make_secret  # noqa: E402

STRANGERS = 256
SOURCES = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
GET_IN_S = 5.0
FLOOD_SETTLE_S = 2.0
TRY_LIMIT_S = 30.0  # give up trying (the check fails long before)


def flood(port, stop_path, stats_path):
    """The strangers, in a child process: one epoll loop, reconnecting each
    socket the moment the server closes it. Writes its counts at the end."""
    sel = selectors.DefaultSelector()
    connects = closes = failures = 0

    def open_one(i):
        nonlocal connects, failures
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((SOURCES[i % len(SOURCES)], 0))
            err = s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            failures += 1
            return False
        if err not in (0, errno.EINPROGRESS):
            s.close()
            failures += 1
            return False
        connects += 1
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE,
                     [i, False])
        return True

    pending = list(range(STRANGERS))
    while not os.path.exists(stop_path):
        retry = []
        for i in pending:
            if not open_one(i):
                retry.append(i)
        pending = retry
        for key, ev in sel.select(timeout=0.05):
            s, (i, spoke) = key.fileobj, key.data
            if ev & selectors.EVENT_WRITE and not spoke:
                key.data[1] = True  # connected
                sel.modify(s, selectors.EVENT_READ, key.data)
                continue
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                continue  # the server's ERROR; its close follows
            sel.unregister(s)
            s.close()
            closes += 1
            pending.append(i)
        if pending:
            time.sleep(0.001)  # refused connects (fd limits): do not spin
    with open(stats_path, "w") as f:
        json.dump({"connects": connects, "closes": closes,
                   "failures": failures}, f)


def main():
    build = sys.argv[1]
    server_bin = os.path.join(build, "apps", "dblp-udp-server")
    worker_bin = os.path.join(build, "apps", "dblp-udp-worker")
    tmp = tempfile.mkdtemp(prefix="dblp-admission-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    port = free_port()
    slog = open(os.path.join(tmp, "server.log"), "w")
    srv = subprocess.Popen(
        [server_bin, "--secret_file=" + secret, "--workers=1",
         "--control=127.0.0.1:%d" % port,
         "--join_timeout_ms=60000", "--round_timeout_ms=20000",
         "--out_dir=" + os.path.join(tmp, "server")],
        stdout=slog, stderr=subprocess.STDOUT)
    stop_path = os.path.join(tmp, "stop")
    stats_path = os.path.join(tmp, "flood.json")
    child = None
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.1)
        child = os.fork()
        if child == 0:
            try:
                flood(port, stop_path, stats_path)
            finally:
                os._exit(0)
        time.sleep(FLOOD_SETTLE_S)  # every slot the strangers can hold
        run(worker_bin, secret, port, tmp)
        open(stop_path, "w").close()
        os.waitpid(child, 0)
        child = None
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        slog.close()
        with open(os.path.join(tmp, "server.log")) as f:
            server_log = f.read()
        check("the server ends the job cleanly", srv.returncode == 0,
              server_log[-1500:])
        with open(stats_path) as f:
            stats = json.load(f)
        print("flood: %(connects)d connects, %(closes)d closed by the server,"
              " %(failures)d failed" % stats)
        check("the strangers kept reconnecting", stats["closes"] > STRANGERS,
              stats)
        counters = server_counters(tmp)
        print("server counters: %s" % {k: v for k, v in counters.items()
                                       if k.startswith("control_")})
        check("the server counted the strangers it evicted",
              counters.get("control_connections_evicted", 0) > 0, counters)
    finally:
        if child:
            open(stop_path, "w").close()
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    finish()


def server_counters(tmp):
    """The counters of the server's run report, wherever it wrote it."""
    for root, _, files in os.walk(os.path.join(tmp, "server")):
        for name in files:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(root, name)) as f:
                    report = json.load(f)
            except (OSError, ValueError):
                continue
            c = report.get("counters") if isinstance(report, dict) else None
            if isinstance(c, dict) and "control_refused_joins" in c:
                return c
    return {}


def run(worker_bin, secret, port, tmp):
    """Retries the worker until one gets in; checks how long that took."""
    t0 = time.time()
    tries, refusals, winner, got_in = 0, [], None, None
    while time.time() - t0 < TRY_LIMIT_S and winner is None:
        tries += 1
        out = os.path.join(tmp, "w%d" % tries)
        p = subprocess.Popen(
            [worker_bin, "--secret_file=" + secret,
             "--server=127.0.0.1:%d" % port, "--name=w0",
             "--gradient=integer", "--floats=2000", "--iterations=3",
             "--join_timeout_ms=3000", "--round_timeout_ms=20000",
             "--out_dir=" + out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rows = os.path.join(out, "iterations.jsonl")
        while p.poll() is None and got_in is None:
            if os.path.exists(rows) and os.path.getsize(rows) > 0:
                got_in = time.time() - t0
            time.sleep(0.005)
        text = p.communicate(timeout=60)[0]
        if p.returncode == 0:
            winner = (tries, text)
            if got_in is None:
                got_in = time.time() - t0
        else:
            refusals.append(text.strip().splitlines()[-1] if text else "")
            got_in = None
    print("worker: %d tries, in after %s s" %
          (tries, "%.2f" % got_in if got_in is not None else "never"))
    for r in refusals[:3]:
        print("  refused: " + r)
    check("a retrying worker gets in within %.0f s of its first try"
          % GET_IN_S, got_in is not None and got_in <= GET_IN_S,
          "%d tries; last refusal: %s" % (tries, refusals[-1:] or "none"))
    check("its job completes", winner is not None,
          refusals[-1:] or "no try finished")


if __name__ == "__main__":
    main()
