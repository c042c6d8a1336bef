#!/usr/bin/env python3
"""How dblp-server and dblp-worker behave on bad input and lost peers.

Every case must end by itself with a clear message: bad flags exit 2 naming
the flag; a missing port or missing hugepages names the fix; a worker that
cannot reach the server says how to fix it; a worker killed mid-job makes
the server stop with an error naming the worker (--on_worker_loss=abort) or
carry on without it (--on_worker_loss=continue). Nothing may hang.

Usage: app_behaviour_test.py BUILD_DIR
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dblp_testlib import check, finish, free_port  # noqa: E402







SECRET = None  # a job secret file, made in main()


def with_secret(cmd):
    """Every app of these jobs shares one secret (after the "--")."""
    if "--" not in cmd or any(a.startswith(("--secret_file", "--insecure"))
                              for a in cmd):
        return cmd
    i = cmd.index("--") + 1
    return cmd[:i] + ["--secret_file=" + SECRET] + cmd[i:]


def popen(cmd, **kw):
    return subprocess.Popen(with_secret(cmd), **kw)


def run(cmd, timeout=60):
    cmd = with_secret(cmd)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") \
            if isinstance(e.stdout, bytes) else (e.stdout or "")


def eal(prefix, *vdevs, lcore="0"):
    args = ["-l", lcore, "--no-huge", "-m", "256", "--no-pci",
            "--file-prefix=dblp-beh-%d-%s" % (os.getpid(), prefix),
            "--log-level=*:warning"]
    return args + ["--vdev=" + v for v in vdevs]


def main():
    build = sys.argv[1]
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    tmp = tempfile.mkdtemp(prefix="dblp-beh-")
    global SECRET
    SECRET = os.path.join(tmp, "job.secret")
    with os.fdopen(os.open(SECRET, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(32))

    # ---- bad flags: exit 2, the message names the flag ----
    for binary, flag, needle in [
            (server, "--policy=bogus", "policy"),
            (server, "--p_high=1.5", "p_high"),
            (server, "--loss=bernoulli:2", "loss"),
            (server, "--burst_iters=1,x", "burst"),
            (server, "--checksum=maybe", "checksum"),
            (server, "--on_worker_loss=shrug", "on_worker_loss"),
            (worker, "--gradient=weights.bin", "gradient"),
            (worker, "--send_order=random", "send_order"),
            (worker, "--bcast_fill=magic", "bcast_fill"),
            (server, "--bcast_tolerance=sometimes", "bcast_tolerance"),
            (server, "--paper_mode --push_fill=rescale", "paper_mode"),
            (server, "--resync_every=5 --bcast_tolerance=none",
             "resync_every"),
            (server, "--push_feedback --push_fill=prev", "push_feedback"),
            (server, "--resync_every=-2", "resync_every"),
            (server, "--push_feedback --push_fill=rescale", "push_feedback"),
            (server, "--bcast_tolerance=consistent --policy=ltp",
             "consistent"),
            (server, "--bcast_tolerance=consistent --policy=combined",
             "consistent"),
            (server, "--policy=deadline --deadline_factor=0.5",
             "deadline_factor")]:
        rc, out = run([binary] + eal("flags", "net_null0") + ["--"] +
                      flag.split())
        check("bad flag %s %s" % (os.path.basename(binary), flag),
              rc == 2 and needle in out and "error" in out.lower(),
              "rc=%s out=%s" % (rc, out[-400:]))

    # ---- no port at all ----
    rc, out = run([server] + eal("noport") + ["--", "--workers=1"])
    check("server without a port names -a / --vdev",
          rc not in (0, None) and "--vdev" in out and "-a" in out, out[-400:])

    # ---- hugepages: without --no-huge on a machine with none reserved ----
    with open("/proc/meminfo") as f:
        huge_free = [l for l in f if l.startswith("HugePages_Free")]
    if huge_free and int(huge_free[0].split()[1]) == 0:
        rc, out = run([server, "-l", "0", "--no-pci",
                       "--file-prefix=dblp-beh-%d-huge" % os.getpid(),
                       "--vdev=net_null0", "--", "--workers=1"])
        check("missing hugepages names the fix",
              rc not in (0, None) and ("--no-huge" in out or
                                       "hugepages" in out.lower()),
              out[-600:])

    # ---- worker with no server to talk to ----
    port = free_port()
    rc, out = run([worker] + eal("nosrv", "net_null0") +
                  ["--", "--server=127.0.0.1:%d" % port,
                   "--join_timeout_ms=800"], timeout=30)
    check("worker without a server says to start dblp-server",
          rc not in (0, None) and "dblp-server" in out, out[-400:])

    # ---- a worker that would double-count a consistent broadcast ----
    port = free_port()
    sock = os.path.join(tmp, "cons-w0.sock")
    srv = popen(
        [server] + eal("cons", "net_memif0,role=server,socket=%s,id=0" % sock)
        + ["--", "--workers=1", "--listen=127.0.0.1:%d" % port,
           "--bcast_tolerance=consistent", "--stats_period=0",
           "--join_timeout_ms=20000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.8)
    rc, out = run([worker] + eal("cons-w0", "net_memif0,role=client,"
                                 "socket=%s,id=0" % sock,
                                 lcore="1" if os.cpu_count() > 1 else "0") +
                  ["--", "--server=127.0.0.1:%d" % port, "--iterations=5",
                   "--floats=5000", "--bcast_fill=prev", "--stats_period=0"],
                  timeout=60)
    check("worker refuses --bcast_fill=prev under a consistent broadcast",
          rc not in (0, None) and "--bcast_fill=zero" in out, out[-400:])
    try:
        srv.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        srv.communicate()

    # ---- a worker killed mid-job: abort and continue modes ----
    for mode in ("abort", "continue"):
        port = free_port()
        socks = [os.path.join(tmp, "%s-w%d.sock" % (mode, w)) for w in (0, 1)]
        srv = popen(
            [server] + eal("loss-" + mode,
                           "net_memif0,role=server,socket=%s,id=0" % socks[0],
                           "net_memif1,role=server,socket=%s,id=0" % socks[1]) +
            ["--", "--workers=2", "--listen=127.0.0.1:%d" % port,
             "--policy=fixed", "--stats_period=0", "--idle_sleep_us=100",
             "--on_worker_loss=" + mode, "--round_timeout_ms=5000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.8)
        ws = []
        # Worker 1's output goes to a file polled for its WELCOME line, so it
        # is killed mid-job rather than after a fixed delay: a worker linked
        # with libtorch takes a moment longer to start, more on a busy host.
        w1_log = os.path.join(tmp, "%s-w1.log" % mode)
        for w in (0, 1):
            # Both long enough that worker 1 is killed mid-job; worker 0
            # finishes alone in continue mode.
            iters = "8000"
            out_to = open(w1_log, "w") if w == 1 else subprocess.PIPE
            ws.append(popen(
                [worker] + eal("loss-%s-w%d" % (mode, w),
                               "net_memif0,role=client,socket=%s,id=0"
                               % socks[w], lcore="1" if os.cpu_count() > 1
                               else "0") +
                ["--", "--server=127.0.0.1:%d" % port, "--iterations=" + iters,
                 "--floats=50000", "--stats_period=0",
                 "--idle_sleep_us=100"],
                stdout=out_to, stderr=subprocess.STDOUT, text=True))
            if w == 1:
                out_to.close()  # the child holds its own descriptor
            time.sleep(0.2)
        deadline = time.time() + 30
        killed_rank = "1"
        while time.time() < deadline:
            with open(w1_log) as f:
                # Ranks follow the JOIN order, not the launch order.
                m = re.search(r"dblp-worker: rank (\d+)", f.read())
            if m:
                killed_rank = m.group(1)
                break
            time.sleep(0.1)
        time.sleep(0.5)  # a few iterations into the job
        ws[1].send_signal(signal.SIGKILL)  # worker 1 dies mid-job
        ws[1].wait()
        try:
            out, _ = srv.communicate(timeout=60)
            rc = srv.returncode
        except subprocess.TimeoutExpired:
            srv.kill()
            out, rc = srv.communicate()[0], None
        try:
            wout, _ = ws[0].communicate(timeout=60)
            wrc = ws[0].returncode
        except subprocess.TimeoutExpired:
            ws[0].kill()
            wout, wrc = ws[0].communicate()[0], None
        if mode == "abort":
            # Exit code 1 with its summary printed: a crash (memif's close
            # raced its own teardown of the dead worker's port) or a hang
            # fails this.
            check("worker lost, abort: server exits 1 naming it",
                  rc == 1 and
                  re.search(r"^server: \d+ iterations", out, re.M) and
                  "worker %s " % killed_rank in out and
                  "on_worker_loss=continue" in out, out[-600:])
            check("worker lost, abort: the other worker stops, no hang",
                  wrc is not None, wout[-400:])
        else:
            check("worker lost, continue: the job finishes with worker 0",
                  rc == 0 and wrc == 0 and
                  "continuing without worker %s " % killed_rank in out,
                  "server rc=%s worker rc=%s\n%s\n%s" % (rc, wrc, out[-600:],
                                                         wout[-300:]))

    # ---- whole jobs that must end cleanly or with a named cause ----
    def job(name, server_flags, worker_iters, timeout=90):
        port = free_port()
        socks = [os.path.join(tmp, "%s-w%d.sock" % (name, w)) for w in (0, 1)]
        srv = popen(
            [server] + eal(name,
                           "net_memif0,role=server,socket=%s,id=0" % socks[0],
                           "net_memif1,role=server,socket=%s,id=0" % socks[1]) +
            ["--", "--workers=2", "--listen=127.0.0.1:%d" % port,
             "--stats_period=0", "--idle_sleep_us=100",
             "--round_timeout_ms=5000"] + server_flags,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.8)
        ws = []
        for w in (0, 1):
            ws.append(popen(
                [worker] + eal("%s-w%d" % (name, w),
                               "net_memif0,role=client,socket=%s,id=0"
                               % socks[w], lcore="1" if os.cpu_count() > 1
                               else "0") +
                ["--", "--server=127.0.0.1:%d" % port,
                 "--iterations=%d" % worker_iters[w], "--floats=20000",
                 "--stats_period=0", "--idle_sleep_us=100"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            time.sleep(0.2)
        outs = []
        for p in [srv] + ws:
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0]
            outs.append((p.returncode, out))
        return outs

    outs = job("iters", ["--policy=fixed"], (30, 100000))
    check("workers with different --iterations: the server names the flag",
          outs[0][0] not in (0, None) and "--iterations" in outs[0][1],
          outs[0][1][-600:])
    outs = job("ltp1", ["--policy=ltp", "--ltp_min_fraction=1"], (40, 40))
    check("ltp with --ltp_min_fraction=1 runs to the end",
          all(rc == 0 for rc, _ in outs),
          "\n".join(o[-300:] for _, o in outs))

    finish()


if __name__ == "__main__":
    main()
