"""Which CPU a poll-mode process this package starts runs on.

Each process takes the allowed CPU with the fewest server processes
claimed on it, then the fewest DBLP processes of any kind, so two jobs on
one host spread out rather than all taking CPUs 0 and 1, and a server
keeps a core of its own while there are cores to spare: it adds and sends
for every worker, so on a small host a worker polling beside it slows the
whole exchange (W = 2 on two cores, 5 interleaved runs: a broadcast of
67-94 ms with a worker on the server's core, 19-25 ms with both workers on
the other; docs/BENCHMARKS.md "The whole exchange"). A claim is a file under /dev/shm/dblp-lcores named
CPU-PID-SERIAL[-server]; the owner removes it when its process ends, and a
reader removes those of dead pids. Claims are advice: when the directory
cannot be used, the first allowed CPU is taken and nothing fails.
"""

import atexit
import fcntl
import itertools
import os

CLAIM_DIR = "/dev/shm/dblp-lcores"
_serial = itertools.count()
_held = set()


class Claim:
    def __init__(self, cpu, path):
        self.cpu = cpu
        self.path = path

    def release(self):
        if self.path is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        _held.discard(self.path)
        self.path = None


def claim_lcore(server=False):
    """A Claim on the allowed CPU with the fewest servers, then the fewest
    claims (its .cpu). `server`: the claim is a server's."""
    cpus = sorted(os.sched_getaffinity(0))
    try:
        _ensure_dir()
        with open(os.path.join(CLAIM_DIR, ".lock"), "a") as lock:
            # Ranks that start together must not all pick the same CPU.
            fcntl.flock(lock, fcntl.LOCK_EX)
            counts = {c: 0 for c in cpus}
            servers = {c: 0 for c in cpus}
            for cpu, is_server in _live_claims():
                if cpu in counts:
                    counts[cpu] += 1
                    servers[cpu] += is_server
            best = min(cpus, key=lambda c: (servers[c], counts[c], c))
            path = os.path.join(CLAIM_DIR, f"{best}-{os.getpid()}-"
                                f"{next(_serial)}" +
                                ("-server" if server else ""))
            with open(path, "w"):
                pass
    except OSError:
        return Claim(cpus[0], None)
    _held.add(path)
    return Claim(best, path)


def _ensure_dir():
    if not os.path.isdir(CLAIM_DIR):
        os.makedirs(CLAIM_DIR, exist_ok=True)
        try:
            os.chmod(CLAIM_DIR, 0o1777)  # every user's jobs (umask aside)
        except OSError:
            pass


def _live_claims():
    out = []
    for name in os.listdir(CLAIM_DIR):
        if name.startswith("."):
            continue
        try:
            cpu, pid, rest = name.split("-", 2)
            os.kill(int(pid), 0)
            out.append((int(cpu), rest.endswith("-server")))
        except (ValueError, ProcessLookupError):
            try:
                os.unlink(os.path.join(CLAIM_DIR, name))
            except OSError:
                pass
        except PermissionError:  # another user's live process
            out.append((int(cpu), rest.endswith("-server")))
    return out


@atexit.register
def _release_held():
    for path in list(_held):
        try:
            os.unlink(path)
        except OSError:
            pass
