#!/usr/bin/env python3
"""Every flag's error names that flag (issue #35, item 4).

For each app and each flag it lists in --help, the app runs with that flag
set to a bad value ("garbage", and for an address flag 999.1.1.1:9100,
[::1]:9100 and -1) on top of arguments that would otherwise fail in a
known way (no server to reach, no port). A run that ends with an error
other than that baseline one must name the flag (`--name`): the error is
about the value given, and the operator must see which one. A value the
app takes (a name, a path) ends in the baseline error, or runs until the
sweep stops it: both fine. On 2e16acc `dblp-server --shards=2
--shard_index=1 --directory=garbage` blamed --listen ("the directory is on
another host").

Usage: flag_sweep_test.py BUILD_DIR
"""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, finish  # noqa: E402

BAD = ["garbage"]
BAD_ADDRESS = ["garbage", "999.1.1.1:9100", "[::1]:9100", "-1"]
ADDRESS_FLAGS = {"server", "directory", "listen", "control", "data",
                 "local_ip"}
# Flags whose value is free text or a path a bad value cannot be told from.
FREE = {"name", "out_dir", "shm", "log_file", "flagfile", "fromenv",
        "tryfromenv", "undefok", "help", "helpfull", "helpmatch", "helpon",
        "helppackage", "helpshort", "helpxml", "version"}
EAL = ["--no-huge", "-m", "64", "--no-pci", "--log-level=*:error"]


def help_flags(cmd):
    out = subprocess.run(cmd + ["--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         timeout=60).stdout
    return re.findall(r"^    -([a-zA-Z0-9_]+) \(", out, re.M)


def run(cmd, timeout=4):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        return None, ""  # it runs: the value was taken


def last_error(text):
    """The last line, numbers blanked (the baseline's "in 303 ms")."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return re.sub(r"\d+", "N", lines[-1]) if lines else ""


def main():
    build = os.path.abspath(sys.argv[1])
    apps = os.path.join(build, "apps")
    n = [0]

    def prefix():
        n[0] += 1
        return "--file-prefix=dblp-sweep-%d-%d" % (os.getpid(), n[0])

    # Each app's command up to its own flags, and arguments that end the
    # run with a known error fast (nothing listens on port 1; no port).
    cases = {
        "dblp-udp-worker": ([os.path.join(apps, "dblp-udp-worker")],
                            ["--insecure", "--server=127.0.0.1:1",
                             "--join_timeout_ms=300"]),
        "dblp-udp-server": ([os.path.join(apps, "dblp-udp-server")],
                            ["--insecure", "--workers=1",
                             "--control=127.0.0.1:0", "--data=127.0.0.1:0",
                             "--join_timeout_ms=300"]),
        "dblp-server": (None, ["--insecure", "--workers=1"]),
        "dblp-worker": (None, ["--insecure", "--server=127.0.0.1:1"]),
    }
    bad = []
    checked = 0
    seen = set()  # a flag shared by several apps is swept in the first
    for app, (head, base) in cases.items():
        path = os.path.join(apps, app)
        if not os.access(path, os.X_OK):
            print("skip %s: not built" % app)
            continue
        dpdk = head is None

        def command(extra, path=path, dpdk=dpdk, head=head, base=base):
            if dpdk:
                return [path] + EAL + [prefix(), "--"] + base + extra
            return head + base + extra

        flags = help_flags([path, "--"] if dpdk else [path])
        rc0, out0 = run(command([]), timeout=20)
        baseline = last_error(out0)
        print("%s: %d flags; baseline (rc %s): %s" % (app, len(flags), rc0,
                                                      baseline[:120]))
        jobs = []
        for f in flags:
            if f in FREE or f in seen:
                continue
            seen.add(f)
            for v in BAD_ADDRESS if f in ADDRESS_FLAGS else BAD:
                jobs.append((f, v))

        def one(job):
            f, v = job
            extra = ["--%s=%s" % (f, v)]
            if f == "directory":  # only a shard past the first takes one
                extra = ["--shards=2", "--shard_index=1"] + extra
            rc, out = run(command(extra))
            return f, v, rc, out

        with ThreadPoolExecutor(max_workers=2) as pool:
            for f, v, rc, out in pool.map(one, jobs):
                checked += 1
                if rc in (None, 0):
                    continue
                err = last_error(out)
                # `--name` (or testpmd's --name-with-dashes), or gflags'
                # own "... for int32 flag 'name'".
                if err == baseline or "--" + f in out or \
                        "--" + f.replace("_", "-") in out or \
                        "flag '%s'" % f in out:
                    continue
                bad.append("%s --%s=%s (rc %s): %s" % (app, f, v, rc,
                                                       err[:200]))
    check("every bad flag value's error names its flag (%d runs)" % checked,
          not bad, "\n".join(bad))
    finish()


if __name__ == "__main__":
    sys.exit(main())
