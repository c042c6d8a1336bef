#!/usr/bin/env python3
"""Every bad file and bad number an operator can give is refused before
anything starts (issue #21, item 7): exit 2, the flag named, within a few
seconds (a FIFO must not block the open), and for the DPDK apps before the
EAL starts (no "EAL:" line).

Files: a FIFO, a character device (/dev/zero) and a directory as
--secret_file, --cmdline-file, --out_dir, --out. Numbers: --udp_port past
16 bits, --floats whose byte size wraps, nan/inf/negative doubles
(--stats_period, --link_gbps, --burst_loss, --ns_per_frame), --workers=0.

Usage: bad_input_test.py BUILD_DIR
"""

import os
import shutil
import subprocess
import sys
import tempfile
from dblp_testlib import check, finish, make_secret

TIMEOUT_S = 10


def run(cmd):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(
            e.stdout, bytes) else (e.stdout or "")
        return None, out


def main():
    build = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="dblp-badinput-")
    try:
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        secret = make_secret(os.path.join(tmp, "job.secret"))
        bad_files = {"FIFO": fifo, "/dev/zero": "/dev/zero", "directory": tmp}
        app = {a: os.path.join(build, "apps", a) for a in (
            "dblp-server", "dblp-worker", "dblp-udp-server",
            "dblp-udp-worker", "dblp-sim", "dblp-floor", "dblp-udp-bench")}

        def eal(name):
            return ["--no-huge", "-m", "64", "--no-pci",
                    "--file-prefix=dblp-badinput-%d-%s" % (os.getpid(), name),
                    "--log-level=*:info", "--"]

        def argv(a, flags, with_secret=True):
            s = ["--secret_file=" + secret] if with_secret else []
            if a in ("dblp-server", "dblp-worker"):
                return [app[a]] + eal(a) + s + flags
            if a in ("dblp-udp-server", "dblp-udp-worker"):
                return [app[a]] + s + flags
            return [app[a]] + flags

        cases = []  # (app, flags, the flag the error must name, secret?)
        for kind, path in bad_files.items():
            for a in ("dblp-server", "dblp-worker", "dblp-udp-server",
                      "dblp-udp-worker"):
                cases.append((a, ["--secret_file=" + path], "secret_file",
                              False, kind))
            for a in ("dblp-server", "dblp-worker"):
                cases.append((a, ["--cmdline-file=" + path], "cmdline",
                              True, kind))
            for a in ("dblp-floor", "dblp-udp-bench"):
                if kind != "directory":  # a directory is refused by open
                    cases.append((a, ["--out=" + path], "--out", True, kind))
        for a in ("dblp-server", "dblp-worker", "dblp-udp-server",
                  "dblp-udp-worker", "dblp-sim"):
            cases.append((a, ["--out_dir=/dev/zero"], "out_dir", True,
                          "device"))
            cases.append((a, ["--out_dir=" + fifo], "out_dir", True, "FIFO"))
        numbers = [
            ("dblp-server", "--udp_port=4294967295", "udp_port"),
            ("dblp-server", "--udp_port=4294967290", "udp_port"),
            ("dblp-server", "--workers=0", "workers"),
            ("dblp-udp-server", "--workers=0", "workers"),
            ("dblp-sim", "--workers=0", "workers"),
            ("dblp-worker", "--floats=4611686018427387904", "floats"),
            ("dblp-udp-worker", "--floats=4611686018427387904", "floats"),
            ("dblp-sim", "--floats=4611686018427387904", "floats"),
            ("dblp-worker", "--floats=1073741824000", "floats"),
            ("dblp-server", "--rxd=65536", "rxd"),
            ("dblp-worker", "--txd=4294967295", "txd"),
            ("dblp-udp-server", "--cpu=100000", "cpu"),
            ("dblp-udp-server", "--burst_window_ms=1,18446744073709551",
             "burst_window_ms"),
        ]
        for a in ("dblp-server", "dblp-worker"):
            for v in ("nan", "inf", "-1"):
                numbers.append((a, "--stats_period=" + v, "stats_period"))
            numbers.append((a, "--link_gbps=nan", "link_gbps"))
            numbers.append((a, "--burst_loss=nan", "burst_loss"))
        numbers.append(("dblp-udp-server", "--burst_loss=inf", "burst_loss"))
        numbers.append(("dblp-sim", "--ns_per_frame=-1", "ns_per_frame"))
        numbers.append(("dblp-sim", "--control_one_way_ns=nan",
                        "control_one_way_ns"))
        numbers.append(("dblp-server", "--p_fixed=nan", "p_fixed"))
        numbers.append(("dblp-server", "--ltp_deadline_factor=inf",
                        "ltp_deadline_factor"))
        numbers.append(("dblp-udp-server", "--deadline_percentile=nan",
                        "deadline_percentile"))
        numbers.append(("dblp-sim", "--deadline_min_fraction=inf",
                        "deadline_min_fraction"))
        for a, flag, name in numbers:
            cases.append((a, [flag], name, True, flag.split("=", 1)[1]))

        for a, flags, name, with_secret, kind in cases:
            if not os.path.exists(app[a]):
                continue
            rc, out = run(argv(a, flags, with_secret))
            what = "%s %s (%s)" % (a, " ".join(flags), kind)
            check(what + ": exits 2 within %d s" % TIMEOUT_S, rc == 2,
                  "rc=%s\n%s" % (rc, out[-600:]))
            check(what + ": names the flag", name in out, out[-600:])
            if a in ("dblp-server", "dblp-worker"):
                check(what + ": before the EAL starts", "EAL:" not in out,
                      out[-600:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
