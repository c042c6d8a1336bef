#!/usr/bin/env python3
"""dblp-server's server shards at the door, as processes over memif
(--shards, --shard_index, --directory; lib/dblp/control/server_shards.h):

- a shard whose job flags differ from the directory's is refused, and its
  error names the flag on both sides;
- a shard whose --shards differs is refused naming both counts;
- the place a refused shard held is free again: the right shard registers;
- a fixed --session, --on_worker_loss=continue, a control budget without
  room for the shards and a loopback --listen for a remote directory are
  refused with --shards > 1 before the EAL, naming the flag;
- a plain worker that JOINs server shard 1 is refused with the directory's
  address (--server= of shard 0), and says so.

The full sharded job (means, CLR decisions, a killed shard) needs sharded
workers: tests/shard_cluster_test.py.

dblp-udp-server's shards (the same flags, apps/shard_flags.h): the same
flag refusals naming its --control, a shard with other job flags refused,
a shard whose directory never answers ending with the fix.

Usage: server_shards_test.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, eal, finish, free_port  # noqa: E402

TEST = "srvshards"


def server(build, tmp, name, port, extra):
    sock = os.path.join(tmp, name + ".sock")
    cmd = ([os.path.join(build, "apps", "dblp-server")] +
           eal(TEST, name, "net_memif0,role=server,socket=%s,id=0" % sock) +
           ["--", "--listen=127.0.0.1:%d" % port, "--workers=1", "--insecure",
            "--stats_period=0", "--join_timeout_ms=20000"] + extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def ended(p, timeout=15):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out
    return p.returncode, out


def main():
    build = sys.argv[1]
    for app in ("dblp-server", "dblp-worker"):
        if not os.access(os.path.join(build, "apps", app), os.X_OK):
            print("missing " + app)
            sys.exit(1)
    p0, p1 = free_port(), free_port()
    directory = "127.0.0.1:%d" % p0
    # What a sharded job cannot take, refused before the EAL (exit 2).
    srv = os.path.join(build, "apps", "dblp-server")
    for flags, named in (
            (["--shards=2", "--session=7"], "--session"),
            (["--shards=2", "--on_worker_loss=continue"], "--on_worker_loss"),
            (["--shards=2", "--workers=4", "--control_max_connections=4"],
             "--control_max_connections"),
            (["--shards=2", "--shard_index=1", "--directory=10.1.2.3:9100",
              "--listen=127.0.0.1:9100"], "--listen"),
            (["--shards=2", "--paper_mode"], None)):
        r = subprocess.run([srv, "--", "--insecure"] + flags,
                           capture_output=True, text=True, timeout=30)
        out = r.stdout + r.stderr
        if named is None:  # accepted by the flag checks: the EAL comes next
            check("%s passes the flag checks" % " ".join(flags),
                  r.returncode != 2, out[-600:])
            continue
        check("%s is refused before the EAL, naming %s" % (" ".join(flags),
                                                            named),
              r.returncode == 2 and named in out, out[-600:])
    shard1 = ["--shards=2", "--shard_index=1", "--directory=" + directory,
              "--udp_port=47100"]
    with tempfile.TemporaryDirectory(prefix="dblp-srvshards-") as tmp:
        d = server(build, tmp, "s0", p0, ["--shards=2", "--p_low=0.008"])
        try:
            time.sleep(1.0)
            bad = server(build, tmp, "s1a", p1, shard1 + ["--p_low=0.02"])
            rc, out = ended(bad)
            check("a shard with another --p_low is refused", rc == 1, out[-1500:])
            check("the refusal names the flag on both sides",
                  "--p_low=0.008 at the directory, --p_low=0.02 at server "
                  "shard 1" in out, out[-1500:])
            paper = server(build, tmp, "s1p", p1, shard1 + ["--paper_mode"])
            rc, out = ended(paper)
            check("a shard run with --paper_mode (fills, resync, feedback "
                  "rewritten) under a directory without is refused",
                  rc == 1 and "at the directory" in out, out[-1500:])
            three = server(build, tmp, "s1b", p1, [
                "--shards=3", "--shard_index=1", "--directory=" + directory,
                "--udp_port=47100"])
            rc, out = ended(three)
            check("a shard of another --shards is refused",
                  rc == 1 and "--shards=3, the directory with --shards=2" in out,
                  out[-1500:])
            good = server(build, tmp, "s1", p1, shard1)
            try:
                time.sleep(1.5)
                check("the right shard registers and waits for its workers",
                      good.poll() is None)
                wsock = os.path.join(tmp, "s1.sock")
                worker = subprocess.run(
                    [os.path.join(build, "apps", "dblp-worker")] +
                    eal(TEST, "w", "net_memif0,role=client,socket=%s,id=0" %
                        wsock, lcore="1" if (os.cpu_count() or 1) > 1 else "0")
                    + ["--", "--server=127.0.0.1:%d" % p1, "--insecure",
                       "--stats_period=0", "--floats=100000",
                       "--iterations=1", "--join_timeout_ms=5000"],
                    capture_output=True, text=True, timeout=30)
                out = worker.stdout + worker.stderr
                check("a plain worker at server shard 1 is refused",
                      worker.returncode != 0, out[-1500:])
                check("its error names the directory to use",
                      "not the job's directory" in out and
                      "--server=" + directory in out, out[-1500:])
            finally:
                good.kill()
                ended(good, 5)
        finally:
            d.kill()
            ended(d, 5)
    udp_door(build)
    finish()


def udp_server(build, name_flags):
    cmd = [os.path.join(build, "apps", "dblp-udp-server"), "--workers=1",
           "--insecure", "--join_timeout_ms=20000"] + name_flags
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def udp_door(build):
    """dblp-udp-server takes the same shard flags (apps/shard_flags.h):
    the same refusals, naming its own --control, and the same door."""
    srv = os.path.join(build, "apps", "dblp-udp-server")
    for flags, named in (
            (["--shards=2", "--on_worker_loss=continue"], "--on_worker_loss"),
            (["--shards=2", "--workers=4", "--control_max_connections=4"],
             "--control_max_connections"),
            (["--shards=2", "--shard_index=1", "--directory=10.1.2.3:9100",
              "--control=127.0.0.1:9100"], "--control"),
            (["--shards=2", "--shard_index=1"], "--directory"),
            (["--shards=65"], "--shards")):
        r = subprocess.run([srv, "--insecure"] + flags, capture_output=True,
                           text=True, timeout=30)
        out = r.stdout + r.stderr
        check("dblp-udp-server %s is refused, naming %s" % (" ".join(flags),
                                                            named),
              r.returncode == 2 and named in out, out[-600:])
    p0, p1 = free_port(), free_port()
    directory = "127.0.0.1:%d" % p0
    d = udp_server(build, ["--control=" + directory, "--shards=2",
                           "--p_low=0.008"])
    try:
        time.sleep(0.5)
        bad = udp_server(build, ["--control=127.0.0.1:%d" % p1, "--shards=2",
                                 "--shard_index=1", "--directory=" + directory,
                                 "--p_low=0.02"])
        rc, out = ended(bad)
        check("a UDP shard with another --p_low is refused, naming the flag "
              "on both sides", rc == 1 and
              "--p_low=0.008 at the directory, --p_low=0.02 at server shard 1"
              in out, out[-1500:])
        lost = udp_server(build, ["--control=127.0.0.1:%d" % p1, "--shards=2",
                                  "--shard_index=1", "--join_timeout_ms=1500",
                                  "--directory=127.0.0.1:%d" % free_port()])
        rc, out = ended(lost)
        check("a UDP shard whose directory never answers ends (exit 1) "
              "naming it and the fix", rc == 1 and "directory" in out and
              "--shard_index=0" in out, out[-1500:])
    finally:
        d.kill()
        ended(d, 5)


if __name__ == "__main__":
    main()
