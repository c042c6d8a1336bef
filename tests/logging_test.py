#!/usr/bin/env python3
"""Logging and --version, as an operator meets them.

- Every app answers --version with the build's `git describe` (or the
  meson project version outside git) and exits 0.
- The DPDK apps log through DPDK's registered type "dblp": a one-worker
  memif job with --log-level=dblp:debug shows the server's per-iteration
  debug lines, and with --log-level=dblp:warning shows neither those nor
  the info line of a worker's closing connection; the command line and
  version are logged first in both.
- Under systemd (JOURNAL_STREAM set) every DBLP log line starts with its
  syslog priority ("<7>" debug, "<6>" info), which journald turns into
  the severity.

Usage: logging_test.py BUILD_DIR
"""

import os
import re
import subprocess
import sys
import tempfile

from dblp_testlib import check, eal, finish, free_port, make_secret

BUILD = sys.argv[1]
APPS = os.path.join(BUILD, "apps")
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expected_version():
    try:
        return subprocess.run(
            ["git", "-C", SRC, "describe", "--always", "--dirty", "--tags"],
            capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def job(tmp, level, env=None):
    """A 5-iteration, 1-worker memif job; returns (server rc, server log,
    worker rc)."""
    sock = os.path.join(tmp, "w0-%s.sock" % level)
    port = free_port()
    secret = make_secret(os.path.join(tmp, "secret"))
    lv = "--log-level=dblp:%s" % level
    srv = subprocess.Popen(
        [os.path.join(APPS, "dblp-server")]
        + eal("log", "s" + level,
              "net_memif0,role=server,socket=%s,id=0" % sock)
        + [lv, "--", "--workers=1", "--listen=127.0.0.1:%d" % port,
           "--secret_file=" + secret, "--stats_period=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    wrk = subprocess.run(
        [os.path.join(APPS, "dblp-worker")]
        + eal("log", "w" + level,
              "net_memif0,role=client,socket=%s,id=0" % sock, lcore="1")
        + [lv, "--", "--server=127.0.0.1:%d" % port, "--iterations=5",
           "--floats=4096", "--secret_file=" + secret, "--stats_period=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, timeout=60)
    out, _ = srv.communicate(timeout=60)
    return srv.returncode, out, wrk.returncode


def main():
    want = expected_version()
    for app in ("dblp-server", "dblp-worker", "dblp-udp-server",
                "dblp-udp-worker", "dblp-udp-bench"):
        path = os.path.join(APPS, app)
        if not os.path.exists(path):
            continue
        args = [path, "--", "--version"] if app in ("dblp-server",
                                                    "dblp-worker") \
            else [path, "--version"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
        m = re.search(r"version (\S+)", r.stdout + r.stderr)
        check("%s --version" % app, r.returncode == 0 and m is not None and
              (want is None or m.group(1) == want),
              "rc=%d want %s: %s" % (r.returncode, want, r.stdout + r.stderr))

    with tempfile.TemporaryDirectory(prefix="dblp-logtest-") as tmp:
        rc, out, wrc = job(tmp, "debug")
        check("debug job ran", rc == 0 and wrc == 0, out[-1500:])
        check("the command line and version are logged first",
              re.search(r"^dblp \S+: command line: ", out, re.M) is not None,
              out[:600])
        check("--log-level=dblp:debug shows the per-iteration debug lines",
              len(re.findall(r"dblp-server: iteration \d+: mean norm", out))
              >= 4, out[-1500:])
        rc, out, wrc = job(tmp, "warning")
        check("warning job ran", rc == 0 and wrc == 0, out[-1500:])
        check("--log-level=dblp:warning hides debug and info lines",
              "mean norm" not in out and
              "control connection of worker" not in out, out[-1500:])
        env = dict(os.environ, JOURNAL_STREAM="8:12345")
        rc, out, wrc = job(tmp, "debug", env)
        check("journald priorities on every DBLP log line",
              re.search(r"^<7>dblp-server: iteration \d+", out, re.M)
              is not None and
              re.search(r"^<5>dblp \S+: command line", out, re.M) is not None,
              out[-1500:])
    finish()


if __name__ == "__main__":
    main()
