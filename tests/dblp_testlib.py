"""What the process-level tests share: named checks with a closing count,
free ports, EAL arguments, job secrets, and the integer gradients and dump
files of the memif jobs (tests/memif_cluster_test.py, tests/soak_test.py)."""
import os
import socket
import struct
import sys

FAILURES = []
_passed = [0]


def check(name, ok, detail=""):
    """One named check: printed, counted, and kept if it failed."""
    if ok:
        _passed[0] += 1
        print("ok   " + name)
    else:
        FAILURES.append(name)
        print("FAIL " + name + ("\n     " + str(detail).replace("\n", "\n     ")
                               if detail else ""))


def finish():
    """The closing line; exit code 1 if any check failed."""
    print("%d passed, %d failed" % (_passed[0], len(FAILURES)))
    if FAILURES:
        print("failed: " + ", ".join(FAILURES))
    sys.exit(1 if FAILURES else 0)


def kill_all(procs):
    """SIGKILL every process still running, all before any wait, then reap
    them. One at a time, a process could see its peer die and begin to
    exit, and a SIGKILL during its exit's leak check (sanitized builds)
    cuts that check short."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def hooked_app(build, name):
    """The tests' twin of app `name` with the fault flags
    (--hostile_per_round, --lying_gradient, --shard_map_override): the
    same main compiled with DBLP_TEST_HOOKS, in build/apps/hooked/, built
    only with -Dtest_hooks=true (tools/run-tests.sh sets it) and never
    installed. Exits naming the fix when the build has none."""
    path = os.path.join(build, "apps", "hooked", name)
    if not os.access(path, os.X_OK):
        print("FAIL: %s is missing: the tests' fault flags are only in a "
              "build with -Dtest_hooks=true (meson configure %s "
              "-Dtest_hooks=true, or tools/run-tests.sh)" % (path, build))
        sys.exit(1)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eal(test, prefix, *vdevs, lcore="0"):
    """EAL arguments for one app of a test: --no-huge, its own
    --file-prefix (dblp-<test>-<pid>-<prefix>), the given vdevs."""
    return (["-l", lcore, "--no-huge", "-m", "256", "--no-pci",
             "--file-prefix=dblp-%s-%d-%s" % (test, os.getpid(), prefix),
             "--log-level=*:warning"] + ["--vdev=" + v for v in vdevs])


def make_secret(path, data=None):
    """A job secret file (mode 0600, 32 random bytes unless `data`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data if data is not None else os.urandom(32))
    return path


def integer_value(j, it, rank):
    # Must match dblp::IntegerGradientValue.
    return float(((j * 7 + it * 3 + rank * 5) % 17) - 8)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_f32(path):
    with open(path, "rb") as f:
        data = f.read()
    return struct.unpack("<%df" % (len(data) // 4), data)


def read_bits(path, nbits):
    with open(path, "rb") as f:
        data = f.read()
    words = struct.unpack("<%dQ" % (len(data) // 8), data)
    return [(words[i // 64] >> (i % 64)) & 1 for i in range(nbits)]


class NetnsTestbed:
    """deploy/netns-testbed.sh's namespaces for one test: `with
    NetnsTestbed(hosts, subnet) as bed:` brings them up (bed.ns(i) is host
    i's namespace, address subnet.<i+1>) and always down; bed.ok is False
    (and the reason in bed.why) when this machine cannot make them (not
    root, no ip(8)): the caller skips."""

    def __init__(self, hosts, subnet, hub=False):
        self.hosts, self.subnet, self.hub = hosts, subnet, hub
        self.prefix = "dtb%d" % (os.getpid() % 100000)
        self.script = os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "deploy", "netns-testbed.sh")
        self.ok, self.why = False, ""

    def ns(self, i):
        return "%s-h%d" % (self.prefix, i)

    def ip(self, i):
        return "%s.%d" % (self.subnet, i + 1)

    def __enter__(self):
        import shutil
        import subprocess
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.why = "needs root and ip(8)"
            return self
        up = subprocess.run(["bash", self.script, "up", "--hosts",
                             str(self.hosts), "--prefix", self.prefix,
                             "--subnet", self.subnet],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
        if up.returncode != 0:
            self.why = "the testbed did not come up: " + up.stdout[-400:]
            return self
        if self.hub:
            # Every frame to every port, as a hub (or a switch whose table
            # overflowed) would: a third host sees the others' traffic.
            subprocess.run(["ip", "-n", self.prefix + "-sw", "link", "set",
                            "br0", "type", "bridge", "ageing_time", "0"],
                           check=True)
        self.ok = True
        return self

    def __exit__(self, *exc):
        import subprocess
        subprocess.run(["bash", self.script, "down", "--prefix", self.prefix],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return False
